//! Capability `terminal`: the hub's live endpoint takes argocd-server's
//! exec (its web terminal) as a WebSocket of `v5.channel.k8s.io`, opens it
//! on the cluster's agent, and relays its frames both ways by credits;
//! it refuses what argocd-server's terminal never sends, a cluster whose
//! agent runs without `--terminal`, sessions over the cluster's bound, and
//! ends an idle one. The agent is a raw client of the protocol, so that
//! the test sees every message; the hub is the hub-controller binary, the
//! user a WebSocket client of the endpoint as client-go's executor is.

mod common;
mod grpc_env;

use std::time::Duration;

use argocd_pull_proto::v1::{
    AgentMessage, HubMessage, ObjectKey, TerminalClose, TerminalData, TerminalOpen, TerminalOpened,
    agent_message, hub_message,
};
use argocd_pull_proto::version;
use common::grpc_client::{self, hello};
use futures::SinkExt;
use grpc_env::terminal::{Ws, closed_with, next_frame, open};
use grpc_env::{Env, TIMEOUT};
use kube::api::ListParams;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "live-token-of-the-terminal-test";
/// argocd-server's exec, as client-go's WebSocket executor sends it.
const EXEC: &str = "/api/v1/namespaces/guestbook/pods/web-1/exec?command=sh&container=main&stderr=true&stdin=true&stdout=true&tty=true";

type Agent = (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<HubMessage>,
);

/// A raw agent of cluster `i` of `env` offering `live-views`, and
/// `terminal` when `terminal`.
async fn agent(env: &Env, i: usize, terminal: bool) -> Agent {
    let identity = testenv::pki::CertKey {
        cert_pem: std::fs::read_to_string(&env.spokes[i].certs.cert).unwrap(),
        key_pem: std::fs::read_to_string(&env.spokes[i].certs.key).unwrap(),
    };
    let mut first = hello(1, 1);
    if let Some(agent_message::Kind::Hello(h)) = &mut first.kind {
        h.capabilities.push(version::CAPABILITY_LIVE_VIEWS.into());
        if terminal {
            h.capabilities.push(version::CAPABILITY_TERMINAL.into());
        }
    }
    let (tx, inbound, welcome) =
        grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, &identity, first)
            .await
            .unwrap();
    let Some(hub_message::Kind::Welcome(welcome)) = welcome.kind else {
        panic!("no Welcome: {welcome:?}");
    };
    let agreed = welcome
        .capabilities
        .iter()
        .any(|c| c == version::CAPABILITY_TERMINAL);
    assert_eq!(agreed, terminal, "{:?}", welcome.capabilities);
    (tx, inbound)
}

/// The next terminal message for the agent.
async fn next_terminal(inbound: &mut tonic::Streaming<HubMessage>) -> hub_message::Kind {
    loop {
        let m = tokio::time::timeout(TIMEOUT, grpc_client::next(inbound))
            .await
            .expect("a terminal message in time")
            .unwrap();
        match m.kind {
            Some(
                k @ (hub_message::Kind::TerminalOpen(_)
                | hub_message::Kind::TerminalData(_)
                | hub_message::Kind::TerminalCredit(_)
                | hub_message::Kind::TerminalClose(_)),
            ) => return k,
            _ => continue,
        }
    }
}

async fn send(tx: &tokio::sync::mpsc::Sender<AgentMessage>, kind: agent_message::Kind) {
    tx.send(AgentMessage { kind: Some(kind) }).await.unwrap();
}

/// The agent opens the session of `open` as the delivered copy `key` of
/// hub uid `uid`.
async fn opened(agent: &Agent, open: &TerminalOpen, key: &ObjectKey, uid: &str) {
    let opened = TerminalOpened {
        id: open.id,
        key: Some(key.clone()),
        hub_uid: uid.into(),
        window: 4,
    };
    send(&agent.0, agent_message::Kind::TerminalOpened(opened)).await;
}

async fn expect_open(agent: &mut Agent) -> TerminalOpen {
    match next_terminal(&mut agent.1).await {
        hub_message::Kind::TerminalOpen(o) => o,
        other => panic!("not a TerminalOpen: {other:?}"),
    }
}

/// The Events of the hub Application `name` in `ns`, by reason.
async fn events(env: &Env, name: &str) -> Vec<(String, String)> {
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.hub_client.clone(), &env.team);
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// The upsert of the hub Application the agent gets: its key and hub uid.
async fn delivered(agent: &mut Agent) -> (ObjectKey, String) {
    loop {
        let m = tokio::time::timeout(TIMEOUT, grpc_client::next(&mut agent.1))
            .await
            .expect("an upsert in time")
            .unwrap();
        if let Some(hub_message::Kind::Upsert(u)) = m.kind {
            let uid = u.meta.as_ref().map(|m| m.uid.clone()).unwrap_or_default();
            return (u.key.unwrap(), uid);
        }
    }
}

/// Input and output of session `id` pass as they are, by credits.
async fn relays_by_credits(ws: &mut Ws, agent1: &mut Agent, id: u64) {
    // Input goes to the agent as it was typed.
    ws.send(Message::Binary(b"\x00echo hello\n".to_vec().into()))
        .await
        .unwrap();
    match next_terminal(&mut agent1.1).await {
        hub_message::Kind::TerminalData(d) => assert_eq!(d.frame, b"\x00echo hello\n"),
        other => panic!("not the input: {other:?}"),
    }
    // Output comes to the user; what the user took is granted back.
    for n in 0..8u8 {
        let frame = [b"\x01hello ".as_slice(), &[b'0' + n]].concat();
        let data = TerminalData { id, frame };
        send(&agent1.0, agent_message::Kind::TerminalData(data)).await;
    }
    for n in 0..8u8 {
        assert_eq!(
            next_frame(ws).await,
            [b"\x01hello ".as_slice(), &[b'0' + n]].concat()
        );
    }
    let mut granted = 0;
    while granted < 8 {
        match next_terminal(&mut agent1.1).await {
            hub_message::Kind::TerminalCredit(c) => granted += c.frames,
            other => panic!("not a credit: {other:?}"),
        }
    }
    // Past its window (4, as the agent opened it, one taken by the
    // first line), the user's input waits for the agent's credit.
    for n in 0..6u8 {
        ws.send(Message::Binary(vec![0, b'a' + n].into()))
            .await
            .unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        match next_terminal(&mut agent1.1).await {
            hub_message::Kind::TerminalData(d) => got.push(d.frame),
            other => panic!("not input: {other:?}"),
        }
    }
    let credit = argocd_pull_proto::v1::TerminalCredit { id, frames: 3 };
    send(&agent1.0, agent_message::Kind::TerminalCredit(credit)).await;
    while got.len() < 6 {
        match next_terminal(&mut agent1.1).await {
            hub_message::Kind::TerminalData(d) => got.push(d.frame),
            other => panic!("not input: {other:?}"),
        }
    }
    assert_eq!(got[5], [0, b'f']);
}

/// The hub Application `name` records a session's opening and its end.
async fn audited(env: &Env, name: &str) {
    // Recorded on the hub Application: its opening and its end.
    let until = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let seen = events(env, name).await;
        let reasons: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
        if reasons.contains(&"TerminalOpened") && reasons.contains(&"TerminalClosed") {
            let note = &seen.iter().find(|(r, _)| r == "TerminalOpened").unwrap().1;
            assert!(
                note.contains("guestbook/web-1") && note.contains("container main"),
                "{note}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no audit Events: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    env.assert_logged("a web terminal opened in pod guestbook/web-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_relays_both_ways_by_credits_and_is_audited() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    let (addr, ca) = grpc_env::live::start_hub(
        &mut env,
        TOKEN,
        &[
            "--terminal-sessions-per-cluster=1",
            "--terminal-idle-timeout=3s",
        ],
    )
    .await;
    let mut agent1 = agent(&env, 0, true).await;
    let _agent2 = agent(&env, 1, false).await;
    env.create("web", 0, json!({})).await;
    let (key, uid) = delivered(&mut agent1).await;

    // The user's exec reaches the agent as argocd-server asked it.
    let user = tokio::spawn(async move { open(addr, &ca, TOKEN, "cluster1", EXEC).await });
    let open_msg = expect_open(&mut agent1).await;
    assert_eq!(
        (
            open_msg.namespace.as_str(),
            open_msg.pod.as_str(),
            open_msg.container.as_str()
        ),
        ("guestbook", "web-1", "main")
    );
    assert_eq!(open_msg.command, ["sh"]);
    assert!(open_msg.tty && open_msg.stdin && open_msg.stdout && open_msg.stderr);
    assert_eq!(open_msg.idle_seconds, 3);
    opened(&agent1, &open_msg, &key, &uid).await;
    let mut ws = user.await.unwrap().expect("the upgrade");

    relays_by_credits(&mut ws, &mut agent1, open_msg.id).await;

    // A second session of cluster1 is over its bound.
    let (code, body) = open(addr, &env_ca(&env), TOKEN, "cluster1", EXEC)
        .await
        .unwrap_err();
    assert_eq!(code, 429, "{body}");
    assert!(body.contains("--terminal-sessions-per-cluster"), "{body}");

    // The command ends on the cluster: the user's WebSocket closes.
    let close = TerminalClose {
        id: open_msg.id,
        code: 200,
        reason: "the command ended".into(),
    };
    send(&agent1.0, agent_message::Kind::TerminalClose(close)).await;
    assert_eq!(closed_with(&mut ws).await, "the command ended");

    audited(&env, "web").await;

    // An idle session is ended, and the agent told.
    let ca = env_ca(&env);
    let user = tokio::spawn(async move { open(addr, &ca, TOKEN, "cluster1", EXEC).await });
    let open_msg = expect_open(&mut agent1).await;
    opened(&agent1, &open_msg, &key, &uid).await;
    let mut ws = user.await.unwrap().expect("the upgrade");
    assert!(
        closed_with(&mut ws)
            .await
            .contains("--terminal-idle-timeout")
    );
    match next_terminal(&mut agent1.1).await {
        hub_message::Kind::TerminalClose(c) => {
            assert_eq!((c.id, c.code), (open_msg.id, 408), "{}", c.reason)
        }
        other => panic!("the agent was not told: {other:?}"),
    }
}

fn env_ca(env: &Env) -> String {
    std::fs::read_to_string(env.dir.path().join("ca.crt")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_refused_before_it_reaches_a_pod_it_may_not() {
    let mut env = Env::new(&["cluster1", "cluster2"]).await;
    let (addr, ca) = grpc_env::live::start_hub(&mut env, TOKEN, &[]).await;
    let mut agent1 = agent(&env, 0, true).await;
    let _agent2 = agent(&env, 1, false).await;

    // Without the token.
    let (code, _) = open(addr, &ca, "not-the-token", "cluster1", EXEC)
        .await
        .unwrap_err();
    assert_eq!(code, 401);
    // A cluster whose agent runs without --terminal: off, and why.
    let (code, body) = open(addr, &ca, TOKEN, "cluster2", EXEC).await.unwrap_err();
    assert_eq!(code, 501, "{body}");
    assert!(
        body.contains("--terminal") && body.contains("TERMINAL=true"),
        "{body}"
    );
    // What argocd-server's terminal never asks: another subresource, a
    // query it never sends.
    let attach = EXEC.replace("/exec?", "/attach?");
    let (code, _) = open(addr, &ca, TOKEN, "cluster1", &attach)
        .await
        .unwrap_err();
    assert_eq!(code, 403);
    let extra = format!("{EXEC}&input=x");
    let (code, _) = open(addr, &ca, TOKEN, "cluster1", &extra)
        .await
        .unwrap_err();
    assert_eq!(code, 400);
    // SPDY (client-go's fallback, a POST): WebSocket only.
    let reader = grpc_env::live::client(&format!("https://{addr}/clusters/cluster1"), &ca, TOKEN);
    let spdy = http::Request::post(EXEC)
        .header("upgrade", "SPDY/3.1")
        .header("connection", "Upgrade")
        .body(Vec::new())
        .unwrap();
    let (code, message) = grpc_env::live::refused(reader.request_text(spdy).await);
    assert_eq!(code, 405, "{message}");
    // A pod the agent does not exec into: its refusal, as it said it.
    let user = tokio::spawn(async move { open(addr, &ca, TOKEN, "cluster1", EXEC).await });
    let open_msg = expect_open(&mut agent1).await;
    let refusal = TerminalClose {
        id: open_msg.id,
        code: 403,
        reason: "pod guestbook/web-1 belongs to no Application this agent applied".into(),
    };
    send(&agent1.0, agent_message::Kind::TerminalClose(refusal)).await;
    let (code, body) = user.await.unwrap().unwrap_err();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("belongs to no Application"), "{body}");
}
