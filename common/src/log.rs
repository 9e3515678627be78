//! Logging in Istio's shape: `--log_output_level default:info,ca:debug` and
//! lines like `2026-01-02T03:04:05.123456Z\tinfo\tca\tmessage key=value`.
//!
//! A scope is a `tracing` target without `::` (e.g. `target: "ca"`); events
//! from module paths belong to the `default` scope, whose name Istio omits.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Istio's default for `--log_output_level`.
pub const DEFAULT_LOG_OUTPUT_LEVEL: &str = "default:info";

/// Our own crates: their root modules' events belong to the default scope.
const OWN_CRATES: &[&str] = &["istiod", "pilot_agent", "common", "tests"];

/// Crates whose debug output is noise unless asked for by name.
const QUIET_CRATES: &[&str] = &[
    "h2",
    "hyper",
    "hyper_util",
    "tower",
    "rustls",
    "tonic",
    "notify",
    "reqwest",
];

/// A bad `--log_output_level`.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid --log_output_level {input:?}: {reason} (expected scope:level pairs, e.g. default:info,ca:debug; levels are debug, info, warn, error, fatal, none)"
)]
pub struct LogLevelError {
    input: String,
    reason: String,
}

fn level_directive(level: &str) -> Option<&'static str> {
    Some(match level {
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" => "error",
        "none" => "off",
        _ => return None,
    })
}

/// Turns Istio's `scope:level,...` into an `EnvFilter`.
pub fn filter(spec: &str) -> Result<EnvFilter, LogLevelError> {
    let mut default = "info";
    let mut scoped = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (scope, level) = match part.split_once(':') {
            Some((s, l)) => (s.trim(), l.trim()),
            // Istio accepts a bare level as the default scope's.
            None => ("default", part),
        };
        let level = level_directive(level).ok_or_else(|| LogLevelError {
            input: spec.to_string(),
            reason: format!("unknown level {level:?} for scope {scope:?}"),
        })?;
        if scope == "default" || scope == "all" {
            default = level;
        } else {
            scoped.push(format!("{scope}={level}"));
        }
    }
    let mut directives = vec![default.to_string()];
    for c in QUIET_CRATES {
        if !scoped.iter().any(|s| s.starts_with(&format!("{c}="))) {
            directives.push(format!("{c}=warn"));
        }
    }
    directives.extend(scoped);
    EnvFilter::try_new(directives.join(",")).map_err(|e| LogLevelError {
        input: spec.to_string(),
        reason: e.to_string(),
    })
}

/// Installs the global subscriber. Call once, from `main`.
pub fn init(spec: &str, as_json: bool) -> Result<(), LogLevelError> {
    let filter = filter(spec)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stdout);
    // A second init (tests calling main twice) is harmless: keep the first.
    let _ = if as_json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.event_format(IstioFormat).try_init()
    };
    Ok(())
}

/// Istio's text line format.
pub struct IstioFormat;

impl<S, N> FormatEvent<S, N> for IstioFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let now = time::OffsetDateTime::now_utc();
        let meta = event.metadata();
        let level = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warn",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "debug",
        };
        write!(
            writer,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z\t{level}\t",
            now.year(),
            u8::from(now.month()),
            now.day(),
            now.hour(),
            now.minute(),
            now.second(),
            now.microsecond()
        )?;
        let target = meta.target();
        if !target.contains("::")
            && target != "default"
            && !QUIET_CRATES.contains(&target)
            && !OWN_CRATES.contains(&target)
        {
            write!(writer, "{target}\t")?;
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(fields) = span.extensions().get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, " {fields}")?;
                }
            }
        }
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_levels() {
        assert!(filter("default:info,ca:debug,sds:none").is_ok());
        assert!(filter("debug").is_ok());
        let err = filter("default:loud").unwrap_err().to_string();
        assert!(err.contains("\"loud\""), "{err}");
    }
}
