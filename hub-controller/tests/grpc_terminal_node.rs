//! Capability `terminal` on a real node: the user's exec goes through the
//! hub's live endpoint, the gRPC stream and the spoke-agent (in-process,
//! `--live-views --terminal`) to the managed cluster's API server, its
//! kubelet and containerd, and the command's output comes back; a pod of
//! no Application the agent applied is refused by the agent. The pod runs
//! the harness's ticker image (no shell: the command exec'd is the ticker
//! itself, which writes its first line at once).

mod common;
mod grpc_env;

use std::time::Duration;

use argocd_pull_spoke_agent::Mode;
use futures::SinkExt;
use grpc_env::terminal::{next_frame, open};
use grpc_env::{Env, TIMEOUT};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use testenv::node::Node;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "live-token-of-the-terminal-node-test";
const NS: &str = "guestbook";

/// A pod of the ticker image named `name`, tracked (Argo CD's annotation)
/// as Application `tracked_by`'s when given.
fn ticker_pod(name: &str, tracked_by: Option<&str>) -> Pod {
    let annotations = match tracked_by {
        Some(app) => json!({ "argocd.argoproj.io/tracking-id": format!("{app}:/Pod:{NS}/{name}") }),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "namespace": NS, "annotations": annotations },
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "ticker",
                "image": format!("argocd-pull-ticker:{}", env!("CARGO_PKG_VERSION")),
                "imagePullPolicy": "Never",
                "args": [name],
                "securityContext": {
                    "runAsNonRoot": true,
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": { "drop": ["ALL"] },
                },
            }],
        },
    }))
    .unwrap()
}

/// Creates `pods` on the spoke (once its namespace's ServiceAccount is
/// there) and waits until each container runs.
async fn running(pods: &Api<Pod>, wanted: &[Pod]) {
    for pod in wanted {
        testenv::wait::until("the pod to be created", TIMEOUT, || async {
            match pods.create(&PostParams::default(), pod).await {
                Ok(_) => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }
    for pod in wanted {
        let name = pod.metadata.name.clone().unwrap();
        testenv::wait::until(
            "the pod's container to run",
            Duration::from_secs(90),
            || async {
                let p = pods.get(&name).await.map_err(|e| e.to_string())?;
                let runs = p
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .and_then(|c| c.state.as_ref())
                    .is_some_and(|s| s.running.is_some());
                if runs {
                    Ok(())
                } else {
                    Err(format!("{name}: {:?}", p.status))
                }
            },
        )
        .await;
    }
}

/// The exec argocd-server would ask of pod `pod`, with the ticker as the
/// command, writing `word`.
fn exec(pod: &str, word: &str) -> String {
    format!(
        "/api/v1/namespaces/{NS}/pods/{pod}/exec?command=%2Fusr%2Flocal%2Fbin%2Fticker&command={word}&container=ticker&stderr=true&stdout=true"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_reaches_a_pod_of_an_application_the_agent_applied_on_a_real_node() {
    let mut env = Env::new(&["cluster1"]).await;
    let (addr, ca) = grpc_env::live::start_hub(&mut env, TOKEN, &[]).await;
    let testenv = testenv::paths::own_binary("testenv")
        .expect("the harness's binary: cargo build -p argocd-pull-test --bin testenv");
    let mut node = Node::start("terminal-node")
        .await
        .expect("containerd starts");
    node.join(&env.spokes[0].cluster, &testenv)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut config = env.agent_config(0, &env.hub_address(), Mode::Managed);
    config.live.views = true;
    config.live.terminal = true;
    env.start_agent_with(0, config);
    env.wait_connected().await;
    env.create("web", 0, json!({})).await;
    let spoke_apps = env.spoke_apps(0);
    testenv::wait::until("the delivered copy", TIMEOUT, || async {
        spoke_apps
            .get("web")
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    env.spokes[0].cluster.ensure_namespace(NS).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(env.spokes[0].client.clone(), NS);
    running(
        &pods,
        &[
            ticker_pod("web-1", Some("web")),
            ticker_pod("stray-1", None),
        ],
    )
    .await;

    // The command's output, from containerd through the kubelet, the API
    // server, the agent and the hub.
    let word = format!("hello-{}", std::process::id());
    let mut ws = open(addr, &ca, TOKEN, "cluster1", &exec("web-1", &word))
        .await
        .unwrap_or_else(|(code, body)| panic!("{code}: {body}"));
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains(&format!("{word} 1")) {
        let frame = next_frame(&mut ws).await;
        assert_eq!(frame[0], 1, "stdout: {frame:?}");
        out.extend_from_slice(&frame[1..]);
    }
    env.assert_logged(&format!(
        "a web terminal opened in pod {NS}/web-1 container ticker"
    ));
    // The user closes it: the session ends at the hub (and the agent).
    ws.send(Message::Close(None)).await.unwrap();
    let closed = format!(
        "the web terminal in pod {NS}/web-1 container ticker of cluster cluster1 closed after"
    );
    testenv::wait::until("the session's end", TIMEOUT, || async {
        if env.hub_log().contains(&closed) {
            Ok(())
        } else {
            Err("not closed")
        }
    })
    .await;

    // A pod no Application the agent applied tracks: the agent refuses.
    let (code, body) = open(addr, &ca, TOKEN, "cluster1", &exec("stray-1", &word))
        .await
        .unwrap_err();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("belongs to no Application"), "{body}");
    drop(node);
}
