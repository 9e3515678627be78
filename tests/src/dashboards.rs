//! Istio's Grafana dashboards, vendored in `tests/data/istio-dashboards/`
//! (origin in the README there): reads each dashboard's PromQL, that is
//! every panel target's `expr` and the Prometheus query behind each
//! `query_result(...)` template variable, and turns it into a plain query by
//! substituting Grafana's variables (`$workload`, `${service}`, `[[qrep]]`,
//! `$__rate_interval`, ...) with values a test chooses.
//!
//! Values are inserted verbatim: a test that stands in for a multi-value or
//! "All" selection passes the regular expression Grafana would send (for
//! example `(default|istio-system)`). A variable the test did not give, or a
//! formatted reference (`${name:csv}`), is an error naming the dashboard,
//! the panel and the variable, never left in the query.
//!
//! serde_json's `Value` reads the dashboards: Grafana's schema has changed
//! over its versions (rows, nested panels, targets without `refId`), and only
//! the few fields below matter here.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Grafana variables and the values to put in their place, by name without
/// the `$` (`"workload"`, `"__rate_interval"`).
pub type Variables = BTreeMap<String, String>;

/// The vendored dashboards, by file name, in the order Istio's Grafana
/// sample lists its "istio" folder: mesh, service, workload, control plane.
pub const VENDORED: [&str; 4] = [
    "istio-mesh-dashboard.gen.json",
    "istio-service-dashboard.json",
    "istio-workload-dashboard.json",
    "pilot-dashboard.gen.json",
];

/// Why a dashboard could not be read or a query not be made plain.
#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("reading dashboard {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("dashboard {path} is not JSON: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("dashboard {path} has no string `title`")]
    NoTitle { path: PathBuf },
    #[error("{at}: variable `${name}` has no value; add it to the substitution map")]
    UnknownVariable { at: String, name: String },
    #[error("{at}: `{reference}` asks for Grafana format `{format}`, which is not supported")]
    UnsupportedFormat {
        at: String,
        reference: String,
        format: String,
    },
    #[error("{at}: `{reference}` is not a well-formed Grafana variable reference")]
    Malformed { at: String, reference: String },
}

/// Where in a dashboard a query sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A panel's target; `ref_id` is Grafana's `refId` (`A`, `B`, ...) when set.
    Panel {
        title: String,
        ref_id: Option<String>,
    },
    /// The `query_result(...)` query of a template variable, which fills its
    /// drop-down.
    Variable { name: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Panel {
                title,
                ref_id: Some(r),
            } => write!(f, "panel \"{title}\" target {r}"),
            Origin::Panel {
                title,
                ref_id: None,
            } => write!(f, "panel \"{title}\""),
            Origin::Variable { name } => write!(f, "variable ${name}"),
        }
    }
}

/// One PromQL expression of a dashboard, as written there (with Grafana's
/// variables in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The dashboard's title.
    pub dashboard: String,
    pub origin: Origin,
    /// Grafana's `hide` on the target: computed but not drawn.
    pub hidden: bool,
    pub expr: String,
}

impl Query {
    /// `dashboard "<title>", panel "<title>" target A`: names the query in
    /// a test's failure.
    pub fn location(&self) -> String {
        format!("dashboard \"{}\", {}", self.dashboard, self.origin)
    }

    /// Names of the Grafana variables the expression uses.
    pub fn variables(&self) -> Result<BTreeSet<String>, DashboardError> {
        let mut names = BTreeSet::new();
        scan(&self.expr, &self.location(), |name| {
            names.insert(name.to_string());
            Ok(String::new())
        })?;
        Ok(names)
    }

    /// The expression with every variable replaced by its value in `vars`.
    pub fn substitute(&self, vars: &Variables) -> Result<String, DashboardError> {
        let at = self.location();
        scan(&self.expr, &at, |name| {
            vars.get(name)
                .cloned()
                .ok_or_else(|| DashboardError::UnknownVariable {
                    at: at.clone(),
                    name: name.to_string(),
                })
        })
    }
}

/// One dashboard's queries.
#[derive(Debug, Clone)]
pub struct Dashboard {
    pub file: String,
    pub title: String,
    pub queries: Vec<Query>,
}

impl Dashboard {
    /// Reads and walks one dashboard file.
    pub fn load(path: &Path) -> Result<Dashboard, DashboardError> {
        let text = fs::read_to_string(path).map_err(|source| DashboardError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|source| DashboardError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        Dashboard::from_json(file, &json).ok_or_else(|| DashboardError::NoTitle {
            path: path.to_path_buf(),
        })
    }

    /// Walks a parsed dashboard; `None` when it has no title.
    pub fn from_json(file: String, json: &Value) -> Option<Dashboard> {
        let title = json.get("title")?.as_str()?.to_string();
        let mut queries = Vec::new();
        for panel in array(json, "panels") {
            panel_queries(&title, panel, &mut queries);
        }
        // Grafana's schema before 5.0 put panels in `rows`.
        for row in array(json, "rows") {
            for panel in array(row, "panels") {
                panel_queries(&title, panel, &mut queries);
            }
        }
        let variables = json.get("templating").map(|t| array(t, "list"));
        for variable in variables.into_iter().flatten() {
            variable_query(&title, variable, &mut queries);
        }
        Some(Dashboard {
            file,
            title,
            queries,
        })
    }

    /// The queries of panels (not of template variables).
    pub fn panel_queries(&self) -> impl Iterator<Item = &Query> {
        self.queries
            .iter()
            .filter(|q| matches!(q.origin, Origin::Panel { .. }))
    }

    /// Names of every Grafana variable the dashboard's queries use.
    pub fn variables(&self) -> Result<BTreeSet<String>, DashboardError> {
        let mut all = BTreeSet::new();
        for query in &self.queries {
            all.extend(query.variables()?);
        }
        Ok(all)
    }
}

/// The directory of the vendored dashboards.
pub fn vendored_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/istio-dashboards")
}

/// Reads the four vendored dashboards, in [`VENDORED`]'s order.
pub fn load_vendored() -> Result<Vec<Dashboard>, DashboardError> {
    let dir = vendored_dir();
    VENDORED
        .iter()
        .map(|file| Dashboard::load(&dir.join(file)))
        .collect()
}

fn array<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A panel's targets, then those of the panels nested in it (a collapsed row
/// holds its panels).
fn panel_queries(dashboard: &str, panel: &Value, out: &mut Vec<Query>) {
    let title = panel
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for target in array(panel, "targets") {
        let Some(expr) = target.get("expr").and_then(Value::as_str) else {
            continue;
        };
        if expr.trim().is_empty() {
            continue;
        }
        out.push(Query {
            dashboard: dashboard.to_string(),
            origin: Origin::Panel {
                title: title.to_string(),
                ref_id: target
                    .get("refId")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            },
            hidden: target.get("hide").and_then(Value::as_bool) == Some(true),
            expr: expr.to_string(),
        });
    }
    for nested in array(panel, "panels") {
        panel_queries(dashboard, nested, out);
    }
}

/// A `query` variable whose query is `query_result(<PromQL>)`. Grafana's
/// other variable functions (`label_values`, `metrics`, ...) are not PromQL
/// and are left out; so are `custom` and `datasource` variables.
fn variable_query(dashboard: &str, variable: &Value, out: &mut Vec<Query>) {
    if variable.get("type").and_then(Value::as_str) != Some("query") {
        return;
    }
    let query = match variable.get("query") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Object(o)) => o.get("query").and_then(Value::as_str).unwrap_or_default(),
        _ => return,
    };
    let Some(inner) = query
        .trim()
        .strip_prefix("query_result(")
        .and_then(|rest| rest.strip_suffix(')'))
    else {
        return;
    };
    let name = variable
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    out.push(Query {
        dashboard: dashboard.to_string(),
        origin: Origin::Variable {
            name: name.to_string(),
        },
        hidden: false,
        expr: inner.to_string(),
    });
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn is_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_word)
}

/// Copies `expr`, replacing each Grafana variable reference by what
/// `value(name)` returns. The three syntaxes are Grafana's: `$name`,
/// `${name}` / `${name:format}` and the deprecated `[[name]]` /
/// `[[name:format]]`. A `$` not followed by a name (a regex anchor) is kept.
fn scan(
    expr: &str,
    at: &str,
    mut value: impl FnMut(&str) -> Result<String, DashboardError>,
) -> Result<String, DashboardError> {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(pos) = rest.find(['$', '[']) {
        out.push_str(&rest[..pos]);
        let tail = &rest[pos..];
        let malformed = || DashboardError::Malformed {
            at: at.to_string(),
            reference: tail.chars().take(24).collect(),
        };
        let (reference, body) = if let Some(braced) = tail.strip_prefix("${") {
            let end = braced.find('}').ok_or_else(malformed)?;
            (&tail[..end + 3], &braced[..end])
        } else if let Some((end, body)) = tail
            .strip_prefix("[[")
            .and_then(|b| b.find("]]").map(|end| (end, &b[..end])))
            .filter(|(_, body)| body.split(':').all(is_name) && body.split(':').count() <= 2)
        {
            (&tail[..end + 4], body)
        } else {
            let len = tail[1..].find(|c| !is_word(c)).unwrap_or(tail.len() - 1);
            if tail.starts_with('[') || len == 0 {
                // A range selector's or a regex class's `[`, or a lone `$`
                // (a regex anchor): ordinary text, as for Grafana.
                out.push_str(&tail[..1]);
                rest = &tail[1..];
                continue;
            }
            (&tail[..len + 1], &tail[1..len + 1])
        };
        let (name, format) = match body.split_once(':') {
            Some((name, format)) => (name, Some(format)),
            None => (body, None),
        };
        if !is_name(name) {
            return Err(malformed());
        }
        if let Some(format) = format {
            return Err(DashboardError::UnsupportedFormat {
                at: at.to_string(),
                reference: reference.to_string(),
                format: format.to_string(),
            });
        }
        out.push_str(&value(name)?);
        rest = &tail[reference.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Variables {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn query(expr: &str) -> Query {
        Query {
            dashboard: "D".into(),
            origin: Origin::Panel {
                title: "P".into(),
                ref_id: Some("A".into()),
            },
            hidden: false,
            expr: expr.into(),
        }
    }

    #[test]
    fn substitutes_the_three_syntaxes_and_keeps_regex_anchors() {
        let q = query(
            r#"sum(rate(m{a="$workload",b=~"${srcns}",c="[[qrep]]",d=~"x$"}[$__rate_interval]))"#,
        );
        let v = vars(&[
            ("workload", "httpbin-v1"),
            ("srcns", "(default|other)"),
            ("qrep", "destination"),
            ("__rate_interval", "1m"),
        ]);
        assert_eq!(
            q.substitute(&v).unwrap(),
            r#"sum(rate(m{a="httpbin-v1",b=~"(default|other)",c="destination",d=~"x$"}[1m]))"#
        );
        let names: Vec<_> = q.variables().unwrap().into_iter().collect();
        assert_eq!(names, ["__rate_interval", "qrep", "srcns", "workload"]);
    }

    #[test]
    fn a_missing_variable_is_an_error_naming_the_query() {
        let err = query("m[$__interval]")
            .substitute(&Variables::new())
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("$__interval"), "{text}");
        assert!(
            text.contains("dashboard \"D\", panel \"P\" target A"),
            "{text}"
        );
    }

    #[test]
    fn formats_and_unclosed_references_are_refused() {
        let v = vars(&[("ns", "default")]);
        assert!(matches!(
            query(r#"m{a=~"${ns:regex}"}"#).substitute(&v),
            Err(DashboardError::UnsupportedFormat { ref format, .. }) if format == "regex"
        ));
        assert!(matches!(
            query(r#"m{a="${ns"}"#).substitute(&v),
            Err(DashboardError::Malformed { .. })
        ));
        assert!(matches!(
            query(r#"m{a="${ns.x}"}"#).substitute(&v),
            Err(DashboardError::Malformed { .. })
        ));
        // A POSIX class in a regex is not a `[[name]]` reference.
        assert_eq!(
            query(r#"m{a=~"[[:alpha:]]+"}[5m:1m]"#)
                .substitute(&v)
                .unwrap(),
            r#"m{a=~"[[:alpha:]]+"}[5m:1m]"#
        );
    }

    #[test]
    fn walks_nested_panels_rows_and_query_result_variables() {
        let json = serde_json::json!({
            "title": "T",
            "panels": [
                {"type": "row", "title": "R", "panels": [
                    {"title": "inner", "targets": [{"expr": "up", "refId": "A", "hide": true}]}
                ]},
                {"title": "outer", "targets": [{"expr": "a"}, {"expr": ""}, {"refId": "B"}]}
            ],
            "rows": [{"panels": [{"title": "old", "targets": [{"expr": "b"}]}]}],
            "templating": {"list": [
                {"name": "ds", "type": "datasource", "query": "prometheus"},
                {"name": "ns", "type": "query", "query": "query_result(sum(m) by (ns))"},
                {"name": "obj", "type": "query", "query": {"query": "query_result(c)"}},
                {"name": "lv", "type": "query", "query": "label_values(up, job)"},
                {"name": "qrep", "type": "custom", "query": "source,destination"}
            ]}
        });
        let d = Dashboard::from_json("t.json".into(), &json).unwrap();
        let got: Vec<(String, bool, &str)> = d
            .queries
            .iter()
            .map(|q| (q.origin.to_string(), q.hidden, q.expr.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("panel \"inner\" target A".to_string(), true, "up"),
                ("panel \"outer\"".to_string(), false, "a"),
                ("panel \"old\"".to_string(), false, "b"),
                ("variable $ns".to_string(), false, "sum(m) by (ns)"),
                ("variable $obj".to_string(), false, "c"),
            ]
        );
        assert_eq!(d.panel_queries().count(), 3);
        assert!(Dashboard::from_json("x".into(), &serde_json::json!({})).is_none());
    }

    #[test]
    fn the_vendored_dashboards_have_queries() {
        let dashboards = load_vendored().unwrap();
        let titles: Vec<_> = dashboards.iter().map(|d| d.title.as_str()).collect();
        assert_eq!(
            titles,
            [
                "Istio Mesh Dashboard",
                "Istio Service Dashboard",
                "Istio Workload Dashboard",
                "Istio Control Plane Dashboard",
            ]
        );
        for d in &dashboards {
            assert!(
                d.panel_queries().count() > 0,
                "{} has no panel queries",
                d.file
            );
            assert!(d.variables().unwrap().contains("__rate_interval"));
        }
    }
}
