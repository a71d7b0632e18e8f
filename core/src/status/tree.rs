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
//! The tree has the managed resources only (no children such as
//! ReplicaSets and Pods: those are in the cluster's Redis, not in the
//! status), each with its health.

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
/// and name it chooses. The live views come through argocd-pull's own
/// endpoint instead (docs/ui.md, deliverable 2).
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
}
