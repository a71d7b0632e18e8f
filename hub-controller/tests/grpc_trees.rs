//! Capability `trees`, the hub's half: what an agent reports of its
//! cluster's Argo CD (the whole tree, children included, and the managed
//! resources with their live and desired states) reaches the hub's real
//! argocd-server, through the hub-controller binary with `--argocd-redis`:
//! its API's `resource-tree` shows the children under their owners, and
//! `managed-resources` the live state. A tree for another hub Application
//! (an old uid) is refused and changes nothing. The agent here is a raw
//! client of the protocol, so that the test controls exactly what it says.

mod common;
mod grpc_env;

use argocd_pull_proto::v1::{AgentMessage, ResourceTreeReport, agent_message, hub_message};
use argocd_pull_proto::version;
use common::grpc_client::{self, hello};
use grpc_env::{Env, TIMEOUT};
use http::Method;
use serde_json::{Value, json};
use testenv::argocd::{Server, ServerOptions};
use testenv::wait;

fn tree(hub_uid: &str, key: argocd_pull_proto::v1::ObjectKey, pod: &str) -> AgentMessage {
    let nodes = json!({ "nodes": [
        { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
          "name": "guestbook-ui", "uid": "spoke-d", "health": { "status": "Healthy" } },
        { "group": "apps", "version": "v1", "kind": "ReplicaSet", "namespace": "guestbook",
          "name": "guestbook-ui-5d", "uid": "spoke-rs", "health": { "status": "Healthy" },
          "parentRefs": [{ "group": "apps", "kind": "Deployment", "namespace": "guestbook",
                           "name": "guestbook-ui", "uid": "spoke-d" }] },
        { "version": "v1", "kind": "Pod", "namespace": "guestbook", "name": pod,
          "uid": "spoke-p", "health": { "status": "Healthy" },
          "parentRefs": [{ "group": "apps", "kind": "ReplicaSet", "namespace": "guestbook",
                           "name": "guestbook-ui-5d", "uid": "spoke-rs" }] },
    ]});
    let live = json!({ "apiVersion": "apps/v1", "kind": "Deployment",
                       "metadata": { "name": "guestbook-ui", "namespace": "guestbook" },
                       "spec": { "replicas": 1 } });
    let managed = json!([{ "group": "apps", "kind": "Deployment", "namespace": "guestbook",
                           "name": "guestbook-ui", "liveState": live.to_string(),
                           "targetState": live.to_string() }]);
    AgentMessage {
        kind: Some(agent_message::Kind::Tree(ResourceTreeReport {
            key: Some(key),
            hub_uid: hub_uid.into(),
            tree_json: serde_json::to_vec(&nodes).unwrap(),
            managed_resources_json: serde_json::to_vec(&managed).unwrap(),
        })),
    }
}

/// `kind/name <- parent kind` of each node argocd-server's tree has, sorted.
async fn nodes(server: &Server, token: &str, app: &str, ns: &str) -> Result<Vec<String>, String> {
    let (code, tree) = server
        .api(
            Method::GET,
            &format!("/api/v1/applications/{app}/resource-tree?appNamespace={ns}"),
            Some(token),
            None,
        )
        .await
        .map_err(|e| e.to_string())?;
    if code != 200 {
        return Err(format!("{code}: {tree}"));
    }
    let mut out: Vec<String> = tree["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            let parent = n
                .pointer("/parentRefs/0/kind")
                .and_then(Value::as_str)
                .unwrap_or("-");
            let uid = n.get("uid").and_then(Value::as_str).unwrap_or("");
            format!(
                "{}/{} <- {parent}{uid}",
                n["kind"].as_str().unwrap_or(""),
                n["name"].as_str().unwrap_or("")
            )
        })
        .collect();
    out.sort();
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn argocd_server_shows_the_tree_and_live_states_an_agent_reports() {
    let mut env = Env::new(&["cluster1"]).await;
    let server = Server::start(&env.hub, ServerOptions::default())
        .await
        .expect("argocd-server starts on the hub");
    let redis = server.redis().to_string();
    env.start_hub(&["--argocd-redis", &redis]).await;
    let token = server
        .login("admin", server.admin_password())
        .await
        .unwrap();

    let app = env.create("guestbook", 0, json!({})).await;
    let uid = app.metadata.uid.clone().unwrap();
    let ns = env.team.clone();

    // cluster1's agent, offering `trees`.
    let identity = testenv::pki::CertKey {
        cert_pem: std::fs::read_to_string(&env.spokes[0].certs.cert).unwrap(),
        key_pem: std::fs::read_to_string(&env.spokes[0].certs.key).unwrap(),
    };
    let mut first = hello(1, 1);
    if let Some(agent_message::Kind::Hello(h)) = &mut first.kind {
        h.capabilities.push(version::CAPABILITY_TREES.into());
    }
    let (tx, mut inbound, welcome) =
        grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, &identity, first)
            .await
            .unwrap();
    let Some(hub_message::Kind::Welcome(welcome)) = welcome.kind else {
        panic!("no Welcome: {welcome:?}");
    };
    assert!(
        welcome
            .capabilities
            .iter()
            .any(|c| c == version::CAPABILITY_TREES),
        "a hub with --argocd-redis offers trees: {:?}",
        welcome.capabilities
    );
    let key = loop {
        let m = grpc_client::next(&mut inbound).await.unwrap();
        if let Some(hub_message::Kind::Upsert(u)) = m.kind {
            break u.key.unwrap();
        }
    };

    tx.send(tree(&uid, key.clone(), "guestbook-ui-5d-abc"))
        .await
        .unwrap();
    let want = vec![
        "Deployment/guestbook-ui <- -".to_string(),
        "Pod/guestbook-ui-5d-abc <- ReplicaSet".to_string(),
        "ReplicaSet/guestbook-ui-5d <- Deployment".to_string(),
    ];
    wait::until("the reported tree in argocd-server", TIMEOUT, || async {
        wait::equal(
            nodes(&server, &token, "guestbook", &ns).await,
            Ok(want.clone()),
        )
    })
    .await;

    // The live state, as `argocd app manifests --source live` reads it.
    let (code, managed) = server
        .api(
            Method::GET,
            &format!("/api/v1/applications/guestbook/managed-resources?appNamespace={ns}"),
            Some(&token),
            None,
        )
        .await
        .unwrap();
    assert_eq!(code, 200, "{managed}");
    let live: Value = serde_json::from_str(
        managed
            .pointer("/items/0/liveState")
            .and_then(Value::as_str)
            .unwrap_or("null"),
    )
    .unwrap();
    assert_eq!(live["spec"]["replicas"], 1, "{managed}");

    // A tree for another hub Application (an old uid) is refused; the next
    // one of the right uid replaces the first.
    tx.send(tree("some-older-uid", key.clone(), "forged"))
        .await
        .unwrap();
    tx.send(tree(&uid, key.clone(), "guestbook-ui-5d-def"))
        .await
        .unwrap();
    let want = vec![
        "Deployment/guestbook-ui <- -".to_string(),
        "Pod/guestbook-ui-5d-def <- ReplicaSet".to_string(),
        "ReplicaSet/guestbook-ui-5d <- Deployment".to_string(),
    ];
    wait::until("the second tree in argocd-server", TIMEOUT, || async {
        wait::equal(
            nodes(&server, &token, "guestbook", &ns).await,
            Ok(want.clone()),
        )
    })
    .await;
    env.assert_logged("refused a resource tree");
}
