//! The parts of a VirtualService HTTP route besides its destinations, as
//! Istio's route translation applies them: `redirect` (Envoy's
//! `RedirectAction`), `directResponse` (`DirectResponseAction`), `headers`
//! (set overwrites, add appends, remove drops), `corsPolicy` (the CORS
//! filter's per-route `CorsPolicy`) and `mirror`/`mirrors` percentages.

use proto::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, RuntimeFractionalPercent, data_source,
    header_value_option::HeaderAppendAction,
};
use proto::pb::envoy::config::route::v3::{DirectResponseAction, RedirectAction, redirect_action};
use proto::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCors;
use proto::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use proto::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent};
use proto::pb::google::protobuf::BoolValue;

use crate::model::istio::{
    CorsPolicy, HeaderOperations, Headers, HttpDirectResponse, HttpRedirect, Percent, StringMatch,
};

/// The name of Envoy's CORS filter, the key of its per-route config.
pub const CORS_FILTER: &str = "envoy.filters.http.cors";

/// A float percentage as Envoy's fraction, in millionths as Istio sends it.
pub fn percent(v: f64) -> FractionalPercent {
    FractionalPercent {
        numerator: (v.clamp(0.0, 100.0) * 10_000.0).round() as u32,
        denominator: fractional_percent::DenominatorType::Million.into(),
    }
}

/// `redirect`: path, authority, scheme and port replaced, with the status
/// code (301 unless given). `FROM_REQUEST_PORT` is the port the route
/// serves (Envoy cannot derive it; routes are built per port, as in Istio);
/// `FROM_PROTOCOL_DEFAULT` and no port leave the port out of the location.
pub fn redirect(r: &HttpRedirect, listener_port: u16) -> RedirectAction {
    use redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier};
    let response_code = match r.redirect_code.unwrap_or(301) {
        302 => RedirectResponseCode::Found,
        303 => RedirectResponseCode::SeeOther,
        307 => RedirectResponseCode::TemporaryRedirect,
        308 => RedirectResponseCode::PermanentRedirect,
        // Validation admits only 301, 302, 303, 307 and 308.
        _ => RedirectResponseCode::MovedPermanently,
    };
    let port_redirect = match (r.port, r.derive_port.as_str()) {
        (Some(p), _) => p,
        (None, "FROM_REQUEST_PORT") => u32::from(listener_port),
        _ => 0,
    };
    RedirectAction {
        host_redirect: r.authority.clone(),
        port_redirect,
        response_code: response_code.into(),
        scheme_rewrite_specifier: (!r.scheme.is_empty())
            .then(|| SchemeRewriteSpecifier::SchemeRedirect(r.scheme.clone())),
        path_rewrite_specifier: if !r.uri.is_empty() {
            Some(PathRewriteSpecifier::PathRedirect(r.uri.clone()))
        } else {
            (!r.prefix_rewrite.is_empty())
                .then(|| PathRewriteSpecifier::PrefixRewrite(r.prefix_rewrite.clone()))
        },
        ..Default::default()
    }
}

/// `directResponse`: the status and the body, text or decoded bytes.
pub fn direct_response(d: &HttpDirectResponse) -> DirectResponseAction {
    use base64::Engine as _;
    let body = d.body.as_ref().and_then(|b| {
        let specifier = if let Some(s) = &b.string {
            data_source::Specifier::InlineString(s.clone())
        } else {
            // Validation refuses bytes that are not base64.
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b.bytes.as_deref()?)
                .ok()?;
            data_source::Specifier::InlineBytes(bytes)
        };
        Some(DataSource {
            specifier: Some(specifier),
            ..Default::default()
        })
    });
    DirectResponseAction {
        status: d.status,
        body,
        ..Default::default()
    }
}

/// Envoy's header lists for one side of a `headers` block.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct HeaderLists {
    /// Request headers to set and add.
    pub request_add: Vec<HeaderValueOption>,
    /// Request headers to remove.
    pub request_remove: Vec<String>,
    /// Response headers to set and add.
    pub response_add: Vec<HeaderValueOption>,
    /// Response headers to remove.
    pub response_remove: Vec<String>,
}

impl HeaderLists {
    /// Appends `other`'s operations after these (a destination's after the
    /// route's, so that its `set` wins, as in Istio).
    pub fn extend(&mut self, other: HeaderLists) {
        self.request_add.extend(other.request_add);
        self.request_remove.extend(other.request_remove);
        self.response_add.extend(other.response_add);
        self.response_remove.extend(other.response_remove);
    }
}

fn header_option(name: &str, value: &str, action: HeaderAppendAction) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.to_string(),
            value: value.to_string(),
            ..Default::default()
        }),
        append_action: action.into(),
        ..Default::default()
    }
}

fn side(ops: Option<&HeaderOperations>) -> (Vec<HeaderValueOption>, Vec<String>) {
    let Some(ops) = ops else {
        return Default::default();
    };
    let set = ops
        .set
        .iter()
        .map(|(k, v)| header_option(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd));
    let add = ops
        .add
        .iter()
        .map(|(k, v)| header_option(k, v, HeaderAppendAction::AppendIfExistsOrAdd));
    (set.chain(add).collect(), ops.remove.clone())
}

/// `headers`: `set` as `OVERWRITE_IF_EXISTS_OR_ADD`, `add` as
/// `APPEND_IF_EXISTS_OR_ADD` (each sorted by name, set first, as Istio
/// orders them), `remove` as the lists of headers to remove.
pub fn header_lists(h: Option<&Headers>) -> HeaderLists {
    let Some(h) = h else {
        return HeaderLists::default();
    };
    let (request_add, request_remove) = side(h.request.as_ref());
    let (response_add, response_remove) = side(h.response.as_ref());
    HeaderLists {
        request_add,
        request_remove,
        response_add,
        response_remove,
    }
}

/// `corsPolicy` as the CORS filter's per-route policy (Istio's
/// `TranslateCORSPolicy`): origins as string matchers, the lists
/// comma-joined, `maxAge` in whole seconds, the filter enabled for every
/// request, and preflights that match no origin forwarded upstream unless
/// `unmatchedPreflights: IGNORE`.
pub fn cors(c: &CorsPolicy) -> EnvoyCors {
    let joined = |v: &[String]| v.join(",");
    EnvoyCors {
        allow_origin_string_match: c
            .allow_origins
            .iter()
            .filter_map(|m| string_matcher(m, false))
            .collect(),
        allow_methods: joined(&c.allow_methods),
        allow_headers: joined(&c.allow_headers),
        expose_headers: joined(&c.expose_headers),
        max_age: c
            .max_age
            .map(|d| d.as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|value| BoolValue { value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator: 100,
                denominator: fractional_percent::DenominatorType::Hundred.into(),
            }),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(BoolValue {
            value: c.unmatched_preflights != "IGNORE",
        }),
        ..Default::default()
    }
}

/// A mirror's share: the percentage given (none when it is 0, as Istio
/// drops such a mirror), else all requests.
pub fn mirror_fraction(p: Option<&Percent>) -> Option<RuntimeFractionalPercent> {
    let default_value = match p {
        Some(p) if p.value <= 0.0 => return None,
        Some(p) => percent(p.value),
        None => FractionalPercent {
            numerator: 100,
            denominator: fractional_percent::DenominatorType::Hundred.into(),
        },
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(default_value),
        ..Default::default()
    })
}

/// An Istio `StringMatch` as Envoy's matcher (`None` when empty).
pub(super) fn string_matcher(m: &StringMatch, ignore_case: bool) -> Option<StringMatcher> {
    let pattern = if let Some(e) = &m.exact {
        string_matcher::MatchPattern::Exact(e.clone())
    } else if let Some(p) = &m.prefix {
        string_matcher::MatchPattern::Prefix(p.clone())
    } else if let Some(r) = &m.regex {
        string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: r.clone(),
            ..Default::default()
        })
    } else {
        return None;
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case,
    })
}
