//! How Sluice's binaries (`sluice-gateway`, `sluice-host`, `sluice dev`)
//! report on themselves: logs on stderr, one event a line.
//!
//! - `SLUICE_LOG` filters them (`tracing` `EnvFilter` syntax: `info`,
//!   `warn,sluice_agent=debug`, …); each binary names its default.
//! - `SLUICE_LOG_FORMAT` picks the line format: `text` (default, for
//!   people) or `json` (one JSON object a line, for log shippers: `timestamp`,
//!   `level`, `target`, `fields` with `message` and the event's fields, and
//!   the spans it happened in).

use tracing_subscriber::EnvFilter;

/// The log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (colours when stderr is a terminal).
    Text,
    /// One JSON object a line.
    Json,
}

/// Why logging could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `SLUICE_LOG_FORMAT` names no format.
    #[error("SLUICE_LOG_FORMAT='{0}' is not a log format: use `text` or `json`")]
    Format(String),
    /// `SLUICE_LOG` is not a filter.
    #[error("SLUICE_LOG='{value}' is not a log filter ({reason}): use e.g. `info` or `warn,sluice_agent=debug`")]
    Filter { value: String, reason: String },
    /// A logger was already installed in this process.
    #[error("logging was already started in this process")]
    AlreadyStarted,
}

impl LogFormat {
    /// Reads a format name (`text` or `json`, any case).
    pub fn parse(s: &str) -> Result<Self, TelemetryError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(TelemetryError::Format(s.to_string())),
        }
    }
}

/// The filter for `value` (`SLUICE_LOG`), or `default` when unset.
pub fn filter(value: Option<&str>, default: &str) -> Result<EnvFilter, TelemetryError> {
    match value {
        None => Ok(EnvFilter::new(default)),
        Some(v) => {
            EnvFilter::try_new(v).map_err(|e| TelemetryError::Filter { value: v.to_string(), reason: e.to_string() })
        }
    }
}

/// Starts logging to stderr as `SLUICE_LOG` and `SLUICE_LOG_FORMAT` say,
/// with `default` as the filter when `SLUICE_LOG` is unset.
pub fn init_logs(default: &str) -> Result<(), TelemetryError> {
    let var = |name: &str| std::env::var(name).ok();
    let format = LogFormat::parse(var("SLUICE_LOG_FORMAT").as_deref().unwrap_or("text"))?;
    let filter = filter(var("SLUICE_LOG").as_deref(), default)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(true).try_init(),
    };
    installed.map_err(|_| TelemetryError::AlreadyStarted)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn formats_and_filters_are_read_or_refused_with_the_reason() {
        assert_eq!(LogFormat::parse("JSON").unwrap(), LogFormat::Json);
        assert_eq!(LogFormat::parse("text").unwrap(), LogFormat::Text);
        let e = LogFormat::parse("xml").unwrap_err().to_string();
        assert!(e.contains("'xml'") && e.contains("json"), "{e}");
        assert!(filter(Some("warn,sluice_agent=debug"), "info").is_ok());
        let e = filter(Some("info,[[["), "info").unwrap_err().to_string();
        assert!(e.contains("SLUICE_LOG='info,[[['"), "{e}");
        assert_eq!(filter(None, "warn").unwrap().to_string(), "warn");
    }
}
