//! Test fixtures shared by the pure modules' unit tests (and, with the
//! `testing` feature, by those of the crates built on the core).

use argocd_pull_apis::argocd::{Application, ProjectDestination, ProjectSpec};
use argocd_pull_apis::keys;
use serde_json::{Value, json};

use crate::route::decide::World;

/// A pull-model hub Application `team/guestbook` for cluster `c1`, with
/// `extra` merged in.
pub fn app(extra: Value) -> Application {
    let mut v = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {
            "name": "guestbook", "namespace": "team", "uid": "u-1", "resourceVersion": "7",
            "labels": { keys::PULL_LABEL: "true" },
            "annotations": { keys::MANAGED_CLUSTER: "c1" },
        },
        "spec": { "project": "default", "destination": { "namespace": "gb" } }
    });
    merge(&mut v, extra);
    serde_json::from_value(v).unwrap()
}

pub fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// A world of fixed facts.
pub struct Fixed {
    pub addon: bool,
    pub clusters: &'static [&'static str],
    pub decided: &'static [&'static str],
}

impl World for Fixed {
    fn addon_enabled(&self, _: &str) -> bool {
        self.addon
    }
    fn cluster_exists(&self, c: &str) -> bool {
        self.clusters.contains(&c)
    }
    fn decided_in(&self, _: &str) -> Vec<String> {
        self.decided.iter().map(|s| s.to_string()).collect()
    }
    fn project(&self, name: &str) -> Option<ProjectSpec> {
        // Any project but `missing` exists, open to everything.
        (name != "missing").then(|| ProjectSpec {
            source_namespaces: vec!["*".into()],
            destinations: vec![ProjectDestination {
                server: "*".into(),
                name: "*".into(),
                namespace: "*".into(),
            }],
            source_repos: vec!["*".into()],
        })
    }
}
