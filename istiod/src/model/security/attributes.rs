//! The attributes of an AuthorizationPolicy rule (Istio's
//! `pkg/config/security`): which `when` keys exist and what each matches,
//! the `{*}`/`{**}` path templates, and IPs and CIDRs as Istio reads them.
//! Validation refuses what the RBAC generator could not build from them;
//! both read this one definition.

use std::net::IpAddr;

/// An attribute of an authorization rule: a `from`/`to` field or a `when`
/// key, by what it matches. Permissions match the request or connection,
/// principals its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attr {
    // Permissions.
    /// `destination.ip`: the destination address.
    DestIp,
    /// `destination.port`, `ports`: the destination port.
    DestPort,
    /// `connection.sni`: the TLS server name.
    Sni,
    /// `experimental.envoy.filters.*[...]`: a filter's dynamic metadata.
    EnvoyFilter(String),
    /// `hosts`: the `:authority`.
    Host,
    /// `paths`: the request path.
    Path,
    /// `methods`: the request method.
    Method,
    // Principals.
    /// `source.ip`, `ipBlocks`: the peer's address.
    SrcIp,
    /// `remote.ip`, `remoteIpBlocks`: the original client address.
    RemoteIp,
    /// `source.namespace`, `namespaces`: the peer's namespace.
    SrcNamespace,
    /// `source.serviceAccount`, `serviceAccounts`: the peer's service account.
    SrcServiceAccount,
    /// `source.principal`, `principals`: the peer's SPIFFE identity.
    SrcPrincipal,
    /// `request.auth.principal`, `requestPrincipals`: the JWT's `iss/sub`.
    RequestPrincipal,
    /// `request.auth.audiences`: the JWT's `aud`.
    Audiences,
    /// `request.auth.presenter`: the JWT's `azp`.
    Presenter,
    /// `request.headers[name]`: a request header.
    RequestHeader(String),
    /// `request.auth.claims[a][b]`: a (nested) JWT claim.
    Claims(Vec<String>),
}

impl Attr {
    /// Whether only an HTTP chain can check it (a TCP chain cannot).
    pub fn http_only(&self) -> bool {
        matches!(
            self,
            Attr::Host
                | Attr::Path
                | Attr::Method
                | Attr::RequestPrincipal
                | Attr::Audiences
                | Attr::Presenter
                | Attr::RequestHeader(_)
                | Attr::Claims(_)
        )
    }

    /// Whether it matches the request or connection (a permission) rather
    /// than its source (a principal).
    pub fn is_permission(&self) -> bool {
        matches!(
            self,
            Attr::DestIp
                | Attr::DestPort
                | Attr::Sni
                | Attr::EnvoyFilter(_)
                | Attr::Host
                | Attr::Path
                | Attr::Method
        )
    }
}

/// The name in brackets after `prefix` (`request.headers[x]` -> `x`).
fn bracketed(key: &str, prefix: &str) -> Option<String> {
    let name = key
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    (!name.is_empty() && !name.contains(['[', ']'])).then(|| name.to_string())
}

/// Nested bracketed names (`request.auth.claims[a][b]` -> `[a, b]`).
fn nested(key: &str, prefix: &str) -> Option<Vec<String>> {
    let rest = key
        .strip_prefix(prefix)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    let parts: Vec<String> = rest.split("][").map(str::to_string).collect();
    parts
        .iter()
        .all(|p| !p.is_empty() && !p.contains(['[', ']']))
        .then_some(parts)
}

/// Istio's `when` keys.
pub fn when_attr(key: &str) -> Option<Attr> {
    let attr = match key {
        "destination.ip" => Attr::DestIp,
        "destination.port" => Attr::DestPort,
        "connection.sni" => Attr::Sni,
        "source.ip" => Attr::SrcIp,
        "remote.ip" => Attr::RemoteIp,
        "source.namespace" => Attr::SrcNamespace,
        "source.serviceAccount" => Attr::SrcServiceAccount,
        "source.principal" => Attr::SrcPrincipal,
        "request.auth.principal" => Attr::RequestPrincipal,
        "request.auth.audiences" => Attr::Audiences,
        "request.auth.presenter" => Attr::Presenter,
        k if k.starts_with("experimental.envoy.filters.") => Attr::EnvoyFilter(k.to_string()),
        k => {
            if let Some(h) = bracketed(k, "request.headers") {
                Attr::RequestHeader(h)
            } else if let Some(c) = nested(k, "request.auth.claims") {
                Attr::Claims(c)
            } else {
                return None;
            }
        }
    };
    Some(attr)
}

/// Whether `key` is one of Istio's `when` keys (for validation).
pub fn known_when_key(key: &str) -> bool {
    when_attr(key).is_some_and(|a| match a {
        Attr::EnvoyFilter(k) => envoy_filter_key(&k).is_some(),
        _ => true,
    })
}

/// `experimental.envoy.filters.a.b[c]` -> (`envoy.filters.a.b`, `c`).
pub fn envoy_filter_key(key: &str) -> Option<(String, String)> {
    let rest = key.strip_prefix("experimental.")?.strip_suffix(']')?;
    let (filter, path) = rest.split_once('[')?;
    (!path.is_empty() && filter.len() > "envoy.filters.".len())
        .then(|| (filter.to_string(), path.to_string()))
}

/// Whether `v` uses Istio's `{*}`/`{**}` path templates.
pub fn is_path_template(v: &str) -> bool {
    v.contains("{*}") || v.contains("{**}")
}

/// An IP or CIDR (`10.0.0.1`, `10.0.0.0/16`, `::1`) as its address and
/// prefix length; a bare address is a full-length prefix.
pub fn parse_cidr(v: &str) -> Option<(IpAddr, u32)> {
    let (addr, len) = match v.split_once('/') {
        Some((a, l)) => (a, Some(l.parse::<u32>().ok()?)),
        None => (v, None),
    };
    let ip: IpAddr = addr.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = len.unwrap_or(max);
    (len <= max).then_some((ip, len))
}
