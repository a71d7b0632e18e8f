//! The commands (sync, refresh, terminate) waiting for one cluster's
//! agent: added once, sent once per session, and kept until their answer
//! is completed on the hub. [`Ops`] is the state, without locks;
//! [`ClusterState`] wakes the sender when it changes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_pull_proto::v1::{AckOutcome, OperationRequest, operation_request};

use super::{ClusterState, Work};

#[derive(Clone, Debug)]
pub struct PendingOp {
    pub request: OperationRequest,
    pub owner: Work,
    /// The session it was last sent on.
    sent_in: Option<u64>,
    not_before: Option<Instant>,
    pub outcome: Option<(AckOutcome, String)>,
    /// A sync answered once settled on the cluster: the spoke's
    /// `operationState.startedAt` then (empty: none). The hub copy keeps
    /// `.operation` until its status shows a start at least this late.
    pub settled_started_at: Option<String>,
    /// Its answer was logged (and, when refused, made an Event): for a
    /// command with nothing to take off the hub copy (a terminate), which
    /// stays until its sync is completed.
    reported: bool,
}

impl PendingOp {
    fn new(request: OperationRequest, owner: Work) -> Self {
        Self {
            request,
            owner,
            sent_in: None,
            not_before: None,
            outcome: None,
            settled_started_at: None,
            reported: false,
        }
    }

    /// Whether it waits to be sent on session `id` at `now`.
    fn ready(&self, id: u64, now: Instant) -> bool {
        self.sent_in != Some(id)
            && self.outcome.is_none()
            && self.not_before.is_none_or(|t| t <= now)
    }
}

/// The commands of one cluster, by operation id.
#[derive(Debug, Default)]
pub struct Ops(BTreeMap<String, PendingOp>);

impl Ops {
    pub fn get(&self, id: &str) -> Option<&PendingOp> {
        self.0.get(id)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The id of the unanswered-or-not command of `owner` that is a sync
    /// (`sync`) or a refresh (`!sync`), if there is one.
    pub fn of(&self, owner: &Work, sync: bool) -> Option<String> {
        self.0
            .iter()
            .find(|(_, op)| {
                op.owner == *owner
                    && match op.request.kind {
                        Some(operation_request::Kind::Sync(_)) => sync,
                        Some(operation_request::Kind::Refresh(_)) => !sync,
                        _ => false,
                    }
            })
            .map(|(id, _)| id.clone())
    }

    /// Adds a stamped command unless it is known already.
    fn add(&mut self, request: OperationRequest, owner: Work) -> bool {
        if self.0.contains_key(&request.operation_id) {
            return false;
        }
        let id = request.operation_id.clone();
        self.0.insert(id, PendingOp::new(request, owner));
        true
    }

    /// The agent answered a command (`settled_started_at`: a sync answered
    /// once settled, see [`PendingOp::settled_started_at`]). Returns its
    /// owner when the answer is final (the owner's reconcile completes it on
    /// the hub).
    pub fn answered(
        &mut self,
        id: &str,
        outcome: AckOutcome,
        message: &str,
        settled_started_at: Option<&str>,
    ) -> Option<Work> {
        let op = self.0.get_mut(id)?;
        if outcome == AckOutcome::Retry {
            op.sent_in = None;
            op.not_before = Some(Instant::now() + Duration::from_secs(1));
            return None;
        }
        op.outcome = Some((outcome, message.to_string()));
        op.settled_started_at = settled_started_at.map(str::to_string);
        Some(op.owner.clone())
    }

    /// A command the connected agent cannot run: recorded as refused with
    /// `message` and reported (the caller reports it), never sent.
    pub fn add_refused(&mut self, request: OperationRequest, owner: Work, message: &str) {
        let id = request.operation_id.clone();
        self.0.entry(id).or_insert(PendingOp {
            outcome: Some((AckOutcome::Rejected, message.to_string())),
            reported: true,
            ..PendingOp::new(request, owner)
        });
    }

    /// True the first time it is called for an answered command `id`.
    pub fn report_once(&mut self, id: &str) -> bool {
        match self.0.get_mut(id) {
            Some(op) if op.outcome.is_some() && !op.reported => {
                op.reported = true;
                true
            }
            _ => false,
        }
    }

    /// The command is completed on the hub: forget it.
    pub fn done(&mut self, id: &str) {
        self.0.remove(id);
    }

    /// Forgets the unanswered commands of `owner` that it no longer carries.
    pub fn retain(&mut self, owner: &Work, carried: &[String]) {
        self.0
            .retain(|id, op| &op.owner != owner || carried.contains(id) || op.outcome.is_some());
    }

    /// Every command is sent again on the next session.
    pub(super) fn unsend(&mut self) {
        for op in self.0.values_mut() {
            op.sent_in = None;
        }
    }

    pub(super) fn clear(&mut self) {
        self.0.clear();
    }

    /// Whether a command waits to be sent on session `id`.
    pub(super) fn any_ready(&self, id: u64) -> bool {
        let now = Instant::now();
        self.0.values().any(|op| op.ready(id, now))
    }

    /// Up to `max` commands to send on session `id`, marked sent.
    pub(super) fn send(&mut self, id: u64, max: usize) -> Vec<OperationRequest> {
        let now = Instant::now();
        let mut out = Vec::new();
        for op in self.0.values_mut() {
            if out.len() >= max {
                break;
            }
            if op.ready(id, now) {
                op.sent_in = Some(id);
                op.not_before = None;
                out.push(op.request.clone());
            }
        }
        out
    }
}

impl ClusterState {
    /// Adds a stamped command unless it is known already, and wakes the
    /// sender.
    pub fn add_op(&self, request: OperationRequest, owner: Work) -> bool {
        let added = self.lock().ops.add(request, owner);
        if added {
            self.wake.notify_one();
        }
        added
    }

    /// Whether the connected agent offered `capability`; `true` when none
    /// is connected (the one that connects is asked, and refuses what it
    /// cannot run).
    pub fn agent_offers(&self, capability: &str) -> bool {
        self.agent()
            .is_none_or(|(_, a)| a.capabilities.iter().any(|c| c == capability))
    }
}
