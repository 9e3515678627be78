//! Timestamps as Kubernetes and Istio write them: RFC 3339 in UTC, to the
//! second (`2026-12-07T02:10:00Z`, the API's `metav1.Time`) or to the
//! nanosecond without trailing zeros (Go's `time.RFC3339Nano`).

use std::time::SystemTime;

use time::{OffsetDateTime, UtcOffset};

/// `t` in RFC 3339, UTC, whole seconds.
pub fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Now in RFC 3339, UTC, whole seconds.
pub fn now_rfc3339() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

/// `t` in Go's `time.RFC3339Nano`, UTC: the fraction of a second without
/// trailing zeros, none when whole.
pub fn rfc3339_nano(t: SystemTime) -> String {
    let t = OffsetDateTime::from(t);
    let whole = rfc3339(t);
    match t.nanosecond() {
        0 => whole,
        nanos => {
            let frac = format!(".{nanos:09}");
            format!(
                "{}{}Z",
                whole.trim_end_matches('Z'),
                frac.trim_end_matches('0')
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn formats_as_kubernetes_and_go_do() {
        let t = UNIX_EPOCH + Duration::from_secs(1_796_609_400);
        assert_eq!(rfc3339(OffsetDateTime::from(t)), "2026-12-07T02:10:00Z");
        assert_eq!(rfc3339_nano(t), "2026-12-07T02:10:00Z");
        assert_eq!(
            rfc3339_nano(t + Duration::from_nanos(120_000_000)),
            "2026-12-07T02:10:00.12Z"
        );
        let offset = OffsetDateTime::from(t).to_offset(UtcOffset::from_hms(2, 0, 0).unwrap());
        assert_eq!(rfc3339(offset), "2026-12-07T02:10:00Z");
        assert_eq!(now_rfc3339().len(), "2026-12-07T02:10:00Z".len());
    }
}
