//! Go-style durations (`10s`, `1m30s`, `24h`) as used in ClusterSet specs; the CRD pattern and
//! CEL already validated them, so parsing here only has to be exact, not forgiving.

use std::time::Duration;

/// Parses `<number><unit>` sequences with units `ms`, `s`, `m`, `h`; `None` if malformed.
pub fn parse(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (scale, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else {
            return None;
        };
        total += value * scale;
        rest = &rest[len..];
    }
    Some(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        let cases = [
            ("10s", Some(10_000)),
            ("1m30s", Some(90_000)),
            ("24h", Some(86_400_000)),
            ("500ms", Some(500)),
            ("1.5h", Some(5_400_000)),
            ("", None),
            ("10", None),
            ("10d", None),
            ("s", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text).map(|d| d.as_millis() as u64), want, "{text:?}");
        }
    }
}
