//! The argocd-pull addon against real OCM: `clusteradm addon enable` on a
//! hub running OCM's registration, placement and addon-manager, two
//! managed clusters joined for real with their registration and work
//! agents and a real node each, where the agent runs as the pod OCM
//! deploys, and the hub-controller binary keeping the certificates (the
//! fixtures: `common/addon.rs`). Install with
//! Placements, uninstall and refusals of OCM-issued certificates:
//! `addon_lifecycle.rs`.

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use testenv::wait;

mod common;
use common::addon::{AGENT_NS, AddonHub, TIMEOUT, client_cert};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clusteradm_addon_enable_deploys_registers_and_connects_the_agent() {
    testenv::init_tracing();
    let hub = AddonHub::start().await;
    let fleet = hub.fleet;

    // What a user types.
    hub.clusteradm_addon("enable", "cluster1,cluster2").await;
    let agents = hub.agents_deployed_and_connected().await;

    // Applications go over gRPC to the cluster they name, status comes back.
    let team = fleet.hub.cluster().namespace("team").await.unwrap();
    let spoke_uids = hub.deliver_over_grpc(&team).await;

    // Rotation: the klusterlet's certificate Secret goes (as when OCM
    // renews it); the real CSR flow issues a new one, the kubelet copies it
    // into the pod's files, and the agent reconnects with it without a
    // restart.
    let spoke1 = fleet.cluster("cluster1");
    let spoke1_secrets: Api<Secret> = Api::namespaced(spoke1.client().await.unwrap(), AGENT_NS);
    let cert_name = argocd_pull_addon::client_cert_secret();
    let before = client_cert(&spoke1_secrets.get(&cert_name).await.unwrap());
    spoke1_secrets
        .delete(&cert_name, &Default::default())
        .await
        .unwrap();
    let renewed = wait::until(
        "a new certificate for cluster1's agent",
        TIMEOUT,
        || async {
            let now = spoke1_secrets
                .get_opt(&cert_name)
                .await
                .map_err(|e| e.to_string())?
                .map(|s| client_cert(&s))
                .unwrap_or_default();
            if !now.is_empty() && now != before {
                Ok(now)
            } else {
                Err("the same certificate, or none".to_string())
            }
        },
    )
    .await;
    hub.connected_with("cluster1", &renewed).await;
    agents[0]
        .shows("cluster1's agent pod Ready, never restarted", |s| {
            s.connected && s.restarts == 0
        })
        .await;
    // Nothing dropped: a status change after the rotation still arrives.
    hub.status_reaches_hub(&team, "cluster1", "Progressing")
        .await;

    // Disable on cluster2: OCM removes the agent there; its Application
    // falls back to a ManifestWork without being deleted on the spoke.
    hub.clusteradm_addon("disable", "cluster2").await;
    agents[1]
        .shows("cluster2's agent pod removed by OCM", |s| !s.running)
        .await;
    hub.fell_back_to_manifest_work(&team, "cluster2", &spoke_uids[1])
        .await;
    // cluster1 is untouched.
    assert!(agents[0].now().await.unwrap().connected);

    let hub_log = hub.hub_log();
    assert!(
        !hub_log.contains("refused an agent's client certificate"),
        "the hub refused an OCM-issued certificate:\n{hub_log}"
    );
}
