//! What the hub holds for one cluster's agent, across its connections: the
//! desired set (managed mode), the outbox that delivers it, the latest
//! observed report of every Application, and the commands not yet
//! acknowledged. No I/O: the session moves messages in and out, the index
//! and the reconcilers read and change it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use argocd_pull_proto::coalesce::Outbox;
use argocd_pull_proto::digest::{Entries, Repair, resync_requests};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMode, ApplicationDelete, ApplicationUpsert, DigestSet, HubMessage, ObjectKey,
    ObservedApplication, OperationRequest, hub_message,
};
use tokio::sync::{Notify, watch};

use crate::route::assign::{Desired, HubRef};

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
            (Item::Upsert(a), Item::Upsert(b)) => a.version == b.version,
            (Item::Delete { hub_uid: a }, Item::Delete { hub_uid: b })
            | (Item::Release { hub_uid: a }, Item::Release { hub_uid: b }) => a == b,
            _ => false,
        }
    }
}

/// The latest report of one Application.
#[derive(Clone, Debug)]
pub enum Observation {
    Observed {
        version: String,
        report: Arc<ObservedApplication>,
    },
    Gone,
    /// Known only from the mirror on the hub (autonomous mode, before the
    /// agent reported it again): in the replica, nothing to write.
    Mirrored {
        version: String,
    },
}

/// Which hub object a command belongs to, and where its completion goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Work {
    /// A pull-model hub Application (managed mode).
    App(HubRef),
    /// The read-only mirror of an autonomous agent's Application.
    Mirror { cluster: String, key: ObjectKey },
}

#[derive(Clone, Debug)]
pub struct PendingOp {
    pub request: OperationRequest,
    pub owner: Work,
    /// The session it was last sent on.
    sent_in: Option<u64>,
    not_before: Option<Instant>,
    pub outcome: Option<(AckOutcome, String)>,
}

/// The connected agent.
#[derive(Debug)]
struct Session {
    id: u64,
    mode: AgentMode,
    /// Ends the session's tasks when a newer connection replaces it.
    stop: watch::Sender<bool>,
}

#[derive(Default)]
pub struct Inner {
    /// Managed mode: what the hub wants on the cluster, live objects only
    /// (the set its digest covers).
    pub desired: BTreeMap<ObjectKey, Arc<Desired>>,
    outbox: Option<Outbox<ObjectKey, Item>>,
    /// The last item put in the outbox per key, so that an unchanged
    /// decision is not sent again.
    enqueued: HashMap<ObjectKey, Item>,
    /// Handed out and not yet acknowledged, by key.
    in_flight: HashMap<ObjectKey, (u64, Item, Instant)>,
    /// The latest report per key: the hub's replica of the observed set.
    pub observed: HashMap<ObjectKey, Observation>,
    pub ops: BTreeMap<String, PendingOp>,
    session: Option<Session>,
    /// Acknowledgements and resync requests, sent ahead of object messages.
    control: VecDeque<HubMessage>,
    /// Why the agent refused the latest value of a key.
    pub rejected: HashMap<ObjectKey, String>,
    /// Keys whose delete the agent has requested, with the hub uid.
    delete_acked: HashMap<ObjectKey, String>,
    /// Keys the agent reported gone after their delete, with the hub uid.
    pub gone: HashMap<ObjectKey, String>,
    /// Keys reported gone while their delete was on its way, with the hub
    /// uid of the delete: its acknowledgement completes it. (An agent that
    /// finds nothing to delete may say `gone` before it answers the delete;
    /// waiting for another `gone` would wait for ever.)
    gone_before_ack: HashMap<ObjectKey, String>,
}

impl Inner {
    fn outbox(&mut self) -> &mut Outbox<ObjectKey, Item> {
        self.outbox.get_or_insert_with(|| Outbox::new(WINDOW))
    }
}

/// See the module documentation.
pub struct ClusterState {
    pub name: String,
    inner: Mutex<Inner>,
    /// Wakes the session's sender.
    pub wake: Notify,
}

impl ClusterState {
    pub fn new(name: &str) -> Self {
        Self {
            name: name.into(),
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .expect("never poisoned: no code panics holding it")
    }

    fn enqueue(&self, inner: &mut Inner, key: &ObjectKey, item: Item) {
        if inner.enqueued.get(key) == Some(&item) {
            return;
        }
        inner.enqueued.insert(key.clone(), item.clone());
        inner.outbox().upsert(key.clone(), item);
        self.wake.notify_one();
    }

    /// The hub wants `desired` on the cluster under `key`.
    pub fn set_desired(&self, key: &ObjectKey, desired: Arc<Desired>) {
        let mut inner = self.lock();
        inner.gone.remove(key);
        inner.delete_acked.remove(key);
        inner.gone_before_ack.remove(key);
        if inner
            .desired
            .get(key)
            .is_none_or(|d| d.version != desired.version)
        {
            inner.rejected.remove(key);
        }
        inner.desired.insert(key.clone(), desired.clone());
        self.enqueue(&mut inner, key, Item::Upsert(desired));
    }

    /// The hub Application of `key` is being deleted: delete it on the spoke.
    pub fn set_deleting(&self, key: &ObjectKey, hub_uid: &str) {
        let mut inner = self.lock();
        inner.desired.remove(key);
        let item = Item::Delete {
            hub_uid: hub_uid.into(),
        };
        self.enqueue(&mut inner, key, item);
    }

    /// No hub Application wants `key` any more: delete what was delivered.
    pub fn remove(&self, key: &ObjectKey) {
        let mut inner = self.lock();
        if let Some(d) = inner.desired.remove(key) {
            let item = Item::Delete {
                hub_uid: d.hub_uid.clone(),
            };
            self.enqueue(&mut inner, key, item);
        }
    }

    /// `key` moved to the ManifestWork transport: the agent lets go of it.
    pub fn release(&self, key: &ObjectKey) {
        let mut inner = self.lock();
        if let Some(d) = inner.desired.remove(key) {
            let item = Item::Release {
                hub_uid: d.hub_uid.clone(),
            };
            self.enqueue(&mut inner, key, item);
        }
    }

    /// Sends `item` for `key` again whatever was sent before (a repair).
    pub fn resend(&self, key: &ObjectKey, item: Item) {
        let mut inner = self.lock();
        inner.enqueued.insert(key.clone(), item.clone());
        inner.outbox().upsert(key.clone(), item);
        self.wake.notify_one();
    }

    /// Forgets everything about `key` once nothing is desired or pending
    /// for it (the Application is gone on both sides), so that memory
    /// follows the Applications there are.
    pub fn forget_if_idle(&self, key: &ObjectKey) {
        let mut inner = self.lock();
        if inner.desired.contains_key(key)
            || inner.enqueued.contains_key(key)
            || inner.in_flight.contains_key(key)
        {
            return;
        }
        inner.gone.remove(key);
        inner.delete_acked.remove(key);
        inner.gone_before_ack.remove(key);
        inner.rejected.remove(key);
        if matches!(inner.observed.get(key), Some(Observation::Gone)) {
            inner.observed.remove(key);
        }
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
        inner.desired.contains_key(key) || inner.enqueued.contains_key(key)
    }

    /// The desired set, for digests and repairs.
    pub fn desired_entries(&self) -> Entries {
        self.lock()
            .desired
            .iter()
            .map(|(k, d)| (k.clone(), d.version.clone()))
            .collect()
    }

    /// The hub's replica of the observed set.
    pub fn observed_entries(&self) -> Entries {
        self.lock()
            .observed
            .iter()
            .filter_map(|(k, o)| match o {
                Observation::Observed { version, .. } | Observation::Mirrored { version } => {
                    Some((k.clone(), version.clone()))
                }
                Observation::Gone => None,
            })
            .collect()
    }

    /// Records a report. Returns true when it is a `gone` that completes a
    /// delete the agent had acknowledged.
    pub fn observe(&self, key: &ObjectKey, observation: Observation) -> bool {
        let mut inner = self.lock();
        let completes = matches!(observation, Observation::Gone)
            && match inner.delete_acked.get(key).cloned() {
                Some(uid) => {
                    inner.gone.insert(key.clone(), uid);
                    inner.enqueued.remove(key);
                    true
                }
                None => false,
            };
        match &observation {
            Observation::Gone if !completes => {
                if let Some((_, Item::Delete { hub_uid }, _)) = inner.in_flight.get(key) {
                    let hub_uid = hub_uid.clone();
                    inner.gone_before_ack.insert(key.clone(), hub_uid);
                }
            }
            Observation::Observed { .. } => {
                inner.gone_before_ack.remove(key);
            }
            _ => {}
        }
        inner.observed.insert(key.clone(), observation);
        completes
    }

    /// Asks the agent for its observed entries of one bucket again.
    pub fn request_resync(&self, bucket: u32) {
        let entries = self.observed_entries();
        for r in resync_requests(DigestSet::Observed, &entries, &[bucket]) {
            self.control(HubMessage {
                kind: Some(hub_message::Kind::ResyncRequest(r)),
            });
        }
    }

    /// Queues a control message (acknowledgement, resync request).
    pub fn control(&self, m: HubMessage) {
        self.lock().control.push_back(m);
        self.wake.notify_one();
    }

    // -----------------------------------------------------------------------
    // Commands

    /// Adds a stamped command unless it is known already.
    pub fn add_op(&self, request: OperationRequest, owner: Work) -> bool {
        let mut inner = self.lock();
        if inner.ops.contains_key(&request.operation_id) {
            return false;
        }
        inner.ops.insert(
            request.operation_id.clone(),
            PendingOp {
                request,
                owner,
                sent_in: None,
                not_before: None,
                outcome: None,
            },
        );
        drop(inner);
        self.wake.notify_one();
        true
    }

    /// The agent answered a command. Returns its owner when the answer is
    /// final (the owner's reconcile completes it on the hub).
    pub fn op_answered(&self, id: &str, outcome: AckOutcome, message: &str) -> Option<Work> {
        let mut inner = self.lock();
        let op = inner.ops.get_mut(id)?;
        match outcome {
            AckOutcome::Retry => {
                op.sent_in = None;
                op.not_before = Some(Instant::now() + Duration::from_secs(1));
                None
            }
            _ => {
                op.outcome = Some((outcome, message.to_string()));
                Some(op.owner.clone())
            }
        }
    }

    /// The command is completed on the hub: forget it.
    pub fn op_done(&self, id: &str) {
        self.lock().ops.remove(id);
    }

    /// Forgets the unanswered commands of `owner` that it no longer carries.
    pub fn retain_ops(&self, owner: &Work, carried: &[String]) {
        self.lock()
            .ops
            .retain(|id, op| &op.owner != owner || carried.contains(id) || op.outcome.is_some());
    }

    // -----------------------------------------------------------------------
    // Sessions

    /// Attaches a new session; a previous one is told to stop. What was in
    /// flight on the old stream goes back to the outbox.
    pub fn attach(&self, id: u64, mode: AgentMode) -> watch::Receiver<bool> {
        let mut inner = self.lock();
        if let Some(old) = inner.session.take() {
            let _ = old.stop.send(true);
        }
        inner.outbox().requeue_in_flight();
        inner.in_flight.clear();
        inner.gone_before_ack.clear();
        inner.control.clear();
        for op in inner.ops.values_mut() {
            op.sent_in = None;
        }
        let (stop, stopped) = watch::channel(false);
        inner.session = Some(Session { id, mode, stop });
        stopped
    }

    /// Detaches session `id` if it is still the current one.
    pub fn detach(&self, id: u64) {
        let mut inner = self.lock();
        if inner.session.as_ref().is_some_and(|s| s.id == id) {
            inner.session = None;
            inner.outbox().requeue_in_flight();
            inner.in_flight.clear();
            inner.gone_before_ack.clear();
            inner.control.clear();
        }
    }

    /// The mode of the connected agent, if one is connected.
    pub fn mode(&self) -> Option<AgentMode> {
        self.lock().session.as_ref().map(|s| s.mode)
    }

    /// Up to `max` messages for session `id`: control messages first, then
    /// commands, then object messages (managed mode only).
    pub fn next_messages(&self, id: u64, max: usize) -> Vec<HubMessage> {
        let mut inner = self.lock();
        let Some(session) = inner.session.as_ref() else {
            return Vec::new();
        };
        if session.id != id {
            return Vec::new();
        }
        let managed = session.mode == AgentMode::Managed;
        let mut out = Vec::new();
        while out.len() < max {
            match inner.control.pop_front() {
                Some(m) => out.push(m),
                None => break,
            }
        }
        let now = Instant::now();
        for op in inner.ops.values_mut() {
            if out.len() >= max {
                break;
            }
            if op.sent_in == Some(id)
                || op.outcome.is_some()
                || op.not_before.is_some_and(|t| t > now)
            {
                continue;
            }
            op.sent_in = Some(id);
            op.not_before = None;
            out.push(HubMessage {
                kind: Some(hub_message::Kind::Operation(op.request.clone())),
            });
        }
        while managed && out.len() < max {
            let Some(m) = inner.outbox().next_ready() else {
                break;
            };
            inner
                .in_flight
                .insert(m.key.clone(), (m.seq, m.value.clone(), now));
            out.push(object_message(m.key, m.seq, &m.value));
        }
        out
    }

    /// Whether a sender has something to send right now.
    pub fn has_ready(&self, id: u64) -> bool {
        let mut inner = self.lock();
        let Some(session) = inner.session.as_ref() else {
            return false;
        };
        if session.id != id {
            return false;
        }
        let managed = session.mode == AgentMode::Managed;
        let now = Instant::now();
        !inner.control.is_empty()
            || inner.ops.values().any(|op| {
                op.sent_in != Some(id)
                    && op.outcome.is_none()
                    && op.not_before.is_none_or(|t| t <= now)
            })
            || (managed && inner.outbox().has_ready())
    }

    /// The agent acknowledged (key, seq). Returns the acknowledged item when
    /// it matched what was in flight. A delete acknowledged after the agent
    /// reported the Application gone (while the delete was on its way) is
    /// complete.
    pub fn object_acked(
        &self,
        key: &ObjectKey,
        seq: u64,
        outcome: AckOutcome,
        message: &str,
    ) -> Option<Item> {
        let mut inner = self.lock();
        let (s, item, _) = inner.in_flight.get(key).cloned()?;
        if s != seq {
            return None;
        }
        match outcome {
            AckOutcome::Retry => {
                // Sent again by `retry` after a pause, not at once.
                return None;
            }
            AckOutcome::Rejected => {
                inner.rejected.insert(key.clone(), message.to_string());
            }
            _ => {
                if matches!(item, Item::Upsert(_)) {
                    inner.rejected.remove(key);
                }
            }
        }
        inner.in_flight.remove(key);
        inner.outbox().ack(key, seq);
        match &item {
            Item::Delete { hub_uid } if outcome == AckOutcome::Applied => {
                inner.delete_acked.insert(key.clone(), hub_uid.clone());
                if inner.gone_before_ack.remove(key).as_ref() == Some(hub_uid) {
                    inner.gone.insert(key.clone(), hub_uid.clone());
                    if inner.enqueued.get(key) == Some(&item) {
                        inner.enqueued.remove(key);
                    }
                }
            }
            Item::Release { .. } if inner.enqueued.get(key) == Some(&item) => {
                inner.enqueued.remove(key);
            }
            _ => {}
        }
        drop(inner);
        self.wake.notify_one();
        Some(item)
    }

    /// Sends (key, seq) again: the agent could not apply it now.
    pub fn retry(&self, key: &ObjectKey, seq: u64) {
        let mut inner = self.lock();
        if inner.in_flight.get(key).is_some_and(|(s, _, _)| *s == seq) {
            inner.in_flight.remove(key);
            inner.outbox().nack(key, seq);
            drop(inner);
            self.wake.notify_one();
        }
    }

    /// Seconds the oldest unacknowledged object message has waited, and the
    /// number of keys pending or in flight.
    pub fn lag(&self) -> (f64, usize) {
        let mut inner = self.lock();
        let oldest = inner
            .in_flight
            .values()
            .map(|(_, _, t)| t.elapsed().as_secs_f64())
            .fold(0.0, f64::max);
        (oldest, inner.outbox().len())
    }

    /// Applies the repairs for the desired set the agent asked for; `remove`
    /// decides what a key the hub does not want becomes (a delete, a
    /// release, or nothing).
    pub fn repair(&self, repairs: Vec<Repair>, remove: impl Fn(&ObjectKey) -> Option<Item>) {
        for r in repairs {
            match r {
                Repair::Send(key) => {
                    self.resend_desired(&key);
                }
                Repair::Remove(key) => {
                    if let Some(item) = remove(&key) {
                        self.resend(&key, item);
                    }
                }
            }
        }
    }
}

fn object_message(key: ObjectKey, seq: u64, item: &Item) -> HubMessage {
    let kind = match item {
        Item::Upsert(d) => hub_message::Kind::Upsert(ApplicationUpsert {
            key: Some(key),
            seq,
            meta: Some(d.meta.clone()),
            application_json: d.json.as_ref().clone(),
        }),
        Item::Delete { hub_uid } => hub_message::Kind::Delete(ApplicationDelete {
            key: Some(key),
            seq,
            hub_uid: hub_uid.clone(),
            release: false,
        }),
        Item::Release { hub_uid } => hub_message::Kind::Delete(ApplicationDelete {
            key: Some(key),
            seq,
            hub_uid: hub_uid.clone(),
            release: true,
        }),
    };
    HubMessage { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_pull_proto::v1::ObjectMeta;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn desired(name: &str, version: &str) -> Arc<Desired> {
        Arc::new(Desired {
            hub: HubRef {
                namespace: "team".into(),
                name: name.into(),
            },
            hub_uid: format!("uid-{name}"),
            version: version.into(),
            json: Arc::new(b"{}".to_vec()),
            meta: ObjectMeta {
                version: version.into(),
                ..Default::default()
            },
        })
    }

    fn kinds(ms: &[HubMessage]) -> Vec<String> {
        ms.iter()
            .map(|m| match m.kind.as_ref().unwrap() {
                hub_message::Kind::Upsert(u) => format!("upsert {}", u.key.as_ref().unwrap().name),
                hub_message::Kind::Delete(d) if d.release => {
                    format!("release {}", d.key.as_ref().unwrap().name)
                }
                hub_message::Kind::Delete(d) => format!("delete {}", d.key.as_ref().unwrap().name),
                hub_message::Kind::Operation(o) => format!("op {}", o.operation_id),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_new_resource_version_alone_is_not_sent_again() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        assert_eq!(c.next_messages(1, 10).len(), 1);
        let mut newer = (*desired("a", "v1")).clone();
        newer.meta.resource_version = "99".into();
        c.set_desired(&key("a"), Arc::new(newer));
        assert!(c.next_messages(1, 10).is_empty());
    }

    #[test]
    fn only_changes_are_sent_and_the_latest_wins() {
        let c = ClusterState::new("c1");
        c.set_desired(&key("a"), desired("a", "v1"));
        c.set_desired(&key("a"), desired("a", "v1"));
        c.set_desired(&key("a"), desired("a", "v2"));
        assert!(c.next_messages(1, 10).is_empty(), "no session yet");
        c.attach(1, AgentMode::Managed);
        let sent = c.next_messages(1, 10);
        assert_eq!(kinds(&sent), ["upsert a"]);
        let hub_message::Kind::Upsert(u) = sent[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        assert_eq!(u.meta.as_ref().unwrap().version, "v2");
        // Unchanged: nothing more.
        c.set_desired(&key("a"), desired("a", "v2"));
        assert!(c.next_messages(1, 10).is_empty());
        assert!(
            c.object_acked(&key("a"), u.seq, AckOutcome::Applied, "")
                .is_some()
        );
        assert_eq!(c.desired_entries().len(), 1);
    }

    #[test]
    fn a_delete_is_confirmed_by_gone_after_its_acknowledgement() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        let up = c.next_messages(1, 10);
        c.set_deleting(&key("a"), "uid-a");
        assert!(
            c.desired_entries().is_empty(),
            "a deleting object is not desired"
        );
        // A gone before the delete is acknowledged confirms nothing.
        assert!(!c.observe(&key("a"), Observation::Gone));
        let hub_message::Kind::Upsert(u) = up[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), u.seq, AckOutcome::Applied, "");
        let del = c.next_messages(1, 10);
        assert_eq!(kinds(&del), ["delete a"]);
        let hub_message::Kind::Delete(d) = del[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), d.seq, AckOutcome::Applied, "");
        assert!(c.observe(&key("a"), Observation::Gone));
        assert_eq!(
            c.lock().gone.get(&key("a")).map(String::as_str),
            Some("uid-a")
        );
    }

    /// What an agent that finds nothing to delete may answer: `gone` first,
    /// then the acknowledgement. The delete is complete (a finalizer can be
    /// released) and, once no hub Application names the key, forgotten.
    #[test]
    fn a_gone_before_the_delete_is_acknowledged_completes_it_with_the_ack() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        let up = c.next_messages(1, 10);
        let hub_message::Kind::Upsert(u) = up[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), u.seq, AckOutcome::Applied, "");
        c.set_deleting(&key("a"), "uid-a");
        let del = c.next_messages(1, 10);
        let hub_message::Kind::Delete(d) = del[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        assert!(!c.observe(&key("a"), Observation::Gone));
        assert!(c.lock().gone.is_empty(), "not before the acknowledgement");
        c.object_acked(&key("a"), d.seq, AckOutcome::Applied, "");
        assert_eq!(
            c.lock().gone.get(&key("a")).map(String::as_str),
            Some("uid-a")
        );
        c.forget_if_idle(&key("a"));
        let inner = c.lock();
        assert!(
            inner.gone.is_empty()
                && inner.delete_acked.is_empty()
                && inner.enqueued.is_empty()
                && inner.observed.is_empty(),
            "nothing is left of a key gone on both sides"
        );
    }

    /// A `gone` from before the Application was delivered again says
    /// nothing about the delete that follows.
    #[test]
    fn a_gone_before_the_delete_was_sent_does_not_complete_it() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        let up = c.next_messages(1, 10);
        let hub_message::Kind::Upsert(u) = up[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        assert!(!c.observe(&key("a"), Observation::Gone));
        c.object_acked(&key("a"), u.seq, AckOutcome::Applied, "");
        c.set_deleting(&key("a"), "uid-a");
        let del = c.next_messages(1, 10);
        let hub_message::Kind::Delete(d) = del[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), d.seq, AckOutcome::Applied, "");
        assert!(c.lock().gone.is_empty(), "the spoke copy may still exist");
        assert!(c.observe(&key("a"), Observation::Gone));
    }

    #[test]
    fn a_new_session_gets_what_the_old_one_left_in_flight() {
        let c = ClusterState::new("c1");
        let mut old = c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        assert_eq!(kinds(&c.next_messages(1, 10)), ["upsert a"]);
        c.control(HubMessage::default());
        c.attach(2, AgentMode::Managed);
        assert!(*old.borrow_and_update(), "the old session is told to stop");
        assert!(
            c.next_messages(1, 10).is_empty(),
            "the old session gets nothing"
        );
        assert_eq!(
            kinds(&c.next_messages(2, 10)),
            ["upsert a"],
            "no stale control"
        );
    }

    #[test]
    fn commands_go_once_per_session_until_answered() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Autonomous);
        c.set_desired(&key("a"), desired("a", "v1"));
        let owner = Work::Mirror {
            cluster: "c1".into(),
            key: key("a"),
        };
        let op = OperationRequest {
            operation_id: "op-1".into(),
            key: Some(key("a")),
            kind: None,
        };
        assert!(c.add_op(op.clone(), owner.clone()));
        assert!(!c.add_op(op, owner.clone()));
        assert_eq!(
            kinds(&c.next_messages(1, 10)),
            ["op op-1"],
            "autonomous: commands only"
        );
        assert!(c.next_messages(1, 10).is_empty());
        c.attach(2, AgentMode::Autonomous);
        assert_eq!(
            kinds(&c.next_messages(2, 10)),
            ["op op-1"],
            "resent after reconnect"
        );
        assert_eq!(c.op_answered("op-1", AckOutcome::Retry, ""), None);
        assert!(!c.has_ready(2), "a retry waits a moment");
        assert_eq!(
            c.op_answered("op-1", AckOutcome::Duplicate, ""),
            Some(owner.clone())
        );
        assert!(c.next_messages(2, 10).is_empty());
        c.op_done("op-1");
        assert!(c.lock().ops.is_empty());
    }

    #[test]
    fn a_release_is_forgotten_once_acknowledged() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        let m = c.next_messages(1, 10);
        let hub_message::Kind::Upsert(u) = m[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), u.seq, AckOutcome::Applied, "");
        c.release(&key("a"));
        let m = c.next_messages(1, 10);
        assert_eq!(kinds(&m), ["release a"]);
        let hub_message::Kind::Delete(d) = m[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), d.seq, AckOutcome::Applied, "");
        assert!(!c.knows(&key("a")));
    }

    #[test]
    fn a_rejection_is_kept_until_a_new_value() {
        let c = ClusterState::new("c1");
        c.attach(1, AgentMode::Managed);
        c.set_desired(&key("a"), desired("a", "v1"));
        let m = c.next_messages(1, 10);
        let hub_message::Kind::Upsert(u) = m[0].kind.as_ref().unwrap() else {
            unreachable!()
        };
        c.object_acked(&key("a"), u.seq, AckOutcome::Rejected, "too big");
        assert_eq!(c.lock().rejected[&key("a")], "too big");
        assert!(c.next_messages(1, 10).is_empty(), "not retried");
        c.set_desired(&key("a"), desired("a", "v2"));
        assert!(c.lock().rejected.is_empty());
        assert_eq!(kinds(&c.next_messages(1, 10)), ["upsert a"]);
    }
}
