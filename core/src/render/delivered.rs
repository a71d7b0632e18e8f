//! The copy of a hub Application that the managed cluster receives.
//!
//! Built fresh from the hub object every time (the hub object itself is
//! never modified), keeping every field we do not know about, and dropping
//! only what must not travel: the pull-model routing keys, `skip-reconcile`
//! (the spoke's Argo CD must reconcile it), server-set metadata and status.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use serde_json::{Map, Value, json};

use crate::route::target::Target;

/// The destination the spoke's Argo CD uses for its own cluster.
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// Keys that route the hub copy and must not reach the spoke.
const STRIPPED_ANNOTATIONS: [&str; 6] = [
    // kubectl's copy of the whole object as last applied: on the hub it
    // holds the routing annotations and any value the spoke must not see.
    "kubectl.kubernetes.io/last-applied-configuration",
    keys::MANAGED_CLUSTER,
    keys::MANAGED_CLUSTER_APP_NAMESPACE,
    keys::DESTINATION_NAME,
    keys::DESTINATION_SERVER,
    keys::SKIP_RECONCILE,
];

/// The ApplicationSet owning an Application, as `namespace/name`.
pub fn owning_application_set(app: &Application) -> Option<String> {
    let owner = app
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "ApplicationSet" && o.api_version.starts_with("argoproj.io/"))?;
    Some(format!(
        "{}/{}",
        app.metadata.namespace.as_deref().unwrap_or_default(),
        owner.name
    ))
}

/// The Application as delivered to `target`.
pub fn delivered_copy(app: &Application, target: &Target) -> Value {
    let meta = &app.metadata;
    let mut labels: Map<String, Value> = meta
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != keys::PULL_LABEL)
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut annotations: Map<String, Value> = meta
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !STRIPPED_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    if let Some(set) = owning_application_set(app) {
        labels.insert(keys::APPLICATION_SET_LABEL.into(), "true".into());
        annotations.insert(keys::HOSTING_APPLICATION_SET.into(), set.into());
    }

    let mut metadata = Map::new();
    metadata.insert("name".into(), meta.name.clone().unwrap_or_default().into());
    metadata.insert("namespace".into(), target.app_namespace.clone().into());
    if !labels.is_empty() {
        metadata.insert("labels".into(), labels.into());
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), annotations.into());
    }
    if let Some(finalizers) = meta.finalizers.as_ref().filter(|f| !f.is_empty()) {
        // Argo CD's cascade-delete finalizer must act on the spoke, where the
        // resources are.
        metadata.insert("finalizers".into(), json!(finalizers));
    }

    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("argoproj.io/v1alpha1"));
    out.insert("kind".into(), json!("Application"));
    out.insert("metadata".into(), metadata.into());
    if let Value::Object(fields) = &app.data {
        for (k, v) in fields {
            // status is the spoke's to write; apiVersion, kind and metadata are set above.
            if !matches!(k.as_str(), "status" | "apiVersion" | "kind" | "metadata") {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    let annotations = meta.annotations.as_ref();
    let get = |k: &str| annotations.and_then(|a| a.get(k)).filter(|v| !v.is_empty());
    let spec = out.entry("spec").or_insert_with(|| json!({}));
    if let Value::Object(spec) = spec {
        let dest = spec.entry("destination").or_insert_with(|| json!({}));
        if let Value::Object(dest) = dest {
            // Argo CD refuses a destination with both name and server.
            match (get(keys::DESTINATION_NAME), get(keys::DESTINATION_SERVER)) {
                (Some(name), _) => {
                    dest.insert("name".into(), name.clone().into());
                    dest.remove("server");
                }
                (None, server) => {
                    let server = server.map(String::as_str).unwrap_or(IN_CLUSTER);
                    dest.insert("server".into(), server.into());
                    dest.remove("name");
                }
            }
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            cluster: "cluster1".into(),
            app_namespace: "argocd".into(),
        }
    }

    fn hub_app(extra: Value) -> Application {
        let mut v = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {
                "name": "guestbook", "namespace": "hub-apps",
                "uid": "0b9f8f7e-1111-2222-3333-444455556666", "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "managedFields": [{ "manager": "kubectl" }],
                "labels": { keys::PULL_LABEL: "true", "team": "a" },
                "annotations": {
                    keys::MANAGED_CLUSTER: "cluster1",
                    keys::SKIP_RECONCILE: "true",
                    keys::REFRESH: "hard",
                    "kubectl.kubernetes.io/last-applied-configuration":
                        "{\"metadata\":{\"annotations\":{\"apps.open-cluster-management.io/ocm-managed-cluster\":\"cluster1\"}}}",
                    "note": "kept"
                },
                "finalizers": [keys::RESOURCES_FINALIZER],
            },
            "spec": {
                "project": "default",
                "source": { "repoURL": "https://git.example/repo.git", "path": "app" },
                "destination": { "name": "in-cluster", "namespace": "guestbook" },
                "futureField": { "kept": true }
            },
            "operation": { "sync": { "revision": "abc" } },
            "status": { "health": { "status": "Healthy" } }
        });
        if let (Value::Object(base), Value::Object(extra)) = (&mut v, extra) {
            for (k, val) in extra {
                base.insert(k, val);
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn strips_routing_keys_server_metadata_and_status() {
        let out = delivered_copy(&hub_app(json!({})), &target());
        assert_eq!(
            out["metadata"],
            json!({
                "name": "guestbook", "namespace": "argocd",
                "labels": { "team": "a" },
                "annotations": { keys::REFRESH: "hard", "note": "kept" },
                "finalizers": [keys::RESOURCES_FINALIZER],
            })
        );
        assert!(out.get("status").is_none());
    }

    #[test]
    fn keeps_unknown_fields_and_operation() {
        let out = delivered_copy(&hub_app(json!({ "topLevelFuture": 1 })), &target());
        assert_eq!(out["spec"]["futureField"], json!({ "kept": true }));
        assert_eq!(out["operation"], json!({ "sync": { "revision": "abc" } }));
        assert_eq!(out["topLevelFuture"], 1);
    }

    #[test]
    fn destination_defaults_to_in_cluster_server() {
        let out = delivered_copy(&hub_app(json!({})), &target());
        assert_eq!(
            out["spec"]["destination"],
            json!({ "server": IN_CLUSTER, "namespace": "guestbook" })
        );
    }

    #[test]
    fn destination_annotations_override() {
        let mut app = hub_app(json!({}));
        let ann = app.metadata.annotations.as_mut().unwrap();
        ann.insert(keys::DESTINATION_SERVER.into(), "https://other:6443".into());
        let out = delivered_copy(&app, &target());
        assert_eq!(out["spec"]["destination"]["server"], "https://other:6443");
        assert!(out["spec"]["destination"].get("name").is_none());
        assert!(
            out["metadata"]["annotations"]
                .get(keys::DESTINATION_SERVER)
                .is_none()
        );

        let ann = app.metadata.annotations.as_mut().unwrap();
        ann.insert(keys::DESTINATION_NAME.into(), "spoke-local".into());
        let out = delivered_copy(&app, &target());
        assert_eq!(out["spec"]["destination"]["name"], "spoke-local");
        assert!(out["spec"]["destination"].get("server").is_none());
    }

    #[test]
    fn marks_application_set_ownership() {
        let app = hub_app(json!({}));
        let mut value = serde_json::to_value(&app).unwrap();
        value["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
            "name": "guestbook-set", "uid": "u", "controller": true
        }]);
        let app: Application = serde_json::from_value(value).unwrap();
        let out = delivered_copy(&app, &target());
        assert_eq!(
            out["metadata"]["labels"][keys::APPLICATION_SET_LABEL],
            "true"
        );
        assert_eq!(
            out["metadata"]["annotations"][keys::HOSTING_APPLICATION_SET],
            "hub-apps/guestbook-set"
        );
        assert!(out["metadata"].get("ownerReferences").is_none());
    }
}
