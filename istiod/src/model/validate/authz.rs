//! Validation of AuthorizationPolicy, with the rules of Istio's
//! `ValidateAuthorizationPolicy`, and the policy scope both request-level
//! security kinds share.

use super::super::security::{AuthorizationPolicy, PolicyTargetReference};
use super::{Errors, check_policy_selector};

/// Shared by both kinds: `selector` and `targetRef(s)` are exclusive, and a
/// target reference attaches a policy to a gateway or waypoint, which this
/// istiod does not serve: refused rather than accepted and never applied.
pub(super) fn scope(
    selector: bool,
    target_ref: Option<&PolicyTargetReference>,
    target_refs: &[PolicyTargetReference],
    e: &mut Errors,
) {
    if selector && (target_ref.is_some() || !target_refs.is_empty()) {
        e.add(
            "spec.targetRef",
            "selector and targetRef(s) are mutually exclusive (keep one of them)",
        );
    }
    if target_ref.is_some() {
        e.add(
            "spec.targetRef",
            "attaches the policy to a gateway or waypoint, which this istiod does not serve; sidecars are chosen with spec.selector",
        );
    }
    if !target_refs.is_empty() {
        e.add(
            "spec.targetRefs",
            "attach the policy to gateways or waypoints, which this istiod does not serve; sidecars are chosen with spec.selector",
        );
    }
}

pub(super) fn authorization_policy(ap: &AuthorizationPolicy, e: &mut Errors) {
    if let Some(sel) = &ap.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    scope(
        ap.selector.is_some(),
        ap.target_ref.as_ref(),
        &ap.target_refs,
        e,
    );
}
