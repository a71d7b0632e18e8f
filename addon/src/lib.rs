//! The OCM addon that deploys and registers the spoke-agent on managed
//! clusters. Rendering is pure: the manifests are built from [`AddonConfig`]
//! without touching any cluster, so they can be checked in and reviewed.

#![forbid(unsafe_code)]

use argocd_pull_apis::ocm::{
    ClusterManagementAddOn, ClusterManagementAddOnAddOnMeta, ClusterManagementAddOnInstallStrategy,
    ClusterManagementAddOnInstallStrategyType, ClusterManagementAddOnSpec,
};
use kube::api::ObjectMeta;

/// What the addon manifests depend on.
#[derive(Clone, Debug)]
pub struct AddonConfig {
    /// Name of the ClusterManagementAddOn (`clusteradm addon enable --names <this>`).
    pub addon_name: String,
}

/// The ClusterManagementAddOn that makes the addon known to OCM. Installed
/// manually by default (`clusteradm addon enable`).
pub fn cluster_management_addon(config: &AddonConfig) -> ClusterManagementAddOn {
    ClusterManagementAddOn {
        metadata: ObjectMeta {
            name: Some(config.addon_name.clone()),
            ..Default::default()
        },
        spec: ClusterManagementAddOnSpec {
            add_on_meta: Some(ClusterManagementAddOnAddOnMeta {
                display_name: Some("argocd-pull".into()),
                description: Some(
                    "Runs Argo CD in the pull model: the spoke-agent pulls Applications from the hub"
                        .into(),
                ),
            }),
            install_strategy: Some(ClusterManagementAddOnInstallStrategy {
                r#type: Some(ClusterManagementAddOnInstallStrategyType::Manual),
                ..Default::default()
            }),
            ..Default::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_management_addon_is_named_for_the_addon_and_manual() {
        let cma = cluster_management_addon(&AddonConfig {
            addon_name: "argocd-pull".into(),
        });
        let v = serde_json::to_value(&cma).unwrap();
        assert_eq!(v["apiVersion"], "addon.open-cluster-management.io/v1alpha1");
        assert_eq!(v["kind"], "ClusterManagementAddOn");
        assert_eq!(v["metadata"]["name"], "argocd-pull");
        assert_eq!(v["spec"]["installStrategy"]["type"], "Manual");
    }
}
