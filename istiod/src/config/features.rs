//! Istio's feature flags istiod reads.

use common::env::Reader;

use crate::model::features::Features;

/// Istio's `ENABLE_TLS_ON_SIDECAR_INGRESS` (default false): Sidecar
/// `ingress[].tls` terminates TLS on ports whose mTLS mode is DISABLE;
/// without it such a Sidecar is refused.
pub const ENV_ENABLE_TLS_ON_SIDECAR_INGRESS: &str = "ENABLE_TLS_ON_SIDECAR_INGRESS";

/// Reads the feature flags.
pub(super) fn parse(r: &mut Reader<'_>) -> Features {
    Features {
        enable_tls_on_sidecar_ingress: r.bool(ENV_ENABLE_TLS_ON_SIDECAR_INGRESS, false),
    }
}

#[cfg(test)]
mod tests {
    use common::env::MapEnv;

    use super::*;

    #[test]
    fn flags_are_off_by_default_and_a_bad_one_named() {
        let env = MapEnv::default();
        let mut r = Reader::new(&env);
        assert_eq!(parse(&mut r), Features::default());
        let env = MapEnv::from_pairs([(ENV_ENABLE_TLS_ON_SIDECAR_INGRESS, "yes")]);
        let mut r = Reader::new(&env);
        parse(&mut r);
        let errors = r.finish().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("ENABLE_TLS_ON_SIDECAR_INGRESS="),
            "{errors:?}"
        );
    }
}
