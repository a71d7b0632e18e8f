//! Autonomous mode for cluster2, as example/README.md says: its own
//! AddOnDeploymentConfig, the mirrors binding, the cluster's addon pointed
//! at the config; OCM redeploys the agent, and an Application the cluster
//! keeps itself shows up on the hub as a read-only mirror.

use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::keys;
use kube::api::{Api, DynamicObject};
use testenv::stack::Stack;

use super::support::{at, eventually, example, get};

pub async fn cluster2_goes_autonomous(stack: &Stack, hub_client: &kube::Client, c2: &kube::Client) {
    // Autonomous mode for cluster2, as example/README.md says: its own
    // config (the hub-controller adds HUB_CA to it), the mirrors binding,
    // the cluster's addon pointed at the config; OCM redeploys the agent.
    stack
        .apply(&example("autonomous/addondeploymentconfig.yaml"))
        .await
        .unwrap();
    stack
        .set_hub_address("argocd-pull-autonomous")
        .await
        .unwrap();
    stack
        .apply(&example("autonomous/mirrors-rolebinding.yaml"))
        .await
        .unwrap();
    testenv::stack::kubectl(
        stack.hub(),
        &[
            "patch",
            "managedclusteraddon",
            "argocd-pull",
            "-n",
            "cluster2",
            "--type",
            "merge",
            "--patch-file",
            &example("autonomous/managedclusteraddon-patch.yaml")
                .display()
                .to_string(),
        ],
    )
    .await
    .unwrap();
    let agent = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(
        c2.clone(),
        testenv::stack::AGENT_NAMESPACE,
    );
    eventually(
        stack,
        "cluster2's agent redeployed autonomous and connected",
        || async {
            let d = agent
                .get(testenv::stack::AGENT)
                .await
                .map_err(|e| e.to_string())?;
            let args = d
                .spec
                .and_then(|s| s.template.spec)
                .and_then(|s| s.containers.first().cloned())
                .and_then(|c| c.args)
                .unwrap_or_default();
            let pods = stack.pods().await.map_err(|e| e.to_string())?;
            if args.iter().any(|a| a == "--mode=autonomous")
                && pods.get("cluster2").is_some_and(|p| p.ready)
            {
                Ok(())
            } else {
                Err(format!("{args:?} {pods:?}"))
            }
        },
    )
    .await;
    // An Application the cluster keeps itself shows up on the hub as a
    // read-only mirror, with the status its Argo CD reports.
    stack
        .apply_on(
            stack.cluster("cluster2"),
            &example("autonomous/application.yaml"),
        )
        .await
        .unwrap();
    let mirrors = Api::<DynamicObject>::namespaced_with(
        hub_client.clone(),
        "cluster2",
        &application_resource(),
    );
    eventually(
        stack,
        "the mirror of cluster2's own Application on the hub",
        || async {
            let m = get(&mirrors, "guestbook-local").await?;
            let ok = at(
                &m,
                &format!("/metadata/labels/{}", keys::MIRROR_OF.replace('/', "~1")),
            ) == "cluster2"
                && at(&m, "/status/sync/status") == "Synced"
                && at(&m, "/status/health/status") == "Healthy";
            if ok {
                Ok(())
            } else {
                Err(format!("{} {}", m["metadata"]["labels"], m["status"]))
            }
        },
    )
    .await;
}
