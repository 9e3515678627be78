//! The XDS cache: which generated resources are kept between pushes.

use common::env::Reader;

use crate::pushctx::cache::{CacheSettings, DEFAULT_CACHE_SIZE};

/// `PILOT_ENABLE_XDS_CACHE`: cache EDS, and the switch for the others (true).
pub const ENV_ENABLE_XDS_CACHE: &str = "PILOT_ENABLE_XDS_CACHE";
/// `PILOT_ENABLE_CDS_CACHE`: cache clusters (true).
pub const ENV_ENABLE_CDS_CACHE: &str = "PILOT_ENABLE_CDS_CACHE";
/// `PILOT_ENABLE_RDS_CACHE`: cache routes (true).
pub const ENV_ENABLE_RDS_CACHE: &str = "PILOT_ENABLE_RDS_CACHE";
/// `PILOT_XDS_CACHE_SIZE`: entries kept at most (60000).
pub const ENV_XDS_CACHE_SIZE: &str = "PILOT_XDS_CACHE_SIZE";
/// `PILOT_XDS_CACHE_STATS`: export the `xds_cache_*` metrics (false).
pub const ENV_XDS_CACHE_STATS: &str = "PILOT_XDS_CACHE_STATS";

/// Reads the XDS cache settings.
pub(super) fn parse(r: &mut Reader<'_>) -> CacheSettings {
    CacheSettings {
        enabled: r.bool(ENV_ENABLE_XDS_CACHE, true),
        cds: r.bool(ENV_ENABLE_CDS_CACHE, true),
        rds: r.bool(ENV_ENABLE_RDS_CACHE, true),
        size: r.parse(ENV_XDS_CACHE_SIZE, DEFAULT_CACHE_SIZE),
        stats: r.bool(ENV_XDS_CACHE_STATS, false),
    }
}

#[cfg(test)]
mod tests {
    use common::env::MapEnv;

    use super::*;

    #[test]
    fn istio_defaults_and_a_bad_size_named() {
        let env = MapEnv::default();
        let mut r = Reader::new(&env);
        assert_eq!(parse(&mut r), CacheSettings::default());
        r.finish().unwrap();

        let env = MapEnv::from_pairs([(ENV_XDS_CACHE_SIZE, "many"), (ENV_ENABLE_RDS_CACHE, "0")]);
        let mut r = Reader::new(&env);
        let c = parse(&mut r);
        assert!(!c.rds && c.cds);
        let errors = r.finish().unwrap_err().0;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("PILOT_XDS_CACHE_SIZE"), "{errors:?}");
    }
}
