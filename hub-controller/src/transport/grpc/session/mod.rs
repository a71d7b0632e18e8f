//! One agent's stream: the handshake, then a receiver and a sender running
//! side by side until the stream ends, the agent goes silent, its
//! certificate expires, a newer connection of the same cluster replaces it,
//! or the hub shuts down. Anything the agent sends that breaks the contract
//! ends only this stream, with a status saying what is wrong.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use argocd_pull_proto::digest::SetDigest;
use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::{
    AgentMessage, AgentMode, DigestSet, Heartbeat, HubMessage, Welcome, agent_message, hub_message,
};
use argocd_pull_proto::{validate, version};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::cluster::ClusterState;
use super::hub::Hub;

mod inbound;
use inbound::handle;

/// How long an agent has to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages per batch the sender takes from the cluster state.
const BATCH: usize = 64;

pub type Out = mpsc::Sender<Result<HubMessage, Status>>;

/// Runs one stream to its end.
pub async fn run(
    hub: Arc<Hub>,
    cluster: String,
    not_after: i64,
    mut inbound: Streaming<AgentMessage>,
    out: Out,
    shutdown: watch::Receiver<bool>,
) {
    let metrics = hub.metrics.clone();
    let hello = match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
        Err(_) => {
            refuse(
                &hub,
                &cluster,
                "handshake-timeout",
                &out,
                Status::deadline_exceeded("no Hello within 30s"),
            )
            .await;
            return;
        }
        Ok(Err(status)) => {
            let status = inbound_error(status);
            refuse(&hub, &cluster, "malformed", &out, status).await;
            return;
        }
        Ok(Ok(None)) => return,
        Ok(Ok(Some(m))) => m,
    };
    let negotiated = validate::first_agent_message(&hello)
        .map_err(Status::from)
        .and_then(|h| version::negotiate(&Default::default(), h).map_err(Status::from));
    let negotiated = match negotiated {
        Ok(n) => n,
        Err(status) => {
            let reason = if status.code() == tonic::Code::FailedPrecondition {
                "protocol-version"
            } else {
                "malformed"
            };
            refuse(&hub, &cluster, reason, &out, status).await;
            return;
        }
    };
    let agent_version = match &hello.kind {
        Some(agent_message::Kind::Hello(h)) => h.agent_version.clone(),
        _ => String::new(),
    };
    // Digests and decisions need the whole view of the hub.
    hub.wait_synced().await;

    let cs = hub.cluster(&cluster);
    let id = hub.session_id();
    let replaced = cs.attach(id, negotiated.mode);
    let heartbeat = hub.config.heartbeat;
    let welcome = Welcome {
        protocol_version: negotiated.version,
        capabilities: negotiated.capabilities.iter().cloned().collect(),
        hub_version: env!("CARGO_PKG_VERSION").into(),
        heartbeat_interval_seconds: heartbeat.as_secs().max(1) as u32,
        digest_interval_seconds: hub.config.digest_interval.as_secs().max(1) as u32,
        max_message_bytes: MAX_MESSAGE_BYTES as u32,
    };
    if out
        .send(Ok(HubMessage {
            kind: Some(hub_message::Kind::Welcome(welcome)),
        }))
        .await
        .is_err()
    {
        cs.detach(id);
        return;
    }
    let mode = version::mode_name(negotiated.mode);
    tracing::info!(%cluster, session = id, mode, protocol = negotiated.version, %agent_version, "agent connected");
    metrics
        .connected
        .get_or_create(&metrics.cluster(&cluster))
        .set(1);
    seen(&hub, &cluster);
    // Both sides compare right away: whatever a broken stream lost is
    // repaired now, not at the next periodic digest.
    if negotiated.mode == AgentMode::Managed {
        cs.control(desired_digest(&cs));
    }

    let sender = tokio::spawn(send_loop(
        hub.clone(),
        cs.clone(),
        id,
        negotiated.mode,
        out.clone(),
    ));
    let end = receive_loop(
        &hub,
        &cs,
        negotiated.mode,
        &mut inbound,
        replaced,
        shutdown,
        not_after,
        heartbeat,
    )
    .await;
    sender.abort();
    cs.detach(id);
    metrics
        .connected
        .get_or_create(&metrics.cluster(&cluster))
        .set(0);
    match end {
        End::Closed => tracing::info!(%cluster, session = id, "agent disconnected"),
        End::Replaced => {
            tracing::info!(%cluster, session = id, "replaced by a newer connection of the same cluster");
            let _ = out
                .send(Err(Status::aborted(
                    "replaced by a newer connection from the same cluster",
                )))
                .await;
        }
        End::Shutdown => {
            let _ = out
                .send(Err(Status::unavailable("the hub is shutting down")))
                .await;
        }
        End::Error(reason, status) => {
            refuse(&hub, &cluster, reason, &out, status).await;
        }
    }
}

enum End {
    Closed,
    Replaced,
    Shutdown,
    Error(&'static str, Status),
}

/// Ends the stream with `status`, logged with the cluster.
async fn refuse(hub: &Hub, cluster: &str, reason: &'static str, out: &Out, status: Status) {
    tracing::warn!(%cluster, reason, code = ?status.code(), message = %status.message(), "refused an agent's stream");
    hub.metrics.refuse(cluster, reason);
    let _ = out.send(Err(status)).await;
}

/// A receive error as the agent should read it: a message over the limit
/// gets the protocol's RESOURCE_EXHAUSTED with the limit in it.
fn inbound_error(status: Status) -> Status {
    let m = status.message();
    if m.contains("message length too large") || status.code() == tonic::Code::ResourceExhausted {
        Status::resource_exhausted(format!(
            "a message is over the {} byte limit of one message: {m}",
            MAX_MESSAGE_BYTES
        ))
    } else {
        status
    }
}

fn seen(hub: &Hub, cluster: &str) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    hub.metrics
        .last_seen
        .get_or_create(&hub.metrics.cluster(cluster))
        .set(now);
}

fn desired_digest(cs: &ClusterState) -> HubMessage {
    HubMessage {
        kind: Some(hub_message::Kind::Digest(
            SetDigest::of(&cs.desired_entries()).to_proto(DigestSet::Desired),
        )),
    }
}

async fn send_loop(
    hub: Arc<Hub>,
    cs: Arc<ClusterState>,
    id: u64,
    mode: AgentMode,
    out: super::session::Out,
) {
    let heartbeat = hub.config.heartbeat;
    let mut digest = tokio::time::interval(hub.config.digest_interval);
    digest.tick().await;
    let mut last_sent = tokio::time::Instant::now();
    let label = hub.metrics.cluster(&cs.name);
    loop {
        let notified = cs.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let batch = cs.next_messages(id, BATCH);
        if batch.is_empty() {
            let (lag, pending) = cs.lag();
            hub.metrics.lag.get_or_create(&label).set(lag);
            hub.metrics
                .pending
                .get_or_create(&label)
                .set(pending as i64);
            tokio::select! {
                _ = &mut notified => {}
                _ = digest.tick() => {
                    if mode == AgentMode::Managed {
                        cs.control(desired_digest(&cs));
                    }
                }
                _ = tokio::time::sleep_until(last_sent + heartbeat) => {
                    let hb = HubMessage { kind: Some(hub_message::Kind::Heartbeat(Heartbeat {
                        sent_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64,
                    })) };
                    if out.send(Ok(hb)).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
                // Commands waiting out a retry pause.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
            continue;
        }
        for m in batch {
            hub.metrics.message(&cs.name, "out", hub_kind(&m));
            if out.send(Ok(m)).await.is_err() {
                return;
            }
        }
        last_sent = tokio::time::Instant::now();
    }
}

#[allow(clippy::too_many_arguments)]
async fn receive_loop(
    hub: &Arc<Hub>,
    cs: &Arc<ClusterState>,
    mode: AgentMode,
    inbound: &mut Streaming<AgentMessage>,
    mut replaced: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
    not_after: i64,
    heartbeat: Duration,
) -> End {
    let expires_in = Duration::from_secs(
        (not_after
            - SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs() as i64)
            .max(0) as u64,
    );
    let expiry = tokio::time::sleep(expires_in);
    tokio::pin!(expiry);
    loop {
        let next = tokio::select! {
            _ = replaced.wait_for(|r| *r) => return End::Replaced,
            _ = shutdown.wait_for(|s| *s) => return End::Shutdown,
            _ = &mut expiry => {
                return End::Error("certificate-expired", Status::unauthenticated(
                    "the client certificate has expired: reconnect with the renewed one"));
            }
            m = tokio::time::timeout(heartbeat * 3, inbound.message()) => m,
        };
        let m = match next {
            Err(_) => {
                return End::Error(
                    "silent",
                    Status::deadline_exceeded(format!(
                        "nothing received for {:?} (three heartbeat intervals)",
                        heartbeat * 3
                    )),
                );
            }
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => return End::Closed,
            Ok(Err(status)) => {
                if status.code() == tonic::Code::Cancelled || status.code() == tonic::Code::Unknown
                {
                    return End::Closed;
                }
                let status = inbound_error(status);
                let reason = if status.code() == tonic::Code::ResourceExhausted {
                    "oversized"
                } else {
                    "stream-error"
                };
                return End::Error(reason, status);
            }
        };
        seen(hub, &cs.name);
        hub.metrics.message(&cs.name, "in", agent_kind(&m));
        if let Err(e) = validate::agent_message(&m) {
            return End::Error("malformed", e.into());
        }
        if let Err(status) = handle(hub, cs, mode, m) {
            return End::Error("malformed", status);
        }
    }
}

fn agent_kind(m: &AgentMessage) -> &'static str {
    use agent_message::Kind;
    match &m.kind {
        None => "unknown",
        Some(Kind::Hello(_)) => "hello",
        Some(Kind::Status(_)) => "status",
        Some(Kind::ObjectAck(_)) => "object_ack",
        Some(Kind::OperationAck(_)) => "operation_ack",
        Some(Kind::Digest(_)) => "digest",
        Some(Kind::ResyncRequest(_)) => "resync_request",
        Some(Kind::Heartbeat(_)) => "heartbeat",
    }
}

fn hub_kind(m: &HubMessage) -> &'static str {
    use hub_message::Kind;
    match &m.kind {
        None => "unknown",
        Some(Kind::Welcome(_)) => "welcome",
        Some(Kind::Upsert(_)) => "upsert",
        Some(Kind::Delete(_)) => "delete",
        Some(Kind::Operation(_)) => "operation",
        Some(Kind::ObjectAck(_)) => "object_ack",
        Some(Kind::Digest(_)) => "digest",
        Some(Kind::ResyncRequest(_)) => "resync_request",
        Some(Kind::Heartbeat(_)) => "heartbeat",
    }
}
