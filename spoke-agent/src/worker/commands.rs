//! The hub's commands (sync, refresh, terminate) run on this cluster's
//! Applications, each at most once ([`apply::run_command`]), and their
//! answers: at once, or for a sync once Argo CD has settled it.

use argocd_pull_apis::argocd::Application;
use argocd_pull_proto::owner::{self, Holder};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, ObjectKey, OperationAck, OperationRequest, RefreshKind,
    agent_message, operation_request,
};
use kube::api::{Api, Patch, PatchParams};
use std::sync::Arc;

use super::{Outcome, api, applied, write_error};
use crate::Mode;
use crate::apply::{self, Command, MANAGER, Run, Settlement};
use crate::cache::Cache;
use crate::state::AgentState;

/// Runs the commands the hub queued in the agent's state and answers them
/// there, keeping the syncs not settled yet until they are.
pub struct Commands {
    client: kube::Client,
    state: Arc<AgentState>,
    cache: Cache,
    mode: Mode,
}

impl Commands {
    pub fn new(client: kube::Client, state: Arc<AgentState>, cache: Cache, mode: Mode) -> Self {
        Self {
            client,
            state,
            cache,
            mode,
        }
    }

    /// Runs the commands queued for `key` and answers them, then answers
    /// the syncs of `key` that have settled since they were set.
    pub async fn run(&self, key: &ObjectKey) {
        let api = api(&self.client, key);
        for op in self.state.take_ops(key) {
            match self.run_op(&api, key, &op).await {
                Answer::Now((outcome, message)) => {
                    if outcome == AckOutcome::Applied {
                        tracing::info!(namespace = %key.namespace, name = %key.name, id = %op.operation_id, "command started");
                    }
                    self.answer(key, op.operation_id, outcome, message, None);
                }
                Answer::Settled { started_at } => self.answer(
                    key,
                    op.operation_id,
                    AckOutcome::Duplicate,
                    String::new(),
                    Some(started_at),
                ),
                Answer::Later => {
                    tracing::info!(namespace = %key.namespace, name = %key.name, id = %op.operation_id, "sync set, answered once it settles");
                }
            }
        }
        self.settle(key);
    }

    fn answer(
        &self,
        key: &ObjectKey,
        operation_id: String,
        outcome: AckOutcome,
        message: String,
        settled_started_at: Option<String>,
    ) {
        self.state.control(AgentMessage {
            kind: Some(agent_message::Kind::OperationAck(OperationAck {
                operation_id,
                key: Some(key.clone()),
                outcome: outcome as i32,
                message,
                settled: settled_started_at.is_some(),
                settled_started_at: settled_started_at.unwrap_or_default(),
            })),
        });
    }

    /// Answers the syncs of `key` that have settled since they were set.
    fn settle(&self, key: &ObjectKey) {
        let waiting = self.state.settling(key);
        if waiting.is_empty() {
            return;
        }
        let app = self.cache.get(key);
        for (id, uid) in waiting {
            if let Settlement::Settled { started_at } = apply::settlement(app.as_deref(), &id, &uid)
            {
                tracing::info!(namespace = %key.namespace, name = %key.name, id, started_at, "sync settled");
                self.state.settled(key, &id);
                self.answer(
                    key,
                    id,
                    AckOutcome::Applied,
                    String::new(),
                    Some(started_at),
                );
            }
        }
    }

    /// The Application at `key` as it is now, if a command `op` from the hub
    /// may run on it; otherwise the answer to the hub: not there (yet), or
    /// not the agent's to run commands on.
    async fn commanded(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        op: &OperationRequest,
    ) -> Result<Application, Outcome> {
        let current = match api.get_opt(&key.name).await {
            Ok(Some(c)) => c,
            Ok(None) if self.mode == Mode::Autonomous => {
                return Err((
                    AckOutcome::Rejected,
                    format!(
                        "no Application {}/{} on the cluster",
                        key.namespace, key.name
                    ),
                ));
            }
            Ok(None) => {
                return Err((
                    AckOutcome::Retry,
                    "the Application is not applied yet".into(),
                ));
            }
            Err(e) => return Err(write_error(e)),
        };
        if self.mode == Mode::Managed && !apply::is_managed(&current) {
            // A command from the hub only ever concerns what the agent
            // manages for it.
            let holder = Holder::NotArgocdPull;
            return Err((AckOutcome::Rejected, owner::conflict_message(key, &holder)));
        }
        // And only the copy it applied for the hub Application the
        // command is for (a hub of the release before names none: any
        // copy it manages, as then).
        if self.mode == Mode::Managed
            && !op.hub_uid.is_empty()
            && !apply::is_delivered_for(&current, &op.hub_uid)
        {
            let holder =
                Holder::HubApplication(apply::hub_uid(&current).unwrap_or_default().to_string());
            tracing::warn!(namespace = %key.namespace, name = %key.name, hub_uid = %op.hub_uid, holder = ?apply::hub_uid(&current),
                "refused a command for a copy applied for another hub Application");
            return Err((AckOutcome::Rejected, owner::conflict_message(key, &holder)));
        }
        Ok(current)
    }

    async fn run_op(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        op: &OperationRequest,
    ) -> Answer {
        let command = match command_of(op) {
            Ok(c) => c,
            Err(refused) => return Answer::Now(refused),
        };
        for _ in 0..5 {
            let current = match self.commanded(api, key, op).await {
                Ok(c) => c,
                Err(refused) => return Answer::Now(refused),
            };
            let sync = matches!(command, Command::Sync(_));
            let uid = current.metadata.uid.clone().unwrap_or_default();
            match apply::run_command(&current, &op.operation_id, &command) {
                Run::Duplicate if sync => {
                    // Sent again (a new session, a restarted hub): answered
                    // as the first time would be, once settled.
                    return match apply::settlement(Some(&current), &op.operation_id, &uid) {
                        Settlement::Waiting => {
                            self.state.settle_later(key, &op.operation_id, &uid);
                            Answer::Later
                        }
                        Settlement::Settled { started_at } => Answer::Settled { started_at },
                    };
                }
                Run::Duplicate => return Answer::Now((AckOutcome::Duplicate, String::new())),
                Run::Nothing => return Answer::Now(applied()),
                Run::Patch(p) => match api
                    .patch(&key.name, &PatchParams::apply(MANAGER), &Patch::Merge(p))
                    .await
                {
                    Ok(_) if sync => {
                        self.state.settle_later(key, &op.operation_id, &uid);
                        return Answer::Later;
                    }
                    Ok(_) => return Answer::Now(applied()),
                    // Changed meanwhile: decide again on the new version.
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    Err(e) => return Answer::Now(write_error(e)),
                },
            }
        }
        Answer::Now((AckOutcome::Retry, "the Application keeps changing".into()))
    }
}

/// How the agent answers one command.
enum Answer {
    /// Now, with this outcome.
    Now(Outcome),
    /// A sync sent again that has settled already.
    Settled { started_at: String },
    /// A sync set on the cluster: answered when it settles.
    Later,
}

/// The command an OperationRequest asks for, or why it is refused.
fn command_of(op: &OperationRequest) -> Result<Command, Outcome> {
    Ok(match &op.kind {
        Some(operation_request::Kind::Sync(s)) => match serde_json::from_slice(&s.operation_json) {
            Ok(v) => Command::Sync(v),
            Err(e) => {
                return Err((
                    AckOutcome::Rejected,
                    format!("operation_json is not JSON: {e}"),
                ));
            }
        },
        Some(operation_request::Kind::Refresh(r)) => {
            Command::Refresh(RefreshKind::try_from(r.kind).unwrap_or_default())
        }
        Some(operation_request::Kind::Terminate(_)) => Command::Terminate,
        None => return Err((AckOutcome::Rejected, "no command".into())),
    })
}
