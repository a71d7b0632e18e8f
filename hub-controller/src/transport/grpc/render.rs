//! Pure: what the gRPC transport sends and shows: the copy an agent gets
//! ([`grpc_copy`]) and the read-only hub mirror of an autonomous cluster's
//! Application ([`mirror`]).

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::v1::ObjectKey;
use serde_json::{Map, Value, json};

use crate::render::delivered_copy;

/// The delivered copy as the gRPC transport sends it: the shared delivered
/// copy without `.operation` and the refresh annotation (both travel as
/// commands, run exactly once) and without argocd-pull's bookkeeping.
pub fn grpc_copy(app: &Application, target: &crate::route::target::Target) -> Value {
    let mut copy = delivered_copy(app, target);
    if let Value::Object(map) = &mut copy {
        map.remove("operation");
    }
    if let Some(Value::Object(a)) = copy.pointer_mut("/metadata/annotations") {
        a.retain(|k, _| k != keys::REFRESH && !k.starts_with(keys::OWN_PREFIX));
        if a.is_empty()
            && let Some(Value::Object(m)) = copy.pointer_mut("/metadata")
        {
            m.remove("annotations");
        }
    }
    copy
}

// ---------------------------------------------------------------------------
// Autonomous mirrors

/// Annotation on a mirror: the version of the agent's report it shows.
pub const MIRROR_VERSION: &str = "argocd-pull.io/observed-version";

/// Labels that make a hub Application a pull-model one: never on a mirror.
const ROUTING_LABELS: [&str; 2] = [keys::PULL_LABEL, keys::APPLICATION_SET_LABEL];
/// Annotations that route a hub Application: never on a mirror.
const ROUTING_ANNOTATIONS: [&str; 6] = [
    keys::MANAGED_CLUSTER,
    keys::MANAGED_CLUSTER_APP_NAMESPACE,
    keys::DESTINATION_NAME,
    keys::DESTINATION_SERVER,
    keys::HUB_APP_NAMESPACE,
    keys::HUB_APP_NAME,
];

/// The read-only hub mirror of an autonomous agent's Application: in the
/// namespace named after the cluster, kept off the hub's Argo CD, pointing
/// at the cluster by name, without finalizers (deleting a mirror must never
/// wait for anything) and without `.operation` (the hub asks for syncs
/// through commands).
pub fn mirror(cluster: &str, key: &ObjectKey, app: &Value, status: &Value, version: &str) -> Value {
    let meta = app.get("metadata").cloned().unwrap_or_default();
    let mut labels: Map<String, Value> = meta
        .get("labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    // A mirror is inert: nothing on the spoke may make it a pull-model
    // Application delivered elsewhere, whatever labels a spoke admin sets.
    labels.retain(|k, _| !ROUTING_LABELS.contains(&k.as_str()) && !k.starts_with(keys::OWN_PREFIX));
    labels.insert(keys::MIRROR_OF.into(), cluster.into());
    let mut annotations: Map<String, Value> = meta
        .get("annotations")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    annotations.retain(|k, _| {
        k != keys::REFRESH
            && !ROUTING_ANNOTATIONS.contains(&k.as_str())
            && !k.starts_with(keys::OWN_PREFIX)
            && k != "kubectl.kubernetes.io/last-applied-configuration"
    });
    annotations.insert(keys::SKIP_RECONCILE.into(), "true".into());
    annotations.insert(
        keys::MIRROR_SOURCE.into(),
        format!("{}/{}", key.namespace, key.name).into(),
    );
    annotations.insert(MIRROR_VERSION.into(), version.into());

    let mut spec = app.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(Value::Object(dest)) = spec.get_mut("destination") {
        // Seen from the hub, the spoke's in-cluster destination is the cluster.
        dest.remove("server");
        dest.insert("name".into(), cluster.into());
    }
    // Lets a restarted hub tell an edited mirror from an intact one.
    annotations.insert(keys::SPEC_HASH.into(), content::hash(&spec).into());
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": key.name,
            "namespace": cluster,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
        "status": status,
    })
}

/// Whether the mirror on the hub shows what `wanted` says: the fields the
/// mirror owns (spec, status, its labels and annotations). Annotations the
/// hub adds on its own (a refresh request, command stamps) are not edits.
pub fn mirror_matches(current: &Application, wanted: &Value) -> bool {
    let current_json = serde_json::to_value(current).unwrap_or_default();
    if current_json.get("spec") != wanted.get("spec")
        || current_json.get("status").unwrap_or(&Value::Null)
            != wanted.get("status").unwrap_or(&Value::Null)
    {
        return false;
    }
    for field in ["labels", "annotations"] {
        let have = current_json.pointer(&format!("/metadata/{field}"));
        if let Some(Value::Object(want)) = wanted.pointer(&format!("/metadata/{field}")) {
            for (k, v) in want {
                if have.and_then(|h| h.get(k)) != Some(v) {
                    return false;
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::route::target::target;

    #[test]
    fn the_grpc_copy_carries_no_commands_or_bookkeeping() {
        let a = app(json!({
            "metadata": { "annotations": {
                keys::REFRESH: "hard", keys::SYNC_REQUEST: "x y", "keep": "me" } },
            "operation": { "sync": {} }
        }));
        let t = target(&a).unwrap();
        let copy = grpc_copy(&a, &t);
        assert!(copy.get("operation").is_none());
        assert_eq!(copy["metadata"]["annotations"], json!({ "keep": "me" }));
    }

    #[test]
    fn mirrors_are_read_only_copies_in_the_cluster_namespace() {
        let spoke = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "local", "namespace": "argocd",
                "labels": { "team": "a", keys::PULL_LABEL: "true", keys::MIRROR_OF: "c9" },
                "annotations": { keys::REFRESH: "normal", keys::OPERATION_IDS: "x", "note": "n",
                    keys::MANAGED_CLUSTER: "victim", keys::MANAGED_CLUSTER_APP_NAMESPACE: "kube-system",
                    keys::TRANSPORT: "grpc" },
                "finalizers": [keys::RESOURCES_FINALIZER] },
            "spec": { "project": "default",
                      "destination": { "server": "https://kubernetes.default.svc", "namespace": "x" } }
        });
        let status = json!({ "health": { "status": "Healthy" } });
        let m = mirror("c1", &key("argocd", "local"), &spoke, &status, "v1");
        assert_eq!(m["metadata"]["namespace"], "c1");
        // Inert: a spoke admin's routing labels and annotations are gone.
        assert_eq!(
            m["metadata"]["labels"],
            json!({ "team": "a", keys::MIRROR_OF: "c1" })
        );
        for k in [
            keys::MANAGED_CLUSTER,
            keys::MANAGED_CLUSTER_APP_NAMESPACE,
            keys::TRANSPORT,
        ] {
            assert!(m["metadata"]["annotations"].get(k).is_none(), "{k}");
        }
        assert_eq!(m["metadata"]["annotations"][keys::SKIP_RECONCILE], "true");
        assert_eq!(
            m["metadata"]["annotations"][keys::MIRROR_SOURCE],
            "argocd/local"
        );
        assert!(m["metadata"]["annotations"].get(keys::REFRESH).is_none());
        assert!(
            m["metadata"]["annotations"]
                .get(keys::OPERATION_IDS)
                .is_none()
        );
        assert!(m["metadata"].get("finalizers").is_none());
        assert_eq!(
            m["spec"]["destination"],
            json!({ "name": "c1", "namespace": "x" })
        );
        assert_eq!(m["status"], status);

        let mut on_hub = m.clone();
        on_hub["metadata"]["annotations"][keys::REFRESH] = json!("hard");
        let on_hub: Application = serde_json::from_value(on_hub).unwrap();
        assert!(
            mirror_matches(&on_hub, &m),
            "a refresh request is not an edit"
        );
        let mut edited = m.clone();
        edited["spec"]["project"] = json!("other");
        let edited: Application = serde_json::from_value(edited).unwrap();
        assert!(!mirror_matches(&edited, &m));
    }
}
