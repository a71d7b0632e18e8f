//! Certificate rotation on real API servers, the way OCM does it: the
//! agent's certificate and key files are replaced on disk and the agent
//! picks them up without a restart. A certificate that expires while
//! connected ends the stream on the hub; the agent waits for a renewed one
//! and then catches up on what changed meanwhile.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use testenv::wait;

mod common;
mod grpc_env;
use common::set_source;
use grpc_env::{Env, TIMEOUT, agent_subject};

/// Replaces the agent's certificate and key the way a Secret volume
/// update does: new files renamed into place.
fn rotate(env: &Env, pair: &testenv::pki::CertKey) {
    let certs = &env.spokes[0].certs;
    let tmp = env.dir.path().join("rotating");
    std::fs::write(&tmp, &pair.key_pem).unwrap();
    std::fs::rename(&tmp, &certs.key).unwrap();
    std::fs::write(&tmp, &pair.cert_pem).unwrap();
    std::fs::rename(&tmp, &certs.cert).unwrap();
}

async fn set_revision(env: &Env, revision: &str) {
    set_source(&env.hub_apps(), "alpha", "targetRevision", revision).await;
}

fn connections(env: &Env) -> usize {
    env.hub_log()
        .lines()
        .filter(|l| l.contains("agent connected cluster=cluster1"))
        .count()
}

/// Waits until cluster1's agent has connected `n` times, `what`.
async fn wait_connections(env: &Env, n: usize, what: &str) {
    wait::until(what, TIMEOUT, || async {
        match connections(env) {
            now if now == n => Ok(()),
            now => Err(now),
        }
    })
    .await;
}

#[tokio::test]
async fn rotated_certificates_are_picked_up_without_a_restart() {
    let env = Env::managed(&["cluster1"]).await;
    env.create("alpha", 0, json!({})).await;
    let expected: BTreeMap<String, usize> = [("alpha".to_string(), 0)].into();
    wait::until("alpha delivered", TIMEOUT, || env.converged(&expected)).await;
    assert_eq!(connections(&env), 1);

    // OCM renews the certificate: the agent reconnects with the new one.
    let subject = agent_subject("cluster1");
    rotate(&env, &env.ca.client(&subject, None).unwrap());
    wait_connections(&env, 2, "a connection with the renewed certificate").await;
    let agent = env.spokes[0].agent.as_ref().unwrap();
    assert_eq!(agent.metrics.certificate_reloads.get(), 1);
    set_revision(&env, "after-rotation").await;
    wait::until("delivered over the new connection", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;

    // A certificate that expires while connected: the hub ends the stream,
    // the agent refuses to dial with it and waits.
    rotate(
        &env,
        &env.ca
            .client_expiring(&subject, Duration::from_secs(15))
            .unwrap(),
    );
    wait_connections(&env, 3, "a connection with the short-lived certificate").await;
    wait::until("the hub to end the stream at expiry", TIMEOUT, || async {
        let log = env.hub_log();
        let ended = log.lines().any(|l| {
            l.contains("cluster=cluster1") && l.contains("reason=\"certificate-expired\"")
        });
        let agent = env.spokes[0].agent.as_ref().unwrap();
        if ended && !agent.connected() {
            Ok(())
        } else {
            Err(format!("ended {ended}"))
        }
    })
    .await;
    set_revision(&env, "while-expired").await;

    // The renewal arrives: the agent reconnects on its own and catches up.
    rotate(&env, &env.ca.client(&subject, None).unwrap());
    env.wait_connected().await;
    wait::until("caught up after the renewal", TIMEOUT, || {
        env.converged(&expected)
    })
    .await;
    let spoke = env.spoke_apps(0).get("alpha").await.unwrap();
    assert_eq!(
        spoke.data["spec"]["source"]["targetRevision"],
        "while-expired"
    );
}
