//! A cluster's agent mode as a platform team sets it
//! (`example/autonomous`): an AddOnDeploymentConfig with `AGENT_MODE` in
//! the addon's namespace, named in the cluster's ManagedClusterAddOn.

use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{AddOnDeploymentConfig, ManagedClusterAddOn};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Configures `cluster`'s agent for `mode` (`managed` or `autonomous`).
pub async fn configure(hub: &kube::Client, cluster: &str, mode: &str) {
    let ns = argocd_pull_addon::HUB_NAMESPACE;
    let name = format!("argocd-pull-{cluster}");
    let ssa = PatchParams::apply("platform-team").force();
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": ns } })).unwrap();
    match Api::<Namespace>::all(hub.clone())
        .create(&Default::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
    Api::<AddOnDeploymentConfig>::namespaced(hub.clone(), ns)
        .patch(
            &name,
            &ssa,
            &Patch::Apply(json!({
                "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "AddOnDeploymentConfig",
                "metadata": { "name": name, "namespace": ns },
                "spec": { "customizedVariables": [
                    { "name": argocd_pull_addon::MODE_VARIABLE, "value": mode },
                ] },
            })),
        )
        .await
        .unwrap();
    Api::<ManagedClusterAddOn>::namespaced(hub.clone(), cluster)
        .patch(
            keys::ADDON_NAME,
            &ssa,
            &Patch::Apply(json!({
                "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                "kind": "ManagedClusterAddOn",
                "metadata": { "name": keys::ADDON_NAME, "namespace": cluster },
                "spec": { "configs": [{
                    "group": "addon.open-cluster-management.io",
                    "resource": "addondeploymentconfigs",
                    "namespace": ns,
                    "name": name,
                }] },
            })),
        )
        .await
        .unwrap();
}
