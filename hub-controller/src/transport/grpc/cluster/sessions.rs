//! The agent's connections as one cluster's state sees them: one session
//! at a time (a newer one replaces it, taking over what was in flight),
//! and what its sender hands out next: control messages, commands, then
//! object messages within the window.

use std::time::Instant;

use argocd_pull_proto::v1::{AgentMode, HubMessage, hub_message};
use tokio::sync::watch;

use super::{ClusterState, Session, object_message};

impl ClusterState {
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
}
