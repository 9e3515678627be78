//! Validation of ProxyConfig, with the rules of Istio's
//! `ValidateProxyConfig`: the selector's labels and a concurrency that is
//! not negative; plus names of environment variables a container accepts
//! and the image types Istio's images are tagged with.

use super::super::proxy_config::ProxyConfig;
use super::{Errors, check_policy_selector};

/// The variants Istio publishes its proxy image in.
const IMAGE_TYPES: [&str; 3] = ["default", "debug", "distroless"];

pub(super) fn proxy_config(pc: &ProxyConfig, e: &mut Errors) {
    if let Some(sel) = &pc.selector {
        check_policy_selector("spec.selector", sel, e);
    }
    if let Some(c) = pc.concurrency
        && c < 0
    {
        e.add(
            "spec.concurrency",
            format!("{c} must be greater than or equal to 0 (0 means one worker per core)"),
        );
    }
    for name in pc.environment_variables.keys() {
        if name.is_empty() || name.contains('=') {
            e.add(
                "spec.environmentVariables",
                format!("{name:?} is not an environment variable name (use a name without '=')"),
            );
        }
    }
    if let Some(image) = &pc.image
        && !image.image_type.is_empty()
        && !IMAGE_TYPES.contains(&image.image_type.as_str())
    {
        e.add(
            "spec.image.imageType",
            format!(
                "{:?} is not an image type (use one of {})",
                image.image_type,
                IMAGE_TYPES.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const PC: &str = "apiVersion: networking.istio.io/v1beta1\nkind: ProxyConfig\nmetadata: {name: p, namespace: demo}\n";

    #[test]
    fn accepts_istio_fields() {
        let errs = errors(
            "pc.yaml",
            PC,
            "{selector: {matchLabels: {app: a}}, concurrency: 0, environmentVariables: {A: b}, image: {imageType: distroless}}",
        );
        assert!(errs.is_empty(), "{errs:#?}");
    }

    #[test]
    fn refuses_bad_values_and_unknown_fields() {
        refused(
            &errors("pc.yaml", PC, "{concurrency: -1}"),
            "spec.concurrency",
            "greater than or equal to 0",
        );
        refused(
            &errors("pc.yaml", PC, "{image: {imageType: slim}}"),
            "spec.image.imageType",
            "distroless",
        );
        refused(
            &errors("pc.yaml", PC, "{selector: {matchLabels: {'': a}}}"),
            "spec.selector.matchLabels",
            "cannot be empty",
        );
        refused(
            &errors("pc.yaml", PC, "{proxyMetadata: {A: b}}"),
            "spec.proxyMetadata",
            "unknown field",
        );
    }
}
