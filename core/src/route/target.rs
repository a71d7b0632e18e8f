//! Which managed cluster, and which namespace there, a hub Application is
//! delivered to, read from the annotations argocd-pull-integration users
//! already have.

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::names::dns_label;
use kube::core::ObjectMeta;

/// Where an Application goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The ManagedCluster, which is also its namespace on the hub.
    pub cluster: String,
    /// The Application's namespace on the managed cluster.
    pub app_namespace: String,
}

/// Why an Application that opted in cannot be delivered. Each message says
/// what the user has to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("annotation {key} is missing or empty: set it to the name of the ManagedCluster to deliver to", key = keys::MANAGED_CLUSTER)]
    MissingCluster,
    #[error("annotation {key}={value:?} is not a valid ManagedCluster name: {why}", key = keys::MANAGED_CLUSTER)]
    InvalidCluster { value: String, why: String },
    #[error("annotation {key}={value:?} is not a valid namespace name: {why}", key = keys::MANAGED_CLUSTER_APP_NAMESPACE)]
    InvalidAppNamespace { value: String, why: String },
}

/// The namespace used on the spoke when neither the annotation nor the hub
/// namespace says otherwise.
pub const DEFAULT_APP_NAMESPACE: &str = "argocd";

/// Whether the Application opted in to the pull model (Go ParseBool). An
/// autonomous cluster's mirror never has: whoever labels one, it is not
/// delivered anywhere.
pub fn is_pulled(app: &Application) -> bool {
    pulled(&app.metadata)
}

/// [`is_pulled`], from the metadata alone.
pub fn pulled(meta: &ObjectMeta) -> bool {
    let labels = meta.labels.as_ref();
    labels.is_none_or(|l| !l.contains_key(keys::MIRROR_OF))
        && labels
            .and_then(|l| l.get(keys::PULL_LABEL))
            .and_then(|v| keys::parse_bool(v))
            .unwrap_or(false)
}

/// The delivery target of an Application that opted in.
pub fn target(app: &Application) -> Result<Target, TargetError> {
    target_of(&app.metadata)
}

/// [`target`], from the metadata alone.
pub fn target_of(meta: &ObjectMeta) -> Result<Target, TargetError> {
    let annotation = |key: &str| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(|v| v.as_str())
            .filter(|v| !v.is_empty())
    };
    let cluster = annotation(keys::MANAGED_CLUSTER).ok_or(TargetError::MissingCluster)?;
    if let Err(why) = dns_label(cluster) {
        return Err(TargetError::InvalidCluster {
            value: cluster.to_string(),
            why,
        });
    }
    let app_namespace = match annotation(keys::MANAGED_CLUSTER_APP_NAMESPACE) {
        Some(ns) => {
            dns_label(ns).map_err(|why| TargetError::InvalidAppNamespace {
                value: ns.to_string(),
                why,
            })?;
            ns
        }
        None => meta
            .namespace
            .as_deref()
            .filter(|ns| !ns.is_empty())
            .unwrap_or(DEFAULT_APP_NAMESPACE),
    };
    Ok(Target {
        cluster: cluster.to_string(),
        app_namespace: app_namespace.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(labels: serde_json::Value, annotations: serde_json::Value, ns: &str) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": { "name": "a", "namespace": ns, "labels": labels, "annotations": annotations },
            "spec": {}
        }))
        .unwrap()
    }

    #[test]
    fn pull_label_uses_go_parse_bool() {
        for (value, pulled) in [
            ("true", true),
            ("True", true),
            ("1", true),
            ("t", true),
            ("false", false),
            ("yes", false),
            ("", false),
        ] {
            let a = app(json!({ keys::PULL_LABEL: value }), json!({}), "ns");
            assert_eq!(is_pulled(&a), pulled, "{value:?}");
        }
        assert!(!is_pulled(&app(json!({}), json!({}), "ns")));
        // A mirror labelled by someone is still not delivered anywhere.
        let labelled_mirror = app(
            json!({ keys::PULL_LABEL: "true", keys::MIRROR_OF: "c1" }),
            json!({ keys::MANAGED_CLUSTER: "c2" }),
            "c1",
        );
        assert!(!is_pulled(&labelled_mirror));
    }

    #[test]
    fn target_table() {
        let cases = [
            (
                json!({ keys::MANAGED_CLUSTER: "cluster1" }),
                "hubns",
                Ok(("cluster1", "hubns")),
            ),
            (
                json!({ keys::MANAGED_CLUSTER: "cluster1", keys::MANAGED_CLUSTER_APP_NAMESPACE: "apps" }),
                "hubns",
                Ok(("cluster1", "apps")),
            ),
            (
                json!({ keys::MANAGED_CLUSTER: "c" }),
                "",
                Ok(("c", DEFAULT_APP_NAMESPACE)),
            ),
            (json!({}), "ns", Err("missing")),
            (json!({ keys::MANAGED_CLUSTER: "" }), "ns", Err("missing")),
            (
                json!({ keys::MANAGED_CLUSTER: "Cluster_1" }),
                "ns",
                Err("invalid cluster"),
            ),
            (
                json!({ keys::MANAGED_CLUSTER: "a".repeat(64) }),
                "ns",
                Err("invalid cluster"),
            ),
            (
                json!({ keys::MANAGED_CLUSTER: "c", keys::MANAGED_CLUSTER_APP_NAMESPACE: "-x" }),
                "ns",
                Err("invalid namespace"),
            ),
        ];
        for (annotations, ns, want) in cases {
            let got = target(&app(
                json!({ keys::PULL_LABEL: "true" }),
                annotations.clone(),
                ns,
            ));
            match (got, want) {
                (Ok(t), Ok((cluster, app_ns))) => {
                    assert_eq!(
                        (t.cluster.as_str(), t.app_namespace.as_str()),
                        (cluster, app_ns),
                        "{annotations}"
                    )
                }
                (Err(TargetError::MissingCluster), Err("missing")) => {}
                (Err(TargetError::InvalidCluster { .. }), Err("invalid cluster")) => {}
                (Err(TargetError::InvalidAppNamespace { .. }), Err("invalid namespace")) => {}
                (got, want) => panic!("{annotations}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn errors_say_what_to_fix() {
        let e = target(&app(json!({}), json!({}), "ns")).unwrap_err();
        assert!(e.to_string().contains(keys::MANAGED_CLUSTER), "{e}");
        let e = target(&app(
            json!({}),
            json!({ keys::MANAGED_CLUSTER: "Bad_Name" }),
            "ns",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("lower-case"), "{e}");
    }
}
