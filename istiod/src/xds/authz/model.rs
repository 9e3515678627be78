//! One AuthorizationPolicy rule as an Envoy RBAC `Policy` (Istio's
//! `authz/model`): every `from` source becomes one principal and every `to`
//! operation one permission (a request matches if any principal and any
//! permission match); inside each, every attribute present must match
//! (`and`), any of its `values` (`or`) and none of its `notValues` (`not`).
//! `when` conditions are added to every principal or permission, by key.
//!
//! HTTP-only attributes (hosts, methods, paths, request principals,
//! `request.*` conditions) cannot be checked on a TCP chain. As Istio does
//! (its TCP authorization task documents it): in an ALLOW policy the whole
//! rule is dropped (it allows less); in a DENY or AUDIT policy only the
//! attribute is dropped and the rest of the rule stays, so the rule matches
//! more connections and never denies less than asked. The same holds for a
//! value the builder cannot use (validation refuses those first).
//!
//! Request principals (`requestPrincipals`, `request.auth.principal`) are
//! `<iss>/<sub>` in Istio; Envoy's `jwt_authn` filter publishes the claims
//! separately, so a value is split at its last `/` and matched as `iss` and
//! `sub` of the validated payload, as Istio's own generator does now:
//! `*` is any validated token (its `iss` is present), `*<x>` without a `/`
//! is a `sub` ending in `<x>` (any issuer), `*<i>/<s>` an issuer ending in
//! `<i>` and `sub` `<s>`, `<x>*` without a `/` an issuer starting with `<x>`
//! (any subject), `<i>/<s>*` issuer `<i>` and a subject starting with `<s>`.
//! Where this differs from matching the single string `<iss>/<sub>`: a
//! subject containing `/` is split at the wrong place, and a `*` pattern
//! spanning the separator (`*x/y` where `x` lies in the subject) does not
//! match.

use proto::pb::envoy::config::core::v3::TypedExtensionConfig;
use proto::pb::envoy::config::rbac::v3::{
    MetadataSource, Permission, Policy, Principal, SourcedMetadata, permission, principal,
};
use proto::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use proto::pb::envoy::r#type::matcher::v3::{MetadataMatcher, PathMatcher, path_matcher};

use super::matcher as m;
use crate::model::security::Rule;
use crate::model::security::attributes::{Attr, envoy_filter_key, is_path_template, when_attr};
use crate::xds::util::any;

/// Why an attribute could not be generated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenError {
    /// An HTTP-only attribute on a TCP chain.
    #[error("{0:?} is HTTP only")]
    HttpOnly(String),
    /// A value the builder cannot use.
    #[error("{key:?}: invalid value {value:?}")]
    Invalid {
        /// The attribute.
        key: String,
        /// The value.
        value: String,
    },
    /// A `when` key that is not one of Istio's.
    #[error("unknown attribute {0:?}")]
    Unknown(String),
}

fn invalid(key: &str, value: &str) -> GenError {
    GenError::Invalid {
        key: key.to_string(),
        value: value.to_string(),
    }
}

fn perm(rule: permission::Rule) -> Permission {
    Permission { rule: Some(rule) }
}

fn princ(id: principal::Identifier) -> Principal {
    Principal {
        identifier: Some(id),
    }
}

fn authenticated(sm: proto::pb::envoy::r#type::matcher::v3::StringMatcher) -> Principal {
    princ(principal::Identifier::Authenticated(
        principal::Authenticated {
            principal_name: Some(sm),
        },
    ))
}

fn sourced(mm: MetadataMatcher) -> SourcedMetadata {
    SourcedMetadata {
        metadata_matcher: Some(mm),
        metadata_source: MetadataSource::Dynamic as i32,
    }
}

fn meta_principal(mm: MetadataMatcher) -> Principal {
    princ(principal::Identifier::SourcedMetadata(sourced(mm)))
}

fn and_principals(ids: Vec<Principal>) -> Principal {
    princ(principal::Identifier::AndIds(principal::Set { ids }))
}

/// One value of a per-value permission attribute.
fn permission_value(attr: &Attr, key: &str, v: &str) -> Result<Permission, GenError> {
    Ok(match attr {
        Attr::DestIp => perm(permission::Rule::DestinationIp(
            m::cidr(v).ok_or_else(|| invalid(key, v))?,
        )),
        Attr::DestPort => perm(permission::Rule::DestinationPort(
            v.parse::<u16>().map_err(|_| invalid(key, v))?.into(),
        )),
        Attr::Sni => perm(permission::Rule::RequestedServerName(m::string(v))),
        Attr::Host => perm(permission::Rule::Header(m::host(":authority", v))),
        Attr::Method => perm(permission::Rule::Header(m::header(":method", v))),
        Attr::Path if is_path_template(v) => {
            // Istio's `{*}`/`{**}` are Envoy's uri_template `*`/`**`.
            let template = v.replace("{**}", "**").replace("{*}", "*");
            perm(permission::Rule::UriTemplate(TypedExtensionConfig {
                name: "envoy.path.match.uri_template.uri_template_matcher".into(),
                typed_config: Some(any(&UriTemplateMatchConfig {
                    path_template: template,
                })),
            }))
        }
        Attr::Path => perm(permission::Rule::UrlPath(PathMatcher {
            rule: Some(path_matcher::Rule::Path(m::string(v))),
        })),
        _ => unreachable!("a principal attribute reached permission_value"),
    })
}

/// One value of a per-value principal attribute.
fn principal_value(attr: &Attr, key: &str, v: &str, ns: &str) -> Result<Principal, GenError> {
    Ok(match attr {
        Attr::SrcIp => princ(principal::Identifier::DirectRemoteIp(
            m::cidr(v).ok_or_else(|| invalid(key, v))?,
        )),
        Attr::RemoteIp => princ(principal::Identifier::RemoteIp(
            m::cidr(v).ok_or_else(|| invalid(key, v))?,
        )),
        Attr::SrcNamespace => {
            authenticated(m::regex(&format!(".*/ns/{}/.*", v.replace('*', ".*"))))
        }
        Attr::SrcServiceAccount => {
            // `<ns>/<sa>`, or `<sa>` in the policy's namespace; any trust
            // domain, extra path segments allowed as in Istio's regex.
            let (sa_ns, sa) = v.split_once('/').unwrap_or((ns, v));
            authenticated(m::regex(&format!(
                "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                regex::escape(sa_ns),
                regex::escape(sa)
            )))
        }
        Attr::SrcPrincipal => authenticated(m::string_with_prefix(v, "spiffe://", false)),
        Attr::RequestHeader(h) => princ(principal::Identifier::Header(m::header(h, v))),
        _ => unreachable!("a permission or aggregate attribute reached principal_value"),
    })
}

/// `<iss>/<sub>` as matchers of the payload's `iss` and `sub` (see the
/// module comment).
fn request_principal(v: &str) -> Principal {
    let any = || m::value_present();
    let s = |sm| m::value_string(sm);
    let (iss, sub) = match v.rfind('/') {
        Some(i) => (&v[..i], Some(&v[i + 1..])),
        None => (v, None),
    };
    let (mi, ms) = if v == "*" {
        (any(), None)
    } else if let Some(rest) = v.strip_prefix('*') {
        match sub {
            Some(sub) => {
                let mi = if iss == "*" { any() } else { s(m::string(iss)) };
                (mi, Some(s(m::exact(sub, false))))
            }
            None => (any(), Some(s(m::string(&format!("*{rest}"))))),
        }
    } else if v.ends_with('*') {
        match sub {
            Some(sub) => {
                let ms = if sub == "*" { any() } else { s(m::string(sub)) };
                (s(m::exact(iss, false)), Some(ms))
            }
            None => (s(m::string(v)), None),
        }
    } else {
        (
            s(m::exact(iss, false)),
            Some(s(m::exact(sub.unwrap_or_default(), false))),
        )
    };
    let mut ids = vec![meta_principal(m::jwt_claim(&["iss"], mi))];
    if let Some(ms) = ms {
        ids.push(meta_principal(m::jwt_claim(&["sub"], ms)));
    }
    and_principals(ids)
}

/// An attribute over several values at once (metadata matchers).
fn aggregate_principal(attr: &Attr, values: &[String]) -> Option<Principal> {
    Some(match attr {
        Attr::RequestPrincipal => {
            let mut or: Vec<Principal> = values.iter().map(|v| request_principal(v)).collect();
            if or.len() == 1 {
                or.remove(0)
            } else {
                princ(principal::Identifier::OrIds(principal::Set { ids: or }))
            }
        }
        Attr::Audiences => meta_principal(m::jwt_claim(&["aud"], m::value_string_or_list(values))),
        Attr::Presenter => meta_principal(m::jwt_claim(&["azp"], m::value_string_or_list(values))),
        Attr::Claims(path) => {
            let path: Vec<&str> = path.iter().map(String::as_str).collect();
            meta_principal(m::jwt_claim(&path, m::value_string_or_list(values)))
        }
        _ => return None,
    })
}

/// `experimental.envoy.filters.*`: a `[v]` value matches a list containing
/// `v`, any other a string.
fn envoy_filter_permission(key: &str, values: &[String]) -> Result<Permission, GenError> {
    let (filter, path) = envoy_filter_key(key).ok_or_else(|| GenError::Unknown(key.into()))?;
    let ms = values
        .iter()
        .map(
            |v| match v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                Some(inner) => m::value_list_one_of(m::value_string(m::string(inner))),
                None => m::value_string(m::string(v)),
            },
        )
        .collect();
    Ok(perm(permission::Rule::SourcedMetadata(sourced(
        m::metadata(&filter, &[path.as_str()], m::value_or(ms)),
    ))))
}

/// One attribute with its values and notValues.
struct Entry<'a> {
    key: &'a str,
    attr: Attr,
    values: &'a [String],
    not_values: &'a [String],
}

/// How the builder generates: on a TCP chain or not, and for which action.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// A TCP chain: HTTP-only attributes cannot be matched.
    pub tcp: bool,
    /// An ALLOW policy (drop a rule it cannot generate) rather than DENY,
    /// AUDIT or CUSTOM (drop the attribute, keeping the rule wider).
    pub allow: bool,
}

/// The matchers of one entry's values (`or`) and notValues (`not or`); an
/// error drops the rule in ALLOW mode, the entry otherwise.
fn generate<T>(
    e: &Entry<'_>,
    mode: Mode,
    one: impl Fn(&str) -> Result<T, GenError>,
    aggregate: impl Fn(&[String]) -> Result<Option<T>, GenError>,
    or: impl Fn(Vec<T>) -> T,
    not: impl Fn(T) -> T,
) -> Result<Vec<T>, GenError> {
    let check = |r: Result<Vec<T>, GenError>| match r {
        Ok(v) => Ok(v),
        Err(err) if mode.allow => Err(err),
        Err(err) => {
            tracing::debug!(%err, "authorization attribute ignored in a rule that denies or audits");
            Ok(Vec::new())
        }
    };
    if mode.tcp && e.attr.http_only() {
        return check(Err(GenError::HttpOnly(e.key.to_string())));
    }
    let side = |vals: &[String]| -> Result<Option<T>, GenError> {
        if vals.is_empty() {
            return Ok(None);
        }
        if let Some(t) = aggregate(vals)? {
            return Ok(Some(t));
        }
        Ok(Some(or(vals
            .iter()
            .map(|v| one(v))
            .collect::<Result<_, _>>()?)))
    };
    let mut out = Vec::new();
    out.extend(check(side(e.values).map(|t| t.into_iter().collect()))?);
    out.extend(check(
        side(e.not_values).map(|t| t.into_iter().map(&not).collect()),
    )?);
    Ok(out)
}

fn permission_and(e: &[Entry<'_>], mode: Mode) -> Result<Permission, GenError> {
    let mut rules = Vec::new();
    for e in e {
        rules.extend(generate(
            e,
            mode,
            |v| permission_value(&e.attr, e.key, v),
            |vals| match &e.attr {
                Attr::EnvoyFilter(k) => envoy_filter_permission(k, vals).map(Some),
                _ => Ok(None),
            },
            |rules| perm(permission::Rule::OrRules(permission::Set { rules })),
            |p| perm(permission::Rule::NotRule(Box::new(p))),
        )?);
    }
    if rules.is_empty() {
        rules.push(perm(permission::Rule::Any(true)));
    }
    Ok(perm(permission::Rule::AndRules(permission::Set { rules })))
}

fn principal_and(e: &[Entry<'_>], mode: Mode, ns: &str) -> Result<Principal, GenError> {
    let mut ids = Vec::new();
    for e in e {
        ids.extend(generate(
            e,
            mode,
            |v| principal_value(&e.attr, e.key, v, ns),
            |vals| Ok(aggregate_principal(&e.attr, vals)),
            |ids| princ(principal::Identifier::OrIds(principal::Set { ids })),
            |p| princ(principal::Identifier::NotId(Box::new(p))),
        )?);
    }
    if ids.is_empty() {
        ids.push(princ(principal::Identifier::Any(true)));
    }
    Ok(and_principals(ids))
}

fn entry<'a>(
    key: &'a str,
    attr: Attr,
    values: &'a [String],
    not_values: &'a [String],
) -> Option<Entry<'a>> {
    (!values.is_empty() || !not_values.is_empty()).then_some(Entry {
        key,
        attr,
        values,
        not_values,
    })
}

/// The RBAC policy of one rule of a policy in namespace `ns`.
pub fn rule_policy(rule: &Rule, ns: &str, mode: Mode) -> Result<Policy, GenError> {
    let mut base_perm = Vec::new();
    let mut base_princ = Vec::new();
    for c in &rule.when {
        let attr = when_attr(&c.key).ok_or_else(|| GenError::Unknown(c.key.clone()))?;
        let target = if attr.is_permission() {
            &mut base_perm
        } else {
            &mut base_princ
        };
        target.extend(entry(&c.key, attr, &c.values, &c.not_values));
    }

    let mut principals = Vec::new();
    for from in &rule.from {
        let mut list = Vec::new();
        if let Some(s) = &from.source {
            list.extend(entry(
                "principals",
                Attr::SrcPrincipal,
                &s.principals,
                &s.not_principals,
            ));
            list.extend(entry(
                "requestPrincipals",
                Attr::RequestPrincipal,
                &s.request_principals,
                &s.not_request_principals,
            ));
            list.extend(entry(
                "serviceAccounts",
                Attr::SrcServiceAccount,
                &s.service_accounts,
                &s.not_service_accounts,
            ));
            list.extend(entry(
                "namespaces",
                Attr::SrcNamespace,
                &s.namespaces,
                &s.not_namespaces,
            ));
            list.extend(entry(
                "remoteIpBlocks",
                Attr::RemoteIp,
                &s.remote_ip_blocks,
                &s.not_remote_ip_blocks,
            ));
            list.extend(entry(
                "ipBlocks",
                Attr::SrcIp,
                &s.ip_blocks,
                &s.not_ip_blocks,
            ));
        }
        list.extend(base_princ.iter().map(|e| Entry {
            attr: e.attr.clone(),
            ..*e
        }));
        principals.push(principal_and(&list, mode, ns)?);
    }
    if rule.from.is_empty() {
        principals.push(principal_and(&base_princ, mode, ns)?);
    }

    let mut permissions = Vec::new();
    for to in &rule.to {
        let mut list = Vec::new();
        if let Some(o) = &to.operation {
            list.extend(entry("hosts", Attr::Host, &o.hosts, &o.not_hosts));
            list.extend(entry("methods", Attr::Method, &o.methods, &o.not_methods));
            list.extend(entry("paths", Attr::Path, &o.paths, &o.not_paths));
            list.extend(entry("ports", Attr::DestPort, &o.ports, &o.not_ports));
        }
        list.extend(base_perm.iter().map(|e| Entry {
            attr: e.attr.clone(),
            ..*e
        }));
        permissions.push(permission_and(&list, mode)?);
    }
    if rule.to.is_empty() {
        permissions.push(permission_and(&base_perm, mode)?);
    }

    Ok(Policy {
        permissions,
        principals,
        ..Default::default()
    })
}
