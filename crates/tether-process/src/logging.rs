//! Structured logs through `tracing`: JSON lines for log pipelines or plain text for people,
//! filtered with RUST_LOG syntax.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Plain,
}

/// The filter string is not valid RUST_LOG syntax.
#[derive(Debug, thiserror::Error)]
#[error("invalid --log-level {filter:?}: {source} (use e.g. `info` or `info,tether_leader=debug`)")]
pub struct LogFilterError {
    filter: String,
    source: tracing_subscriber::filter::ParseError,
}

/// Installs the global subscriber. Call once, first thing.
pub fn init(format: LogFormat, filter: &str) -> Result<(), LogFilterError> {
    let env = EnvFilter::try_new(filter).map_err(|source| LogFilterError {
        filter: filter.to_string(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env)
        .with_writer(std::io::stderr);
    // A second init (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Plain => builder.try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_filter_is_a_clear_error() {
        let err = init(LogFormat::Plain, "info,=[").unwrap_err().to_string();
        assert!(err.contains("--log-level"), "{err}");
    }
}
