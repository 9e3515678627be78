//! Validation of the Ingresses that name Istio's class outright
//! (`kubernetes.io/ingress.class: istio` or `ingressClassName: istio`):
//! what Istio's ingress controller skips is refused here, naming the field,
//! so that it is not ignored without a word. Ingresses of other classes are
//! another controller's, and are not checked.

use std::collections::BTreeMap;

use super::super::ingress::{Ingress, IngressBackend};
use super::Errors;

pub(super) fn ingress(i: &Ingress, annotations: &BTreeMap<String, String>, e: &mut Errors) {
    if !i.names_istio_class(annotations) {
        return;
    }
    if i.spec.default_backend.is_some() {
        e.add(
            "spec.defaultBackend",
            "is not routed by Istio's ingress controller (it would take every host's unmatched requests); route it with a rule whose path is / instead",
        );
    }
    for (r, rule) in i.spec.rules.iter().enumerate() {
        let Some(http) = &rule.http else { continue };
        for (p, path) in http.paths.iter().enumerate() {
            backend(
                &format!("spec.rules[{r}].http.paths[{p}].backend"),
                &path.backend,
                e,
            );
        }
    }
}

fn backend(field: &str, b: &IngressBackend, e: &mut Errors) {
    if b.resource.is_some() {
        e.add(
            format!("{field}.resource"),
            "is not routed by Istio's ingress controller (use a service backend)",
        );
    }
    match &b.service {
        None if b.resource.is_none() => e.add(
            format!("{field}.service"),
            "is required (name the Service and its port)",
        ),
        Some(s) if s.port.number.is_none() && s.port.name.is_empty() => {
            e.add(format!("{field}.service.port"), "needs a number or a name")
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{errors, refused};

    const ING: &str =
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: i, namespace: demo}\n";

    #[test]
    fn refuses_what_istio_skips_on_its_own_class() {
        let errs = errors(
            "i.yaml",
            ING,
            "{ingressClassName: istio, defaultBackend: {service: {name: a, port: {number: 80}}}, rules: [{http: {paths: [{path: /, pathType: Prefix, backend: {resource: {kind: Bucket, name: b}}}, {path: /x, pathType: Prefix, backend: {service: {name: a, port: {}}}}]}}]}",
        );
        refused(&errs, "spec.defaultBackend", "not routed");
        refused(
            &errs,
            "spec.rules[0].http.paths[0].backend.resource",
            "use a service backend",
        );
        refused(
            &errs,
            "spec.rules[0].http.paths[1].backend.service.port",
            "number or a name",
        );
    }

    #[test]
    fn leaves_other_classes_alone() {
        let errs = errors(
            "i.yaml",
            ING,
            "{ingressClassName: nginx, defaultBackend: {service: {name: a, port: {number: 80}}}}",
        );
        assert!(errs.is_empty(), "{errs:#?}");
    }
}
