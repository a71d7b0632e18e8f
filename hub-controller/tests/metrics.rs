//! What a running hub-controller exports, against what docs/operations.md
//! lists (name, labels, per-cluster or not) and what the chart's dashboard
//! and alerts query: a series exported and not listed, listed and not
//! exported, or queried and not exported fails here. The hub runs first
//! with the defaults (every series fleet-level: no `cluster` label
//! anywhere), then with `--metrics-per-cluster`.

mod common;
mod grpc_env;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use argocd_pull_apis::keys;

use grpc_env::{Env, TIMEOUT};
use kube::api::PostParams;
use serde_json::{Value, json};
use testenv::paths::{bin_dir, workspace_dir};
use testenv::wait;

/// One row of a metrics table in docs/operations.md.
#[derive(Debug)]
struct Row {
    name: String,
    labels: BTreeSet<String>,
    /// Exported only with `--metrics-per-cluster`.
    per_cluster_only: bool,
    /// Gains a `cluster` label with `--metrics-per-cluster`.
    gains_cluster: bool,
}

/// The rows of the table under `### {heading}` in the Metrics section.
fn documented(heading: &str) -> Vec<Row> {
    let doc = std::fs::read_to_string(workspace_dir().join("docs/operations.md")).unwrap();
    let section = doc
        .split("\n## Metrics\n")
        .nth(1)
        .expect("docs/operations.md has a Metrics section");
    let section = section.split("\n## ").next().unwrap();
    let table = section
        .split(&format!("\n### {heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("no ### {heading} under Metrics"));
    let table = table.split("\n### ").next().unwrap();
    table
        .lines()
        .filter(|l| l.starts_with("| `argocd_pull_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let labels = cells[3];
            Row {
                name: cells[1].trim_matches('`').to_string(),
                labels: labels
                    .replace("(+ cluster)", "")
                    .replace("(cluster)", "")
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                per_cluster_only: cells[4].contains("`--metrics-per-cluster` only"),
                gains_cluster: labels.contains("cluster)"),
            }
        })
        .collect()
}

/// Families in an OpenMetrics text (counters with `_total`, as the docs
/// name them) with the label names their samples carry.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut types = BTreeMap::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        }
    }
    let family = |sample: &str| -> String {
        for (suffix, kind) in [
            ("_total", "counter"),
            ("_bucket", "histogram"),
            ("_sum", "histogram"),
            ("_count", "histogram"),
        ] {
            if let Some(base) = sample.strip_suffix(suffix)
                && types.get(base).map(String::as_str) == Some(kind)
            {
                return if kind == "counter" {
                    sample.to_string()
                } else {
                    base.to_string()
                };
            }
        }
        sample.to_string()
    };
    let mut out: BTreeMap<String, BTreeSet<String>> = types
        .iter()
        .map(|(name, kind)| {
            let name = if kind == "counter" {
                format!("{name}_total")
            } else {
                name.clone()
            };
            (name, BTreeSet::new())
        })
        .collect();
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let end = l.find(['{', ' ']).unwrap_or(l.len());
        let labels = out.entry(family(&l[..end])).or_default();
        if let Some(inner) = l[end..].strip_prefix('{') {
            let inner = &inner[..inner.rfind('}').unwrap()];
            for pair in split_labels(inner) {
                labels.insert(pair.split('=').next().unwrap().to_string());
            }
        }
    }
    out
}

/// `a="x",b="y, z"` into its pairs (values may hold commas).
fn split_labels(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut quoted) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < s.len() {
        out.push(&s[start..]);
    }
    out
}

/// Every name a sample of `text` may be queried by: the sample names, and
/// for each family its histogram series and counter name.
fn queryable(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{s}"));
                    }
                }
                _ => {
                    names.insert(name.to_string());
                }
            }
        } else if !l.starts_with('#') && !l.is_empty() {
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            names.insert(l[..end].to_string());
        }
    }
    names
}

/// The metric names a PromQL expression reads: identifiers followed by a
/// selector (`{`) or a range (`[`), and any of ours.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        // Skip strings (label values) and Grafana variables.
        if c == '"' || c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != c {
                i += 1;
            }
            i += 1;
            continue;
        }
        if c == '$' {
            i += 1;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let next = chars.get(j).copied();
            // A label matcher's name is followed by `=`, `!=`, `=~`, `!~`.
            let in_matcher = matches!(next, Some('=' | '!'));
            if !in_matcher && (word.starts_with("argocd_pull_") || matches!(next, Some('{' | '[')))
            {
                names.insert(word);
            }
            continue;
        }
        i += 1;
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(argocd_pull_hub_grpc_delivery_seconds_bucket[$__rate_interval])))"#
        ),
        BTreeSet::from(["argocd_pull_hub_grpc_delivery_seconds_bucket".to_string()])
    );
    assert_eq!(
        metric_names(
            r#"max(argocd_pull_hub_queue_depth) > 1000 or up{job="x", argocd_pull_fake="y"} and foo[5m]"#
        ),
        BTreeSet::from([
            "argocd_pull_hub_queue_depth".to_string(),
            "up".to_string(),
            "foo".to_string()
        ])
    );
}

/// The chart's dashboard and alert rules, rendered by Helm with both on:
/// (where, expression).
fn chart_queries() -> Vec<(String, String)> {
    let out = Command::new(bin_dir().join("helm"))
        .args([
            "template",
            "argocd-pull",
            workspace_dir()
                .join("deploy/helm/argocd-pull")
                .to_str()
                .unwrap(),
            "--set",
            "metrics.dashboard.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
        ])
        .output()
        .expect("helm (run make tools)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut queries = Vec::new();
    for doc in text.split("\n---") {
        let Some(o) = serde_yaml::from_str::<Option<Value>>(doc).unwrap() else {
            continue;
        };
        match o["kind"].as_str() {
            Some("PrometheusRule") => {
                for g in o["spec"]["groups"].as_array().unwrap() {
                    for r in g["rules"].as_array().unwrap() {
                        queries.push((
                            format!("alert {}", r["alert"].as_str().unwrap()),
                            r["expr"].as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
            Some("ConfigMap") if o["metadata"]["name"] == "argocd-pull-dashboard" => {
                let dashboard: Value =
                    serde_json::from_str(o["data"]["argocd-pull.json"].as_str().unwrap()).unwrap();
                for p in dashboard["panels"].as_array().unwrap() {
                    for t in p["targets"].as_array().into_iter().flatten() {
                        queries.push((
                            format!("panel {}", p["title"].as_str().unwrap()),
                            t["expr"].as_str().unwrap().to_string(),
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    assert!(
        queries.iter().any(|(w, _)| w.starts_with("alert"))
            && queries.iter().any(|(w, _)| w.starts_with("panel")),
        "the chart rendered no dashboard or no alerts"
    );
    queries
}

/// Compares one scrape with the hub's rows; `per_cluster` says how the hub runs.
fn check_hub(text: &str, per_cluster: bool) {
    let rows = documented("hub-controller");
    let got = exported(text);
    let wanted: BTreeSet<&str> = rows
        .iter()
        .filter(|r| per_cluster || !r.per_cluster_only)
        .map(|r| r.name.as_str())
        .collect();
    let have: BTreeSet<&str> = got.keys().map(String::as_str).collect();
    let undocumented: Vec<_> = have.difference(&wanted).collect();
    let missing: Vec<_> = wanted.difference(&have).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "per_cluster={per_cluster}: exported and not in docs/operations.md: {undocumented:?}; \
         in docs/operations.md and not exported: {missing:?}"
    );
    for r in rows.iter().filter(|r| per_cluster || !r.per_cluster_only) {
        let seen = &got[&r.name];
        if seen.is_empty() {
            continue;
        }
        let mut expected = r.labels.clone();
        if per_cluster && r.gains_cluster {
            expected.insert("cluster".into());
        }
        assert_eq!(
            seen, &expected,
            "labels of {} (per_cluster={per_cluster})",
            r.name
        );
        if !per_cluster {
            assert!(!seen.contains("cluster"), "{} has a cluster label", r.name);
        }
    }
}

/// Two Applications refused, one by each transport: their namespace has
/// no Placement that lets it target cluster1.
async fn refuse_two(env: &Env, suffix: &str) {
    env.hub.ensure_namespace("outsiders").await.unwrap();
    let outsiders = common::apps_api(&env.hub_client, "outsiders");
    for (name, transport) in [("refused-grpc", "grpc"), ("refused-work", "manifestwork")] {
        let annotations = json!({
            keys::MANAGED_CLUSTER: "cluster1",
            keys::MANAGED_CLUSTER_APP_NAMESPACE: grpc_env::SPOKE_NS,
            keys::TRANSPORT: transport,
        });
        let app = common::app(
            &format!("{name}-{suffix}"),
            "outsiders",
            annotations,
            json!({}),
        );
        outsiders
            .create(&PostParams::default(), &app)
            .await
            .unwrap();
    }
}

/// The hub's /metrics once `ready` holds for them, `what`.
async fn metrics_when(env: &Env, what: &str, ready: impl Fn(&str) -> bool) -> String {
    wait::until(what, TIMEOUT, || async {
        let text = env.hub_process.as_ref().unwrap().metrics().await;
        if ready(&text) { Ok(text) } else { Err(text) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_the_dashboard_and_the_alerts_name_what_a_running_hub_exports() {
    let mut env = Env::new(&["cluster1"]).await;
    let defaults = env
        .spawn_hub(
            env.grpc_addr,
            &["--leader-elect=false"],
            &[("ARGOCD_PULL_METRICS_PER_CLUSTER", "false")],
        )
        .await;
    env.hub_process = Some(defaults);
    env.connect_agent(0).await;
    env.create("app", 0, json!({})).await;
    let expected = BTreeMap::from([("app".to_string(), 0)]);
    wait::until("app delivered and its status on the hub", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;
    // Labelled counters appear with their first sample: one refusal by
    // each transport.
    refuse_two(&env, "1").await;
    // The acknowledgement that completes a delivery, and the refusals,
    // counted.
    let text = metrics_when(&env, "a delivery and two refusals counted", |text| {
        grpc_env::series::value(text, "argocd_pull_hub_grpc_delivery_seconds_count") >= 1.0
            && grpc_env::series::value(text, "argocd_pull_hub_grpc_agents_connected") == 1.0
            && text.contains("argocd_pull_hub_grpc_refused_total{reason=\"NotAuthorized\"}")
            && text.contains("argocd_pull_hub_applications_refused_total{reason=\"NotAuthorized\"}")
    })
    .await;
    check_hub(&text, false);
    println!(
        "default /metrics with one agent: {} bytes, {} series",
        text.len(),
        text.lines().filter(|l| !l.starts_with('#')).count()
    );

    let names = queryable(&text);
    let mut unknown = Vec::new();
    for (place, expr) in chart_queries() {
        for name in metric_names(&expr) {
            if !names.contains(&name) {
                unknown.push(format!("{place}: {name} in {expr}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "the chart queries series the hub does not export:\n{}",
        unknown.join("\n")
    );

    // The agent's list, against the registry its /metrics serves.
    // A labelled family is exported from its first sample: one each.
    let (registry, agent, api) = argocd_pull_spoke_agent::registry();
    agent.message("in", "upsert");
    agent.use_wire("websocket");
    agent.dial_failed("grpc");
    agent
        .applies
        .get_or_create(&argocd_pull_spoke_agent::metrics::OutcomeLabel { outcome: "applied" })
        .inc();
    api.requests
        .get_or_create(&argocd_pull_runtime::client::RequestLabels {
            verb: "patch".into(),
            resource: "applications".into(),
            code: "200".into(),
        })
        .inc();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let rows = documented("spoke-agent");
    let got = exported(&text);
    let wanted: BTreeSet<&String> = rows.iter().map(|r| &r.name).collect();
    assert_eq!(
        got.keys().collect::<BTreeSet<_>>(),
        wanted,
        "the spoke-agent's metrics and docs/operations.md"
    );
    for r in &rows {
        assert_eq!(got[&r.name], r.labels, "labels of {}", r.name);
    }

    // With --metrics-per-cluster: the per-cluster series too.
    env.kill_hub().await;
    let per_cluster = env
        .spawn_hub(env.grpc_addr, &["--leader-elect=false"], &[])
        .await;
    env.hub_process = Some(per_cluster);
    refuse_two(&env, "2").await;
    let text = metrics_when(&env, "cluster1's agent back, per cluster", |text| {
        text.contains("argocd_pull_hub_grpc_agent_connected{cluster=\"cluster1\"} 1")
            && text.contains("argocd_pull_hub_grpc_messages_total{cluster=\"cluster1\"")
            && text.contains(
                "argocd_pull_hub_grpc_refused_total{cluster=\"cluster1\",reason=\"NotAuthorized\"}",
            )
            && text.contains("argocd_pull_hub_applications_refused_total{reason=\"NotAuthorized\"}")
    })
    .await;
    check_hub(&text, true);
}
