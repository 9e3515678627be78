//! Validation of RequestAuthentication, with the rules of Istio's
//! `ValidateRequestAuthentication` (`validateJwtRule`). Like Istio, several
//! rules with the same issuer are accepted (each becomes a provider).

use std::time::Duration;

use super::super::security::{JwtRule, RequestAuthentication};
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
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        jwt_rule(&format!("spec.jwtRules[{i}]"), rule, e);
    }
}

fn jwt_rule(field: &str, rule: &JwtRule, e: &mut Errors) {
    // Istio requires one of the two: without an issuer any `iss` is
    // accepted, and without a URI the keys are found by OpenID discovery.
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        e.add(
            format!("{field}.issuer"),
            "issuer or jwksUri must be set (the token's iss claim, e.g. https://accounts.example.com)",
        );
    }
    for (i, aud) in rule.audiences.iter().enumerate() {
        if aud.is_empty() {
            e.add(
                format!("{field}.audiences[{i}]"),
                "audience must be a non-empty string (remove the empty entry)",
            );
        }
    }
    if !rule.jwks_uri.is_empty()
        && let Err(msg) = check_jwks_uri(&rule.jwks_uri)
    {
        e.add(format!("{field}.jwksUri"), msg.to_string());
    }
    if !rule.jwks.is_empty()
        && let Err(msg) = crate::jwks::check_jwks(&rule.jwks)
    {
        e.add(
            format!("{field}.jwks"),
            format!("jwks parse error: {msg} (give a JSON Web Key Set: {{\"keys\": [...]}})"),
        );
    }
    for (i, h) in rule.from_headers.iter().enumerate() {
        let hf = format!("{field}.fromHeaders[{i}].name");
        if h.name.is_empty() {
            e.add(
                hf,
                "location header name must be a non-empty string (e.g. Authorization)",
            );
        } else {
            check_header_name(&hf, &h.name, e);
        }
    }
    for (i, p) in rule.from_params.iter().enumerate() {
        if p.is_empty() {
            e.add(
                format!("{field}.fromParams[{i}]"),
                "location query must be a non-empty string (e.g. access_token)",
            );
        }
    }
    for (i, c) in rule.from_cookies.iter().enumerate() {
        if c.is_empty() {
            e.add(
                format!("{field}.fromCookies[{i}]"),
                "cookie name must be a non-empty string",
            );
        }
    }
    if !rule.output_payload_to_header.is_empty() {
        check_header_name(
            &format!("{field}.outputPayloadToHeader"),
            &rule.output_payload_to_header,
            e,
        );
    }
    for (i, c) in rule.output_claim_to_headers.iter().enumerate() {
        let cf = format!("{field}.outputClaimToHeaders[{i}]");
        if c.header.is_empty() || c.claim.is_empty() {
            e.add(
                cf,
                "outputClaimToHeaders header and claim value must be non-empty strings",
            );
        } else {
            check_header_name(&format!("{cf}.header"), &c.header, e);
        }
    }
    if let Some(t) = rule.timeout {
        check_timeout(&format!("{field}.timeout"), t, e);
    }
}

/// Why a `jwksUri` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum JwksUriError {
    /// It does not parse as a URL.
    #[error("{uri:?} is not a URL: {reason} (e.g. https://example.com/jwks.json)")]
    NotUrl {
        /// The URI as written.
        uri: String,
        /// Why it does not parse (the URL parser's words).
        reason: String,
    },
    /// The scheme is neither http nor https.
    #[error("URI scheme {0:?} is not supported (use http:// or https://)")]
    Scheme(String),
    /// There is no host.
    #[error("{0:?} has no host")]
    NoHost(String),
}

/// Istio's `ParseJwksURI`: an http or https URL with a host and, if given,
/// a numeric port.
fn check_jwks_uri(uri: &str) -> Result<(), JwksUriError> {
    let url = reqwest::Url::parse(uri).map_err(|err| JwksUriError::NotUrl {
        uri: uri.to_string(),
        reason: err.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(JwksUriError::Scheme(url.scheme().to_string()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(JwksUriError::NoHost(uri.to_string()));
    }
    Ok(())
}

/// Istio's `ValidateStrictHTTPHeaderName`: RFC 7230 token characters only.
fn check_header_name(field: &str, name: &str, e: &mut Errors) {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if !name.chars().all(token) {
        e.add(
            field,
            format!("header name {name:?} is not a valid header name (letters, digits and !#$%&'*+-.^_`|~ only)"),
        );
    }
}

/// Istio's `ValidateDuration`: at least 1ms, whole milliseconds.
fn check_timeout(field: &str, d: Duration, e: &mut Errors) {
    if d < Duration::from_millis(1) {
        e.add(field, "duration must be greater than 1ms");
    } else if !d.subsec_nanos().is_multiple_of(1_000_000) {
        e.add(field, "only durations to ms precision are supported");
    }
}

#[cfg(test)]
mod tests {
    use crate::model::error::ConfigError;
    use crate::model::parse_file;

    const RA: &str = "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: jwt, namespace: demo}\n";
    const OBJECT: &str = "RequestAuthentication/demo/jwt";

    fn errors(spec: &str) -> Vec<ConfigError> {
        match parse_file("mesh/ra.yaml", &format!("{RA}spec:\n{spec}")) {
            Ok(_) => Vec::new(),
            Err(errors) => errors,
        }
    }

    #[track_caller]
    fn assert_rejected(spec: &str, field: &str, needle: &str) {
        let errors = errors(spec);
        let prefix = format!("mesh/ra.yaml: {OBJECT}: {field}: ");
        assert!(
            errors.iter().any(|e| {
                let s = e.to_string();
                e.field() == Some(field) && s.starts_with(&prefix) && s.contains(needle)
            }),
            "expected {prefix}...{needle}...; got:\n{}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    #[track_caller]
    fn assert_accepted(spec: &str) {
        let errors = errors(spec);
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn issuer_or_jwks_uri_is_required() {
        assert_rejected(
            "  jwtRules: [{audiences: [a]}]",
            "spec.jwtRules[0].issuer",
            "issuer or jwksUri must be set",
        );
        assert_accepted("  jwtRules: [{jwksUri: 'https://example.com/jwks'}]");
        // No keys at all: Istio finds them by OpenID discovery.
        assert_accepted("  jwtRules: [{issuer: 'https://example.com'}]");
    }

    #[test]
    fn audiences_must_be_non_empty() {
        assert_rejected(
            "  jwtRules: [{issuer: i, audiences: [a, '']}]",
            "spec.jwtRules[0].audiences[1]",
            "audience must be a non-empty string",
        );
    }

    #[test]
    fn jwks_uri_must_be_an_http_url() {
        assert_rejected(
            "  jwtRules: [{issuer: i, jwksUri: 'ftp://example.com/keys'}]",
            "spec.jwtRules[0].jwksUri",
            "URI scheme \"ftp\" is not supported",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, jwksUri: 'not a url'}]",
            "spec.jwtRules[0].jwksUri",
            "is not a URL",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, jwksUri: 'https://example.com:99999/keys'}]",
            "spec.jwtRules[0].jwksUri",
            "is not a URL",
        );
        assert_accepted("  jwtRules: [{issuer: i, jwksUri: 'http://198.18.0.1:8000/jwks'}]");
    }

    #[test]
    fn inline_jwks_must_parse() {
        assert_rejected(
            "  jwtRules: [{issuer: i, jwks: 'nope'}]",
            "spec.jwtRules[0].jwks",
            "jwks parse error: not JSON",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, jwks: '{\"keys\": [{\"n\": \"x\"}]}'}]",
            "spec.jwtRules[0].jwks",
            "keys[0] has no \"kty\"",
        );
        // Both given: the inline keys are used, as in Istio.
        assert_accepted(
            "  jwtRules: [{issuer: i, jwksUri: 'https://e.com/k', jwks: '{\"keys\": []}'}]",
        );
    }

    #[test]
    fn token_locations() {
        assert_rejected(
            "  jwtRules: [{issuer: i, fromHeaders: [{prefix: 'Bearer '}]}]",
            "spec.jwtRules[0].fromHeaders[0].name",
            "location header name must be a non-empty string",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, fromHeaders: [{name: 'x jwt'}]}]",
            "spec.jwtRules[0].fromHeaders[0].name",
            "is not a valid header name",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, fromParams: ['']}]",
            "spec.jwtRules[0].fromParams[0]",
            "location query must be a non-empty string",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, fromCookies: ['']}]",
            "spec.jwtRules[0].fromCookies[0]",
            "cookie name must be a non-empty string",
        );
        assert_accepted(
            "  jwtRules: [{issuer: i, fromHeaders: [{name: x-jwt, prefix: 'Token '}], fromParams: [t], fromCookies: [c]}]",
        );
    }

    #[test]
    fn output_headers() {
        assert_rejected(
            "  jwtRules: [{issuer: i, outputClaimToHeaders: [{header: x-sub}]}]",
            "spec.jwtRules[0].outputClaimToHeaders[0]",
            "header and claim value must be non-empty",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, outputClaimToHeaders: [{claim: sub}]}]",
            "spec.jwtRules[0].outputClaimToHeaders[0]",
            "header and claim value must be non-empty",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, outputClaimToHeaders: [{header: ':authority', claim: sub}]}]",
            "spec.jwtRules[0].outputClaimToHeaders[0].header",
            "is not a valid header name",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, outputPayloadToHeader: 'x payload'}]",
            "spec.jwtRules[0].outputPayloadToHeader",
            "is not a valid header name",
        );
        assert_accepted(
            "  jwtRules: [{issuer: i, outputPayloadToHeader: x-payload, outputClaimToHeaders: [{header: x-sub, claim: sub}]}]",
        );
    }

    #[test]
    fn timeout_in_whole_milliseconds() {
        assert_rejected(
            "  jwtRules: [{issuer: i, timeout: 100us}]",
            "spec.jwtRules[0].timeout",
            "greater than 1ms",
        );
        assert_rejected(
            "  jwtRules: [{issuer: i, timeout: 1.5ms}]",
            "spec.jwtRules[0].timeout",
            "ms precision",
        );
        assert_accepted("  jwtRules: [{issuer: i, timeout: 2s}]");
    }

    #[test]
    fn duplicate_issuers_are_accepted_as_in_istio() {
        assert_accepted("  jwtRules: [{issuer: i, jwks: '{\"keys\": []}'}, {issuer: i}]");
    }
}
