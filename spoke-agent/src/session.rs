//! The agent's connection to the hub: dial with jittered exponential
//! backoff, handshake, then receive and send side by side until the stream
//! ends. The cluster keeps working while the hub is away (the Applications
//! are the cluster's own Argo CD's business); reports queue up, coalesced,
//! and the digests after the next handshake repair whatever was missed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use argocd_pull_proto::digest::{Repair, SetDigest, repairs_for, resync_requests};
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, ApplicationDelete, ApplicationUpsert, Digest, DigestSet,
    Heartbeat, Hello, HubMessage, ObjectAck, ObjectKey, ResyncRequest, agent_message, hub_message,
};
use argocd_pull_proto::{validate, version};
use argocd_pull_runtime::Readiness;
use argocd_pull_runtime::shutdown::Shutdown;
use argocd_pull_runtime::task::AbortOnDrop;
use tokio::sync::mpsc;

use crate::metrics::AgentMetrics;
use crate::reports::Reports;
use crate::state::{AgentState, Instruction, RETRY_PAUSE};
use crate::worker::Worker;
use crate::{AgentConfig, Mode};
use argocd_pull_runtime::backoff::Backoff;

mod live;
mod open;
pub mod proxy;
mod tunnel;
mod websocket;
pub mod wire;

use open::status_text;
pub use open::{OpenError, Opened, open, open_on, open_through, open_with};
use wire::{Wire, next_wire};

/// Readiness check that is true while a stream to the hub is open.
pub const HUB_CONNECTED: &str = "hub-connected";
/// A connection that lasted this long was healthy: back off from the start.
const HEALTHY: Duration = Duration::from_secs(30);
const BATCH: usize = 64;

static SESSIONS: AtomicU64 = AtomicU64::new(1);

enum End {
    Shutdown,
    CertificateChanged,
    Lost(String),
    /// No stream was opened; the failure may tell against the wire.
    NotOpened(OpenError),
}

pub struct Connection {
    pub config: AgentConfig,
    /// What the agent holds across connections: what this one sends from.
    pub state: Arc<AgentState>,
    /// Where the hub's instructions and commands go.
    pub worker: Arc<Worker>,
    pub metrics: AgentMetrics,
    pub readiness: Readiness,
    /// Managed mode: the AppProjects and credentials the hub sends.
    pub projects: Option<Arc<crate::projects::Projects>>,
    /// Managed mode with `--live-views`: the reader of the hub's live
    /// views.
    pub live: Option<Arc<crate::live::Reader>>,
    /// With `--live-views` and `--terminal`: the web terminals of the hub.
    pub terminal: Option<Arc<crate::live::Terminals>>,
}

impl Connection {
    fn state(&self) -> &Arc<AgentState> {
        &self.state
    }

    fn mode(&self) -> AgentMode {
        match self.config.mode {
            Mode::Managed => AgentMode::Managed,
            Mode::Autonomous => AgentMode::Autonomous,
        }
    }

    /// This release's Hello, with `trees` when a managed agent reads its
    /// Argo CD's Redis and `live-views` (with `live-credits`) when it
    /// serves them.
    fn hello(&self) -> Hello {
        let mut hello = version::hello(self.mode(), env!("CARGO_PKG_VERSION"));
        hello.heartbeat_interval_seconds =
            u32::try_from(self.config.heartbeat.as_secs()).unwrap_or(u32::MAX);
        if self.config.mode == Mode::Managed && self.config.argocd_redis.is_some() {
            hello
                .capabilities
                .push(version::CAPABILITY_TREES.to_string());
        }
        self.offer_live(&mut hello);
        hello
    }

    /// Connects, and reconnects, until shutdown.
    pub async fn run(self: Arc<Self>, shutdown: Shutdown) {
        let mut backoff = Backoff::new(self.config.backoff_min, self.config.backoff_max);
        let metrics = &self.metrics;
        let mut attempts = 0u64;
        let mut wire = Wire::first(self.config.route.wire.transport);
        loop {
            if attempts > 0 {
                metrics.reconnects.inc();
            }
            attempts += 1;
            let started = Instant::now();
            let end = tokio::select! {
                _ = shutdown.clone().wait() => End::Shutdown,
                end = self.session(&shutdown, wire) => end,
            };
            self.readiness.set(HUB_CONNECTED, false);
            metrics.connected.set(0);
            match end {
                End::Shutdown => return,
                End::CertificateChanged => {
                    tracing::info!(cluster = %self.config.cluster_name, "client certificate changed on disk; reconnecting with it");
                    metrics.certificate_reloads.inc();
                    backoff.reset();
                    continue;
                }
                End::Lost(reason) => {
                    tracing::warn!(cluster = %self.config.cluster_name, hub = %self.config.hub_address, wire = wire.name(), %reason, "no connection to the hub; the cluster keeps running, changes are sent on reconnect");
                }
                End::NotOpened(e) => {
                    tracing::warn!(cluster = %self.config.cluster_name, hub = %self.config.hub_address, wire = wire.name(), reason = %e.reason, "no connection to the hub; the cluster keeps running, changes are sent on reconnect");
                    wire = self.wire_after(wire, &e);
                }
            }
            if started.elapsed() > HEALTHY {
                backoff.reset();
            }
            let delay = backoff.delay();
            tracing::debug!(?delay, "reconnecting after");
            // A renewed certificate is worth trying at once.
            let fingerprint = self.config.tls.fingerprint();
            let changed = async {
                loop {
                    tokio::time::sleep(self.config.tls_reload_interval).await;
                    if self.config.tls.fingerprint() != fingerprint {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = shutdown.clone().wait() => return,
                _ = tokio::time::sleep(delay) => {}
                _ = changed => {}
            }
        }
    }

    /// The wire of the next dial after `e` on `wire`, the change logged.
    fn wire_after(&self, wire: Wire, e: &OpenError) -> Wire {
        if e.failure.is_some() {
            self.metrics.dial_failed(wire.name());
        }
        let next = next_wire(self.config.route.wire.transport, wire, e.failure);
        if next != wire {
            tracing::info!(cluster = %self.config.cluster_name, from = wire.name(), to = next.name(), reason = %e.reason,
                "the way to the hub does not speak this wire (an HTTP/1.1-only proxy refuses HTTP/2); dialling the other wire (--transport auto)");
        }
        next
    }

    async fn session(&self, shutdown: &Shutdown, wire: Wire) -> End {
        let loaded = match self.config.tls.load() {
            Ok(l) => l,
            Err(e) => return End::Lost(format!("{e:#}")),
        };
        let Opened {
            tx,
            mut inbound,
            welcome,
            negotiated,
        } = match open_on(
            &self.config.hub_address,
            loaded.config,
            self.hello(),
            &self.config.route,
            wire,
        )
        .await
        {
            Ok(o) => o,
            Err(e) => return End::NotOpened(e),
        };
        self.metrics.use_wire(wire.name());
        let heartbeat = negotiated.heartbeat;
        let asked = self.config.heartbeat;
        if !asked.is_zero() && asked != heartbeat {
            tracing::info!(cluster = %self.config.cluster_name, ?asked, granted = ?heartbeat,
                "the hub grants another heartbeat interval than asked (it keeps between its --grpc-heartbeat-min and --grpc-heartbeat)");
        }
        let digest_interval = Duration::from_secs(welcome.digest_interval_seconds.max(1) as u64);
        let id = SESSIONS.fetch_add(1, Ordering::Relaxed);
        self.state().attach(id, negotiated.capabilities.clone());
        self.readiness.set(HUB_CONNECTED, true);
        let metrics = &self.metrics;
        metrics.connected.set(1);
        tracing::info!(cluster = %self.config.cluster_name, hub = %self.config.hub_address, protocol = negotiated.version,
            wire = wire.name(), subject = %loaded.subject, "connected to the hub");
        // Compare right away: whatever a broken stream lost is repaired now.
        self.state().control(self.worker.reports().digest());
        if let Some(p) = &self.projects {
            p.reconnected();
        }
        // Aborted if this future is dropped half-way (the agent shutting
        // down, or its caller giving up): the send loop must not live on,
        // keeping the stream open and the hub believing we are connected.
        let sender = AbortOnDrop(tokio::spawn(send_loop(
            self.state().clone(),
            self.worker.reports().clone(),
            self.metrics.clone(),
            id,
            tx,
            heartbeat,
            digest_interval,
        )));
        let end = self
            .receive(&mut inbound, shutdown, heartbeat, &loaded.fingerprint)
            .await;
        drop(sender);
        self.state().detach(id);
        self.end_live();
        if let Some(terminal) = &self.terminal {
            terminal.cancel_all();
        }
        end
    }

    async fn receive(
        &self,
        inbound: &mut tonic::Streaming<HubMessage>,
        shutdown: &Shutdown,
        heartbeat: Duration,
        fingerprint: &str,
    ) -> End {
        let mut reload = tokio::time::interval(self.config.tls_reload_interval);
        reload.tick().await;
        loop {
            let next = tokio::select! {
                _ = shutdown.clone().wait() => return End::Shutdown,
                _ = reload.tick() => {
                    if self.config.tls.fingerprint().is_some_and(|f| f != fingerprint) {
                        return End::CertificateChanged;
                    }
                    continue;
                }
                m = tokio::time::timeout(heartbeat * 3, inbound.message()) => m,
            };
            let m = match next {
                Err(_) => {
                    return End::Lost(format!("nothing from the hub for {:?}", heartbeat * 3));
                }
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => return End::Lost("the hub closed the stream".into()),
                Ok(Err(status)) => return End::Lost(status_text(&status)),
            };
            let metrics = &self.metrics;
            metrics.last_seen.set(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64(),
            );
            metrics.message("in", m.kind_name());
            if let Err(e) = validate::hub_message(&m) {
                return End::Lost(format!("the hub sent a malformed message: {e}"));
            }
            if let Err(e) = self.handle(m) {
                return End::Lost(e);
            }
        }
    }

    /// What the agent does with one message from the hub after the
    /// Welcome; an error ends the stream.
    fn handle(&self, m: HubMessage) -> Result<(), String> {
        use hub_message::Kind;
        match m.kind.expect("validated") {
            Kind::Welcome(_) => unreachable!("validated"),
            Kind::Heartbeat(_) => {}
            Kind::ProjectSet(p) => match &self.projects {
                Some(projects) => projects.set(&p),
                None => tracing::warn!(
                    "the hub sent AppProjects, which an agent in autonomous mode does not keep"
                ),
            },
            Kind::Upsert(u) => self.upsert(u),
            Kind::Delete(d) => self.delete(d),
            Kind::Operation(op) => self.worker.command(op.key.clone().expect("validated"), op),
            Kind::ObjectAck(a) => self.object_ack(a),
            Kind::Digest(d) => self.digest(&d)?,
            Kind::ResyncRequest(r) => self.resync_request(&r)?,
            live @ (Kind::LiveRequest(_)
            | Kind::LiveCancel(_)
            | Kind::LiveCredit(_)
            | Kind::TerminalOpen(_)
            | Kind::TerminalData(_)
            | Kind::TerminalCredit(_)
            | Kind::TerminalClose(_)) => self.live_message(live)?,
        }
        Ok(())
    }

    /// An Application to create or update: queued for the worker, unless
    /// this agent runs in autonomous mode or it is over the size limit of
    /// one object (then rejected).
    fn upsert(&self, u: ApplicationUpsert) {
        let state = self.state();
        let key = u.key.clone().expect("validated");
        let refusal = if self.config.mode != Mode::Managed {
            Some(
                "this agent runs in autonomous mode: the cluster owns its Applications".to_string(),
            )
        } else {
            limits::check_object_json(
                &format!("Application {}/{}", key.namespace, key.name),
                u.application_json.len(),
            )
            .err()
            .map(|e| e.to_string())
        };
        match refusal {
            Some(message) => reject(state, key, u.seq, message),
            None => self
                .worker
                .instruct(key, u.seq, Instruction::Upsert(Arc::new(u))),
        }
    }

    /// An Application to delete, or to release (left on the cluster,
    /// no longer the hub's): queued for the worker, unless this agent runs
    /// in autonomous mode (then rejected).
    fn delete(&self, d: ApplicationDelete) {
        let state = self.state();
        let key = d.key.clone().expect("validated");
        if self.config.mode != Mode::Managed {
            reject(
                state,
                key,
                d.seq,
                "this agent runs in autonomous mode: the cluster owns its Applications".into(),
            );
            return;
        }
        let instruction = if d.release {
            Instruction::Release { hub_uid: d.hub_uid }
        } else {
            Instruction::Delete { hub_uid: d.hub_uid }
        };
        self.worker.instruct(key, d.seq, instruction);
    }

    /// The hub's answer to a status report: the report is sent again
    /// after a pause (retry), or settled.
    fn object_ack(&self, a: ObjectAck) {
        let state = self.state();
        let key = a.key.expect("validated");
        match AckOutcome::try_from(a.outcome).unwrap_or(AckOutcome::Retry) {
            AckOutcome::Retry => {
                let (state, seq) = (state.clone(), a.seq);
                tokio::spawn(async move {
                    tokio::time::sleep(RETRY_PAUSE).await;
                    state.retry(&key, seq);
                });
            }
            AckOutcome::Rejected => {
                tracing::warn!(namespace = %key.namespace, name = %key.name, message = %a.message, "the hub refused a status report");
                state.acked(&key, a.seq);
            }
            _ => state.acked(&key, a.seq),
        }
    }

    /// The digest of the hub's desired set: a managed agent asks for the
    /// buckets where what it applied differs. Other digests, and any in
    /// autonomous mode, are ignored.
    fn digest(&self, d: &Digest) -> Result<(), String> {
        let (set, theirs) = SetDigest::from_proto(d).map_err(|e| e.to_string())?;
        if set != DigestSet::Desired || self.config.mode != Mode::Managed {
            return Ok(());
        }
        let ours = self.worker.cache().desired_replica();
        let buckets = SetDigest::of(&ours).differing_buckets(&theirs);
        if !buckets.is_empty() {
            tracing::info!(
                buckets = buckets.len(),
                "the hub's desired set differs from what is applied; asking for repairs"
            );
            self.metrics.resyncs.inc();
            for r in resync_requests(DigestSet::Desired, &ours, &buckets) {
                self.state().control(AgentMessage {
                    kind: Some(agent_message::Kind::ResyncRequest(r)),
                });
            }
        }
        Ok(())
    }

    /// The hub's entries in the buckets where its view of the observed set
    /// differs from the agent's: answered with the repairs (a report sent
    /// again, or one saying the Application is gone).
    fn resync_request(&self, r: &ResyncRequest) -> Result<(), String> {
        let reports = self.worker.reports();
        let repairs = repairs_for(&reports.observed_entries(), r).map_err(|e| e.to_string())?;
        if !repairs.is_empty() {
            tracing::info!(
                repairs = repairs.len(),
                "the hub's view of this cluster differs; sending repairs"
            );
            self.metrics.resyncs.inc();
        }
        for repair in repairs {
            match repair {
                Repair::Send(key) => reports.report(&key, true),
                Repair::Remove(key) => reports.gone(&key),
            }
        }
        Ok(())
    }
}

fn reject(state: &AgentState, key: ObjectKey, seq: u64, message: String) {
    tracing::warn!(namespace = %key.namespace, name = %key.name, %message, "refused the hub's message");
    state.object_ack(key, seq, AckOutcome::Rejected, message);
}

async fn send_loop(
    state: Arc<AgentState>,
    reports: Reports,
    metrics: AgentMetrics,
    id: u64,
    tx: mpsc::Sender<AgentMessage>,
    heartbeat: Duration,
    digest_interval: Duration,
) {
    let mut digest = tokio::time::interval(digest_interval);
    digest.tick().await;
    let mut last_sent = tokio::time::Instant::now();
    loop {
        let notified = state.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let batch = state.next_messages(id, BATCH);
        if batch.is_empty() {
            let (lag, pending) = state.lag();
            metrics.lag.set(lag);
            metrics.pending.set(pending as i64);
            tokio::select! {
                _ = &mut notified => {}
                _ = digest.tick() => state.control(reports.digest()),
                _ = tokio::time::sleep_until(last_sent + heartbeat) => {
                    let hb = AgentMessage { kind: Some(agent_message::Kind::Heartbeat(Heartbeat {
                        sent_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64,
                    })) };
                    if tx.send(hb).await.is_err() {
                        return;
                    }
                    last_sent = tokio::time::Instant::now();
                }
            }
            continue;
        }
        for m in batch {
            metrics.message("out", m.kind_name());
            if tx.send(m).await.is_err() {
                return;
            }
        }
        last_sent = tokio::time::Instant::now();
    }
}
