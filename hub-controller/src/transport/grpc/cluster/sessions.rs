//! The agent's connections as one cluster's state sees them: one session
//! at a time (a newer one replaces it, taking over what was in flight),
//! what its sender hands out next (the digest, resync requests,
//! acknowledgements, commands, then object messages within the window),
//! and the ways the hub ends a session from outside: revoking the cluster,
//! denying its certificate.

use std::sync::atomic::Ordering;
use std::time::Instant;

use argocd_pull_proto::v1::{
    AgentMode, ApplicationDelete, ApplicationUpsert, HubMessage, ObjectKey, hub_message,
};
use tokio::sync::watch;

use super::{
    Agent, ClusterState, DigestSet, Inner, Item, Session, SetDigest, Stop, resync_requests,
};

impl ClusterState {
    /// Its agent was heard from at `unix` (seconds).
    pub fn seen(&self, unix: f64) {
        self.last_seen.store(unix.to_bits(), Ordering::Relaxed);
    }

    /// When its agent was last heard from here (Unix seconds).
    pub fn last_seen(&self) -> Option<f64> {
        let bits = self.last_seen.load(Ordering::Relaxed);
        (bits != 0).then(|| f64::from_bits(bits))
    }

    /// Attaches a new session; a previous one is told to stop. What was in
    /// flight on the old stream goes back to the outbox.
    pub fn attach(&self, id: u64, mode: AgentMode) -> watch::Receiver<Option<Stop>> {
        self.attach_as(id, mode, Agent::default())
            .expect("attach is only called on clusters that are not revoked")
    }

    /// [`Self::attach`] for a session of `agent` (its certificate's
    /// fingerprint is what the deny list checks); refused, leaving any current session alone, while the cluster is
    /// revoked (checked under the same lock [`Self::revoke`] takes, so no
    /// session slips in after a revocation).
    pub fn attach_as(
        &self,
        id: u64,
        mode: AgentMode,
        agent: Agent,
    ) -> Result<watch::Receiver<Option<Stop>>, String> {
        let mut inner = self.lock();
        if let Some(why) = &inner.revoked {
            return Err(why.clone());
        }
        if let Some(old) = inner.session.take() {
            let _ = old.stop.send(Some(Stop::Replaced));
        }
        inner.clear_session_queues();
        inner.ops.unsend();
        let (stop, stopped) = watch::channel(None);
        inner.session = Some(Session {
            id,
            mode,
            agent,
            stop,
        });
        Ok(stopped)
    }

    /// Detaches session `id` if it is still the current one.
    pub fn detach(&self, id: u64) {
        let mut inner = self.lock();
        if inner.session.as_ref().is_some_and(|s| s.id == id) {
            inner.session = None;
            inner.clear_session_queues();
        }
    }

    /// The cluster may not connect until [`Self::allow`]; a connected
    /// agent is told to stop. Returns whether one was connected.
    pub fn revoke(&self, why: &str) -> bool {
        let mut inner = self.lock();
        inner.revoked = Some(why.to_string());
        match &inner.session {
            Some(s) => {
                let _ = s.stop.send(Some(Stop::Revoked(why.to_string())));
                true
            }
            None => false,
        }
    }

    /// The cluster may connect again. Returns whether it was revoked.
    pub fn allow(&self) -> bool {
        self.lock().revoked.take().is_some()
    }

    /// Why the cluster may not connect, while it may not.
    pub fn revoked(&self) -> Option<String> {
        self.lock().revoked.clone()
    }

    /// Stops the session if `denied` has a note for its certificate.
    /// Returns the fingerprint of a session so stopped.
    pub fn stop_if_denied(&self, denied: impl Fn(&str) -> Option<String>) -> Option<String> {
        let inner = self.lock();
        let session = inner.session.as_ref()?;
        let note = denied(&session.agent.fingerprint)?;
        let _ = session.stop.send(Some(Stop::Denied(note)));
        Some(session.agent.fingerprint.clone())
    }

    /// Whether session `id` is the one attached.
    pub fn is_current(&self, id: u64) -> bool {
        self.lock().session.as_ref().is_some_and(|s| s.id == id)
    }

    /// Whether an agent session is attached here.
    pub fn has_session(&self) -> bool {
        self.lock().session.is_some()
    }

    /// Ends the session because its agent connected to another replica
    /// (this stream is stale: an agent has one). Returns whether one was
    /// attached.
    pub fn moved_away(&self) -> bool {
        match &self.lock().session {
            Some(s) => {
                let _ = s.stop.send(Some(Stop::Replaced));
                true
            }
            None => false,
        }
    }

    /// Forgets what the agent reported, once this replica no longer writes
    /// for the cluster: whoever writes next hears it from the agent, and
    /// what is kept here would be older than what they write. Keeps what
    /// the hub's mirrors show (read from the hub). Returns whether anything
    /// was forgotten.
    pub fn forget_reports(&self) -> bool {
        self.lock().forget_reports()
    }

    /// The mode of the connected agent, if one is connected.
    pub fn mode(&self) -> Option<AgentMode> {
        self.lock().session.as_ref().map(|s| s.mode)
    }

    /// The connected agent and its mode, if one is connected.
    pub fn agent(&self) -> Option<(AgentMode, Agent)> {
        self.lock()
            .session
            .as_ref()
            .map(|s| (s.mode, s.agent.clone()))
    }

    /// Up to `max` messages for session `id`: the digest and resync
    /// requests first (however many those take), then acknowledgements,
    /// commands, and object messages (managed mode only).
    pub fn next_messages(&self, id: u64, max: usize) -> Vec<HubMessage> {
        let (out, drained) = self.lock().next_messages(&self.name, id, max);
        if drained {
            self.room.notify_one();
        }
        out
    }

    /// Whether a sender has something to send right now.
    pub fn has_ready(&self, id: u64) -> bool {
        self.lock().has_ready(id)
    }
}

/// The session's side of the state machine, without locks or wakeups.
impl Inner {
    fn forget_reports(&mut self) -> bool {
        let observed = self.observed.len();
        self.observed
            .retain(|_, o| matches!(o, super::Observation::Mirrored { .. }));
        let forgot = self.observed.len() != observed
            || !self.rejected.is_empty()
            || !self.deletes.gone.is_empty()
            || !self.deletes.delete_acked.is_empty()
            || !self.ops.is_empty();
        self.rejected.clear();
        self.deletes.gone.clear();
        self.deletes.delete_acked.clear();
        self.deletes.gone_before_ack.clear();
        self.ops.clear();
        forgot
    }

    /// See [`ClusterState::next_messages`]; also returns whether
    /// acknowledgements were taken (the receiver may read again).
    fn next_messages(&mut self, cluster: &str, id: u64, max: usize) -> (Vec<HubMessage>, bool) {
        let Some(session) = self.session.as_ref() else {
            return (Vec::new(), false);
        };
        if session.id != id {
            return (Vec::new(), false);
        }
        let managed = session.mode == AgentMode::Managed;
        let mut out = Vec::new();
        if std::mem::take(&mut self.control.digest_due) {
            let digest = SetDigest::of(&self.desired_entries()).to_proto(DigestSet::Desired);
            out.push(HubMessage {
                kind: Some(hub_message::Kind::Digest(digest)),
            });
        }
        if !self.control.resync_buckets.is_empty() {
            let buckets: Vec<u32> = std::mem::take(&mut self.control.resync_buckets)
                .into_iter()
                .collect();
            let replica = self.observed_entries();
            for r in resync_requests(DigestSet::Observed, &replica, &buckets) {
                out.push(HubMessage {
                    kind: Some(hub_message::Kind::ResyncRequest(r)),
                });
            }
        }
        let before = self.control.messages.len();
        while out.len() < max {
            match self.control.messages.pop_front() {
                Some(m) => out.push(m),
                None => break,
            }
        }
        let drained = self.control.messages.len() != before;
        if drained {
            self.count_control();
        }
        for request in self.ops.send(id, max.saturating_sub(out.len())) {
            out.push(HubMessage {
                kind: Some(hub_message::Kind::Operation(request)),
            });
        }
        let now = Instant::now();
        while managed && out.len() < max {
            let Some(m) = self.outbox().next_ready() else {
                break;
            };
            self.sending
                .in_flight
                .insert(m.key.clone(), (m.seq, m.value.clone(), now));
            let mut message = object_message(m.key.clone(), m.seq, &m.value);
            if let (Some(hub_message::Kind::Upsert(u)), Some(t)) =
                (&mut message.kind, self.sending.traces.get_mut(&m.key))
            {
                u.trace_parent = t.sent(cluster, &m.key);
            }
            out.push(message);
        }
        (out, drained)
    }

    fn has_ready(&mut self, id: u64) -> bool {
        let Some(session) = self.session.as_ref() else {
            return false;
        };
        if session.id != id {
            return false;
        }
        let managed = session.mode == AgentMode::Managed;
        self.control.digest_due
            || !self.control.resync_buckets.is_empty()
            || !self.control.messages.is_empty()
            || self.ops.any_ready(id)
            || (managed && self.outbox().has_ready())
    }
}

fn object_message(key: ObjectKey, seq: u64, item: &Item) -> HubMessage {
    let kind = match item {
        Item::Upsert(d) => hub_message::Kind::Upsert(ApplicationUpsert {
            key: Some(key),
            seq,
            meta: Some(d.meta.clone()),
            application_json: d.json.bytes(),
            trace_parent: String::new(),
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
