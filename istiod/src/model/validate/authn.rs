//! Validation of RequestAuthentication, with the rules of Istio's
//! `ValidateRequestAuthentication`.

use super::super::security::RequestAuthentication;
use super::authz::scope;
use super::{Errors, check_policy_selector};

pub(super) fn request_authentication(ra: &RequestAuthentication, e: &mut Errors) {
    if let Some(sel) = &ra.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    scope(
        ra.selector.is_some(),
        ra.target_ref.as_ref(),
        &ra.target_refs,
        e,
    );
}
