//! A hostile agent on real API servers: a client holding a valid agent
//! certificate that sends what a spoke-agent never would.

use std::time::Duration;

use argocd_pull_proto::digest::BUCKETS;
use argocd_pull_proto::v1::{
    AgentMessage, DigestEntry, DigestSet, Heartbeat, ObjectKey, ResyncRequest, agent_message,
};
use testenv::wait;

mod common;
mod grpc_env;
use common::grpc_client::{self, hello, report};
use grpc_env::series::value;
use grpc_env::{Env, SPOKE_NS, TIMEOUT, agent_subject};

/// The hub-controller process's resident set, in bytes (`VmRSS`).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// A resync request listing `entries` Applications the hub never sent,
/// each with a version that names a hub uid (so the hub would queue a
/// delete for each).
fn flood_request(round: usize, entries: usize) -> AgentMessage {
    AgentMessage {
        kind: Some(agent_message::Kind::ResyncRequest(ResyncRequest {
            set: DigestSet::Desired as i32,
            buckets: (0..BUCKETS).collect(),
            entries: (0..entries)
                .map(|i| DigestEntry {
                    key: Some(ObjectKey {
                        namespace: SPOKE_NS.into(),
                        name: format!("flood-{round}-{i}"),
                    }),
                    version: format!("uid-{round}-{i}.h"),
                })
                .collect(),
        })),
    }
}

/// About the bytes `m` takes on the wire: each entry's strings and the
/// protobuf framing around them (tags and lengths, 10 bytes at most).
fn wire_len(m: &AgentMessage) -> usize {
    match &m.kind {
        Some(agent_message::Kind::ResyncRequest(r)) => r
            .entries
            .iter()
            .map(|e| {
                let k = e.key.as_ref().unwrap();
                k.namespace.len() + k.name.len() + e.version.len() + 10
            })
            .sum(),
        _ => 0,
    }
}

/// Hole: an agent's `ResyncRequest` was neither validated nor bounded,
/// and the deletes it made the hub queue for keys it does not know were
/// never dropped. A client with cluster1's certificate sends 40 requests
/// of 20,000 unknown Applications each, twice, and reads without
/// acknowledging: over the second flood the hub's RSS grows by less than
/// half the bytes it was sent (the old
/// hub kept every key several times over: far more than was sent), and
/// what it keeps pending for the agent stays at the bound.
#[tokio::test]
async fn a_flood_of_resync_requests_leaves_the_hubs_memory_flat() {
    const ROUNDS: usize = 40;
    const ENTRIES: usize = 20_000;
    const SETTLE: Duration = Duration::from_secs(12);
    let mut env = Env::new(&["cluster1"]).await;
    env.start_hub(&[]).await;
    let pid = env
        .hub_process
        .as_ref()
        .unwrap()
        .child
        .id()
        .expect("running");
    let identity = env.ca.client(&agent_subject("cluster1"), None).unwrap();
    let (tx, mut inbound, _welcome) = grpc_client::open(
        &env.hub_address(),
        &env.ca.pem.cert_pem,
        &identity,
        hello(1, 1),
    )
    .await
    .unwrap();
    // Reads everything the hub sends (the deletes too), acknowledges
    // nothing.
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    // And stays connected: the hub ends a stream silent for three
    // heartbeats, which would drop what it queued for it.
    let beating = tx.clone();
    let heartbeat = tokio::spawn(async move {
        loop {
            let beat = AgentMessage {
                kind: Some(agent_message::Kind::Heartbeat(Heartbeat::default())),
            };
            if beating.send(beat).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });

    // The refusals of reports of unknown Applications, counted: one after
    // a batch of requests says the hub has read the batch.
    let refused =
        "argocd_pull_hub_grpc_refused_total{cluster=\"cluster1\",reason=\"not-this-agents\"}";
    let mut marks = 0u64;
    let mut sent_bytes = 0usize;
    let send_batch = async |from: usize, to: usize, marks: &mut u64, bytes: &mut usize| {
        for round in from..to {
            let m = flood_request(round, ENTRIES);
            *bytes += wire_len(&m);
            tx.send(m).await.unwrap();
        }
        *marks += 1;
        let marker = ObjectKey {
            namespace: SPOKE_NS.into(),
            name: format!("marker-{marks}"),
        };
        tx.send(report(marker, *marks, b"{}".to_vec()))
            .await
            .unwrap();
        let want = *marks as f64;
        wait::until("the hub to read the batch", TIMEOUT * 3, || async {
            let m = env.hub_process.as_ref().unwrap().metrics().await;
            match value(&m, refused) {
                n if n >= want => Ok(()),
                n => Err(n),
            }
        })
        .await;
    };
    // A first flood of the same size fills every bound (the repairs queued
    // for the agent, the buffers a request of this size needs) before the
    // baseline: a warm-up of three requests left the baseline anywhere
    // from 56 to 69 MiB between runs of one build, as much as the bound
    // below, while the hub after the flood held 71 to 74 MiB every time.
    // What the second flood adds is what a flood accumulates.
    let mut warm = 0;
    send_batch(0, ROUNDS, &mut marks, &mut warm).await;
    // Long enough for the allocator to hand back what a request needed
    // only while it was answered (jemalloc's decay is 10 s); the baseline
    // is the most the hub held meanwhile.
    let mut before = 0;
    for _ in 0..SETTLE.as_secs() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        before = before.max(rss(pid));
    }
    send_batch(ROUNDS, 2 * ROUNDS, &mut marks, &mut sent_bytes).await;
    tokio::time::sleep(SETTLE).await;
    let after = rss(pid);
    let m = env.hub_process.as_ref().unwrap().metrics().await;
    let pending = value(
        &m,
        "argocd_pull_hub_grpc_agent_pending_objects{cluster=\"cluster1\"}",
    );
    let grown = after.saturating_sub(before);
    eprintln!(
        "hub RSS {} MiB -> {} MiB (+{:.1} MiB) after {ROUNDS} resync requests of {ENTRIES} unknown Applications ({:.1} MiB sent); {pending} objects pending for the agent",
        before >> 20,
        after >> 20,
        grown as f64 / (1 << 20) as f64,
        sent_bytes as f64 / (1 << 20) as f64,
    );
    assert!(
        (grown as usize) < sent_bytes / 2,
        "the hub grew by {grown} bytes for {sent_bytes} bytes of requests ({pending} pending)"
    );
    assert!(
        // `transport::grpc::cluster::MAX_REPAIR_REMOVALS`: the flood
        // reached the bound (a missing series reads 0) and stopped there.
        (1000.0..=1024.0).contains(&pending),
        "{pending} objects pending for one agent"
    );
    assert!(!reader.is_finished(), "the stream stayed open throughout");
    heartbeat.abort();
    drop(tx);
    reader.abort();
}
