//! Test fixtures shared by the pure modules' unit tests.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::v1::ObjectKey;
use serde_json::{Value, json};

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

pub fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey {
        namespace: ns.into(),
        name: name.into(),
    }
}
