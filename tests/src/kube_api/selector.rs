//! Label and field selectors as the API parses them from `labelSelector` and
//! `fieldSelector`. Hand-written: the grammar is Kubernetes' own
//! (`k8s.io/apimachinery/pkg/labels`), and no crate outside kube-rs's
//! client-side builders parses it.

use std::collections::BTreeSet;

use serde_json::Value;

/// A selector that cannot be parsed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SelectorError {
    /// A requirement the grammar does not allow.
    #[error("unable to parse requirement: {0:?}")]
    Requirement(String),
    /// A field the resource cannot be selected by.
    #[error("field label not supported: {0}")]
    Field(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(s: &str) -> Option<BTreeSet<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(s: &str) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let bad = || SelectorError::Requirement(part.to_string());
            let req = if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, set)) = part.split_once(" notin ") {
                Requirement::NotIn(k.trim().to_string(), parse_set(set).ok_or_else(bad)?)
            } else if let Some((k, set)) = part.split_once(" in ") {
                Requirement::In(k.trim().to_string(), parse_set(set).ok_or_else(bad)?)
            } else {
                Requirement::Exists(part.to_string())
            };
            let key = match &req {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Builds a selector from a `meta/v1` `LabelSelector` object
    /// (`matchLabels` and `matchExpressions` with `In`, `NotIn`, `Exists`,
    /// `DoesNotExist`), as webhooks' `namespaceSelector` and `objectSelector`
    /// are written. Absent or `{}` selects everything.
    pub fn from_object(sel: &Value) -> Result<LabelSelector, SelectorError> {
        let mut reqs = Vec::new();
        let bad = |what: &Value| SelectorError::Requirement(what.to_string());
        if let Some(labels) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in labels {
                let v = v.as_str().ok_or_else(|| bad(v))?;
                reqs.push(Requirement::Equals(k.clone(), v.to_string()));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            let key = e.get("key").and_then(Value::as_str).ok_or_else(|| bad(e))?;
            let values: BTreeSet<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            let key = key.to_string();
            reqs.push(match e.get("operator").and_then(Value::as_str) {
                Some("In") if !values.is_empty() => Requirement::In(key, values),
                Some("NotIn") if !values.is_empty() => Requirement::NotIn(key, values),
                Some("Exists") if values.is_empty() => Requirement::Exists(key),
                Some("DoesNotExist") if values.is_empty() => Requirement::NotExists(key),
                _ => return Err(bad(e)),
            });
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether it has no requirement (selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `obj`'s `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value`,
/// comma-separated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses `s`, allowing `metadata.name`, `metadata.namespace` and `extra`.
    pub fn parse(s: &str, extra: &[&str]) -> Result<FieldSelector, SelectorError> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(SelectorError::Requirement(part.to_string()));
            };
            let field = field.trim();
            if !["metadata.name", "metadata.namespace"].contains(&field) && !extra.contains(&field)
            {
                return Err(SelectorError::Field(field.to_string()));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether `obj`'s fields satisfy every requirement (a missing field is
    /// the empty string, as the API's field sets have it).
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let ptr = format!("/{}", field.replace('.', "/"));
            let actual = match obj.pointer(&ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                _ => String::new(),
            };
            (actual == *value) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_requirements() {
        let o = obj(json!({"app": "web", "version": "v1"}));
        let yes = [
            "",
            "app=web",
            "app==web",
            "app!=db",
            "missing!=x",
            "app in (web, db)",
            "version notin (v2)",
            "missing notin (v2)",
            "app",
            "!missing",
            "app=web,version in (v1,v2),!missing",
        ];
        for s in yes {
            assert!(
                LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "app in (db)",
            "missing in (x)",
            "version notin (v1)",
            "missing",
            "!app",
            "app=web,version=v2",
        ];
        for s in no {
            assert!(
                !LabelSelector::parse(s).unwrap().matches(&o),
                "{s} should not match"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn label_selector_objects() {
        let o = obj(json!({"app": "web", "version": "v1"}));
        let sel = |v: Value| LabelSelector::from_object(&v).unwrap().matches(&o);
        assert!(sel(json!({})));
        assert!(sel(json!({"matchLabels": {"app": "web"}})));
        assert!(!sel(json!({"matchLabels": {"app": "db"}})));
        assert!(sel(json!({"matchExpressions": [
            {"key": "version", "operator": "In", "values": ["v1", "v2"]},
            {"key": "tier", "operator": "DoesNotExist"},
            {"key": "app", "operator": "Exists"},
            {"key": "missing", "operator": "NotIn", "values": ["x"]},
        ]})));
        assert!(!sel(
            json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]})
        ));
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]})
            )
            .is_err()
        );
        assert!(
            LabelSelector::from_object(
                &json!({"matchExpressions": [{"key": "a", "operator": "In"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn field_requirements() {
        let o = obj(json!({}));
        let pods = &["spec.nodeName"];
        let sel = |s| FieldSelector::parse(s, pods).unwrap();
        assert!(sel("metadata.name=a,metadata.namespace==ns").matches(&o));
        assert!(sel("metadata.name!=b").matches(&o));
        assert!(sel("spec.nodeName=n1").matches(&o));
        assert!(!sel("metadata.name=b").matches(&o));
        assert_eq!(
            FieldSelector::parse("spec.foo=x", pods),
            Err(SelectorError::Field("spec.foo".into()))
        );
    }
}
