//! The workers: everything the gRPC transport writes to the hub API
//! server for a hub Application (status and condition, command stamps and
//! completion, finalizer release), one keyed work queue, parallel across
//! Applications, each through the one writer ([`crate::status::writer`]).

use argocd_pull_runtime::telemetry::{self, SpanName};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMode, ObjectKey, OperationRequest, SyncOperation, TerminateOperation,
    operation_request,
};
use argocd_pull_proto::version::CAPABILITY_TERMINATE_OPERATION;
use kube::runtime::events::EventType;
use serde_json::Value;

use super::super::cluster::{ClusterState, Observation, Work};
use super::super::commands::{self, Command};
use super::{Hub, app_ref};
use crate::status::Reason;
use crate::status::condition::condition_of;
use crate::status::observed::hub_status;
use crate::status::writer::{COMMAND_MANAGER, holds_argocd_finalizer};
use crate::transport::grpc::assign::{Assignment, HubRef};
use argocd_pull_proto::owner::{Holder, parse_conflict};

impl Hub {
    /// Runs `n` workers until the queue is closed.
    pub async fn run_workers(self: Arc<Self>, n: usize) {
        let workers: Vec<_> = (0..n.max(1))
            .map(|_| {
                let hub = self.clone();
                tokio::spawn(async move {
                    while let Some(work) = hub.queue.next().await {
                        if let Err(e) = hub.reconcile(&work).await {
                            tracing::warn!(?work, error = %e, "gRPC transport: write failed; retrying");
                            hub.metrics.write_errors.inc();
                            hub.queue.add_after(work.clone(), Duration::from_secs(2));
                        }
                        hub.queue.done(&work);
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
    }

    async fn reconcile(&self, work: &Work) -> Result<(), kube::Error> {
        self.wait_synced().await;
        match work {
            Work::App(r) => self.reconcile_app(r).await,
            Work::Mirror { cluster, key } => self.reconcile_mirror(cluster, key).await,
        }
    }

    async fn reconcile_app(&self, r: &HubRef) -> Result<(), kube::Error> {
        let Some(cached) = self.caches.apps.get(&app_ref(r)) else {
            return Ok(());
        };
        if self.writer.behind(cached.identity()) {
            // Decided again when the echo of our last write arrives.
            return Ok(());
        }
        let app = cached.application();
        let verdict = match self.acting_assignment(r) {
            None | Some(Assignment::NotOurs { .. }) => return Ok(()),
            Some(Assignment::Refused {
                cluster,
                key,
                reason,
                message,
            }) => Verdict {
                cluster,
                key,
                reason: Some(reason),
                message,
            },
            Some(Assignment::Deliver {
                cluster,
                key,
                deleting,
                ..
            }) => {
                let cs = self.cluster(&cluster);
                let owner = self.owner(&cluster, &key);
                if deleting {
                    return self.release_deleting(r, &app, &cs, &key, owner).await;
                }
                let (reason, message) = match self.delivery_refusal(r, &cluster, &key, &cs, owner) {
                    Some((reason, message)) => (Some(reason), message),
                    None => (None, String::new()),
                };
                Verdict {
                    cluster,
                    key,
                    reason,
                    message,
                }
            }
        };
        let cs = self.cluster(&verdict.cluster);
        if verdict.reason.is_none() {
            self.commands(&app, Work::App(r.clone()), &cs, &verdict.key)
                .await?;
        }
        self.write_app_status(r, &app, &cs, &verdict).await
    }

    /// The assignment of `r`, unless its cluster is another replica's to
    /// write for.
    fn acting_assignment(&self, r: &HubRef) -> Option<Assignment> {
        let assignment = self
            .index
            .lock()
            .expect("never poisoned")
            .assignment(r)
            .cloned();
        // With several replicas, one writes for a cluster (see `claims`).
        if let Some((cluster, _)) = assignment.as_ref().and_then(|a| a.slot())
            && !matches!(assignment, Some(Assignment::NotOurs { .. }))
            && !self.acts_for(cluster)
        {
            return None;
        }
        assignment
    }

    /// A deleting hub Application delivered to `key`: one that does not own
    /// the spoke copy only has its finalizers released, else it is
    /// [finalized](Self::finalize).
    async fn release_deleting(
        &self,
        r: &HubRef,
        app: &Application,
        cs: &ClusterState,
        key: &ObjectKey,
        owner: Option<HubRef>,
    ) -> Result<(), kube::Error> {
        if owner.as_ref().is_some_and(|o| o != r)
            && !self.copy_is(cs, key, app.metadata.uid.as_deref())
        {
            // Refused: nothing of its own is on the spoke, and
            // the owner's copy is never touched.
            if !holds_argocd_finalizer(app) {
                return Ok(());
            }
            return self.writer.release_finalizers(app).await;
        }
        self.finalize(app, cs, key).await
    }

    /// Why a hub Application assigned for delivery to `key` is not
    /// delivered, if it is not: another one owns the spoke copy, the agent
    /// runs autonomous, or the agent refused the upsert.
    fn delivery_refusal(
        &self,
        r: &HubRef,
        cluster: &str,
        key: &ObjectKey,
        cs: &ClusterState,
        owner: Option<HubRef>,
    ) -> Option<(Reason, String)> {
        if owner.as_ref() != Some(r) {
            let other = owner.map(|w| w.to_string()).unwrap_or_default();
            let msg = format!(
                "Application {}/{} on cluster {cluster} is already delivered for {other}: rename this Application or change its {} annotation",
                key.namespace,
                key.name,
                keys::MANAGED_CLUSTER_APP_NAMESPACE
            );
            Some((Reason::SpokeConflict, msg))
        } else if cs.mode() == Some(AgentMode::Autonomous) {
            let msg = format!(
                "the agent of cluster {cluster} runs in autonomous mode: its Applications are defined on the cluster; deliver this one by ManifestWork (annotation {}: manifestwork) or run the agent in managed mode",
                keys::TRANSPORT
            );
            Some((Reason::AutonomousCluster, msg))
        } else {
            let rejected = cs.lock().rejected.get(key).cloned();
            rejected.map(|m| self.rejection(cluster, key, &m))
        }
    }

    /// Writes the status of the hub Application `r`: the agent's report
    /// when it holds the spoke copy, and the condition of `verdict`; a new
    /// refusal is also logged, counted and a Warning Event.
    async fn write_app_status(
        &self,
        r: &HubRef,
        app: &Application,
        cs: &ClusterState,
        verdict: &Verdict,
    ) -> Result<(), kube::Error> {
        let Verdict {
            cluster,
            key,
            reason,
            message,
        } = verdict;
        let observed = self.observed_status(r, app, cs, verdict);
        let condition = reason.map(|r| format!("{r}: {message}"));
        let current = app.data.get("status").cloned().unwrap_or(Value::Null);
        let Some(status) = status_to_write(&current, observed.as_ref(), &condition) else {
            return Ok(());
        };
        let newly_refused = condition.is_some() && condition_of(&current) != condition.as_deref();
        // The trace of the report this writes, when there is one.
        let span = match cs.take_report_trace(key) {
            Some(parent) => {
                let span =
                    telemetry::span(SpanName::StatusWrite, None, cluster, &r.namespace, &r.name);
                telemetry::continue_from(&span, &parent);
                span
            }
            None => tracing::Span::none(),
        };
        if self
            .writer
            .write_status(app, &status, None)
            .instrument(span)
            .await?
            .is_none()
        {
            return Ok(());
        }
        self.metrics.status_writes.inc();
        if hub_status(&status, observed.as_ref(), condition.clone()) != status {
            // A first step: its echo brings the second ([`Hub::follow_ups`]).
            self.follow_ups
                .lock()
                .expect("never poisoned")
                .insert(r.clone());
        }
        if let (true, Some(reason)) = (newly_refused, reason) {
            tracing::warn!(%cluster, namespace = %r.namespace, name = %r.name, %reason, %message, "not delivered");
            self.metrics.refuse(cluster, reason.as_str());
            self.writer
                .event(app, EventType::Warning, reason.as_str(), message)
                .await;
        }
        Ok(())
    }

    /// The status the agent reported for the spoke copy of `r`, parsed.
    fn observed_status(
        &self,
        r: &HubRef,
        app: &Application,
        cs: &ClusterState,
        verdict: &Verdict,
    ) -> Option<Value> {
        // Only the holder of the spoke Application shows its status: a
        // refused or conflicting one never sees another team's.
        let holds = self.winner(&verdict.cluster, &verdict.key).as_ref() == Some(r);
        match cs.lock().observed.get(&verdict.key) {
            // A report names the hub Application it was delivered for
            // (agents before `owner-check` leave it empty).
            Some(Observation::Observed { report, .. })
                if holds
                    && (report.hub_uid.is_empty()
                        || app.metadata.uid.as_deref() == Some(report.hub_uid.as_str())) =>
            {
                report.status.parse::<Value>().ok()
            }
            _ => None,
        }
    }

    /// The condition for an upsert the agent refused: a spoke Application
    /// that someone else holds is a conflict naming the holder, anything
    /// else the cluster API server's own words.
    fn rejection(&self, cluster: &str, key: &ObjectKey, message: &str) -> (Reason, String) {
        let what = format!(
            "Application {}/{} on cluster {cluster}",
            key.namespace, key.name
        );
        match parse_conflict(message) {
            Some(Holder::HubApplication(uid)) => {
                let holder = self
                    .caches
                    .apps
                    .state()
                    .iter()
                    .find(|a| a.identity().uid.as_deref() == Some(uid.as_str()))
                    .map(|a| HubRef::of(a.as_ref()).to_string())
                    .unwrap_or_else(|| {
                        format!("a hub Application that no longer exists (uid {uid})")
                    });
                (
                    Reason::SpokeConflict,
                    format!(
                        "{what} is held by {holder}, which keeps it: rename this Application or change its {} annotation",
                        keys::MANAGED_CLUSTER_APP_NAMESPACE
                    ),
                )
            }
            Some(Holder::NotArgocdPull) => (
                Reason::SpokeConflict,
                format!(
                    "{what} exists there and argocd-pull did not create it: rename this Application, or delete that one on the cluster"
                ),
            ),
            None => (
                Reason::RejectedByAgent,
                format!("the agent refused it: {message}"),
            ),
        }
    }

    /// Whether the agent reported its copy of `key` as delivered for the
    /// hub Application `uid` (unknown while no report is held: assumed).
    fn copy_is(&self, cs: &ClusterState, key: &ObjectKey, uid: Option<&str>) -> bool {
        match cs.lock().observed.get(key) {
            Some(Observation::Observed { report, .. }) => {
                report.hub_uid.is_empty() || Some(report.hub_uid.as_str()) == uid
            }
            Some(Observation::Gone) => false,
            // Not reported by a connected agent: not there.
            _ => !cs.has_session(),
        }
    }

    /// A deleting hub Application: its Argo CD finalizers are released once
    /// the agent has reported the spoke copy gone after deleting it.
    async fn finalize(
        &self,
        app: &Application,
        cs: &ClusterState,
        key: &ObjectKey,
    ) -> Result<(), kube::Error> {
        if !holds_argocd_finalizer(app) {
            return Ok(());
        }
        let gone_for = cs.lock().gone.get(key).cloned();
        if gone_for.as_deref() != app.metadata.uid.as_deref() {
            return Ok(());
        }
        self.writer.release_finalizers(app).await
    }

    /// Stamps, sends and completes the sync and refresh commands `app`
    /// (a hub Application or a mirror) carries.
    pub(super) async fn commands(
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
        cs.retain_ops(&owner, &ids);
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
                        if cs.report_once(&id) {
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
        cs.add_refused_op(request, owner.clone(), &message);
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
            cs.op_done(id);
            return Ok(false);
        };
        // Changed meanwhile (None): decided again from its next version.
        if self
            .writer
            .patch(app, COMMAND_MANAGER, &patch)
            .await?
            .is_some()
        {
            cs.op_done(id);
            let what = match command {
                Command::Sync(_) => {
                    // Its terminate, if any, ends with it.
                    cs.op_done(&commands::terminate_id(id));
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

/// Where a hub Application is delivered and, when it is not, why: what its
/// status shows.
struct Verdict {
    cluster: String,
    key: ObjectKey,
    reason: Option<Reason>,
    /// Empty when `reason` is None.
    message: String,
}

/// The status to write onto a hub Application whose status is `current`,
/// from the agent's report `observed` and the `condition`; None when there
/// is nothing to write.
fn status_to_write(
    current: &Value,
    observed: Option<&Value>,
    condition: &Option<String>,
) -> Option<Value> {
    // A spoke Application its Argo CD has not looked at yet reports an
    // empty status: onto a hub copy that shows none either, that is
    // nothing reported yet (it was written as `{conditions: []}`, one
    // more PATCH per new Application).
    let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|m| m.is_empty());
    let reported = observed.is_some_and(|o| !(empty(o) && empty(current)));
    if !reported && condition.is_none() && condition_of(current).is_none() {
        // Nothing reported yet and nothing wrong: nothing to write.
        return None;
    }
    let status = hub_status(current, observed, condition.clone());
    (status != *current).then_some(status)
}

/// The commands `app` carries for `owner`, given those `cs` has in flight
/// for it.
fn command_plan(app: &Application, owner: &Work, cs: &ClusterState) -> commands::CommandPlan {
    let in_flight = |sync: bool| {
        cs.lock()
            .ops
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
    };
    let (sync_id, refresh_id) = (in_flight(true), in_flight(false));
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
