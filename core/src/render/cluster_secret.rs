//! The Argo CD cluster Secret that makes a ManagedCluster visible to the
//! hub's Argo CD: its UI lists it and ApplicationSet cluster generators can
//! target it. The hub's Argo CD never connects to it (the Applications it
//! would deploy there are dormant), so the Secret carries no credentials.

use std::collections::BTreeMap;

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManagedCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::core::ObjectMeta;
use kube::{Resource, ResourceExt};

/// Label naming the ManagedCluster a cluster Secret stands for.
pub const CLUSTER_NAME_LABEL: &str = "apps.open-cluster-management.io/cluster-name";

/// The Secret's name in the Argo CD namespace.
pub fn secret_name(cluster: &str) -> String {
    format!("{cluster}-cluster-secret")
}

/// Keeps of `cluster` only what [`cluster_secret`] reads: its metadata
/// (without managedFields, labels and annotations) and its clients' URLs.
/// The cache of every ManagedCluster held the rest for nothing: OCM's
/// status (conditions, capacity, claims, version) and each client
/// config's CA bundle, about 1.5 KiB a cluster, 15 MiB at 10,000.
pub fn slim(cluster: &mut ManagedCluster) {
    cluster.status = None;
    let meta = &mut cluster.metadata;
    meta.managed_fields = None;
    meta.labels = None;
    meta.annotations = None;
    for c in cluster
        .spec
        .managed_cluster_client_configs
        .iter_mut()
        .flatten()
    {
        c.ca_bundle = None;
    }
}

/// The cluster Secret for `cluster`, owned by it so that it goes when the
/// cluster is removed from OCM.
pub fn cluster_secret(cluster: &ManagedCluster, argocd_namespace: &str) -> Secret {
    let name = cluster.name_any();
    // The cluster's own API URL when OCM knows it; otherwise a stable
    // placeholder that is still a valid, unique server for Argo CD.
    let server = cluster
        .spec
        .managed_cluster_client_configs
        .as_ref()
        .and_then(|c| c.first())
        .map(|c| c.url.clone())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| format!("https://{name}"));
    Secret {
        metadata: ObjectMeta {
            name: Some(secret_name(&name)),
            namespace: Some(argocd_namespace.to_string()),
            labels: Some(BTreeMap::from([
                (keys::ARGOCD_SECRET_TYPE.to_string(), "cluster".to_string()),
                (CLUSTER_NAME_LABEL.to_string(), name.clone()),
                (
                    crate::render::work::MANAGED_BY_LABEL.to_string(),
                    crate::render::work::MANAGED_BY.to_string(),
                ),
            ])),
            owner_references: cluster.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([
            ("name".to_string(), name),
            ("server".to_string(), server),
        ])),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cluster(spec: serde_json::Value) -> ManagedCluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": "cluster1", "uid": "u-1" }, "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn names_labels_and_owns_the_secret() {
        let s = cluster_secret(&cluster(json!({})), "argocd");
        assert_eq!(s.metadata.name.as_deref(), Some("cluster1-cluster-secret"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("argocd"));
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()[keys::ARGOCD_SECRET_TYPE],
            "cluster"
        );
        let data = s.string_data.unwrap();
        assert_eq!(data["name"], "cluster1");
        assert_eq!(data["server"], "https://cluster1");
        let owner = &s.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str()),
            ("ManagedCluster", "u-1")
        );
    }

    #[test]
    fn uses_the_cluster_url_ocm_knows() {
        let spec =
            json!({ "managedClusterClientConfigs": [{ "url": "https://api.c1.example:6443" }] });
        let s = cluster_secret(&cluster(spec), "argocd");
        assert_eq!(
            s.string_data.unwrap()["server"],
            "https://api.c1.example:6443"
        );
    }

    #[test]
    fn a_slimmed_cluster_makes_the_same_secret() {
        let mut full: ManagedCluster = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": {
                "name": "cluster1", "uid": "u-1", "generation": 3,
                "labels": { "env": "prod" }, "annotations": { "a": "b" },
                "managedFields": [{ "manager": "registration", "operation": "Update" }]
            },
            "spec": { "hubAcceptsClient": true, "managedClusterClientConfigs": [
                { "url": "https://api.c1.example:6443", "caBundle": "LS0tLS1CRUdJTg==" }
            ] },
            "status": { "conditions": [], "version": { "kubernetes": "v1.35.0" } }
        }))
        .unwrap();
        let before = cluster_secret(&full, "argocd");
        slim(&mut full);
        assert_eq!(cluster_secret(&full, "argocd"), before);
        assert!(full.status.is_none());
        assert_eq!(full.metadata.generation, Some(3), "the watch filters on it");
        assert!(full.metadata.managed_fields.is_none() && full.metadata.annotations.is_none());
        let configs = full.spec.managed_cluster_client_configs.unwrap();
        assert_eq!(configs[0].ca_bundle, None);
        assert_eq!(configs[0].url, "https://api.c1.example:6443");
    }
}
