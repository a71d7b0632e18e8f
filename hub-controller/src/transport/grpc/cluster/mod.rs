//! What the hub holds for one cluster's agent, across its connections: the
//! desired set (managed mode), the outbox that delivers it, the latest
//! observed report of every Application, and the commands not yet
//! acknowledged. No I/O: the session moves messages in and out, the index
//! and the reconcilers read and change it.
//!
//! Nothing here grows with what an agent sends: acknowledgements wait in a
//! queue the session bounds (it stops reading the agent while the queue is
//! full), digests and resync requests are flags and bucket numbers turned
//! into messages when sent, and a retry is scheduled once per message.
//!
//! Two layers: [`Inner`] is the state machine, without locks or wakeups
//! (`delivery` for the deliveries and reports, `sessions` for what a
//! session sends, [`Ops`] for the commands); [`ClusterState`] holds it
//! under one lock and wakes the session's sender and receiver when it
//! changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use argocd_pull_proto::coalesce::Outbox;
use argocd_pull_proto::digest::{Entries, Repair, SetDigest, resync_requests};
use argocd_pull_proto::v1::{AckOutcome, AgentMode, DigestSet, ObjectKey, ObservedApplication};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Notify, watch};

use crate::compact::CompactJson;
use crate::transport::grpc::assign::{Desired, HubRef};

mod control;
mod delivery;
pub mod held;
pub mod live;
mod ops;
pub use ops::{Ops, PendingOp};
mod sessions;
pub mod terminal;
mod traces;

use control::Control;
pub use delivery::Deletes;
use delivery::Sending;

/// At most this many object messages in flight to one agent.
pub const WINDOW: usize = 512;

/// An object message waiting in the outbox.
#[derive(Clone, Debug)]
pub enum Item {
    Upsert(Arc<Desired>),
    Delete { hub_uid: String },
    Release { hub_uid: String },
}

/// Two items are the same message when they would change the same thing:
/// an upsert is its content version (a new resourceVersion of the hub
/// Application, say from a status write, is not a new desired state).
impl PartialEq for Item {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Item::Upsert(a), Item::Upsert(b)) => a.version() == b.version(),
            (Item::Delete { hub_uid: a }, Item::Delete { hub_uid: b })
            | (Item::Release { hub_uid: a }, Item::Release { hub_uid: b }) => a == b,
            _ => false,
        }
    }
}

/// A report as the hub keeps it until the next one: its JSON compressed
/// (a status is most of what the hub holds per Application).
#[derive(Debug)]
pub struct Report {
    /// The hub Application it was delivered for (empty from agents before
    /// `owner-check`).
    pub hub_uid: String,
    pub status: CompactJson,
    /// Autonomous mode: the whole Application.
    pub application: Option<CompactJson>,
    /// Bytes of JSON the agent sent (what the mirror limits count).
    pub bytes: usize,
}

impl Report {
    /// Keeps `o`, whose JSON the caller has checked.
    pub fn of(o: &ObservedApplication) -> Self {
        Self {
            hub_uid: o.hub_uid.clone(),
            status: CompactJson::new(&o.status_json),
            application: (!o.application_json.is_empty())
                .then(|| CompactJson::new(&o.application_json)),
            bytes: o.status_json.len() + o.application_json.len(),
        }
    }
}

/// The latest report of one Application.
#[derive(Clone, Debug)]
pub enum Observation {
    Observed {
        version: String,
        report: Arc<Report>,
    },
    Gone,
    /// Known only from the mirror on the hub (autonomous mode, before the
    /// agent reported it again): in the replica, nothing to write.
    Mirrored {
        version: String,
    },
}

impl Observation {
    /// What the report says the agent holds under its key: `Some(uid)`
    /// for a copy applied for that hub Application (managed mode), `None`
    /// for a copy gone; nothing for an autonomous Application (a mirror's).
    pub fn holder(&self) -> Option<Option<&str>> {
        match self {
            Observation::Observed { version, report } if report.application.is_none() => {
                let uid = (!report.hub_uid.is_empty())
                    .then_some(report.hub_uid.as_str())
                    .or_else(|| crate::transport::grpc::assign::uid_of_version(version))?;
                Some(Some(uid))
            }
            Observation::Gone => Some(None),
            Observation::Observed { .. } | Observation::Mirrored { .. } => None,
        }
    }
}

/// Which hub object a command belongs to, and where its completion goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    /// A pull-model hub Application (managed mode).
    App(HubRef),
    /// The read-only mirror of an autonomous agent's Application.
    Mirror { cluster: String, key: ObjectKey },
}

/// Why the hub ends a session from outside its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// A newer connection of the same cluster took over.
    Replaced,
    /// The cluster was revoked ([`ClusterState::revoke`]), with why.
    Revoked(String),
    /// The session's certificate went on the deny list, with its note.
    Denied(String),
}

/// The connected agent.
#[derive(Debug)]
struct Session {
    id: u64,
    mode: AgentMode,
    /// Who connected, and when.
    agent: Agent,
    /// Ends the session's tasks, saying why.
    stop: watch::Sender<Option<Stop>>,
}

/// One cluster's state machine (see the module documentation).
#[derive(Default)]
pub struct Inner {
    /// Managed mode: what the hub wants on the cluster, live objects only
    /// (the set its digest covers).
    pub desired: BTreeMap<ObjectKey, Arc<Desired>>,
    /// Object messages on their way to the agent.
    sending: Sending,
    /// The latest report per key: the hub's replica of the observed set.
    pub observed: HashMap<ObjectKey, Observation>,
    pub ops: Ops,
    session: Option<Session>,
    /// Capability `live-views`: the reads under way on the session.
    live: live::LiveReads,
    /// What is sent ahead of object messages.
    control: Control,
    /// Why the cluster may not connect, while it may not.
    revoked: Option<String>,
    /// Why the agent refused the latest value of a key.
    pub rejected: HashMap<ObjectKey, String>,
    /// Where each delete and release of a key stands.
    pub deletes: Deletes,
    /// Capability `projects`: the version of the last ProjectSet the agent
    /// answered, with its answer.
    pub projects_acked: Option<(String, AckOutcome)>,
    /// With `--otlp-endpoint`: the trace each key's last report continues,
    /// until its status is written.
    report_traces: HashMap<ObjectKey, String>,
}

/// Deletes and releases of keys the hub does not know that one agent's
/// resync requests may have queued at a time; beyond it, later ones wait
/// for a later digest round.
pub const MAX_REPAIR_REMOVALS: usize = 1024;

impl Inner {
    fn outbox(&mut self) -> &mut Outbox<ObjectKey, Item> {
        self.sending
            .outbox
            .get_or_insert_with(|| Outbox::new(WINDOW))
    }

    fn observed_entries(&self) -> Entries {
        self.observed
            .iter()
            .filter_map(|(k, o)| match o {
                Observation::Observed { version, .. } | Observation::Mirrored { version } => {
                    Some((k.clone(), version.clone()))
                }
                Observation::Gone => None,
            })
            .collect()
    }

    fn desired_entries(&self) -> Entries {
        self.desired
            .iter()
            .map(|(k, d)| (k.clone(), d.version().to_string()))
            .collect()
    }

    fn count_control(&self) {
        if let Some(g) = &self.control.gauge {
            g.set(self.control.messages.len() as i64);
        }
    }

    /// Forgets what was queued for a session that is gone.
    fn clear_session_queues(&mut self) {
        // Their readers see the answer end.
        self.live.clear();
        self.outbox().requeue_in_flight();
        // What the agent's own requests queued goes with it.
        let removals = std::mem::take(&mut self.deletes.removals);
        if !removals.is_empty() {
            for k in &removals {
                self.sending.enqueued.remove(k);
                self.deletes.delete_acked.remove(k);
                self.deletes.gone.remove(k);
                if matches!(self.observed.get(k), Some(Observation::Gone)) {
                    self.observed.remove(k);
                }
            }
            self.outbox().retain(|k| !removals.contains(k));
        }
        self.sending.in_flight.clear();
        self.deletes.gone_before_ack.clear();
        self.control.messages.clear();
        self.control.digest_due = false;
        self.control.resync_buckets.clear();
        self.sending.retrying.clear();
        self.count_control();
    }
}

/// See the module documentation.
/// Who is at the other end of a session, as the hub's status page
/// (`/status` on the admin port) shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Agent {
    /// SHA-256 of the client certificate it connected with.
    pub fingerprint: String,
    /// The agent's own version, from its `Hello`.
    pub version: String,
    /// Seconds since the Unix epoch after which its certificate expires.
    pub certificate_not_after: i64,
    /// Seconds since the Unix epoch when the session began.
    pub since: i64,
    /// The capabilities both sides offered (its `Hello`, the hub's
    /// `Welcome`).
    pub capabilities: Vec<String>,
}

/// [`Inner`] under its lock, and the notifications its changes wake.
pub struct ClusterState {
    pub name: String,
    inner: Mutex<Inner>,
    /// Wakes the session's sender.
    pub wake: Notify,
    /// Wakes the session's receiver when acknowledgements were sent.
    pub room: Notify,
    /// Status reports refused so far (their log is thinned out).
    pub refused_reports: AtomicU64,
    /// When this replica first had anything for the cluster.
    pub created: SystemTime,
    /// Where the time from sending an object message to its
    /// acknowledgement is counted (the hub's, or one of its own).
    delivery: Histogram,
    /// A report changed what the agent holds under some key since the
    /// hub's record of it was last written ([`super::holders`]).
    holders_dirty: AtomicBool,
    /// Unix time (the bits of an f64) of the last message from its agent
    /// here; 0: none yet.
    last_seen: AtomicU64,
}

/// One cluster as the fleet-level metrics see it ([`ClusterState::sample`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The certificate expiry of the agent connected, if one is.
    pub agent_not_after: Option<i64>,
    /// Seconds the oldest object message in flight has waited.
    pub lag: f64,
    pub pending: usize,
    pub control: usize,
    /// The hub wants Applications on the cluster (managed mode).
    pub wanted: bool,
    pub created: SystemTime,
    /// Unix time of the last message from its agent here.
    pub last_seen: Option<f64>,
}

impl ClusterState {
    pub fn new(name: &str) -> Self {
        Self::counting_delivery(name, Histogram::new(std::iter::empty()))
    }

    /// A cluster whose deliveries are counted in `delivery`.
    pub fn counting_delivery(name: &str, delivery: Histogram) -> Self {
        Self {
            name: name.into(),
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            room: Notify::new(),
            refused_reports: AtomicU64::new(0),
            created: SystemTime::now(),
            delivery,
            holders_dirty: AtomicBool::new(false),
            last_seen: AtomicU64::new(0),
        }
    }

    /// What the fleet-level metrics need, under one lock.
    pub fn sample(&self) -> Sample {
        let mut inner = self.lock();
        Sample {
            agent_not_after: inner
                .session
                .as_ref()
                .map(|s| s.agent.certificate_not_after),
            lag: inner
                .sending
                .in_flight
                .values()
                .map(|(_, _, t)| t.elapsed().as_secs_f64())
                .fold(0.0, f64::max),
            pending: inner.outbox().len(),
            control: inner.control.messages.len(),
            wanted: !inner.desired.is_empty(),
            created: self.created,
            last_seen: self.last_seen(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .expect("never poisoned: no code panics holding it")
    }

    /// The trace a report of `key` continues, to write its status in
    /// ([`ClusterState::take_report_trace`]).
    pub fn report_trace(&self, key: &ObjectKey, traceparent: &str) {
        if !traceparent.is_empty() {
            self.lock()
                .report_traces
                .insert(key.clone(), traceparent.to_string());
        }
    }

    /// The trace the last report of `key` continues, once.
    pub fn take_report_trace(&self, key: &ObjectKey) -> Option<String> {
        self.lock().report_traces.remove(key)
    }

    /// Sends the desired value of `key` again, if there is one.
    pub fn resend_desired(&self, key: &ObjectKey) -> bool {
        let desired = self.lock().desired.get(key).cloned();
        match desired {
            Some(d) => {
                self.resend(key, Item::Upsert(d));
                true
            }
            None => false,
        }
    }

    /// Whether the hub has anything to do with `key` in managed mode.
    pub fn knows(&self, key: &ObjectKey) -> bool {
        let inner = self.lock();
        inner.desired.contains_key(key) || inner.sending.enqueued.contains_key(key)
    }

    /// The desired set, for digests and repairs.
    pub fn desired_entries(&self) -> Entries {
        self.lock().desired_entries()
    }

    /// The hub's replica of the observed set.
    pub fn observed_entries(&self) -> Entries {
        self.lock().observed_entries()
    }

    /// Whether what the agent holds changed since the last call (see
    /// [`super::holders`]).
    pub fn take_holders_dirty(&self) -> bool {
        self.holders_dirty.swap(false, Ordering::Relaxed)
    }

    /// What the agent holds must be written again (a write failed).
    pub fn mark_holders_dirty(&self) {
        self.holders_dirty.store(true, Ordering::Relaxed);
    }

    /// Every key's latest report's holder (see [`Observation::holder`]).
    pub fn holders_reported(&self) -> Vec<(ObjectKey, Option<String>)> {
        self.lock()
            .observed
            .iter()
            .filter_map(|(k, o)| o.holder().map(|h| (k.clone(), h.map(str::to_string))))
            .collect()
    }

    /// Seconds the oldest unacknowledged object message has waited, and the
    /// number of keys pending or in flight.
    pub fn lag(&self) -> (f64, usize) {
        let mut inner = self.lock();
        let oldest = inner
            .sending
            .in_flight
            .values()
            .map(|(_, _, t)| t.elapsed().as_secs_f64())
            .fold(0.0, f64::max);
        (oldest, inner.outbox().len())
    }

    /// Applies the repairs for the desired set the agent asked for; `remove`
    /// decides what a key the hub does not want becomes (a delete, a
    /// release, or nothing).
    /// Returns how many removals were left for a later round
    /// ([`MAX_REPAIR_REMOVALS`]).
    pub fn repair(
        &self,
        repairs: Vec<Repair>,
        remove: impl Fn(&ObjectKey) -> Option<Item>,
    ) -> usize {
        let mut deferred = 0;
        for r in repairs {
            match r {
                Repair::Send(key) => {
                    self.resend_desired(&key);
                }
                Repair::Remove(key) => {
                    if self.lock().removals_full(&key) {
                        deferred += 1;
                        continue;
                    }
                    if let Some(item) = remove(&key) {
                        self.lock().queue_removal(key, item);
                        self.wake.notify_one();
                    }
                }
            }
        }
        deferred
    }
}

#[cfg(test)]
mod tests;
