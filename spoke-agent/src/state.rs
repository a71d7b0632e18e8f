//! What the agent holds across its connections to the hub: the hub's
//! instructions not yet carried out, the last desired state applied per
//! Application (to revert local edits), commands to run, and the outbox of
//! status reports. No I/O: the session and the workers move things in and
//! out.

use argocd_pull_runtime::telemetry::{self, SpanName};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use argocd_pull_proto::coalesce::Outbox;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, ApplicationUpsert, Gone, LiveResponse, ObjectAck, ObjectKey,
    ObservedApplication, OperationRequest, ProjectSetAck, ResourceTreeReport, StatusReport,
    agent_message, status_report,
};
use argocd_pull_proto::version;
use tokio::sync::Notify;

/// At most this many status reports in flight to the hub.
pub const WINDOW: usize = 512;

/// What the hub asked for one Application.
#[derive(Clone, Debug)]
pub enum Instruction {
    Upsert(Arc<ApplicationUpsert>),
    Delete { hub_uid: String },
    Release { hub_uid: String },
}

/// One status report.
#[derive(Clone, Debug)]
pub enum Report {
    Observed(Arc<ObservedApplication>),
    Gone { uid: String },
}

impl Report {
    /// Nothing is there (the agent does not say whose uid is gone).
    pub fn gone() -> Self {
        Report::Gone { uid: String::new() }
    }
}

#[derive(Default)]
pub struct Inner {
    outbox: Option<Outbox<ObjectKey, Report>>,
    /// The version last put in the outbox per key, for Applications that
    /// exist (a key reported gone is forgotten, so memory follows the
    /// Applications there are).
    reported: HashMap<ObjectKey, String>,
    instructions: HashMap<ObjectKey, (u64, Instruction)>,
    remembered: HashMap<ObjectKey, Arc<ApplicationUpsert>>,
    ops: HashMap<ObjectKey, Vec<OperationRequest>>,
    /// Syncs set on the cluster and not settled yet: id and the uid of the
    /// Application they were set on.
    settling: HashMap<ObjectKey, Vec<(String, String)>>,
    control: VecDeque<AgentMessage>,
    session: Option<u64>,
    /// The capabilities the current stream's hub negotiated.
    capabilities: BTreeSet<String>,
    in_flight: HashMap<ObjectKey, (u64, Instant)>,
    /// With `--otlp-endpoint`: the trace (W3C `traceparent`) of the last
    /// apply of a key, which its reports continue for [`TRACE_REPORTS`]
    /// after it (the cluster's Argo CD syncs what was applied, and the
    /// statuses it writes meanwhile belong to that delivery).
    traces: HashMap<ObjectKey, (String, Instant)>,
    /// Capability `trees`: the latest tree of each Application not sent
    /// yet, sent after everything else (a later one replaces it).
    trees: std::collections::BTreeMap<ObjectKey, ResourceTreeReport>,
    /// Capability `live-views`: the chunks of live answers not sent yet,
    /// sent after the status reports; at most [`LIVE_QUEUE`] (a reader
    /// waits for room, so a slow hub holds back a followed log, not the
    /// stream).
    live: VecDeque<LiveResponse>,
}

impl Inner {
    fn outbox(&mut self) -> &mut Outbox<ObjectKey, Report> {
        self.outbox.get_or_insert_with(|| Outbox::new(WINDOW))
    }

    /// A stream ended: the reports in flight on it go back to the outbox,
    /// and the control messages not sent on it are dropped.
    fn end_stream(&mut self) {
        self.outbox().requeue_in_flight();
        self.in_flight.clear();
        self.control.clear();
        self.trees.clear();
        self.live.clear();
    }
}

#[derive(Default)]
pub struct AgentState {
    inner: Mutex<Inner>,
    /// Wakes the session's sender.
    pub wake: Notify,
    /// Told when a stream whose hub negotiated `trees` starts: every tree
    /// is reported again on it.
    pub trees_wanted: Notify,
    /// Told when a chunk of a live answer was sent (there is room).
    live_room: Notify,
}

/// At most this many chunks of live answers wait to be sent.
pub const LIVE_QUEUE: usize = 16;

/// How long after an apply the reports of its key continue its trace.
pub const TRACE_REPORTS: std::time::Duration = std::time::Duration::from_secs(60);

/// The `traceparent` of a report's own trace (empty unless traces are
/// exported).
fn report_trace(key: &ObjectKey) -> String {
    if !telemetry::enabled() {
        return String::new();
    }
    let span = telemetry::span(SpanName::Report, None, "", &key.namespace, &key.name);
    telemetry::traceparent(&span)
}

impl AgentState {
    /// The reports of `key` continue the trace `traceparent` (empty: none)
    /// for [`TRACE_REPORTS`].
    pub fn trace_report(&self, key: &ObjectKey, traceparent: String) {
        if !traceparent.is_empty() {
            self.lock()
                .traces
                .insert(key.clone(), (traceparent, Instant::now()));
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .expect("never poisoned: no code panics holding it")
    }

    // -- from the hub ---------------------------------------------------------

    /// Records the hub's latest instruction for `key` (a newer one replaces
    /// one not carried out yet).
    pub fn instruct(&self, key: ObjectKey, seq: u64, instruction: Instruction) {
        self.lock().instructions.insert(key, (seq, instruction));
    }

    pub fn take_instruction(&self, key: &ObjectKey) -> Option<(u64, Instruction)> {
        self.lock().instructions.remove(key)
    }

    /// The desired state last applied for `key`, to revert a local edit.
    pub fn remembered(&self, key: &ObjectKey) -> Option<Arc<ApplicationUpsert>> {
        self.lock().remembered.get(key).cloned()
    }

    pub fn remember(&self, key: &ObjectKey, upsert: Arc<ApplicationUpsert>) {
        self.lock().remembered.insert(key.clone(), upsert);
    }

    pub fn forget(&self, key: &ObjectKey) {
        let mut inner = self.lock();
        inner.remembered.remove(key);
        inner.traces.remove(key);
    }

    pub fn add_op(&self, key: ObjectKey, op: OperationRequest) {
        let mut inner = self.lock();
        let ops = inner.ops.entry(key).or_default();
        if !ops.iter().any(|o| o.operation_id == op.operation_id) {
            ops.push(op);
        }
    }

    pub fn take_ops(&self, key: &ObjectKey) -> Vec<OperationRequest> {
        self.lock().ops.remove(key).unwrap_or_default()
    }

    /// Remembers a sync set on `key`'s Application (uid `uid`), answered
    /// once it settles.
    pub fn settle_later(&self, key: &ObjectKey, id: &str, uid: &str) {
        let mut inner = self.lock();
        let waiting = inner.settling.entry(key.clone()).or_default();
        if !waiting.iter().any(|(i, _)| i == id) {
            waiting.push((id.to_string(), uid.to_string()));
        }
    }

    /// The syncs of `key` not settled yet.
    pub fn settling(&self, key: &ObjectKey) -> Vec<(String, String)> {
        self.lock().settling.get(key).cloned().unwrap_or_default()
    }

    pub fn settled(&self, key: &ObjectKey, id: &str) {
        let mut inner = self.lock();
        if let Some(waiting) = inner.settling.get_mut(key) {
            waiting.retain(|(i, _)| i != id);
            if waiting.is_empty() {
                inner.settling.remove(key);
            }
        }
    }

    // -- to the hub -----------------------------------------------------------

    /// Queues a report unless the same version was queued last (`force`:
    /// queue it anyway, a repair the hub asked for).
    pub fn report(&self, key: &ObjectKey, report: Report, force: bool) {
        let mut inner = self.lock();
        match &report {
            Report::Observed(o) => {
                let version = o
                    .meta
                    .as_ref()
                    .map(|m| m.version.clone())
                    .unwrap_or_default();
                if !force && inner.reported.get(key) == Some(&version) {
                    return;
                }
                inner.reported.insert(key.clone(), version);
            }
            Report::Gone { .. } => {
                if inner.reported.remove(key).is_none() && !force {
                    return;
                }
            }
        }
        inner.outbox().upsert(key.clone(), report);
        drop(inner);
        self.wake.notify_one();
    }

    /// Stops reporting `key` without telling the hub it is gone (released).
    pub fn unreport(&self, key: &ObjectKey) {
        self.lock().reported.remove(key);
    }

    /// Whether `key` was last reported as existing.
    pub fn was_reported(&self, key: &ObjectKey) -> bool {
        self.lock().reported.contains_key(key)
    }

    /// Keys the agent has reported as existing.
    pub fn reported_keys(&self) -> Vec<ObjectKey> {
        self.lock().reported.keys().cloned().collect()
    }

    /// Queues a control message (acknowledgement, digest, resync request).
    pub fn control(&self, m: AgentMessage) {
        self.lock().control.push_back(m);
        self.wake.notify_one();
    }

    /// Queues the answer to a ProjectSet when the current stream's hub
    /// negotiated `projects`; returns whether it did. A hub of the release
    /// before does not know the message and ends the stream on it (after a
    /// rollback, agents re-answering their last set never stayed
    /// connected). Checked under the lock that `attach` takes, so an
    /// answer meant for one stream never goes out on the next.
    pub fn project_set_ack(&self, ack: ProjectSetAck) -> bool {
        let mut inner = self.lock();
        if inner.session.is_none() || !inner.capabilities.contains(version::CAPABILITY_PROJECTS) {
            return false;
        }
        inner.control.push_back(AgentMessage {
            kind: Some(agent_message::Kind::ProjectSetAck(ack)),
        });
        drop(inner);
        self.wake.notify_one();
        true
    }

    /// Queues the tree of one Application when the current stream's hub
    /// negotiated `trees` (replacing one not sent yet); returns whether it
    /// did.
    pub fn tree_report(&self, report: ResourceTreeReport) -> bool {
        let mut inner = self.lock();
        if inner.session.is_none() || !inner.capabilities.contains(version::CAPABILITY_TREES) {
            return false;
        }
        let key = report.key.clone().unwrap_or_default();
        inner.trees.insert(key, report);
        drop(inner);
        self.wake.notify_one();
        true
    }

    /// Queues a chunk of a live answer for stream `session`, waiting while
    /// [`LIVE_QUEUE`] chunks wait; false when that stream ended (or never
    /// negotiated `live-views`): the answer is dropped.
    pub async fn live_response(&self, session: u64, response: LiveResponse) -> bool {
        loop {
            let room = self.live_room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut inner = self.lock();
                if inner.session != Some(session)
                    || !inner.capabilities.contains(version::CAPABILITY_LIVE_VIEWS)
                {
                    return false;
                }
                if inner.live.len() < LIVE_QUEUE {
                    inner.live.push_back(response);
                    drop(inner);
                    self.wake.notify_one();
                    return true;
                }
            }
            room.await;
        }
    }

    /// The current stream, when its hub negotiated `live-views`.
    pub fn live_session(&self) -> Option<u64> {
        let inner = self.lock();
        inner
            .capabilities
            .contains(version::CAPABILITY_LIVE_VIEWS)
            .then_some(inner.session)
            .flatten()
    }

    /// Queues the acknowledgement of the hub's message `seq` about `key`.
    pub fn object_ack(&self, key: ObjectKey, seq: u64, outcome: AckOutcome, message: String) {
        self.control(AgentMessage {
            kind: Some(agent_message::Kind::ObjectAck(ObjectAck {
                key: Some(key),
                seq,
                outcome: outcome as i32,
                message,
            })),
        });
    }

    // -- sessions -------------------------------------------------------------

    /// A new stream: reports in flight on the old one go back to the outbox.
    /// Stream `id` is the current one, its hub having negotiated
    /// `capabilities`.
    pub fn attach(&self, id: u64, capabilities: BTreeSet<String>) {
        let mut inner = self.lock();
        inner.session = Some(id);
        let trees = capabilities.contains(version::CAPABILITY_TREES);
        inner.capabilities = capabilities;
        inner.end_stream();
        drop(inner);
        self.live_room.notify_waiters();
        if trees {
            self.trees_wanted.notify_one();
        }
    }

    pub fn detach(&self, id: u64) {
        let mut inner = self.lock();
        if inner.session == Some(id) {
            inner.session = None;
            inner.end_stream();
        }
        drop(inner);
        // Live readers waiting for room see that their stream ended.
        self.live_room.notify_waiters();
    }

    /// Up to `max` messages for session `id`, control messages first.
    pub fn next_messages(&self, id: u64, max: usize) -> Vec<AgentMessage> {
        let mut inner = self.lock();
        if inner.session != Some(id) {
            return Vec::new();
        }
        let mut out = Vec::new();
        while out.len() < max {
            match inner.control.pop_front() {
                Some(m) => out.push(m),
                None => break,
            }
        }
        let now = Instant::now();
        while out.len() < max {
            let Some(m) = inner.outbox().next_ready() else {
                break;
            };
            inner.in_flight.insert(m.key.clone(), (m.seq, now));
            let state = match m.value {
                Report::Observed(o) => status_report::State::Observed(o.as_ref().clone()),
                Report::Gone { uid } => status_report::State::Gone(Gone { uid }),
            };
            // The trace of the apply it follows, or one of its own.
            let trace_parent = match inner.traces.get(&m.key) {
                Some((t, at)) if at.elapsed() < TRACE_REPORTS => t.clone(),
                Some(_) => {
                    inner.traces.remove(&m.key);
                    report_trace(&m.key)
                }
                None => report_trace(&m.key),
            };
            out.push(AgentMessage {
                kind: Some(agent_message::Kind::Status(StatusReport {
                    key: Some(m.key),
                    seq: m.seq,
                    state: Some(state),
                    trace_parent,
                })),
            });
        }
        let mut sent_live = false;
        while out.len() < max {
            let Some(chunk) = inner.live.pop_front() else {
                break;
            };
            sent_live = true;
            out.push(AgentMessage {
                kind: Some(agent_message::Kind::LiveResponse(chunk)),
            });
        }
        if sent_live {
            self.live_room.notify_waiters();
        }
        while out.len() < max {
            let Some((_, tree)) = inner.trees.pop_first() else {
                break;
            };
            out.push(AgentMessage {
                kind: Some(agent_message::Kind::Tree(tree)),
            });
        }
        out
    }

    /// The hub took (key, seq), or refused it for good.
    pub fn acked(&self, key: &ObjectKey, seq: u64) {
        self.answered(key, seq, true);
    }

    /// The hub could not take (key, seq) now: it goes again.
    pub fn retry(&self, key: &ObjectKey, seq: u64) {
        self.answered(key, seq, false);
    }

    /// The hub answered (key, seq), which is in flight no more if it is
    /// the report in flight for `key`: settled (`took`) or sent again.
    fn answered(&self, key: &ObjectKey, seq: u64, took: bool) {
        let mut inner = self.lock();
        let outbox = inner.outbox();
        let in_flight = if took {
            outbox.ack(key, seq)
        } else {
            outbox.nack(key, seq)
        };
        if in_flight {
            inner.in_flight.remove(key);
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// Seconds the oldest unacknowledged report has waited, and how many
    /// Applications have a report pending or in flight.
    pub fn lag(&self) -> (f64, usize) {
        let mut inner = self.lock();
        let oldest = inner
            .in_flight
            .values()
            .map(|(_, t)| t.elapsed().as_secs_f64())
            .fold(0.0, f64::max);
        (oldest, inner.outbox().len())
    }

    /// Whether every report has been taken by the hub.
    pub fn drained(&self) -> bool {
        self.lock().outbox().is_empty()
    }
}

/// How long to wait before sending a report the hub asked to retry.
pub const RETRY_PAUSE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_proto::v1::ObjectMeta;

    fn key(n: &str) -> ObjectKey {
        ObjectKey {
            namespace: "ns".into(),
            name: n.into(),
        }
    }

    fn observed(version: &str) -> Report {
        Report::Observed(Arc::new(ObservedApplication {
            meta: Some(ObjectMeta {
                version: version.into(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    fn seqs(ms: &[AgentMessage]) -> Vec<(String, u64)> {
        ms.iter()
            .filter_map(|m| match &m.kind {
                Some(agent_message::Kind::Status(s)) => Some((s.key.clone().unwrap().name, s.seq)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn reports_coalesce_and_survive_a_reconnect() {
        let s = AgentState::default();
        s.report(&key("a"), observed("1"), false);
        s.report(&key("a"), observed("2"), false);
        s.report(&key("a"), observed("2"), false);
        s.report(&key("b"), observed("1"), false);
        assert!(s.next_messages(1, 10).is_empty(), "no session");
        s.attach(1, BTreeSet::new());
        let first = seqs(&s.next_messages(1, 10));
        assert_eq!(first.len(), 2, "one per Application: {first:?}");
        // The stream breaks before the acknowledgements.
        s.attach(2, BTreeSet::new());
        let again = seqs(&s.next_messages(2, 10));
        assert_eq!(again.len(), 2);
        s.acked(&key("a"), first[0].1);
        assert!(
            !s.drained(),
            "an acknowledgement of the old stream does not count"
        );
        for (name, seq) in again {
            s.acked(&key(&name), seq);
        }
        assert!(s.drained());
        // A repair re-sends even an unchanged version.
        s.report(&key("a"), observed("2"), false);
        assert!(s.next_messages(2, 10).is_empty());
        s.report(&key("a"), observed("2"), true);
        assert_eq!(seqs(&s.next_messages(2, 10)).len(), 1);
    }

    /// Only a hub that negotiated `projects` knows ProjectSetAck: a hub of
    /// the release before ends the stream on it.
    #[test]
    fn a_project_set_answer_goes_only_on_a_stream_whose_hub_negotiated_projects() {
        let s = AgentState::default();
        let ack = |v: &str| ProjectSetAck {
            version: v.into(),
            outcome: AckOutcome::Applied as i32,
            message: String::new(),
        };
        assert!(!s.project_set_ack(ack("v0")), "no stream");
        s.attach(1, BTreeSet::new());
        assert!(!s.project_set_ack(ack("v1")), "a hub without `projects`");
        assert!(s.next_messages(1, 10).is_empty());
        s.attach(2, [version::CAPABILITY_PROJECTS.to_string()].into());
        assert!(s.project_set_ack(ack("v2")));
        let sent = s.next_messages(2, 10);
        assert!(
            matches!(&sent[..], [AgentMessage { kind: Some(agent_message::Kind::ProjectSetAck(a)) }] if a.version == "v2"),
            "{sent:?}"
        );
    }

    #[test]
    fn control_messages_go_first() {
        let s = AgentState::default();
        s.attach(1, BTreeSet::new());
        s.report(&key("a"), observed("1"), false);
        s.control(AgentMessage::default());
        let ms = s.next_messages(1, 10);
        assert!(ms[0].kind.is_none() && ms.len() == 2);
    }
}
