//! Generation dispatched by type URL, in one place: the push context
//! ([`IstioContext`]) is data, and each generator module reads it without
//! the context calling back into the generators.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{
    CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, NAME_TABLE_TYPE, ROUTE_TYPE, SECRET_TYPE, cds, eds,
    envoyfilter, lds, nds, rds, sds,
};
use crate::pushctx::context::IstioContext;
use crate::pushctx::push_context::{GenerateError, PushContext};
use crate::pushctx::{Proxy, PushPlan, Resource, Updates, proxy_dependencies};

impl PushContext for IstioContext {
    fn version(&self) -> &str {
        &self.version
    }

    fn generate(
        &self,
        proxy: &Proxy,
        type_url: &str,
        names: &BTreeSet<String>,
    ) -> Result<Vec<Arc<Resource>>, GenerateError> {
        let mut proxy = proxy.clone();
        proxy.labels = self.workload_labels(&proxy);
        let all = match type_url {
            CLUSTER_TYPE => cds::build(self, &proxy),
            ENDPOINT_TYPE => eds::build(self, &proxy, names),
            LISTENER_TYPE => lds::build(self, &proxy),
            ROUTE_TYPE => rds::build(self, &proxy, names),
            NAME_TABLE_TYPE => nds::build(self, &proxy),
            SECRET_TYPE => sds::build(self, &proxy, names),
            other => return Err(GenerateError::UnknownType(other.to_string())),
        };
        // EnvoyFilters last, on this proxy's copy of the (cached) output.
        // EDS, RDS and SDS build the names asked for, and only those.
        Ok(envoyfilter::apply(self, &proxy, type_url, all))
    }

    fn plan_push(&self, proxy: &Proxy, updates: &[Arc<Updates>]) -> PushPlan {
        proxy_dependencies::plan(self, proxy, updates)
    }
}
