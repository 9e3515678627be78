//! WorkloadEntry auto-registration and health
//! (`PILOT_ENABLE_WORKLOAD_ENTRY_AUTOREGISTRATION`,
//! `PILOT_ENABLE_WORKLOAD_ENTRY_HEALTHCHECKS`,
//! `PILOT_WORKLOAD_ENTRY_GRACE_PERIOD`).

use std::time::Duration;

use common::env::Reader;

use crate::autoregistration::{
    DEFAULT_GRACE_PERIOD, ENV_AUTOREGISTRATION, ENV_GRACE_PERIOD, ENV_HEALTH_CHECKS, Settings,
};

/// Reads the controller's settings; `max_connection_age` is the server's
/// and `instance_id` this istiod's Pod name.
pub(super) fn parse(
    r: &mut Reader<'_>,
    max_connection_age: Option<Duration>,
    instance_id: &str,
) -> Settings {
    Settings {
        auto_registration: r.bool(ENV_AUTOREGISTRATION, true),
        health_checks: r.bool(ENV_HEALTH_CHECKS, true),
        grace_period: r.duration(ENV_GRACE_PERIOD, DEFAULT_GRACE_PERIOD),
        // Istio's controller: 1.5 x the max connection age.
        max_connection_age: max_connection_age.map(|a| a + a / 2),
        instance_id: instance_id.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use common::env::MapEnv;

    use super::*;

    #[test]
    fn the_cleanup_age_is_one_and_a_half_connection_ages_and_a_bad_grace_period_named() {
        let env = MapEnv::default();
        let mut r = Reader::new(&env);
        let s = parse(&mut r, Some(Duration::from_secs(60)), "istiod-1");
        r.finish().unwrap();
        assert_eq!(s.max_connection_age, Some(Duration::from_secs(90)));
        assert_eq!(s.instance_id, "istiod-1");
        assert_eq!(s.grace_period, DEFAULT_GRACE_PERIOD);

        let env = MapEnv::from_pairs([(ENV_GRACE_PERIOD, "soon")]);
        let mut r = Reader::new(&env);
        parse(&mut r, None, "istiod");
        let errors = r.finish().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with(ENV_GRACE_PERIOD), "{errors:?}");
    }
}
