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

mod inbound;
use inbound::handle;

/// Refused status reports per second one stream may go on sending, and in
/// a burst (a restarted hub may refuse a reconnecting agent's reports of
/// Applications deleted meanwhile, a few hundred at once). Past that the
/// stream is read more slowly, so HTTP/2 flow control holds back an agent
/// flooding the hub with reports of Applications it was never sent, at no
/// cost to the hub; an agent whose reports are accepted is never slowed.
const REFUSED_PER_SECOND: f64 = 50.0;
const REFUSED_BURST: u32 = 1000;

/// How long an agent has to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages per batch the sender takes from the cluster state.
const BATCH: usize = 64;

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
        .connected
        .get_or_create(&metrics.cluster(cluster))
        .set(0);
    report_end(&hub, cluster, id, end, &out).await;
}

/// The handshake up to the point where the agent may be attached: its
/// Hello read and negotiated, the hub's view synced, the cluster admitted
/// and the agent's mode the configured one. Returns what was negotiated
/// and the agent's version; `None` when the stream was refused (the
/// refusal already sent) or ended before its Hello.
async fn handshake(
    hub: &Hub,
    peer: &Peer,
    inbound: &mut Streaming<AgentMessage>,
    out: &Out,
) -> Option<(Negotiated, String)> {
    let cluster = &peer.cluster;
    let hello = read_hello(hub, cluster, inbound, out).await?;
    let negotiated = validate::first_agent_message(&hello)
        .map_err(Status::from)
        .and_then(|h| version::negotiate(&hub.offer(), h).map_err(Status::from));
    let negotiated = match negotiated {
        Ok(n) => n,
        Err(status) => {
            let reason = if status.code() == tonic::Code::FailedPrecondition {
                "protocol-version"
            } else {
                "malformed"
            };
            refuse(hub, cluster, reason, out, status).await;
            return None;
        }
    };
    let agent_version = match &hello.kind {
        Some(agent_message::Kind::Hello(h)) => h.agent_version.clone(),
        _ => String::new(),
    };
    // Digests and decisions need the whole view of the hub, and nobody is
    // welcomed before the deny list is known.
    hub.wait_synced().await;
    hub.config.deny_list.wait_loaded().await;
    // Again: time passed, the deny list or the cluster may have changed.
    if let Err(r) = hub.admit(peer) {
        refuse(hub, cluster, r.reason, out, r.into()).await;
        return None;
    }
    if let Err(status) = configured_mode(hub, cluster, negotiated.mode) {
        refuse(hub, cluster, "mode", out, status).await;
        return None;
    }
    Some((negotiated, agent_version))
}

/// The stream's first message, which must come within [`HELLO_TIMEOUT`];
/// `None` when the stream was refused (the refusal already sent) or the
/// agent closed it without a word.
async fn read_hello(
    hub: &Hub,
    cluster: &str,
    inbound: &mut Streaming<AgentMessage>,
    out: &Out,
) -> Option<AgentMessage> {
    match tokio::time::timeout(HELLO_TIMEOUT, inbound.message()).await {
        Err(_) => {
            refuse(
                hub,
                cluster,
                "handshake-timeout",
                out,
                Status::deadline_exceeded("no Hello within 30s"),
            )
            .await;
            None
        }
        Ok(Err(status)) => {
            let status = inbound_error(status);
            refuse(hub, cluster, "malformed", out, status).await;
            None
        }
        Ok(Ok(None)) => None,
        Ok(Ok(Some(m))) => Some(m),
    }
}

/// A session attached to its cluster's state.
struct Attached {
    cs: Arc<ClusterState>,
    id: u64,
    /// Tells the session why it must end: replaced, revoked or denied.
    stop: watch::Receiver<Option<Stop>>,
}

/// Makes the admitted agent its cluster's session, then this replica the
/// one that writes for the cluster. `None` when the stream was refused
/// (the refusal already sent): the cluster was revoked, or the
/// certificate denied, meanwhile.
async fn attach(
    hub: &Arc<Hub>,
    peer: &Peer,
    negotiated: &Negotiated,
    agent_version: &str,
    out: &Out,
) -> Option<Attached> {
    let cluster = &peer.cluster;
    let cs = hub.cluster(cluster);
    let id = hub.session_id();
    let agent = Agent {
        fingerprint: peer.fingerprint.clone(),
        version: agent_version.to_owned(),
        certificate_not_after: peer.not_after,
        since: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs() as i64,
        capabilities: negotiated.capabilities.iter().cloned().collect(),
    };
    let stop = match cs.attach_as(id, negotiated.mode, agent) {
        Ok(stop) => stop,
        Err(why) => {
            let r = Refusal::revoked(cluster, &why);
            refuse(hub, cluster, r.reason, out, r.into()).await;
            return None;
        }
    };
    // Denied between the check and the attach: the deny list's sweep may
    // have missed this session.
    if let Some(note) = hub.config.deny_list.denied(&peer.fingerprint) {
        cs.detach(id);
        let r = Refusal::denied(&hub.config.deny_list, &peer.fingerprint, &note);
        refuse(hub, cluster, r.reason, out, r.into()).await;
        return None;
    }
    // With several replicas, this one now writes for the cluster (once
    // the one its agent was on before lets go).
    hub.claim_for(cluster, &cs, id);
    let metrics = &hub.metrics;
    cs.set_control_gauge(
        metrics
            .control_queue
            .get_or_create(&metrics.cluster(cluster))
            .clone(),
    );
    Some(Attached { cs, id, stop })
}

/// The hub's answer to a Hello: what was negotiated, and the intervals
/// and the message size limit the agent must keep to.
fn welcome(hub: &Hub, negotiated: &Negotiated) -> HubMessage {
    let welcome = Welcome {
        protocol_version: negotiated.version,
        capabilities: negotiated.capabilities.iter().cloned().collect(),
        hub_version: env!("CARGO_PKG_VERSION").into(),
        heartbeat_interval_seconds: negotiated.heartbeat.as_secs().max(1) as u32,
        digest_interval_seconds: hub.config.digest_interval.as_secs().max(1) as u32,
        max_message_bytes: MAX_MESSAGE_BYTES as u32,
    };
    HubMessage {
        kind: Some(hub_message::Kind::Welcome(welcome)),
    }
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

/// The hub, not the agent, decides the mode: the one the cluster's addon
/// configuration deploys the agent with (`watch::mode`).
fn configured_mode(hub: &Hub, cluster: &str, claimed: AgentMode) -> Result<(), Status> {
    let claimed = version::mode_name(claimed);
    match hub.configured_mode(cluster) {
        // Not enabled: `admit` refused it already, or it was disabled
        // since; the revocation ends it.
        None => Ok(()),
        Some(Err(why)) => Err(Status::failed_precondition(format!(
            "cluster {cluster}: cannot tell which mode its agent may run in: {why}"
        ))),
        Some(Ok(c)) if version::mode_name(c.mode) == claimed => Ok(()),
        Some(Ok(c)) => Err(Status::permission_denied(format!(
            "cluster {cluster} is configured for {} mode ({}), and this agent runs in {claimed} mode; set AGENT_MODE on the cluster's AddOnDeploymentConfig to change the mode",
            version::mode_name(c.mode),
            c.source
        ))),
    }
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
        .last_seen
        .get_or_create(&hub.metrics.cluster(&cs.name))
        .set(now);
}

async fn send_loop(
    hub: Arc<Hub>,
    cs: Arc<ClusterState>,
    id: u64,
    (mode, heartbeat): (AgentMode, Duration),
    out: super::session::Out,
    mut projects: Option<Projects>,
) {
    let mut digest = tokio::time::interval(hub.config.digest_interval);
    digest.tick().await;
    let mut last_sent = tokio::time::Instant::now();
    let label = hub.metrics.cluster(&cs.name);
    loop {
        let notified = cs.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let batch = cs.next_messages(id, BATCH);
        if let Some(p) = projects.as_mut() {
            p.note(&batch);
        }
        if batch.is_empty() {
            if let Some(m) = projects.as_mut().and_then(|p| p.message(&hub, &cs)) {
                if !send(&hub, &cs, &out, m).await {
                    return;
                }
                last_sent = tokio::time::Instant::now();
                continue;
            }
            record_lag(&hub, &cs, &label);
            tokio::select! {
                _ = &mut notified => {}
                _ = digest.tick() => {
                    if mode == AgentMode::Managed {
                        cs.send_digest();
                    }
                    if let Some(p) = projects.as_mut() {
                        p.resend_unless_acked(&cs);
                    }
                }
                _ = async { projects.as_mut().expect("guarded").changed.changed().await }, if projects.is_some() => {
                    if let Some(p) = projects.as_mut() {
                        p.due = true;
                    }
                }
                _ = tokio::time::sleep_until(last_sent + heartbeat) => {
                    if out.send(Box::new(Ok(heartbeat_message()))).await.is_err() {
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
            if !send(&hub, &cs, &out, m).await {
                return;
            }
        }
        last_sent = tokio::time::Instant::now();
    }
}

/// Sends `m` to the agent, counted; false when the stream is gone.
async fn send(hub: &Hub, cs: &ClusterState, out: &Out, m: HubMessage) -> bool {
    hub.metrics.message(&cs.name, "out", m.kind_name());
    out.send(Box::new(Ok(m))).await.is_ok()
}

/// With nothing to send: how far behind the cluster's agent is, as gauges.
fn record_lag(hub: &Hub, cs: &ClusterState, label: &ClusterLabel) {
    let (lag, pending) = cs.lag();
    hub.metrics.lag.get_or_create(label).set(lag);
    hub.metrics.pending.get_or_create(label).set(pending as i64);
}

/// A heartbeat stamped with the time it is sent.
fn heartbeat_message() -> HubMessage {
    HubMessage {
        kind: Some(hub_message::Kind::Heartbeat(Heartbeat {
            sent_at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis() as i64,
        })),
    }
}

/// Capability `projects`: what the sender knows of the cluster's
/// ProjectSet ([`Hub::project_set`]).
struct Projects {
    /// Ticks with every change of an AppProject or credential.
    changed: watch::Receiver<u64>,
    /// The set may have changed since it was last built.
    due: bool,
    /// The version last sent on this stream.
    sent: Option<String>,
}

impl Projects {
    fn new(changed: watch::Receiver<u64>) -> Self {
        Self {
            changed,
            due: true,
            sent: None,
        }
    }

    /// A batch about to be sent: an upsert or delete may change which
    /// projects are used.
    fn note(&mut self, batch: &[HubMessage]) {
        if batch.iter().any(|m| {
            matches!(
                m.kind,
                Some(hub_message::Kind::Upsert(_) | hub_message::Kind::Delete(_))
            )
        }) {
            self.due = true;
        }
    }

    /// The ProjectSet to send, when it is due and differs from the last.
    fn message(&mut self, hub: &Hub, cs: &ClusterState) -> Option<HubMessage> {
        if !std::mem::take(&mut self.due) {
            return None;
        }
        let set = match hub.project_set(cs) {
            Ok(set) => set,
            Err(why) => {
                tracing::warn!(cluster = %cs.name, %why, "AppProjects not sent; the agent keeps the ones it has");
                return None;
            }
        };
        if self.sent.as_deref() == Some(set.version.as_str()) {
            return None;
        }
        tracing::debug!(cluster = %cs.name, version = %set.version, objects = set.objects_json.len(), "sending the cluster's AppProjects");
        self.sent = Some(set.version.clone());
        Some(HubMessage {
            kind: Some(hub_message::Kind::ProjectSet(set)),
        })
    }

    /// At a digest interval: the last set again, unless the agent applied
    /// it (an answer lost with a broken stream, or the cluster's API
    /// server failing).
    fn resend_unless_acked(&mut self, cs: &ClusterState) {
        let acked = cs.lock().projects_acked.clone();
        let applied = matches!(
            (&acked, &self.sent),
            (Some((v, AckOutcome::Applied | AckOutcome::Rejected)), Some(s)) if v == s
        );
        if !applied {
            self.sent = None;
            self.due = true;
        }
    }
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
