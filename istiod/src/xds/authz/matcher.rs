//! Envoy matchers with Istio's value syntax (Istio's `authz/matcher`): a
//! value is exact, or has one `*` as a prefix (suffix match), as a suffix
//! (prefix match), or is `*` alone (presence: any non-empty value).

use proto::pb::envoy::config::core::v3::CidrRange;
use proto::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use proto::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, RegexMatcher, StringMatcher, ValueMatcher,
    list_matcher, metadata_matcher, string_matcher::MatchPattern, value_matcher,
};

use crate::model::security::attributes::parse_cidr;
use crate::xds::util::u32v;

/// The `jwt_authn` filter's metadata namespace, where the request
/// authentication filter writes each validated token's payload under
/// [`JWT_PAYLOAD_KEY`] (the contract with `xds/authn`).
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
/// The key of the validated token's payload in [`JWT_FILTER`]'s metadata.
pub const JWT_PAYLOAD_KEY: &str = "payload";

fn sm(pattern: MatchPattern, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        ignore_case,
        match_pattern: Some(pattern),
    }
}

/// A regex string matcher (Envoy's default RE2 engine).
pub fn regex(r: &str) -> StringMatcher {
    sm(
        MatchPattern::SafeRegex(RegexMatcher {
            regex: r.to_string(),
            ..Default::default()
        }),
        false,
    )
}

/// Exact string match.
pub fn exact(v: &str, ignore_case: bool) -> StringMatcher {
    sm(MatchPattern::Exact(v.to_string()), ignore_case)
}

/// Istio's `StringMatcherWithPrefix`: the value's `*` syntax, with `prefix`
/// (e.g. `spiffe://`) in front of what is matched.
pub fn string_with_prefix(v: &str, prefix: &str, ignore_case: bool) -> StringMatcher {
    if v == "*" {
        return regex(".+");
    }
    if let Some(rest) = v.strip_prefix('*') {
        if prefix.is_empty() {
            return sm(MatchPattern::Suffix(rest.to_string()), ignore_case);
        }
        return regex(&format!(
            "{}.*{}",
            regex::escape(prefix),
            regex::escape(rest)
        ));
    }
    if let Some(rest) = v.strip_suffix('*') {
        return sm(MatchPattern::Prefix(format!("{prefix}{rest}")), ignore_case);
    }
    sm(MatchPattern::Exact(format!("{prefix}{v}")), ignore_case)
}

/// Istio's `StringMatcher`: the `*` syntax, case-sensitive.
pub fn string(v: &str) -> StringMatcher {
    string_with_prefix(v, "", false)
}

/// Istio's `HeaderMatcher`: `*` is presence, else the `*` syntax.
pub fn header(name: &str, v: &str) -> HeaderMatcher {
    let spec = if v == "*" {
        header_matcher::HeaderMatchSpecifier::PresentMatch(true)
    } else {
        header_matcher::HeaderMatchSpecifier::StringMatch(string(v))
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(spec),
        ..Default::default()
    }
}

/// Istio's `HostMatcher`: like [`header`], case-insensitive.
pub fn host(name: &str, v: &str) -> HeaderMatcher {
    let spec = if v == "*" {
        header_matcher::HeaderMatchSpecifier::PresentMatch(true)
    } else {
        header_matcher::HeaderMatchSpecifier::StringMatch(string_with_prefix(v, "", true))
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(spec),
        ..Default::default()
    }
}

/// An IP (a host route) or CIDR as Envoy's `CidrRange`.
pub fn cidr(v: &str) -> Option<CidrRange> {
    let (ip, len) = parse_cidr(v)?;
    Some(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: Some(u32v(len)),
    })
}

/// A value matcher of a string.
pub fn value_string(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

/// A value matcher of presence.
pub fn value_present() -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::PresentMatch(true)),
    }
}

/// Any of the matchers (one alone is itself).
pub fn value_or(mut ms: Vec<ValueMatcher>) -> ValueMatcher {
    if ms.len() == 1 {
        return ms.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: ms,
        })),
    }
}

/// A list value one of whose elements matches `m`.
pub fn value_list_one_of(m: ValueMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(m))),
            },
        ))),
    }
}

/// A string claim equal to one of `values`, or a list claim containing one
/// (a JWT claim such as `aud` may be either).
pub fn value_string_or_list(values: &[String]) -> ValueMatcher {
    let strings: Vec<ValueMatcher> = values.iter().map(|v| value_string(string(v))).collect();
    let any = value_or(strings);
    value_or(vec![any.clone(), value_list_one_of(any)])
}

/// A metadata matcher of `filter`'s dynamic metadata at `path`.
pub fn metadata(filter: &str, path: &[&str], value: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_string(),
        path: path
            .iter()
            .map(|k| metadata_matcher::PathSegment {
                segment: Some(metadata_matcher::path_segment::Segment::Key(k.to_string())),
            })
            .collect(),
        value: Some(value),
        invert: false,
    }
}

/// A matcher of the validated JWT's claim at `claim_path` (under
/// [`JWT_PAYLOAD_KEY`]).
pub fn jwt_claim(claim_path: &[&str], value: ValueMatcher) -> MetadataMatcher {
    let mut path = vec![JWT_PAYLOAD_KEY];
    path.extend_from_slice(claim_path);
    metadata(JWT_FILTER, &path, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_syntax() {
        assert_eq!(string("*"), regex(".+"));
        assert_eq!(
            string("*.com"),
            sm(MatchPattern::Suffix(".com".into()), false)
        );
        assert_eq!(string("/a*"), sm(MatchPattern::Prefix("/a".into()), false));
        assert_eq!(
            string_with_prefix("*/sa/x", "spiffe://", false),
            regex(r"spiffe://.*/sa/x")
        );
        assert_eq!(
            string_with_prefix("td/ns/a/*", "spiffe://", false),
            sm(MatchPattern::Prefix("spiffe://td/ns/a/".into()), false)
        );
    }

    #[test]
    fn cidrs() {
        let c = cidr("10.0.0.1").unwrap();
        assert_eq!(
            (c.address_prefix.as_str(), c.prefix_len.unwrap().value),
            ("10.0.0.1", 32)
        );
        assert_eq!(cidr("10.0.0.0/8").unwrap().prefix_len.unwrap().value, 8);
        assert_eq!(cidr("::1").unwrap().prefix_len.unwrap().value, 128);
        assert!(cidr("10.0.0.0/33").is_none());
        assert!(cidr("nope").is_none());
    }
}
