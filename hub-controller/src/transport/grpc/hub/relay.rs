//! The commands a hub Application (or an autonomous agent's mirror)
//! carries, relayed to its cluster's agent: sync, refresh and terminate are
//! stamped, sent as operations, and taken off once the agent answered,
//! with its answer logged (a refusal is also a Warning Event).

use std::sync::Arc;

use argocd_pull_apis::argocd::Application;
use argocd_pull_proto::content;
use argocd_pull_proto::v1::{
    AckOutcome, ObjectKey, OperationRequest, SyncOperation, TerminateOperation, operation_request,
};
use argocd_pull_proto::version::CAPABILITY_TERMINATE_OPERATION;
use kube::runtime::events::EventType;

use super::super::cluster::{ClusterState, Work};
use super::super::commands::{self, Command};
use crate::status::AppWriter;
use crate::status::writer::COMMAND_MANAGER;

/// Writes what the commands need through the one writer of hub
/// Applications.
pub struct CommandRelay {
    writer: Arc<AppWriter>,
}

impl CommandRelay {
    pub fn new(writer: Arc<AppWriter>) -> Self {
        Self { writer }
    }

    /// Stamps, sends and completes the sync and refresh commands `app`
    /// (a hub Application or a mirror) carries.
    pub async fn commands(
        &self,
        app: &Application,
        owner: Work,
        cs: &ClusterState,
        key: &ObjectKey,
    ) -> Result<(), kube::Error> {
        let plan = command_plan(app, &owner, cs);
        if let Some(patch) = plan.stamp {
            // Our own write brings the Application back here.
            self.writer.patch(app, COMMAND_MANAGER, &patch).await?;
            return Ok(());
        }
        let ids: Vec<String> = plan.ready.iter().map(|(id, _)| id.clone()).collect();
        cs.lock().ops.retain(&owner, &ids);
        for (id, command) in plan.ready {
            let (outcome, settled_started_at) = cs
                .lock()
                .ops
                .get(&id)
                .map(|op| (op.outcome.clone(), op.settled_started_at.clone()))
                .unwrap_or_default();
            match outcome {
                None => {
                    let request = operation_request(app, &owner, key, &id, &command);
                    if command == Command::Terminate
                        && !cs.agent_offers(CAPABILITY_TERMINATE_OPERATION)
                    {
                        self.refuse_terminate(app, &owner, cs, &id, request).await;
                    } else if cs.add_op(request, owner.clone()) {
                        tracing::debug!(cluster = %cs.name, id, "command queued for the agent");
                    }
                }
                Some((outcome, message)) => {
                    if command == Command::Terminate {
                        // Nothing to take off the hub copy: it stays until
                        // its sync is completed.
                        if cs.lock().ops.report_once(&id) {
                            self.report_answer(app, cs, &id, "terminate", outcome, &message)
                                .await;
                        }
                        continue;
                    }
                    if let Some(start) = &settled_started_at
                        && !commands::status_shows_start(app, start)
                    {
                        // Taken off only once the status shows the sync ran,
                        // as Argo CD clears `.operation` in the write that
                        // records it: a reader that sees the operation gone
                        // sees the start too. Our status write brings the
                        // Application back here.
                        tracing::debug!(cluster = %cs.name, id, start, "sync settled; waiting for its status");
                        continue;
                    }
                    if self
                        .complete(app, cs, &id, &command, (outcome, message))
                        .await?
                    {
                        // One write per pass: the next one reads the new version.
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// A terminate the agent cannot run, as it does not offer it: recorded
    /// as refused, so that it is not sent, and reported as such.
    async fn refuse_terminate(
        &self,
        app: &Application,
        owner: &Work,
        cs: &ClusterState,
        id: &str,
        request: OperationRequest,
    ) {
        let message = format!(
            "it does not offer {CAPABILITY_TERMINATE_OPERATION}: upgrade the agent to terminate a sync from the hub"
        );
        cs.lock().ops.add_refused(request, owner.clone(), &message);
        self.report_answer(app, cs, id, "terminate", AckOutcome::Rejected, &message)
            .await;
    }

    /// Takes the command `id` the agent answered off `app` and reports the
    /// answer; true when it wrote (or tried to write) `app`, which ends
    /// the pass. One with nothing to take off is just done.
    async fn complete(
        &self,
        app: &Application,
        cs: &ClusterState,
        id: &str,
        command: &Command,
        (outcome, message): (AckOutcome, String),
    ) -> Result<bool, kube::Error> {
        let Some(patch) = commands::completion_patch(app, id, command) else {
            cs.lock().ops.done(id);
            return Ok(false);
        };
        // Changed meanwhile (None): decided again from its next version.
        if self
            .writer
            .patch(app, COMMAND_MANAGER, &patch)
            .await?
            .is_some()
        {
            cs.lock().ops.done(id);
            let what = match command {
                Command::Sync(_) => {
                    // Its terminate, if any, ends with it.
                    cs.lock().ops.done(&commands::terminate_id(id));
                    "sync"
                }
                Command::Refresh(_) => "refresh",
                Command::Terminate => "terminate",
            };
            self.report_answer(app, cs, id, what, outcome, &message)
                .await;
        }
        Ok(true)
    }

    /// Logs the agent's answer to a command; a refusal is also a Warning
    /// Event on the Application.
    async fn report_answer(
        &self,
        app: &Application,
        cs: &ClusterState,
        id: &str,
        what: &str,
        outcome: AckOutcome,
        message: &str,
    ) {
        if outcome == AckOutcome::Rejected {
            tracing::warn!(cluster = %cs.name, id, %message, "the agent refused a {what}");
            self.writer
                .event(
                    app,
                    EventType::Warning,
                    "CommandRejected",
                    &format!(
                        "the agent of cluster {} refused the {what}: {message}",
                        cs.name
                    ),
                )
                .await;
        } else {
            tracing::info!(cluster = %cs.name, id, ?outcome, "{what} handed over to the spoke");
        }
    }
}

/// The commands `app` carries for `owner`, given those `cs` has in flight
/// for it.
fn command_plan(app: &Application, owner: &Work, cs: &ClusterState) -> commands::CommandPlan {
    let (sync_id, refresh_id) = {
        let inner = cs.lock();
        (inner.ops.of(owner, true), inner.ops.of(owner, false))
    };
    let mut plan = commands::commands(
        app,
        commands::InFlight {
            sync: sync_id.as_deref(),
            refresh: refresh_id.as_deref(),
        },
    );
    // A mirror's status is the agent's report, written whole: a
    // terminate-op on it is not carried (see `status::terminating`).
    if !matches!(owner, Work::App(_)) {
        plan.ready.retain(|(_, c)| *c != Command::Terminate);
    }
    plan
}

/// The request that sends `command` (of `app`, for `owner`) to the agent
/// as operation `id` on its copy `key`.
fn operation_request(
    app: &Application,
    owner: &Work,
    key: &ObjectKey,
    id: &str,
    command: &Command,
) -> OperationRequest {
    let kind = match command {
        Command::Sync(op) => operation_request::Kind::Sync(SyncOperation {
            operation_json: content::canonical(op),
        }),
        Command::Refresh(kind) => {
            operation_request::Kind::Refresh(argocd_pull_proto::v1::RefreshRequest {
                kind: *kind as i32,
            })
        }
        Command::Terminate => operation_request::Kind::Terminate(TerminateOperation {}),
    };
    OperationRequest {
        operation_id: id.to_string(),
        key: Some(key.clone()),
        kind: Some(kind),
        // The owner: the agent runs it only on the copy it
        // applied for this hub Application.
        hub_uid: match owner {
            Work::App(_) => app.metadata.uid.clone().unwrap_or_default(),
            _ => String::new(),
        },
    }
}
