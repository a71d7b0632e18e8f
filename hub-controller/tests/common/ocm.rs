//! What tests against real OCM set up on the hub.

use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;

/// Namespace `ns` of the hub may deploy to every joined cluster: OCM's
/// `global` cluster set bound there, and a Placement on all of it (decided
/// by OCM's placement controller).
pub async fn place_everywhere(client: &kube::Client, ns: &str) {
    let ocm = |version: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("cluster.open-cluster-management.io", version, kind),
            plural,
        )
    };
    for (resource, object) in [
        (
            ocm(
                "v1beta2",
                "ManagedClusterSetBinding",
                "managedclustersetbindings",
            ),
            json!({ "apiVersion": "cluster.open-cluster-management.io/v1beta2",
                    "kind": "ManagedClusterSetBinding",
                    "metadata": { "name": "global" }, "spec": { "clusterSet": "global" } }),
        ),
        (
            ocm("v1beta1", "Placement", "placements"),
            json!({ "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "Placement",
                    "metadata": { "name": "all" }, "spec": { "clusterSets": ["global"] } }),
        ),
    ] {
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
}
