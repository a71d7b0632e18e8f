//! The resource tree of a pulled Application as the hub's argocd-server
//! reads it: built from what the hub copy's status already carries
//! (`status.resources`, the managed resources with their sync and health,
//! which both transports bring back), under the keys of Argo CD's cache.
//!
//! argocd-server answers the tree (`argocd app resources`, the API's
//! `resource-tree`, the UI's live updates) from Redis only, where the
//! application-controller that computed it left it. No controller
//! reconciles a dormant hub copy, so without this the key is missing:
//! argocd-server asks for a refresh on every view and answers with an
//! error. The hub-controller writes what this module builds
//! (`hub-controller/src/status/tree.rs`).
//!
//! The tree from the status has the managed resources only (no children
//! such as ReplicaSets and Pods: those are in the cluster's Redis, not in
//! the status), each with its health. An agent with the `trees` capability
//! reports the whole tree its cluster's Argo CD cached, and the managed
//! resources with their live and desired states (for the diff): the agent
//! takes the Secrets' values out first ([`redact_managed_resources`]), the
//! hub keeps the fields argocd-server shows ([`reported_tree`],
//! [`reported_managed_resources`]) under [`managed_resources_key`].

use serde_json::{Map, Value, json};

/// Argo CD's `common.CacheVersion` (v3.5.7): the suffix of every key of
/// its cache. A hub on another Argo CD release with another version would
/// not find the keys (it says "cache: key is missing", as today).
pub const CACHE_VERSION: &str = "1.8.3";

/// The name Argo CD keeps an Application's state under: its name in the
/// control-plane namespace, `<namespace>_<name>` in any other
/// (`Application.InstanceName`).
pub fn instance_name(namespace: &str, name: &str, argocd_namespace: &str) -> String {
    if namespace.is_empty() || namespace == argocd_namespace {
        name.to_string()
    } else {
        format!("{namespace}_{name}")
    }
}

/// The Redis key of the tree of Application `instance`; `gzip` as
/// argocd-server's `--redis-compress` (default `gzip`) adds `.gz`.
pub fn tree_key(instance: &str, gzip: bool) -> String {
    let key = format!("app|resources-tree|{instance}|{CACHE_VERSION}");
    if gzip { key + ".gz" } else { key }
}

/// The Redis key of the managed resources (target and live state of each,
/// what the diff and `argocd app manifests --source live` show) of
/// Application `instance`.
pub fn managed_resources_key(instance: &str, gzip: bool) -> String {
    let key = tree_channel(instance);
    if gzip { key + ".gz" } else { key }
}

/// The channel argocd-server subscribes to for changes of the tree of
/// `instance` (`OnAppResourcesTreeChanged`: the managed-resources key,
/// never with `.gz`).
pub fn tree_channel(instance: &str) -> String {
    format!("app|managed-resources|{instance}|{CACHE_VERSION}")
}

/// The `ApplicationTree` (Argo CD's JSON field names) of an Application
/// whose status is `status`: one node per entry of `status.resources`,
/// with its health. `None` when the status lists no resources (the key
/// stays missing: nothing is known, which is not an empty tree).
pub fn tree(status: Option<&Value>) -> Option<Value> {
    let resources = status?.get("resources")?.as_array()?;
    let nodes: Vec<Value> = resources.iter().filter_map(node).collect();
    Some(json!({ "nodes": nodes }))
}

/// A `ResourceNode` from one `ResourceStatus`; `None` without a kind or
/// name (not a resource Argo CD could draw).
///
/// Only the fields named below are taken, and never a `uid`: argocd-server
/// serves a node's live manifest, its pods' logs and its actions only for
/// nodes with a uid, from the cluster the hub copy's destination names,
/// with the hub's credentials for it. A hub copy's destination is often the
/// hub itself (`https://kubernetes.default.svc`, as upstream's examples
/// write it), and the names here come from the cluster's report: with a
/// uid, a cluster could make the hub's UI show any hub object of a kind
/// and name it chooses. Nor a uid of our own, even for a copy aimed at the
/// live endpoint: Argo CD's Application has no status subresource, so
/// whoever may update the hub copy (a tenant) writes these names too, and
/// argocd-server would read them on the cluster, where the agent serves
/// every pulled Application's objects, another tenant's included. The
/// live views come from the trees the agents report (docs/ui.md,
/// deliverable 2).
fn node(resource: &Value) -> Option<Value> {
    let text = |field: &str| resource.get(field).and_then(Value::as_str);
    text("kind").filter(|k| !k.is_empty())?;
    text("name").filter(|n| !n.is_empty())?;
    let mut node = Map::new();
    for field in ["group", "version", "kind", "namespace", "name"] {
        if let Some(v) = text(field).filter(|v| !v.is_empty()) {
            node.insert(field.into(), v.into());
        }
    }
    if let Some(health) = resource.get("health").and_then(Value::as_object) {
        let mut h = Map::new();
        for field in ["status", "message"] {
            if let Some(v) = health.get(field).and_then(Value::as_str) {
                h.insert(field.into(), v.into());
            }
        }
        if !h.is_empty() {
            node.insert("health".into(), h.into());
        }
    }
    Some(node.into())
}

/// The fields of a reported `ResourceNode` the hub keeps: what the tree
/// draws (with health, images, info and networking), never a `uid`.
pub const NODE_FIELDS: &[&str] = &[
    "group",
    "version",
    "kind",
    "namespace",
    "name",
    "resourceVersion",
    "health",
    "info",
    "networkingInfo",
    "images",
    "createdAt",
];

/// The most nodes kept of one reported tree.
pub const MAX_NODES: usize = 10_000;

/// Hub side: the `ApplicationTree` an agent reported (its cluster's Argo CD
/// cached it), as the hub's argocd-server gets it: its `nodes`, each with
/// the fields of [`NODE_FIELDS`] and its `parentRefs` (group, kind,
/// namespace, name), so the UI draws the children under their owners.
///
/// Left out: every `uid` unless `uids` (a node's uid is what opens
/// argocd-server's live views of it, which must never open on the hub's
/// own objects: `uids` only when the copy's destination is the cluster's
/// own Secret on the live endpoint,
/// [`crate::live::opens_live_views`]); the orphaned
/// resources and the cluster's hosts (about the cluster, not the
/// Application: they would show a tenant what else runs there); nodes
/// beyond [`MAX_NODES`].
pub fn reported_tree(json: &[u8], uids: bool) -> Result<Value, String> {
    let tree: Value =
        serde_json::from_slice(json).map_err(|e| format!("the tree is not JSON: {e}"))?;
    let nodes = match tree.get("nodes") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(nodes)) => nodes,
        Some(_) => return Err("the tree's nodes are not a list".into()),
    };
    let nodes: Vec<Value> = nodes
        .iter()
        .filter_map(|n| reported_node(n, uids))
        .take(MAX_NODES)
        .collect();
    Ok(json!({ "nodes": nodes }))
}

fn reported_node(node: &Value, uids: bool) -> Option<Value> {
    let node = node.as_object()?;
    let text = |field: &str| node.get(field).and_then(Value::as_str);
    text("kind").filter(|k| !k.is_empty())?;
    text("name").filter(|n| !n.is_empty())?;
    let mut kept: Map<String, Value> = NODE_FIELDS
        .iter()
        .filter_map(|f| Some((f.to_string(), node.get(*f)?.clone())))
        .collect();
    if let Some(parents) = node.get("parentRefs").and_then(Value::as_array) {
        let parents: Vec<Value> = parents
            .iter()
            .filter_map(|p| {
                let p = p.as_object()?;
                let refs: Map<String, Value> = ["group", "kind", "namespace", "name", "uid"]
                    .iter()
                    .filter(|f| uids || **f != "uid")
                    .filter_map(|f| Some((f.to_string(), p.get(*f)?.clone())))
                    .collect();
                Some(Value::Object(refs))
            })
            .collect();
        kept.insert("parentRefs".into(), parents.into());
    }
    if uids && let Some(uid) = node.get("uid").filter(|u| u.is_string()) {
        kept.insert("uid".into(), uid.clone());
    }
    Some(kept.into())
}

/// The fields of a reported `ResourceDiff` the hub keeps.
pub const DIFF_FIELDS: &[&str] = &[
    "group",
    "kind",
    "namespace",
    "name",
    "targetState",
    "liveState",
    "normalizedLiveState",
    "predictedLiveState",
    "hook",
    "modified",
    "resourceVersion",
];

/// Hub side: the managed resources an agent reported, as the hub's
/// argocd-server gets them: a list of `ResourceDiff` with the fields of
/// [`DIFF_FIELDS`], at most [`MAX_NODES`].
pub fn reported_managed_resources(json: &[u8]) -> Result<Value, String> {
    let list: Value = serde_json::from_slice(json)
        .map_err(|e| format!("the managed resources are not JSON: {e}"))?;
    let items = match &list {
        Value::Null => &Vec::new(),
        Value::Array(items) => items,
        _ => return Err("the managed resources are not a list".into()),
    };
    let items: Vec<Value> = items
        .iter()
        .filter_map(|item| {
            let item = item.as_object()?;
            let kept: Map<String, Value> = DIFF_FIELDS
                .iter()
                .filter_map(|f| Some((f.to_string(), item.get(*f)?.clone())))
                .collect();
            Some(Value::Object(kept))
        })
        .take(MAX_NODES)
        .collect();
    Ok(items.into())
}

/// What replaces each value of a Secret (Argo CD's own diff shows
/// `++++++++` in its place).
pub const REDACTED: &str = "++++++++";

/// Agent side: Argo CD's managed resources as its Redis holds them (a JSON
/// list of `ResourceDiff`, each state a JSON document in a string), with
/// every Secret's values replaced by [`REDACTED`] in every state, its
/// `last-applied-configuration` annotation removed (it holds the values
/// too) and the old text `diff` emptied, before anything leaves the cluster.
pub fn redact_managed_resources(json: &[u8]) -> Result<Vec<u8>, String> {
    let mut list: Value = serde_json::from_slice(json)
        .map_err(|e| format!("the managed resources are not JSON: {e}"))?;
    let items = list
        .as_array_mut()
        .ok_or("the managed resources are not a list")?;
    for item in items.iter_mut() {
        let secret = item.get("kind").and_then(Value::as_str) == Some("Secret")
            && item
                .get("group")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
        if !secret {
            continue;
        }
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for state in [
            "targetState",
            "liveState",
            "normalizedLiveState",
            "predictedLiveState",
        ] {
            if let Some(Value::String(text)) = item.get_mut(state) {
                *text = redact_secret(text);
            }
        }
        if item.contains_key("diff") {
            item.insert("diff".into(), Value::String(String::new()));
        }
    }
    Ok(serde_json::to_vec(&list).expect("a Value always serializes"))
}

/// One Secret's state (a JSON document; `null` or empty stays as is)
/// with its values replaced. A state that is not a JSON object is dropped
/// whole: what cannot be read cannot be checked.
fn redact_secret(state: &str) -> String {
    if state.is_empty() || state == "null" {
        return state.to_string();
    }
    let Ok(mut secret @ Value::Object(_)) = serde_json::from_str::<Value>(state) else {
        return String::new();
    };
    redact_secret_object(&mut secret);
    secret.to_string()
}

/// One Secret object with every value of its `data` and `stringData`
/// replaced by [`REDACTED`] (the keys stay) and its
/// `last-applied-configuration` annotation removed (it holds the values
/// too). Anything else is left as it is.
pub fn redact_secret_object(secret: &mut Value) {
    for field in ["data", "stringData"] {
        if let Some(Value::Object(values)) = secret.get_mut(field) {
            for v in values.values_mut() {
                *v = Value::String(REDACTED.into());
            }
        }
    }
    if let Some(Value::Object(annotations)) = secret
        .get_mut("metadata")
        .and_then(|m| m.get_mut("annotations"))
    {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_application_outside_the_control_plane_namespace_is_namespace_underscore_name() {
        assert_eq!(instance_name("argocd", "guestbook", "argocd"), "guestbook");
        assert_eq!(instance_name("", "guestbook", "argocd"), "guestbook");
        assert_eq!(
            instance_name("team-a", "guestbook", "argocd"),
            "team-a_guestbook"
        );
    }

    #[test]
    fn keys_are_argocds() {
        assert_eq!(
            tree_key("team-a_guestbook", true),
            "app|resources-tree|team-a_guestbook|1.8.3.gz"
        );
        assert_eq!(
            tree_key("guestbook", false),
            "app|resources-tree|guestbook|1.8.3"
        );
        assert_eq!(
            tree_channel("team-a_guestbook"),
            "app|managed-resources|team-a_guestbook|1.8.3"
        );
    }

    #[test]
    fn each_managed_resource_becomes_a_node_with_its_health() {
        let status = json!({
            "sync": { "status": "Synced" },
            "resources": [
                { "version": "v1", "kind": "Service", "namespace": "guestbook",
                  "name": "guestbook-ui", "status": "Synced", "health": { "status": "Healthy" } },
                { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
                  "name": "guestbook-ui", "status": "OutOfSync",
                  "health": { "status": "Degraded", "message": "Deployment exceeded its progress deadline" } },
                { "group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole",
                  "name": "reader", "status": "Synced" },
            ],
        });
        assert_eq!(
            tree(Some(&status)).unwrap(),
            json!({ "nodes": [
                { "version": "v1", "kind": "Service", "namespace": "guestbook",
                  "name": "guestbook-ui", "health": { "status": "Healthy" } },
                { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
                  "name": "guestbook-ui",
                  "health": { "status": "Degraded", "message": "Deployment exceeded its progress deadline" } },
                { "group": "rbac.authorization.k8s.io", "version": "v1", "kind": "ClusterRole",
                  "name": "reader" },
            ] })
        );
    }

    #[test]
    fn no_resources_listed_is_no_tree_and_an_empty_list_an_empty_one() {
        assert_eq!(tree(None), None);
        assert_eq!(tree(Some(&json!({ "sync": { "status": "Synced" } }))), None);
        assert_eq!(tree(Some(&json!({ "resources": "not a list" }))), None);
        assert_eq!(
            tree(Some(&json!({ "resources": [] }))),
            Some(json!({ "nodes": [] }))
        );
    }

    #[test]
    fn a_node_takes_no_uid_nor_anything_else_a_cluster_adds() {
        // What a hostile cluster could put in the status it reports: a uid
        // would let argocd-server read the named object live, from the hub
        // when the hub copy's destination is the hub (see `node`).
        let status = json!({ "resources": [
            { "version": "v1", "kind": "Secret", "namespace": "argocd", "name": "argocd-secret",
              "uid": "6f1c2e", "parentRefs": [ { "kind": "Pod", "uid": "1" } ],
              "images": [ "x" ], "networkingInfo": {}, "info": [ { "name": "a", "value": "b" } ] },
        ] });
        assert_eq!(
            tree(Some(&status)).unwrap(),
            json!({ "nodes": [ { "version": "v1", "kind": "Secret", "namespace": "argocd",
                                 "name": "argocd-secret" } ] })
        );
    }

    #[test]
    fn entries_without_a_kind_or_name_are_left_out() {
        let status = json!({ "resources": [
            { "kind": "ConfigMap" },
            { "name": "orphan" },
            { "kind": "", "name": "x" },
            "not an object",
            { "kind": "ConfigMap", "name": "kept", "health": { "status": 3 } },
        ] });
        assert_eq!(
            tree(Some(&status)).unwrap(),
            json!({ "nodes": [ { "kind": "ConfigMap", "name": "kept" } ] })
        );
    }

    #[test]
    fn a_reported_tree_keeps_nodes_and_parents_without_uids_or_anything_of_the_cluster() {
        let spoke = json!({
            "nodes": [
                { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "gb",
                  "name": "ui", "uid": "d-1", "resourceVersion": "7",
                  "health": { "status": "Healthy" }, "images": ["nginx:1"] },
                { "version": "v1", "kind": "Pod", "namespace": "gb", "name": "ui-abc", "uid": "p-1",
                  "parentRefs": [{ "group": "apps", "kind": "ReplicaSet", "namespace": "gb",
                                   "name": "ui-5d", "uid": "rs-1" }],
                  "info": [{ "name": "Status Reason", "value": "Running" }],
                  "secret": "anything else" },
                { "kind": "", "name": "no-kind" },
                "not an object",
            ],
            "orphanedNodes": [{ "kind": "ConfigMap", "name": "someone-elses" }],
            "hosts": [{ "name": "node-1" }],
            "shardsCount": 1,
        });
        let got = reported_tree(&serde_json::to_vec(&spoke).unwrap(), false).unwrap();
        assert_eq!(
            got,
            json!({ "nodes": [
                { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "gb",
                  "name": "ui", "resourceVersion": "7",
                  "health": { "status": "Healthy" }, "images": ["nginx:1"] },
                { "version": "v1", "kind": "Pod", "namespace": "gb", "name": "ui-abc",
                  "parentRefs": [{ "group": "apps", "kind": "ReplicaSet", "namespace": "gb",
                                   "name": "ui-5d" }],
                  "info": [{ "name": "Status Reason", "value": "Running" }] },
            ]})
        );
        // With the live endpoint for the copy's cluster: the uids too.
        let got = reported_tree(&serde_json::to_vec(&spoke).unwrap(), true).unwrap();
        assert_eq!(got["nodes"][0]["uid"], "d-1");
        assert_eq!(got["nodes"][1]["uid"], "p-1");
        assert_eq!(got["nodes"][1]["parentRefs"][0]["uid"], "rs-1");
        assert!(got["nodes"][1].get("secret").is_none());
        assert_eq!(reported_tree(b"{}", false).unwrap(), json!({ "nodes": [] }));
        assert!(reported_tree(b"[1]", false).is_ok_and(|t| t == json!({ "nodes": [] })));
        assert_eq!(
            reported_tree(br#"{"nodes": 3}"#, false).unwrap_err(),
            "the tree's nodes are not a list"
        );
        assert!(
            reported_tree(b"not json", false)
                .unwrap_err()
                .starts_with("the tree is not JSON")
        );
    }

    #[test]
    fn reported_managed_resources_keep_argocds_diff_fields_only() {
        let spoke = json!([{ "kind": "ConfigMap", "name": "a", "liveState": "{}", "targetState": "{}",
                             "extra": 1 }, 7]);
        assert_eq!(
            reported_managed_resources(&serde_json::to_vec(&spoke).unwrap()).unwrap(),
            json!([{ "kind": "ConfigMap", "name": "a", "liveState": "{}", "targetState": "{}" }])
        );
        assert!(reported_managed_resources(b"{}").is_err());
        assert_eq!(
            managed_resources_key("gb", true),
            "app|managed-resources|gb|1.8.3.gz"
        );
    }

    #[test]
    fn a_secrets_values_never_leave_the_cluster() {
        let live = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "db", "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"aHVudGVyMg==\"}}",
                "team": "a" } },
            "data": { "password": "aHVudGVyMg==" },
            "stringData": { "user": "admin" },
        });
        let list = json!([
            { "kind": "Secret", "name": "db", "liveState": live.to_string(),
              "targetState": live.to_string(), "normalizedLiveState": "not json",
              "predictedLiveState": "null", "diff": "password: aHVudGVyMg==" },
            { "group": "example.com", "kind": "Secret", "name": "not-core",
              "liveState": "{\"data\":{\"k\":\"v\"}}" },
            { "kind": "ConfigMap", "name": "cm", "liveState": "{\"data\":{\"k\":\"v\"}}" },
        ]);
        let out = redact_managed_resources(&serde_json::to_vec(&list).unwrap()).unwrap();
        let text = String::from_utf8(out.clone()).unwrap();
        assert!(!text.contains("aHVudGVyMg=="), "{text}");
        assert!(!text.contains("admin"), "{text}");
        let out: Value = serde_json::from_slice(&out).unwrap();
        let state: Value = serde_json::from_str(out[0]["liveState"].as_str().unwrap()).unwrap();
        assert_eq!(state["data"]["password"], REDACTED);
        assert_eq!(state["stringData"]["user"], REDACTED);
        assert_eq!(state["metadata"]["annotations"], json!({ "team": "a" }));
        assert_eq!(out[0]["normalizedLiveState"], "");
        assert_eq!(out[0]["predictedLiveState"], "null");
        assert_eq!(out[0]["diff"], "");
        // Only core Secrets are Secrets; everything else is untouched.
        assert_eq!(out[1], list[1]);
        assert_eq!(out[2], list[2]);
        assert!(redact_managed_resources(b"{}").is_err());
    }
}
