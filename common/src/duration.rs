//! Go's `time.ParseDuration` format (`24h`, `1h30m`, `100ms`, `1.5s`), which
//! every Istio duration variable uses. No maintained crate parses exactly this
//! grammar (humantime accepts other units and spellings), so it is written here.

use std::time::Duration;

/// Why a duration string is not a Go duration.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid duration {input:?}: {reason} (expected a Go duration such as 24h, 1h30m, 500ms)")]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

/// Parses a non-negative Go duration.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| err("missing unit"))?;
        if num_end == 0 {
            return Err(err("expected a number"));
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err("bad number"))?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err("unknown unit")),
        };
        total += value * nanos_per_unit;
        rest = &rest[unit_end..];
    }
    if !total.is_finite() || total > u64::MAX as f64 {
        return Err(err("overflow"));
    }
    Ok(Duration::from_nanos(total.round() as u64))
}

/// Formats a duration the way Go prints it (`1h30m0s`, `500ms`), for logs.
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_secs(1) {
        let ns = d.as_nanos();
        return if ns.is_multiple_of(1_000_000) {
            format!("{}ms", ns / 1_000_000)
        } else if ns.is_multiple_of(1000) {
            format!("{}µs", ns / 1000)
        } else {
            format!("{ns}ns")
        };
    }
    let secs = d.as_secs();
    let frac = d.subsec_nanos();
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let s_str = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{:09}", frac);
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => s_str,
        (0, m) => format!("{m}m{s_str}"),
        (h, m) => format!("{h}h{m}m{s_str}"),
    }
}

/// Formats a duration as protobuf's JSON mapping writes a
/// `google.protobuf.Duration` (seconds, with 0, 3, 6 or 9 fractional
/// digits: `10s`, `0.001s`, `1.500s`): how Istio shows the durations of its
/// config objects.
pub fn format_proto(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        format!("{secs}s")
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{secs}.{:03}s", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1000) {
        format!("{secs}.{:06}s", nanos / 1000)
    } else {
        format!("{secs}.{nanos:09}s")
    }
}

/// Serializes a duration in protobuf's JSON form ([`format_proto`]).
pub fn serialize_proto<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_proto(*d))
}

/// Serializes a duration as Go prints it (for logged configurations).
pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("24h").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert_eq!(parse("300us").unwrap(), Duration::from_micros(300));
    }

    #[test]
    fn formats_as_protobuf_json() {
        assert_eq!(format_proto(Duration::from_secs(10)), "10s");
        assert_eq!(format_proto(Duration::ZERO), "0s");
        assert_eq!(format_proto(Duration::from_millis(1)), "0.001s");
        assert_eq!(format_proto(Duration::from_millis(1500)), "1.500s");
        assert_eq!(format_proto(Duration::from_micros(100)), "0.000100s");
        assert_eq!(format_proto(Duration::from_nanos(1)), "0.000000001s");
        assert_eq!(format_proto(Duration::from_secs(5400)), "5400s");
    }

    #[test]
    fn rejects_bad_durations() {
        for bad in ["", "10", "5 s", "1d", "-1s", "h", "1.2.3s"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(
            parse("10")
                .unwrap_err()
                .to_string()
                .contains("missing unit")
        );
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(86400)), "24h0m0s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
    }
}
