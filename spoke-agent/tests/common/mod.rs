//! What the agent's integration tests share: running as the agent's
//! service account with exactly the RBAC `argocd-pull-addon` renders.

use std::path::PathBuf;

use argocd_pull_addon::{AGENT_NAME, AGENT_NAMESPACE, AddonConfig, agent_rbac};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use testenv::{Cluster, CrdSet};

/// The namespace of the cluster's Argo CD.
pub const ARGOCD: &str = "argocd";

/// The agent's service account, as the API server names its user.
pub fn sa_user() -> String {
    format!("system:serviceaccount:{AGENT_NAMESPACE}:{AGENT_NAME}")
}

/// Applies the agent's RBAC for `mode` as OCM would render it.
pub async fn install_rbac(cluster: &Cluster, mode: &str) {
    let client = cluster.client().await.unwrap();
    for object in agent_rbac(&AddonConfig::default(), mode) {
        let obj: DynamicObject = serde_json::from_value(object.clone()).unwrap();
        let gvk = kube::core::GroupVersionKind::try_from(obj.types.as_ref().unwrap()).unwrap();
        let (ar, caps) = kube::discovery::pinned_kind(&client, &gvk).await.unwrap();
        let api: Api<DynamicObject> = match (caps.scope, obj.namespace()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            _ => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            &obj.name_any(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", obj.name_any()));
    }
}

/// A kubeconfig for `cluster` as the agent's service account, written as
/// `name`.
pub fn agent_kubeconfig(cluster: &Cluster, name: &str) -> PathBuf {
    let kubeconfig = cluster.dir().join(name);
    cluster
        .write_kubeconfig_as(&sa_user(), Some("system:serviceaccounts"), &kubeconfig)
        .unwrap();
    kubeconfig
}

/// The shared test cluster `name` with Argo CD's namespace and the agent's
/// RBAC for managed mode, and a kubeconfig for it as the agent's service
/// account, written as `kubeconfig`.
pub async fn managed_cluster(name: &str, kubeconfig: &str) -> (&'static Cluster, PathBuf) {
    testenv::init_tracing();
    let cluster = testenv::shared(name, CrdSet::Managed).await.unwrap();
    cluster.ensure_namespace(ARGOCD).await.unwrap();
    install_rbac(cluster, "managed").await;
    (cluster, agent_kubeconfig(cluster, kubeconfig))
}
