//! One agent's stream: the handshake, then a receiver and a sender running
//! side by side until the stream ends, the agent goes silent, its
//! certificate expires or is denied, its cluster is revoked, a newer
//! connection of the same cluster replaces it, or the hub shuts down.
//! Anything the agent sends that breaks the contract ends only this stream,
//! with a status saying what is wrong.
//!
//! Backpressure: every status report is acknowledged through the cluster's
//! control queue; while `--grpc-control-queue` acknowledgements wait there
//! the receiver reads nothing more, so HTTP/2 flow control stops an agent
//! that sends without reading, and one that reads nothing for three
//! heartbeat intervals is disconnected (`stalled`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, Heartbeat, HubMessage, Welcome, agent_message, hub_message,
};
use argocd_pull_proto::version::Negotiated;
use argocd_pull_proto::{validate, version};
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use super::cluster::{Agent, ClusterState, Stop};
use argocd_pull_runtime::client::limit::Bucket;

use super::hub::Hub;
use super::identity::Peer;
use super::metrics::ClusterLabel;
use super::revoke::Refusal;

mod handshake;
mod inbound;
mod outbound;
use handshake::{Attached, attach, handshake, welcome};
use inbound::handle;
use outbound::{Projects, send_loop};

/// Refused status reports per second one stream may go on sending, and in
/// a burst (a restarted hub may refuse a reconnecting agent's reports of
/// Applications deleted meanwhile, a few hundred at once). Past that the
/// stream is read more slowly, so HTTP/2 flow control holds back an agent
/// flooding the hub with reports of Applications it was never sent, at no
/// cost to the hub; an agent whose reports are accepted is never slowed.
const REFUSED_PER_SECOND: f64 = 50.0;
const REFUSED_BURST: u32 = 1000;

/// The stream to the agent. Boxed: the channel allocates its slots in
/// blocks of 32, and a `Result<HubMessage, Status>` is a few hundred
/// bytes, so unboxed every connection held about 10 KiB of slots.
pub type Out = mpsc::Sender<Box<Result<HubMessage, Status>>>;

/// Runs one stream to its end.
pub async fn run(
    hub: Arc<Hub>,
    peer: Peer,
    mut inbound: Streaming<AgentMessage>,
    out: Out,
    shutdown: watch::Receiver<bool>,
) {
    let Some((negotiated, agent_version)) = handshake(&hub, &peer, &mut inbound, &out).await else {
        return;
    };
    let Some(Attached { cs, id, stop }) =
        attach(&hub, &peer, &negotiated, &agent_version, &out).await
    else {
        return;
    };
    let cluster = &peer.cluster;
    let metrics = &hub.metrics;
    if out
        .send(Box::new(Ok(welcome(&hub, &negotiated))))
        .await
        .is_err()
    {
        cs.detach(id);
        hub.session_ended(cluster, &cs);
        return;
    }
    let mode = version::mode_name(negotiated.mode);
    tracing::info!(%cluster, session = id, mode, protocol = negotiated.version, %agent_version, certificate = %peer.fingerprint, "agent connected");
    metrics
        .agents
        .connected
        .get_or_create(&metrics.cluster(cluster))
        .set(1);
    seen(&hub, &cs);
    // Both sides compare right away: whatever a broken stream lost is
    // repaired now, not at the next periodic digest.
    if negotiated.mode == AgentMode::Managed {
        cs.send_digest();
    }

    let projects = (negotiated.mode == AgentMode::Managed
        && negotiated.has(version::CAPABILITY_PROJECTS))
    .then(|| Projects::new(hub.projects_changed()));
    let sender = tokio::spawn(send_loop(
        hub.clone(),
        cs.clone(),
        id,
        (negotiated.mode, negotiated.heartbeat),
        out.clone(),
        projects,
    ));
    let end = receive_loop(
        &hub,
        &cs,
        negotiated.mode,
        &mut inbound,
        Ends {
            stop,
            shutdown,
            not_after: peer.not_after,
            fingerprint: &peer.fingerprint,
            closed: &out,
        },
        negotiated.heartbeat,
    )
    .await;
    sender.abort();
    cs.detach(id);
    hub.session_ended(cluster, &cs);
    metrics
        .agents
        .connected
        .get_or_create(&metrics.cluster(cluster))
        .set(0);
    report_end(&hub, cluster, id, end, &out).await;
}

/// Logs how a session ended and tells the agent why, when it is still
/// there to read it.
async fn report_end(hub: &Hub, cluster: &str, id: u64, end: End, out: &Out) {
    match end {
        End::Closed => tracing::info!(%cluster, session = id, "agent disconnected"),
        End::Replaced => {
            tracing::info!(%cluster, session = id, "replaced by a newer connection of the same cluster");
            last_word(
                out,
                Status::aborted("replaced by a newer connection from the same cluster"),
            )
            .await;
        }
        End::Shutdown => {
            last_word(out, Status::unavailable("the hub is shutting down")).await;
        }
        End::Error(reason, status) => {
            refuse(hub, cluster, reason, out, status).await;
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
    last_word(out, status).await;
}

/// Ends the stream with `status`, if the agent takes it in time: one that
/// reads nothing (the stream's buffer full) must not keep the session.
async fn last_word(out: &Out, status: Status) {
    let _ = tokio::time::timeout(Duration::from_secs(5), out.send(Box::new(Err(status)))).await;
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

/// A message from `cs`'s agent: its state keeps the time, the gauge shows it.
fn seen(hub: &Hub, cs: &ClusterState) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    cs.seen(now);
    hub.metrics
        .agents
        .last_seen
        .get_or_create(&hub.metrics.cluster(&cs.name))
        .set(now);
}

/// What ends a session other than its stream.
struct Ends<'a> {
    stop: watch::Receiver<Option<Stop>>,
    shutdown: watch::Receiver<bool>,
    not_after: i64,
    /// Of the certificate the session connected with.
    fingerprint: &'a str,
    /// The response stream: closed when the agent is gone.
    closed: &'a Out,
}

/// Waits until the control queue is below `bound`; false when nothing
/// left it for `patience` (the agent reads nothing).
async fn room(cs: &ClusterState, bound: usize, patience: Duration) -> bool {
    let mut deadline = tokio::time::Instant::now() + patience;
    loop {
        let notified = cs.room.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if cs.control_len() < bound {
            return true;
        }
        tokio::select! {
            _ = &mut notified => deadline = tokio::time::Instant::now() + patience,
            _ = tokio::time::sleep_until(deadline) => return false,
        }
    }
}

async fn receive_loop(
    hub: &Arc<Hub>,
    cs: &Arc<ClusterState>,
    mode: AgentMode,
    inbound: &mut Streaming<AgentMessage>,
    ends: Ends<'_>,
    heartbeat: Duration,
) -> End {
    let Ends {
        mut stop,
        mut shutdown,
        not_after,
        fingerprint,
        closed,
    } = ends;
    let expiry = tokio::time::sleep(until(not_after));
    tokio::pin!(expiry);
    let bound = hub.config.limits.control_queue.max(1);
    let mut refusals = Bucket::new(
        REFUSED_PER_SECOND,
        REFUSED_BURST,
        tokio::time::Instant::now(),
    );
    loop {
        let full = cs.control_len() >= bound;
        let next = tokio::select! {
            s = stop.wait_for(Option::is_some) => {
                let why = s.ok().and_then(|s| s.clone()).unwrap_or(Stop::Replaced);
                return stopped(hub, cs, fingerprint, why);
            }
            _ = shutdown.wait_for(|s| *s) => return End::Shutdown,
            _ = &mut expiry => {
                return End::Error("certificate-expired", Status::unauthenticated(
                    "the client certificate has expired: reconnect with the renewed one"));
            }
            _ = closed.closed() => return End::Closed,
            roomy = room(cs, bound, heartbeat * 3), if full => {
                if roomy {
                    continue;
                }
                return End::Error("stalled", Status::resource_exhausted(format!(
                    "{bound} acknowledgements wait for the agent, which read none for {:?} (three heartbeat intervals): read the stream",
                    heartbeat * 3
                )));
            }
            m = tokio::time::timeout(heartbeat * 3, inbound.message()), if !full => m,
        };
        let m = match received(next, heartbeat) {
            Ok(m) => m,
            Err(end) => return end,
        };
        if let Err(end) = take_in(hub, cs, mode, m, &mut refusals).await {
            return end;
        }
    }
}

/// How long until `not_after` (seconds since the epoch), none once past.
fn until(not_after: i64) -> Duration {
    Duration::from_secs(
        (not_after
            - SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs() as i64)
            .max(0) as u64,
    )
}

/// How a session told to stop (`why`) ends.
fn stopped(hub: &Hub, cs: &ClusterState, fingerprint: &str, why: Stop) -> End {
    match why {
        Stop::Replaced => End::Replaced,
        Stop::Revoked(why) => {
            let r = Refusal::revoked(&cs.name, &why);
            End::Error(r.reason, r.into())
        }
        Stop::Denied(note) => {
            let r = Refusal::denied(&hub.config.deny_list, fingerprint, &note);
            End::Error(r.reason, r.into())
        }
    }
}

/// The message read from the agent, or how the session ends: nothing
/// within three heartbeat intervals (`next` timed out), the stream closed,
/// or a receive error.
fn received(
    next: Result<Result<Option<AgentMessage>, Status>, tokio::time::error::Elapsed>,
    heartbeat: Duration,
) -> Result<AgentMessage, End> {
    match next {
        Err(_) => Err(End::Error(
            "silent",
            Status::deadline_exceeded(format!(
                "nothing received for {:?} (three heartbeat intervals)",
                heartbeat * 3
            )),
        )),
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err(End::Closed),
        Ok(Err(status)) => {
            if status.code() == tonic::Code::Cancelled || status.code() == tonic::Code::Unknown {
                return Err(End::Closed);
            }
            let status = inbound_error(status);
            let reason = if status.code() == tonic::Code::ResourceExhausted {
                "oversized"
            } else {
                "stream-error"
            };
            Err(End::Error(reason, status))
        }
    }
}

/// Validates and handles one message of the agent; a stream whose reports
/// are refused is read more slowly (see [`REFUSED_PER_SECOND`]).
async fn take_in(
    hub: &Arc<Hub>,
    cs: &Arc<ClusterState>,
    mode: AgentMode,
    m: AgentMessage,
    refusals: &mut Bucket,
) -> Result<(), End> {
    seen(hub, cs);
    hub.metrics.message(&cs.name, "in", m.kind_name());
    if let Err(e) = validate::agent_message(&m) {
        return Err(End::Error("malformed", e.into()));
    }
    let refused = cs.refused_reports.load(Ordering::Relaxed);
    if let Err(status) = handle(hub, cs, mode, m) {
        return Err(End::Error("malformed", status));
    }
    if cs.refused_reports.load(Ordering::Relaxed) != refused {
        let wait = refusals.take(tokio::time::Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
    Ok(())
}
