//! The **fleet load generator**: many simulated agents in one process, so
//! that one machine can put a fleet's load on one hub. It is a load
//! generator, not an agent: the benchmark's output and docs say so, and
//! its certificates name it (`...:agent:fleet-load-generator`).
//!
//! Each simulated agent is, for the hub, an agent: its own TCP connection
//! and mutual TLS with its own client certificate (the OCM addon identity of
//! its cluster, read from files like the agent's), and the real protocol on
//! one stream. It opens the stream with the spoke-agent's own code
//! (`session::open`: Hello, Welcome, version check) and keeps what it sends
//! in the spoke-agent's `AgentState` (coalesced status reports, at most one
//! in flight per Application, acknowledgements and control messages first,
//! re-sent after a reconnect). It acknowledges every upsert, delete and
//! command, sends the digest of its observed set after every handshake and
//! every digest interval, answers the hub's desired digest with resync
//! requests and the hub's resync requests with repairs, sends heartbeats,
//! and reconnects with the agent's jittered backoff.
//!
//! What it does not have is a cluster: instead of a kube client, an API
//! server and Argo CD, each simulated agent keeps its Applications in
//! memory, as the agent would have applied them (`apply::applied_config`),
//! and plays its cluster's Argo CD by giving each a synced, healthy status
//! at once (one status report per Application; a real agent reports again
//! whenever Argo CD changes the status, and the hub coalesces those).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::digest::{Entries, Repair, SetDigest, repairs_for, resync_requests};
use argocd_pull_proto::limits;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, ApplicationUpsert, DigestSet, Heartbeat, HubMessage,
    ObjectAck, ObjectKey, ObservedApplication, OperationAck, ProjectSetAck, agent_message,
    hub_message, status_report,
};
use argocd_pull_proto::{content, validate};
use argocd_pull_runtime::backoff::Backoff;
use argocd_pull_spoke_agent::apply;
use argocd_pull_spoke_agent::session::{self, Opened};
use argocd_pull_spoke_agent::state::{AgentState, RETRY_PAUSE, Report};
use argocd_pull_spoke_agent::tls::TlsFiles;
use kube::ResourceExt;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Messages per batch the sender takes from the state, as the agent does.
const BATCH: usize = 64;
/// A connection that lasted this long was healthy (as in the agent).
const HEALTHY: Duration = Duration::from_secs(30);

static SESSIONS: AtomicU64 = AtomicU64::new(1);
/// The first session id of the current epoch (a hub process): an
/// acknowledgement on an earlier session came from a hub that is gone.
static EPOCH_FIRST_SESSION: AtomicU64 = AtomicU64::new(1);

/// The status the simulated Argo CD of `cluster` gives the Application
/// `name` once it has synced it at `target` (its spec's `targetRevision`):
/// what a small, healthy Application's status looks like (sync and health,
/// the last operation, three resources, one history entry), about 1.5 KiB
/// of JSON. The benchmark checks that the hub copy ends up with exactly
/// this.
pub fn simulated_status(cluster: &str, name: &str, target: &str) -> Value {
    // A commit hash: 40 hex digits.
    let revision: String = (0..3)
        .map(|i| content::hash_bytes(format!("{cluster}/{name}/{target}/{i}").as_bytes()))
        .collect::<String>()[..40]
        .to_string();
    let source = json!({ "repoURL": "https://git.example/bench.git", "path": "app", "targetRevision": target });
    let resource = |group: &str, version: &str, kind: &str| {
        json!({ "group": group, "version": version, "kind": kind, "namespace": name, "name": name,
                "status": "Synced", "health": { "status": "Healthy" } })
    };
    let result = |group: &str, version: &str, kind: &str| {
        json!({ "group": group, "version": version, "kind": kind, "namespace": name, "name": name,
                "status": "Synced", "message": format!("{} {name} created", kind.to_lowercase()),
                "hookPhase": "Running", "syncPhase": "Sync" })
    };
    json!({
        "health": { "status": "Healthy", "lastTransitionTime": "2026-01-01T00:00:05Z" },
        "sync": { "status": "Synced", "revision": revision,
                  "comparedTo": { "source": source,
                                  "destination": { "server": "https://kubernetes.default.svc", "namespace": name } } },
        "operationState": {
            "phase": "Succeeded", "message": "successfully synced (all tasks run)",
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:04Z",
            "operation": { "sync": { "revision": revision },
                           "initiatedBy": { "automated": true } },
            "syncResult": { "revision": revision, "source": source,
                            "resources": [ result("", "v1", "ConfigMap"), result("", "v1", "Service"),
                                           result("apps", "v1", "Deployment") ] }
        },
        "resources": [ resource("", "v1", "ConfigMap"), resource("", "v1", "Service"),
                       resource("apps", "v1", "Deployment") ],
        "history": [ { "id": 0, "revision": revision, "deployStartedAt": "2026-01-01T00:00:00Z",
                       "deployedAt": "2026-01-01T00:00:04Z", "source": source,
                       "initiatedBy": { "automated": true } } ],
        "summary": { "images": [ format!("registry.example/{name}:1.0") ] },
        "sourceType": "Directory",
        "reconciledAt": "2026-01-01T00:00:06Z",
        "controllerNamespace": "argocd"
    })
}

/// The `targetRevision` of an Application's spec (`""` when it names none).
pub fn target_revision(app: &Application) -> &str {
    app.data
        .pointer("/spec/source/targetRevision")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether a hub copy carries the status its agent sent for the spec it
/// has ([`simulated_status`]).
pub fn carries_its_status(app: &Application) -> bool {
    let cluster = app
        .annotations()
        .get(keys::MANAGED_CLUSTER)
        .map(String::as_str)
        .unwrap_or_default();
    app.data.get("status")
        == Some(&simulated_status(
            cluster,
            &app.name_any(),
            target_revision(app),
        ))
}

/// The simulated agents, and when the current hub process started (a
/// Welcome from before it came from an earlier one).
pub struct LoadGenerator {
    pub agents: Vec<Arc<SimulatedAgent>>,
    epoch: Mutex<Instant>,
    stop: watch::Sender<bool>,
}

/// Where one simulated agent stands on its current stream.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// The Welcome of its current stream, if that came from the current hub.
    pub welcomed_at: Option<Instant>,
    /// Applications it holds.
    pub apps: usize,
    /// When, on this stream, both digests came to agree: its Applications
    /// are the hub's desired set (the hub's desired digest equals its
    /// replica's), and the current hub process has acknowledged the
    /// current status of each of them, on this stream or an earlier one to
    /// the same process, with nothing left to send (so the hub's copy of
    /// its observed set is its own). An agent that reconnects to the same
    /// process is not asked again for reports the hub holds; counting only
    /// this stream's acknowledgements left such an agent out of sync for
    /// ever (2 of 10,000 in a run where the load generator, starved of CPU,
    /// missed heartbeats and the hub ended 671 streams as silent).
    pub in_sync_at: Option<Instant>,
}

impl LoadGenerator {
    /// A fresh PKI, a free loopback address for the hub's gRPC port, and
    /// one simulated agent per cluster dialling it (see
    /// [`LoadGenerator::for_clusters`]).
    pub fn on_loopback(
        clusters: &[String],
        agent: &str,
        backoff: (Duration, Duration),
    ) -> anyhow::Result<(crate::hub::Pki, std::net::SocketAddr, Self)> {
        let pki = crate::hub::Pki::new()?;
        let grpc_addr = testenv::net::free_addr()?;
        anyhow::ensure!(grpc_addr.ip().is_loopback(), "traffic stays on loopback");
        let address = format!("https://{grpc_addr}");
        let fleet = Self::for_clusters(&pki, clusters, &address, agent, backoff)?;
        Ok((pki, grpc_addr, fleet))
    }

    /// One simulated agent per cluster, each with a certificate of `pki`
    /// naming it `agent`, dialling `address` with `backoff` (min, max).
    pub fn for_clusters(
        pki: &crate::hub::Pki,
        clusters: &[String],
        address: &str,
        agent: &str,
        backoff: (Duration, Duration),
    ) -> anyhow::Result<Self> {
        let agents = clusters
            .iter()
            .map(|c| {
                let tls = pki.agent_files(c, &crate::hub::agent_subject(c, agent))?;
                Ok(SimulatedAgent::new(c, address, tls, backoff))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self::new(agents))
    }

    pub fn new(agents: Vec<SimulatedAgent>) -> Self {
        Self {
            agents: agents.into_iter().map(Arc::new).collect(),
            epoch: Mutex::new(Instant::now()),
            stop: watch::channel(false).0,
        }
    }

    /// A new hub process starts now.
    pub fn new_epoch(&self) -> Instant {
        let now = Instant::now();
        *self.epoch.lock().expect("never poisoned") = now;
        EPOCH_FIRST_SESSION.store(SESSIONS.load(Ordering::SeqCst), Ordering::SeqCst);
        now
    }

    /// Every agent offers `live-views` and answers a read of a path of
    /// `answers` with it (404 otherwise); before [`Self::start`].
    pub fn serve_live(&self, answers: Arc<LiveAnswers>) {
        for a in &self.agents {
            let _ = a.live.set(answers.clone());
        }
    }

    /// Starts every agent: each dials the hub and keeps reconnecting.
    pub fn start(&self) {
        for a in &self.agents {
            tokio::spawn(a.clone().run(self.stop.subscribe()));
        }
    }

    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    pub fn progress(&self) -> Vec<Progress> {
        let epoch = *self.epoch.lock().expect("never poisoned");
        self.agents.iter().map(|a| a.progress(epoch)).collect()
    }

    /// Connection attempts that failed, over all agents.
    pub fn failed_attempts(&self) -> u64 {
        self.agents
            .iter()
            .map(|a| a.failed.load(Ordering::Relaxed))
            .sum()
    }
}

/// One simulated agent (see the module documentation).
pub struct SimulatedAgent {
    pub cluster: String,
    hub_address: String,
    tls: TlsFiles,
    backoff: (Duration, Duration),
    state: Arc<AgentState>,
    local: Mutex<Local>,
    failed: AtomicU64,
    last_error: Mutex<String>,
    /// What it answers the hub's live reads, by path, once asked to serve
    /// them ([`LoadGenerator::serve_live`]).
    live: std::sync::OnceLock<Arc<LiveAnswers>>,
}

/// The answers of a simulated cluster to live reads, by path (query left
/// out): the bytes a real API server gave for the same paths.
pub type LiveAnswers = HashMap<String, Vec<u8>>;

/// An Application on the simulated cluster and what the agent reports of it.
struct Held {
    app: Application,
    observed: Arc<ObservedApplication>,
}

impl Held {
    fn version(&self) -> &str {
        self.observed
            .meta
            .as_ref()
            .map(|m| m.version.as_str())
            .unwrap_or_default()
    }
}

#[derive(Default)]
struct Local {
    apps: BTreeMap<ObjectKey, Held>,
    /// Commands carried out, by id (an agent records them on the Application).
    operations: HashSet<String>,
    next_uid: u64,
    stream: Option<Stream>,
    /// The version of each Application the hub acknowledged, and on which
    /// session: an agent that reconnects to the same hub process is not
    /// asked for reports the hub already holds (their digests agree), so
    /// the acknowledgements of its earlier sessions still count.
    acked: HashMap<ObjectKey, (String, u64)>,
}

/// What the benchmark tracks about the current stream.
struct Stream {
    id: u64,
    welcomed_at: Instant,
    /// The hub's desired digest, as last received on this stream.
    hub_desired: Option<SetDigest>,
    /// Status reports sent on this stream and not yet acknowledged.
    sent: HashMap<ObjectKey, (u64, String)>,
    in_sync_at: Option<Instant>,
}

impl SimulatedAgent {
    pub fn new(
        cluster: &str,
        hub_address: &str,
        tls: TlsFiles,
        backoff: (Duration, Duration),
    ) -> Self {
        Self {
            cluster: cluster.into(),
            hub_address: hub_address.into(),
            tls,
            backoff,
            state: Arc::new(AgentState::default()),
            local: Mutex::default(),
            failed: AtomicU64::new(0),
            live: std::sync::OnceLock::new(),
            last_error: Mutex::default(),
        }
    }

    fn local(&self) -> MutexGuard<'_, Local> {
        self.local.lock().expect("never poisoned")
    }

    pub fn last_error(&self) -> String {
        self.last_error.lock().expect("never poisoned").clone()
    }

    fn progress(&self, epoch: Instant) -> Progress {
        let local = self.local();
        let stream = local.stream.as_ref().filter(|s| s.welcomed_at >= epoch);
        Progress {
            welcomed_at: stream.map(|s| s.welcomed_at),
            apps: local.apps.len(),
            in_sync_at: stream.and_then(|s| s.in_sync_at),
        }
    }

    /// This release's Hello, with `live-views` when it serves them.
    fn hello(&self) -> argocd_pull_proto::v1::Hello {
        let mut hello =
            argocd_pull_proto::version::hello(AgentMode::Managed, env!("CARGO_PKG_VERSION"));
        if self.live.get().is_some() {
            hello
                .capabilities
                .push(argocd_pull_proto::version::CAPABILITY_LIVE_VIEWS.into());
        }
        hello
    }

    /// Connects, and reconnects, until `stop`.
    async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(self.backoff.0, self.backoff.1);
        loop {
            let started = Instant::now();
            let reason = tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                reason = self.session() => reason,
            };
            self.local().stream = None;
            self.failed.fetch_add(1, Ordering::Relaxed);
            *self.last_error.lock().expect("never poisoned") = reason;
            if started.elapsed() > HEALTHY {
                backoff.reset();
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(backoff.delay()) => {}
            }
        }
    }

    /// One stream, to its end; returns why it ended.
    async fn session(self: &Arc<Self>) -> String {
        let loaded = match self.tls.load() {
            Ok(l) => l,
            Err(e) => return format!("{e:#}"),
        };
        let Opened {
            tx,
            mut inbound,
            welcome,
            negotiated,
            ..
        } = match session::open_with(&self.hub_address, loaded.config, self.hello()).await {
            Ok(o) => o,
            Err(reason) => return reason,
        };
        let heartbeat = Duration::from_secs(welcome.heartbeat_interval_seconds.max(1) as u64);
        let digest_interval = Duration::from_secs(welcome.digest_interval_seconds.max(1) as u64);
        let id = SESSIONS.fetch_add(1, Ordering::Relaxed);
        self.state.attach(id, negotiated.capabilities);
        self.local().stream = Some(Stream {
            id,
            welcomed_at: Instant::now(),
            hub_desired: None,
            sent: HashMap::new(),
            in_sync_at: None,
        });
        // Compare right away, as the agent does.
        self.state.control(self.observed_digest());
        let sender = tokio::spawn(self.clone().send_loop(id, tx, heartbeat, digest_interval));
        let reason = loop {
            let m = match tokio::time::timeout(heartbeat * 3, inbound.message()).await {
                Err(_) => break format!("nothing from the hub for {:?}", heartbeat * 3),
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => break "the hub closed the stream".into(),
                Ok(Err(status)) => break format!("{:?}: {}", status.code(), status.message()),
            };
            if let Err(e) = validate::hub_message(&m) {
                break format!("the hub sent a malformed message: {e}");
            }
            if let Err(e) = self.handle(id, m) {
                break e;
            }
        };
        sender.abort();
        self.state.detach(id);
        reason
    }

    async fn send_loop(
        self: Arc<Self>,
        id: u64,
        tx: mpsc::Sender<AgentMessage>,
        heartbeat: Duration,
        digest_interval: Duration,
    ) {
        let mut digest = tokio::time::interval(digest_interval);
        digest.tick().await;
        let mut last_sent = Instant::now();
        loop {
            let notified = self.state.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let batch = self.state.next_messages(id, BATCH);
            if batch.is_empty() {
                tokio::select! {
                    _ = &mut notified => {}
                    _ = digest.tick() => self.state.control(self.observed_digest()),
                    _ = tokio::time::sleep_until(last_sent + heartbeat) => {
                        let hb = AgentMessage { kind: Some(agent_message::Kind::Heartbeat(Heartbeat {
                            sent_at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as i64,
                        })) };
                        if tx.send(hb).await.is_err() {
                            return;
                        }
                        last_sent = Instant::now();
                    }
                }
                continue;
            }
            {
                let mut local = self.local();
                if let Some(stream) = local.stream.as_mut().filter(|s| s.id == id) {
                    for m in &batch {
                        if let Some(agent_message::Kind::Status(r)) = &m.kind
                            && let (Some(key), Some(status_report::State::Observed(o))) =
                                (&r.key, &r.state)
                        {
                            let version = o.meta.as_ref().map(|m| m.version.clone());
                            stream
                                .sent
                                .insert(key.clone(), (r.seq, version.unwrap_or_default()));
                        }
                    }
                }
            }
            for m in batch {
                if tx.send(m).await.is_err() {
                    return;
                }
            }
            last_sent = Instant::now();
        }
    }

    fn handle(&self, id: u64, m: HubMessage) -> Result<(), String> {
        use hub_message::Kind;
        let mut guard = self.local();
        // Through a plain reference, so that its fields borrow apart.
        let local = &mut *guard;
        match m.kind.expect("validated") {
            Kind::Welcome(_) => unreachable!("validated"),
            Kind::Heartbeat(_) | Kind::LiveCancel(_) | Kind::LiveCredit(_) => {}
            // The generator offers no `terminal`: a hub sends none.
            Kind::TerminalOpen(_)
            | Kind::TerminalData(_)
            | Kind::TerminalCredit(_)
            | Kind::TerminalClose(_) => {}
            // Answered whole, in one chunk (the answers are small).
            Kind::LiveRequest(r) => {
                let path = r.path.split('?').next().unwrap_or_default();
                let (code, body) = match self.live.get().and_then(|a| a.get(path)) {
                    Some(body) => (200, body.clone()),
                    None => (404, br#"{"kind":"Status","code":404}"#.to_vec()),
                };
                self.state.control(AgentMessage {
                    kind: Some(agent_message::Kind::LiveResponse(
                        argocd_pull_proto::v1::LiveResponse {
                            id: r.id,
                            http_status: code,
                            content_type: "application/json".into(),
                            body,
                            last: true,
                        },
                    )),
                });
            }
            // Kept as an agent keeps them, in memory: nothing to check.
            Kind::ProjectSet(p) => self.state.control(AgentMessage {
                kind: Some(agent_message::Kind::ProjectSetAck(ProjectSetAck {
                    version: p.version,
                    outcome: AckOutcome::Applied as i32,
                    message: String::new(),
                })),
            }),
            Kind::Upsert(u) => {
                let key = u.key.clone().expect("validated");
                let seq = u.seq;
                let (outcome, message) = self.upsert(local, u);
                self.ack(key.clone(), seq, outcome, message);
                if let Some(held) = local.apps.get(&key) {
                    self.state
                        .report(&key, Report::Observed(held.observed.clone()), false);
                }
            }
            Kind::Delete(d) => {
                let key = d.key.clone().expect("validated");
                let ours = local
                    .apps
                    .get(&key)
                    .is_some_and(|h| h.app.annotations().get(keys::HUB_UID) == Some(&d.hub_uid));
                if d.release {
                    // Left running, no longer managed: not reported any more.
                    if ours {
                        local.apps.remove(&key);
                    }
                    self.state.unreport(&key);
                    self.ack(key, d.seq, AckOutcome::Applied, String::new());
                } else {
                    let uid = if ours {
                        local
                            .apps
                            .remove(&key)
                            .and_then(|h| h.app.metadata.uid)
                            .unwrap_or_default()
                    } else {
                        String::new()
                    };
                    self.ack(key.clone(), d.seq, AckOutcome::Applied, String::new());
                    // Gone at once: the simulated Argo CD has nothing to cascade.
                    self.state.report(&key, Report::Gone { uid }, !ours);
                }
            }
            Kind::Operation(op) => {
                let key = op.key.clone().expect("validated");
                let (outcome, message) = if !local.apps.contains_key(&key) {
                    (
                        AckOutcome::Retry,
                        "the Application is not applied yet".into(),
                    )
                } else if local.operations.insert(op.operation_id.clone()) {
                    (AckOutcome::Applied, String::new())
                } else {
                    (AckOutcome::Duplicate, String::new())
                };
                self.state.control(AgentMessage {
                    kind: Some(agent_message::Kind::OperationAck(OperationAck {
                        operation_id: op.operation_id,
                        key: Some(key),
                        outcome: outcome as i32,
                        message,
                        // No Argo CD runs here to settle a sync: answered at
                        // once, as an agent of an older release does.
                        ..Default::default()
                    })),
                });
            }
            Kind::ObjectAck(a) => {
                let key = a.key.expect("validated");
                match AckOutcome::try_from(a.outcome).unwrap_or(AckOutcome::Retry) {
                    AckOutcome::Retry => {
                        let (state, seq) = (self.state.clone(), a.seq);
                        tokio::spawn(async move {
                            tokio::time::sleep(RETRY_PAUSE).await;
                            state.retry(&key, seq);
                        });
                    }
                    outcome => {
                        if outcome == AckOutcome::Rejected {
                            tracing::warn!(cluster = %self.cluster, namespace = %key.namespace, name = %key.name,
                                message = %a.message, "fleet load generator: the hub refused a status report");
                        }
                        self.state.acked(&key, a.seq);
                        if let Some(stream) = local.stream.as_mut().filter(|s| s.id == id)
                            && stream.sent.get(&key).is_some_and(|(seq, _)| *seq == a.seq)
                        {
                            let (_, version) = stream.sent.remove(&key).expect("just seen");
                            if outcome == AckOutcome::Applied {
                                local.acked.insert(key, (version, id));
                            }
                        }
                    }
                }
            }
            Kind::Digest(d) => {
                let (set, theirs) = SetDigest::from_proto(&d).map_err(|e| e.to_string())?;
                if set == DigestSet::Desired {
                    let ours = replica(local);
                    let buckets = SetDigest::of(&ours).differing_buckets(&theirs);
                    for r in resync_requests(DigestSet::Desired, &ours, &buckets) {
                        self.state.control(AgentMessage {
                            kind: Some(agent_message::Kind::ResyncRequest(r)),
                        });
                    }
                    if let Some(stream) = local.stream.as_mut().filter(|s| s.id == id) {
                        stream.hub_desired = Some(theirs);
                    }
                }
            }
            Kind::ResyncRequest(r) => {
                let repairs =
                    repairs_for(&observed_entries(local), &r).map_err(|e| e.to_string())?;
                for repair in repairs {
                    match repair {
                        Repair::Send(key) => {
                            if let Some(held) = local.apps.get(&key) {
                                self.state.report(
                                    &key,
                                    Report::Observed(held.observed.clone()),
                                    true,
                                );
                            }
                        }
                        Repair::Remove(key) => {
                            self.state
                                .report(&key, Report::Gone { uid: String::new() }, true)
                        }
                    }
                }
            }
        }
        self.check_in_sync(local, id);
        Ok(())
    }

    fn ack(&self, key: ObjectKey, seq: u64, outcome: AckOutcome, message: String) {
        self.state.control(AgentMessage {
            kind: Some(agent_message::Kind::ObjectAck(ObjectAck {
                key: Some(key),
                seq,
                outcome: outcome as i32,
                message,
            })),
        });
    }

    /// Applies an upsert to the simulated cluster, as the agent would, and
    /// has the simulated Argo CD sync it.
    fn upsert(&self, local: &mut Local, u: ApplicationUpsert) -> (AckOutcome, String) {
        let key = u.key.clone().expect("validated");
        if let Err(e) = limits::check_object_json(
            &format!("Application {}/{}", key.namespace, key.name),
            u.application_json.len(),
        ) {
            return (AckOutcome::Rejected, e.to_string());
        }
        let meta = u.meta.clone().unwrap_or_default();
        if let Some(held) = local.apps.get(&key) {
            let a = held.app.annotations();
            if a.get(keys::DESIRED_VERSION) == Some(&meta.version)
                && a.get(keys::HUB_UID) == Some(&meta.uid)
            {
                return (AckOutcome::Applied, String::new());
            }
        }
        let config =
            match apply::applied_config(&key, &u.application_json, &meta.uid, &meta.version) {
                Ok(c) => c,
                Err(e) => return (AckOutcome::Rejected, e.to_string()),
            };
        let mut app: Application = match serde_json::from_value(config) {
            Ok(a) => a,
            Err(e) => return (AckOutcome::Rejected, e.to_string()),
        };
        local.next_uid += 1;
        let uid = match local.apps.get(&key) {
            Some(h) => h.app.metadata.uid.clone(),
            None => Some(format!("{}-{}", self.cluster, local.next_uid)),
        };
        app.metadata.uid = uid;
        app.metadata.resource_version = Some(local.next_uid.to_string());
        app.metadata.generation = Some(1);
        app.data["status"] = simulated_status(&self.cluster, &key.name, target_revision(&app));
        let (_, observed) = apply::observed(&app, false);
        local.apps.insert(
            key,
            Held {
                app,
                observed: Arc::new(observed),
            },
        );
        (AckOutcome::Applied, String::new())
    }

    fn observed_digest(&self) -> AgentMessage {
        let entries = observed_entries(&self.local());
        AgentMessage {
            kind: Some(agent_message::Kind::Digest(
                SetDigest::of(&entries).to_proto(DigestSet::Observed),
            )),
        }
    }

    /// Records when this stream first came to agree with the hub both ways
    /// (see [`Progress::in_sync_at`]).
    fn check_in_sync(&self, local: &mut Local, id: u64) {
        let Some(stream) = local.stream.as_ref().filter(|s| s.id == id) else {
            return;
        };
        let Some(theirs) = stream
            .hub_desired
            .as_ref()
            .filter(|_| stream.in_sync_at.is_none())
        else {
            return;
        };
        let first = EPOCH_FIRST_SESSION.load(Ordering::SeqCst);
        let all_acked = local.apps.iter().all(|(k, h)| {
            local
                .acked
                .get(k)
                .is_some_and(|(v, session)| v == h.version() && *session >= first)
        });
        if !all_acked || SetDigest::of(&replica(local)) != *theirs || !self.state.drained() {
            return;
        }
        if let Some(stream) = local.stream.as_mut() {
            stream.in_sync_at = Some(Instant::now());
        }
    }
}

/// The agent's replica of the hub's desired set (what it applied).
fn replica(local: &Local) -> Entries {
    local
        .apps
        .values()
        .filter_map(|h| Some((apply::key_of(&h.app), apply::replica_version(&h.app)?)))
        .collect()
}

/// The set the agent owns: the version of its report of each Application.
fn observed_entries(local: &Local) -> Entries {
    local
        .apps
        .iter()
        .map(|(k, h)| (k.clone(), h.version().to_string()))
        .collect()
}
