//! The hub, not the agent, decides each agent's mode: real agents with
//! real certificates claim a mode, and the hub accepts only the one the
//! cluster's addon configuration (`AGENT_MODE` of its
//! AddOnDeploymentConfig) gives it; any other is refused, logged and
//! counted, with a message that says what to change.

use argocd_pull_spoke_agent::Mode;
use testenv::wait;

mod common;
mod grpc_env;
use grpc_env::{Env, TIMEOUT};

fn refusals(metrics: &str, cluster: &str) -> f64 {
    grpc_env::series::value(
        metrics,
        &format!("argocd_pull_hub_grpc_refused_total{{cluster=\"{cluster}\",reason=\"mode\"}} "),
    )
}

fn connected(env: &Env, i: usize) -> bool {
    env.spokes[i].agent.as_ref().is_some_and(|a| a.connected())
}

#[tokio::test]
async fn an_agent_claiming_another_mode_than_its_cluster_is_configured_for_is_refused() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    // cluster1 keeps the default (managed); cluster2 is configured autonomous.
    grpc_env::mode::configure(&env.hub_client, "cluster2", "autonomous").await;
    env.start_hub(&[]).await;

    // Each agent claims the other mode.
    env.start_agent(0, Mode::Autonomous);
    env.start_agent(1, Mode::Managed);
    let hub = env.hub_process.as_ref().unwrap();
    wait::until("both refusals counted", TIMEOUT, || async {
        let m = hub.metrics().await;
        match (refusals(&m, "cluster1"), refusals(&m, "cluster2")) {
            (a, b) if a >= 1.0 && b >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    env.assert_logged(
        "cluster cluster1 is configured for managed mode (the default: AddOnDeploymentConfig argocd-pull/argocd-pull does not set AGENT_MODE), and this agent runs in autonomous mode",
    );
    env.assert_logged(
        "cluster cluster2 is configured for autonomous mode (AGENT_MODE of AddOnDeploymentConfig argocd-pull/argocd-pull-cluster2), and this agent runs in managed mode",
    );
    assert!(!connected(&env, 0) && !connected(&env, 1));

    // The same agents in their configured modes are welcomed.
    for (i, mode) in [(0, Mode::Managed), (1, Mode::Autonomous)] {
        env.spokes[i].agent.take().unwrap().stop().await;
        env.start_agent(i, mode);
    }
    env.wait_connected().await;

    // A mode changed on the hub applies at the agent's next connection:
    // cluster1's managed agent, reconnecting, is refused.
    let before = refusals(&hub_metrics(&env).await, "cluster1");
    grpc_env::mode::configure(&env.hub_client, "cluster1", "autonomous").await;
    env.spokes[0].agent.take().unwrap().stop().await;
    env.start_agent(0, Mode::Managed);
    wait::until("the reconnecting agent refused", TIMEOUT, || async {
        match refusals(&hub_metrics(&env).await, "cluster1") {
            n if n > before => Ok(()),
            n => Err(n),
        }
    })
    .await;
    assert!(!connected(&env, 0));
    assert!(connected(&env, 1), "the other cluster is untouched");
}

async fn hub_metrics(env: &Env) -> String {
    env.hub_process.as_ref().unwrap().metrics().await
}
