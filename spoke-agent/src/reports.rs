//! What the hub hears about this cluster's Applications: one status report
//! per Application, as the cache shows it, queued in the agent's outbox
//! ([`AgentState::report`]), and the digest of all of them with which the
//! hub finds what it missed.

use std::sync::Arc;

use argocd_pull_proto::digest::{Entries, SetDigest};
use argocd_pull_proto::v1::{AgentMessage, DigestSet, ObjectKey, agent_message};

use crate::Mode;
use crate::apply;
use crate::cache::Cache;
use crate::state::{AgentState, Report};

/// The status reports of the Applications the agent owns the status of:
/// in managed mode those it manages for the hub, in autonomous mode all it
/// watches.
#[derive(Clone)]
pub struct Reports {
    state: Arc<AgentState>,
    cache: Cache,
    mode: Mode,
}

impl Reports {
    pub fn new(state: Arc<AgentState>, cache: Cache, mode: Mode) -> Self {
        Self { state, cache, mode }
    }

    fn autonomous(&self) -> bool {
        self.mode == Mode::Autonomous
    }

    /// Queues the report of `key` as the cache shows it (`force`: even if
    /// it is the one sent last, a repair the hub asked for).
    pub fn report(&self, key: &ObjectKey, force: bool) {
        match self.cache.get(key) {
            Some(app) if self.autonomous() || apply::is_managed(&app) => {
                let (_, observed) = apply::observed(&app, self.autonomous());
                self.state
                    .report(key, Report::Observed(Arc::new(observed)), force);
            }
            _ => {
                if force || self.state.was_reported(key) {
                    self.state.report(key, Report::gone(), force);
                }
            }
        }
    }

    /// Queues a report that nothing is at `key`, whatever was said last.
    pub fn gone(&self, key: &ObjectKey) {
        self.state.report(key, Report::gone(), true);
    }

    /// The observed set: the version of the report of each Application.
    pub fn observed_entries(&self) -> Entries {
        let autonomous = self.autonomous();
        self.cache
            .all()
            .iter()
            .filter(|a| autonomous || apply::is_managed(a))
            .map(|a| (apply::key_of(a), apply::observed(a, autonomous).0))
            .collect()
    }

    /// The digest of the observed set, for the hub.
    pub fn digest(&self) -> AgentMessage {
        AgentMessage {
            kind: Some(agent_message::Kind::Digest(
                SetDigest::of(&self.observed_entries()).to_proto(DigestSet::Observed),
            )),
        }
    }
}
