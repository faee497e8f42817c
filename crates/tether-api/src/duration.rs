//! Durations given on command lines (`90s`, `1m30s`, `24h`): the Go format the API uses for
//! ClusterSet specs (`kube::core::Duration`), parsed once, with an error that says what to type.

use std::time::Duration;

/// Parses a non-negative Go-style duration, for clap's `value_parser`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 90s, 5m or 24h");
    // NB: kube's parser takes "" for zero; a flag left empty is a mistake, not "no time".
    if text.trim().is_empty() {
        return Err(bad());
    }
    let d: kube::core::Duration = text.trim().parse().map_err(|_| bad())?;
    if d.is_negative() {
        return Err(bad());
    }
    Ok(d.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_says_what_to_type(text in "\\PC*") {
            match parse(&text) {
                Ok(_) => prop_assert!(!text.trim().is_empty()),
                Err(e) => prop_assert!(e.contains("like 90s, 5m or 24h") && e.contains(&format!("{text:?}")), "{}", e),
            }
        }

        #[test]
        fn hours_minutes_and_seconds_add_up(h in 0u64..1000, m in 0u64..60, sec in 0u64..60) {
            let text = format!("{h}h{m}m{sec}s");
            prop_assert_eq!(parse(&text), Ok(Duration::from_secs(h * 3600 + m * 60 + sec)));
        }
    }

    #[test]
    fn go_durations_parse_and_anything_else_says_what_to_type() {
        assert_eq!(parse("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "10", "ten seconds", "-5s", "5d", "1.5.5s"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("like 90s"), "{bad}: {err}");
        }
    }
}
