//! The gRPC transport under faults, on real API servers: connections cut
//! during churn (a TCP proxy between one agent and the hub), the hub killed
//! and restarted, an agent killed and restarted, with changes on both sides
//! while a part is down. After each, both sides show the desired state:
//! nothing lost, nothing duplicated (every sync ran exactly once), nothing
//! stuck.

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_pull_apis::keys;
use argocd_pull_spoke_agent::Mode;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::wait;

mod common;
mod grpc_env;
use common::{merge, set_source};
use grpc_env::{Env, Proxy, TIMEOUT};

const APPS: usize = 24;

fn name(i: usize) -> String {
    format!("app-{i}")
}

/// Even Applications go to cluster1 (through the proxy), odd to cluster2.
fn spoke_of(i: usize) -> usize {
    i % 2
}

/// Merge-patches hub Application `i`.
async fn edit(env: &Env, i: usize, patch: Value) {
    merge(&env.hub_apps(), &name(i), patch).await;
}

async fn set_revision(env: &Env, i: usize, revision: &str) {
    let patch = json!({ "spec": { "source": { "targetRevision": revision } } });
    edit(env, i, patch).await;
}

async fn set_spoke_message(env: &Env, i: usize, message: &str) {
    // It may not have arrived yet; the next round tries again.
    let _ = env
        .spoke_apps(spoke_of(i))
        .patch(
            &name(i),
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "status": { "health": { "status": "Healthy", "message": message } } }),
            ),
        )
        .await;
}

async fn sync(env: &Env, i: usize, revision: &str) {
    edit(
        env,
        i,
        json!({ "operation": { "sync": { "revision": revision } } }),
    )
    .await;
}

async fn converge(env: &Env, expected: &BTreeMap<String, usize>, what: &str) {
    wait::until(what, TIMEOUT, || env.converged(expected)).await;
}

#[tokio::test]
async fn nothing_is_lost_when_connections_hubs_or_agents_fail() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    env.start_hub(&[]).await;
    let proxy = Proxy::start(env.grpc_addr).await;
    let through_proxy = env.agent_config(0, &proxy.address(), Mode::Managed);
    env.start_agent_with(0, through_proxy);
    env.connect_agent(1).await;

    let mut expected = BTreeMap::new();
    for i in 0..APPS {
        let extra = if i % 4 == 0 {
            json!({ "finalizers": [keys::RESOURCES_FINALIZER] })
        } else {
            json!({})
        };
        env.create(&name(i), spoke_of(i), extra).await;
        expected.insert(name(i), spoke_of(i));
    }

    // 1. Churn on both sides while the connection keeps breaking.
    let churn = async {
        for round in 0..6 {
            for i in 0..APPS {
                set_revision(&env, i, &format!("r{round}")).await;
                set_spoke_message(&env, i, &format!("m{round}")).await;
            }
        }
    };
    let cuts = async {
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            proxy.cut();
        }
        proxy.set_down(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.set_down(false);
    };
    tokio::join!(churn, cuts);
    converge(
        &env,
        &expected,
        "convergence after churn through a cut connection",
    )
    .await;
    let spoke = env.spoke_apps(0).get(&name(0)).await.unwrap();
    assert_eq!(spoke.data["spec"]["source"]["targetRevision"], "r5");

    // A sync requested just before the connection breaks runs once.
    sync(&env, 2, "sync-cut").await;
    for _ in 0..3 {
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    converge(&env, &expected, "convergence after a sync across cuts").await;
    assert_eq!(
        env.spokes[0].argocd.syncs_of(&name(2)),
        vec!["sync-cut".to_string()]
    );

    // 2. The hub dies; both sides change meanwhile; it comes back.
    env.kill_hub().await;
    set_revision(&env, 4, "while-hub-down").await;
    set_spoke_message(&env, 6, "spoke-while-hub-down").await;
    sync(&env, 3, "sync-while-hub-down").await;
    env.hub_apps()
        .delete(&name(8), &DeleteParams::default())
        .await
        .unwrap(); // finalizer
    env.hub_apps()
        .delete(&name(9), &DeleteParams::default())
        .await
        .unwrap(); // none
    expected.remove(&name(8));
    expected.remove(&name(9));
    env.create("born-while-hub-down", 1, json!({})).await;
    expected.insert("born-while-hub-down".into(), 1);
    env.start_hub(&[]).await;
    converge(&env, &expected, "convergence after a hub restart").await;
    assert_eq!(
        env.spokes[1].argocd.syncs_of(&name(3)),
        vec!["sync-while-hub-down".to_string()]
    );
    assert!(env.spoke_apps(0).get_opt(&name(8)).await.unwrap().is_none());
    assert!(env.spoke_apps(1).get_opt(&name(9)).await.unwrap().is_none());

    // 3. An agent dies; both sides change meanwhile (including a local
    //    edit it must revert once back); it comes back.
    env.spokes[1].agent.take().unwrap().kill();
    set_revision(&env, 5, "while-agent-down").await;
    sync(&env, 11, "sync-while-agent-down").await;
    env.hub_apps()
        .delete(&name(7), &DeleteParams::default())
        .await
        .unwrap();
    expected.remove(&name(7));
    set_source(
        &env.spoke_apps(1),
        &name(13),
        "path",
        "edited-while-agent-down",
    )
    .await;
    set_spoke_message(&env, 15, "status-while-agent-down").await;
    env.start_agent(1, Mode::Managed);
    converge(&env, &expected, "convergence after an agent restart").await;
    assert_eq!(
        env.spokes[1].argocd.syncs_of(&name(11)),
        vec!["sync-while-agent-down".to_string()]
    );

    // Every sync ran exactly once, and no other ran at all.
    let runs: usize = env
        .spokes
        .iter()
        .map(|s| {
            s.argocd
                .syncs
                .lock()
                .unwrap()
                .values()
                .map(Vec::len)
                .sum::<usize>()
        })
        .sum();
    assert_eq!(runs, 3);
}
