//! Every PromQL query of Istio's Grafana dashboards (mesh, service,
//! workload, control plane; vendored in `tests/data/istio-dashboards/`)
//! parses with Prometheus's own parser once Grafana's variables are
//! substituted as Grafana would for the sample mesh (namespace `demo`,
//! `sleep` calling `httpbin`). The parser is `promtool check rules` on a
//! generated rules file holding one recording rule per query: it parses
//! every rule's `expr` and names each rule that does not parse. Nothing is
//! started: no mesh, no Prometheus server.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::json;
use tests::dashboards::{self, Variables};

/// One query ready for the parser: where it comes from and its PromQL.
struct Plain {
    location: String,
    promql: String,
}

/// What a Grafana user looking at `httpbin-v1` in the sample mesh sends.
/// Single-valued variables go in as they are; a multi-value or "All"
/// variable goes in as Grafana's Prometheus data source formats it: one
/// value escaped for a regex (`\\.` in PromQL's string), several as
/// `(a|b)`.
fn substitution() -> Variables {
    [
        // Grafana's built-ins: `$__rate_interval` is at least four scrape
        // intervals (15 s by default).
        ("__rate_interval", "1m"),
        // Service dashboard.
        ("service", "httpbin.demo.svc.cluster.local"),
        ("qrep", "destination"),
        ("srcns", "demo"),
        ("srcwl", "sleep"),
        ("dstcluster", "Kubernetes"),
        ("dstns", "demo"),
        ("dstwl", "(httpbin-v1|httpbin-v2)"),
        // Workload dashboard.
        ("namespace", "demo"),
        ("workload", "httpbin-v1"),
        ("dstsvc", r"httpbin\\.demo\\.svc\\.cluster\\.local"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A failure `promtool` reported for one query.
#[derive(Debug)]
struct Unparsed {
    location: String,
    promql: String,
    message: String,
}

/// Runs `promtool check rules` on one recording rule per query. `Ok` only
/// when promtool succeeds and counts every rule; each query it names is
/// returned with promtool's message. Panics when promtool is missing or
/// fails without naming a query.
fn check_with_promtool(queries: &[Plain]) -> Result<(), Vec<Unparsed>> {
    let name = |i: usize| format!("dashboard_query_{i}");
    let rules: Vec<_> = queries
        .iter()
        .enumerate()
        .map(|(i, q)| json!({"record": name(i), "expr": q.promql}))
        .collect();
    let file = json!({"groups": [{"name": "istio-dashboards", "rules": rules}]});
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dashboards.rules.yml");
    std::fs::write(&path, serde_yaml_ng::to_string(&file).unwrap()).unwrap();

    let output = match Command::new("promtool")
        .args(["check", "rules", "--lint=none"])
        .arg(&path)
        .output()
    {
        Ok(output) => output,
        Err(e) => panic!(
            "cannot run `promtool` ({e}): install Debian's `prometheus` package, \
             which provides it (scripts/setup.sh does)"
        ),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        let expected = format!("SUCCESS: {} rules found", queries.len());
        assert!(
            text.contains(&expected),
            "promtool did not count every query as a rule (expected `{expected}`):\n{text}"
        );
        return Ok(());
    }
    // promtool reports each rule that does not parse on its own line:
    // `<file>: <line>:<col>: group "...", rule N, "<record>": <message>`.
    let mut failures = Vec::new();
    for line in text.lines() {
        for (i, query) in queries.iter().enumerate() {
            let quoted = format!("\"{}\":", name(i));
            if let Some((_, message)) = line.split_once(&quoted) {
                failures.push(Unparsed {
                    location: query.location.clone(),
                    promql: query.promql.clone(),
                    message: message.trim().to_string(),
                });
            }
        }
    }
    assert!(
        !failures.is_empty(),
        "promtool failed ({}) without naming a query:\n{text}",
        output.status
    );
    Err(failures)
}

#[test]
fn every_dashboard_query_parses_with_prometheus_parser() {
    let vars = substitution();
    let mut plain = Vec::new();
    let mut totals = BTreeMap::new();
    let mut unused: BTreeSet<_> = vars.keys().cloned().collect();
    for dashboard in dashboards::load_vendored().unwrap() {
        let panels = dashboard.panel_queries().count();
        let variables = dashboard.queries.len() - panels;
        assert!(
            panels > 0,
            "no panel query found in {} ({})",
            dashboard.file,
            dashboard.title
        );
        let used: Vec<_> = dashboard.variables().unwrap().into_iter().collect();
        for name in &used {
            unused.remove(name);
        }
        println!(
            "{}: {panels} panel queries, {variables} variable queries; variables used: {}",
            dashboard.title,
            used.join(", ")
        );
        totals.insert(dashboard.title.clone(), panels + variables);
        for query in &dashboard.queries {
            plain.push(Plain {
                location: query.location(),
                promql: query.substitute(&vars).unwrap(),
            });
        }
    }
    println!(
        "{} queries in {} dashboards: {totals:?}",
        plain.len(),
        totals.len()
    );
    assert!(
        unused.is_empty(),
        "substitution() gives variables no dashboard uses: {unused:?}"
    );
    if let Err(failures) = check_with_promtool(&plain) {
        let report: Vec<_> = failures
            .iter()
            .map(|f| format!("{}:\n  {}\n  {}", f.location, f.promql, f.message))
            .collect();
        panic!(
            "{} dashboard queries do not parse:\n{}",
            failures.len(),
            report.join("\n")
        );
    }
}

/// The check above can fail: a query promtool cannot parse comes back with
/// its location and the parser's message, beside one that parses.
#[test]
fn promtool_names_a_query_that_does_not_parse() {
    let queries = [
        Plain {
            location: "good".into(),
            promql: r#"sum(rate(istio_requests_total{reporter="destination"}[1m])) by (source_workload)"#
                .into(),
        },
        Plain {
            location: "bad".into(),
            promql: "sum(rate(istio_requests_total[1m]) by (source_workload)".into(),
        },
    ];
    let failures = check_with_promtool(&queries).unwrap_err();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].location, "bad");
    assert!(failures[0].message.contains("parse error"), "{failures:?}");
}
