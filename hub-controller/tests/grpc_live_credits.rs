//! Capability `live-credits`: the answer to a live read flows by credits,
//! so that a reader slower than the cluster (a followed log read slowly)
//! holds the agent back instead of being cut off. The agent here is a raw
//! client of the protocol, so that the test controls how fast it sends and
//! sees every credit; the hub is the hub-controller binary with its live
//! endpoint, and the reader a Kubernetes client of it that stops reading
//! for a while. An agent without the capability is cut off, as before.

mod common;
mod grpc_env;

use std::time::Duration;

use argocd_pull_proto::v1::{AgentMessage, LiveResponse, agent_message, hub_message};
use argocd_pull_proto::version;
use common::grpc_client::{self, hello};
use futures::AsyncReadExt;
use grpc_env::{Env, TIMEOUT};

/// Chunks the agent sends in all (three windows and more), and the size of
/// each: more than the sockets between the hub and the reader hold.
const CHUNKS: usize = 120;
const CHUNK: usize = 200 * 1024;

fn chunk(id: u64, n: usize, last: bool) -> AgentMessage {
    let mut body = vec![b'.'; CHUNK];
    let mark = format!("chunk {n:05} ");
    body[..mark.len()].copy_from_slice(mark.as_bytes());
    AgentMessage {
        kind: Some(agent_message::Kind::LiveResponse(LiveResponse {
            id,
            http_status: 200,
            content_type: "text/plain".into(),
            body,
            last,
        })),
    }
}

/// The hub with its live endpoint; cluster1's raw agent offering
/// `live-views`, and `live-credits` when `credits`; a client of the
/// endpoint's cluster1 path.
async fn hub_and_agent(
    env: &mut Env,
    credits: bool,
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<argocd_pull_proto::v1::HubMessage>,
    kube::Client,
) {
    let token = "live-token-of-the-credits-test";
    let (addr, ca_pem) = grpc_env::live::start_hub(env, token, &[]).await;
    let identity = testenv::pki::CertKey {
        cert_pem: std::fs::read_to_string(&env.spokes[0].certs.cert).unwrap(),
        key_pem: std::fs::read_to_string(&env.spokes[0].certs.key).unwrap(),
    };
    let mut first = hello(1, 1);
    if let Some(agent_message::Kind::Hello(h)) = &mut first.kind {
        h.capabilities.push(version::CAPABILITY_LIVE_VIEWS.into());
        if credits {
            h.capabilities.push(version::CAPABILITY_LIVE_CREDITS.into());
        }
    }
    let (tx, inbound, welcome) =
        grpc_client::open(&env.hub_address(), &env.ca.pem.cert_pem, &identity, first)
            .await
            .unwrap();
    let Some(hub_message::Kind::Welcome(welcome)) = welcome.kind else {
        panic!("no Welcome: {welcome:?}");
    };
    // Agreed when both offer it: a hub with a live endpoint does.
    assert_eq!(
        welcome
            .capabilities
            .iter()
            .any(|c| c == version::CAPABILITY_LIVE_CREDITS),
        credits,
        "{:?}",
        welcome.capabilities
    );
    let reader =
        grpc_env::live::client(&format!("https://{addr}/clusters/cluster1"), &ca_pem, token);
    (tx, inbound, reader)
}

/// A followed log's read, as argocd-server sends it.
fn follow() -> http::Request<Vec<u8>> {
    http::Request::get("/api/v1/namespaces/guestbook/pods/chatty/log?follow=true")
        .body(Vec::new())
        .unwrap()
}

/// The followed log through `reader`, which takes the first chunk, then
/// nothing for 3 s, then the rest: what arrived, and how the answer ended.
async fn read_with_a_pause(reader: kube::Client) -> (Vec<u8>, std::io::Result<usize>) {
    let body = reader.request_stream(follow()).await.unwrap();
    futures::pin_mut!(body);
    let mut read = vec![0u8; CHUNK];
    body.read_exact(&mut read).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut rest = Vec::new();
    let ended = body.read_to_end(&mut rest).await;
    read.extend(rest);
    (read, ended)
}

/// The next live message for the agent (a request, a credit or a cancel).
async fn next_live(
    inbound: &mut tonic::Streaming<argocd_pull_proto::v1::HubMessage>,
) -> hub_message::Kind {
    loop {
        let m = grpc_client::next(inbound).await.unwrap();
        match m.kind {
            Some(
                k @ (hub_message::Kind::LiveRequest(_)
                | hub_message::Kind::LiveCredit(_)
                | hub_message::Kind::LiveCancel(_)),
            ) => return k,
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_holds_the_agent_back_by_credits_and_gets_every_chunk() {
    let mut env = Env::new(&["cluster1"]).await;
    let (tx, mut inbound, reader) = hub_and_agent(&mut env, true).await;
    let read = tokio::spawn(read_with_a_pause(reader));
    let hub_message::Kind::LiveRequest(request) = next_live(&mut inbound).await else {
        panic!("no LiveRequest first");
    };
    assert_eq!(request.window, 32, "the window of an agent with credits");
    // The agent sends while it has credit, and waits for more when it has
    // none: what it sent and was not granted back never passes the window.
    let mut credit = request.window as usize;
    let mut waited = 0;
    for n in 0..CHUNKS {
        while credit == 0 {
            waited += 1;
            match next_live(&mut inbound).await {
                hub_message::Kind::LiveCredit(c) => {
                    assert_eq!(c.id, request.id);
                    credit += c.chunks as usize;
                }
                other => panic!("a slow reader was cut off: {other:?}"),
            }
        }
        credit -= 1;
        tx.send(chunk(request.id, n, n + 1 == CHUNKS))
            .await
            .unwrap();
    }
    let (body, ended) = tokio::time::timeout(TIMEOUT, read).await.unwrap().unwrap();
    ended.unwrap();
    assert_eq!(body.len(), CHUNKS * CHUNK, "every chunk, whole");
    for n in [0, 1, 31, 32, 33, CHUNKS - 1] {
        let mark = format!("chunk {n:05} ");
        assert_eq!(&body[n * CHUNK..n * CHUNK + mark.len()], mark.as_bytes());
    }
    assert!(
        waited > 0,
        "the agent never ran out of credit: the reader was not slower"
    );
    println!(
        "{CHUNKS} chunks of {CHUNK} bytes through a reader that paused; the agent waited for credit {waited} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_is_cut_off_from_an_agent_without_credits() {
    let mut env = Env::new(&["cluster1"]).await;
    let (tx, mut inbound, reader) = hub_and_agent(&mut env, false).await;
    let read = tokio::spawn(read_with_a_pause(reader));
    let hub_message::Kind::LiveRequest(request) = next_live(&mut inbound).await else {
        panic!("no LiveRequest first");
    };
    assert_eq!(request.window, 0, "no window for an agent without credits");
    // An agent of the release before sends as fast as the cluster gives.
    let sending = tokio::spawn(async move {
        for n in 0..CHUNKS {
            if tx
                .send(chunk(request.id, n, n + 1 == CHUNKS))
                .await
                .is_err()
            {
                break;
            }
        }
        tx
    });
    // The hub cuts the reader off and tells the agent (within the 30 s
    // `next` waits for a message).
    let cancelled = match next_live(&mut inbound).await {
        hub_message::Kind::LiveCancel(c) => c,
        other => panic!("not cut off: {other:?}"),
    };
    assert_eq!(cancelled.id, request.id);
    let (body, _) = tokio::time::timeout(TIMEOUT, read).await.unwrap().unwrap();
    let got = body.len();
    assert!(got < CHUNKS * CHUNK, "cut off, yet {got} bytes arrived");
    let _tx = sending.await.unwrap();
}
