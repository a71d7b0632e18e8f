//! The commands (sync, refresh) waiting for one cluster's agent: added
//! once, sent once per session, and kept until their answer is completed
//! on the hub.

use std::time::{Duration, Instant};

use argocd_pull_proto::v1::{AckOutcome, OperationRequest};

use super::{ClusterState, PendingOp, Work};

impl ClusterState {
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
                settled_started_at: None,
                reported: false,
            },
        );
        drop(inner);
        self.wake.notify_one();
        true
    }

    /// The agent answered a command (`settled_started_at`: a sync answered
    /// once settled, see [`PendingOp::settled_started_at`]). Returns its
    /// owner when the answer is final (the owner's reconcile completes it on
    /// the hub).
    pub fn op_answered(
        &self,
        id: &str,
        outcome: AckOutcome,
        message: &str,
        settled_started_at: Option<&str>,
    ) -> Option<Work> {
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
                op.settled_started_at = settled_started_at.map(str::to_string);
                Some(op.owner.clone())
            }
        }
    }

    /// A command the connected agent cannot run: recorded as refused with
    /// `message` and reported (the caller reports it), never sent.
    pub fn add_refused_op(&self, request: OperationRequest, owner: Work, message: &str) {
        let mut inner = self.lock();
        let id = request.operation_id.clone();
        inner.ops.entry(id).or_insert(PendingOp {
            request,
            owner,
            sent_in: None,
            not_before: None,
            outcome: Some((AckOutcome::Rejected, message.to_string())),
            settled_started_at: None,
            reported: true,
        });
    }

    /// True the first time it is called for an answered command `id`.
    pub fn report_once(&self, id: &str) -> bool {
        let mut inner = self.lock();
        match inner.ops.get_mut(id) {
            Some(op) if op.outcome.is_some() && !op.reported => {
                op.reported = true;
                true
            }
            _ => false,
        }
    }

    /// Whether the connected agent offered `capability`; `true` when none
    /// is connected (the one that connects is asked, and refuses what it
    /// cannot run).
    pub fn agent_offers(&self, capability: &str) -> bool {
        self.agent()
            .is_none_or(|(_, a)| a.capabilities.iter().any(|c| c == capability))
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
}
