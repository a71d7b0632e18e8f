//! The agent's writes to its own cluster: one key at a time per
//! Application, many Applications in parallel. Each pass carries out the
//! hub's latest instruction for the key (apply, delete, release), reverts a
//! local edit, runs the commands, and queues a status report when what the
//! hub should see has changed.

use argocd_pull_runtime::telemetry::{self, SpanName};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::digest::{Entries, bucket_of, resync_requests};
use argocd_pull_proto::owner::{self, Holder};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, ApplicationUpsert, DigestSet, ObjectAck, ObjectKey, OperationAck,
    OperationRequest, agent_message, operation_request,
};
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::Value;

use crate::Mode;
use crate::apply::{self, Command, MANAGER, Run, Settlement};
use crate::metrics::{AgentMetrics, OutcomeLabel};
use crate::state::{AgentState, Instruction, Report};

pub struct Worker {
    pub client: kube::Client,
    pub state: Arc<AgentState>,
    pub store: Store<Application>,
    pub mode: Mode,
    pub metrics: AgentMetrics,
    pub queue: WorkQueue<ObjectKey>,
}

type Outcome = (AckOutcome, String);

fn applied() -> Outcome {
    (AckOutcome::Applied, String::new())
}

impl Worker {
    fn api(&self, key: &ObjectKey) -> Api<Application> {
        Api::namespaced_with(self.client.clone(), &key.namespace, &application_resource())
    }

    fn cached(&self, key: &ObjectKey) -> Option<Arc<Application>> {
        self.store
            .get(&ObjectRef::new_with(&key.name, application_resource()).within(&key.namespace))
    }

    /// Runs `n` workers until the queue closes.
    pub async fn run(self: Arc<Self>, n: usize) {
        let workers: Vec<_> = (0..n.max(1))
            .map(|_| {
                let w = self.clone();
                tokio::spawn(async move {
                    while let Some(key) = w.queue.next().await {
                        w.reconcile(&key).await;
                        w.queue.done(&key);
                    }
                })
            })
            .collect();
        for w in workers {
            let _ = w.await;
        }
    }

    pub async fn reconcile(&self, key: &ObjectKey) {
        let api = self.api(key);
        if let Some((seq, instruction)) = self.state.take_instruction(key) {
            let mut nothing_here = false;
            let (outcome, message) = match instruction {
                Instruction::Upsert(u) => {
                    // The apply continues the hub's trace of the delivery,
                    // and the key's reports carry it on. A repair the hub
                    // sends again untraced is a trace of its own, and the
                    // reports stay with the delivery's.
                    let span =
                        telemetry::span(SpanName::Apply, None, "", &key.namespace, &key.name);
                    telemetry::continue_from(&span, &u.trace_parent);
                    let trace = if u.trace_parent.is_empty() {
                        String::new()
                    } else {
                        telemetry::traceparent(&span)
                    };
                    let outcome = self.upsert(&api, key, u).instrument(span).await;
                    self.state.trace_report(key, trace);
                    outcome
                }
                Instruction::Delete { hub_uid } => {
                    let (outcome, absent) = self.delete(&api, key, &hub_uid).await;
                    nothing_here = absent;
                    outcome
                }
                Instruction::Release { hub_uid } => self.release(&api, key, &hub_uid).await,
            };
            self.state.control(AgentMessage {
                kind: Some(agent_message::Kind::ObjectAck(ObjectAck {
                    key: Some(key.clone()),
                    seq,
                    outcome: outcome as i32,
                    message,
                })),
            });
            if nothing_here {
                // Nothing delivered for that hub Application is here: it is
                // gone, said after the acknowledgement (control messages go
                // out first), as the protocol orders a delete's answers.
                self.state
                    .report(key, Report::Gone { uid: String::new() }, true);
            }
        } else if self.mode == Mode::Managed {
            self.revert_edit(&api, key).await;
        }
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
        self.report(key, false);
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
        let app = self.cached(key);
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

    /// Queues the report of `key` as the cache shows it.
    pub fn report(&self, key: &ObjectKey, force: bool) {
        match self.cached(key) {
            Some(app) if self.mode == Mode::Autonomous || apply::is_managed(&app) => {
                let (_, observed) = apply::observed(&app, self.mode == Mode::Autonomous);
                self.state
                    .report(key, Report::Observed(Arc::new(observed)), force);
            }
            _ => {
                if force || self.state.was_reported(key) {
                    self.state
                        .report(key, Report::Gone { uid: String::new() }, force);
                }
            }
        }
    }

    async fn upsert(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        u: Arc<ApplicationUpsert>,
    ) -> Outcome {
        let meta = u.meta.clone().unwrap_or_default();
        let config = match apply::applied_config(key, &u.application_json, &meta.uid, &meta.version)
        {
            Ok(c) => c,
            Err(e) => return self.counted((AckOutcome::Rejected, e.to_string())),
        };
        // The cache holds only what the agent manages; anything else at this
        // key is read live, and every write carries the resourceVersion its
        // ownership was decided on.
        let mut current = self.cached(key).map(Arc::unwrap_or_clone);
        if current.is_none() {
            current = match api.get_opt(&key.name).await {
                Ok(c) => c,
                Err(e) => return self.counted(write_error(e)),
            };
        }
        for _ in 0..3 {
            if let Some(c) = &current {
                if c.metadata.deletion_timestamp.is_some() {
                    return self.counted((
                        AckOutcome::Retry,
                        "the Application is being deleted on the cluster; it is created again once gone".into(),
                    ));
                }
                let unchanged = apply::is_delivered_for(c, &meta.uid)
                    && !apply::is_edited(c)
                    && c.annotations().get(keys::DESIRED_VERSION) == Some(&meta.version);
                if unchanged {
                    self.state.remember(key, u);
                    return applied();
                }
            }
            let precondition = match self.precondition(key, &meta.uid, current.as_ref(), &config) {
                Ok(p) => p,
                Err(refused) => return refused,
            };
            match self.write(api, key, &config, precondition).await {
                Err(Stale) => {
                    // Changed (or created) since it was read: decide again
                    // on what is there now.
                    current = match api.get_opt(&key.name).await {
                        Ok(c) => c,
                        Err(e) => return self.counted(write_error(e)),
                    };
                }
                Ok(outcome) => {
                    if outcome.0 == AckOutcome::Applied {
                        self.state.remember(key, u);
                    }
                    return self.counted(outcome);
                }
            }
        }
        self.counted((
            AckOutcome::Retry,
            "the Application keeps changing on the cluster".into(),
        ))
    }

    /// What the write of `config` for hub Application `hub_uid` requires of
    /// the Application now at `key`, from who holds it: that it is still
    /// absent, or still at the version read. Refused (and counted as an
    /// owner conflict) when it is someone else's.
    fn precondition(
        &self,
        key: &ObjectKey,
        hub_uid: &str,
        current: Option<&Application>,
        config: &Value,
    ) -> Result<Precondition, Outcome> {
        Ok(match apply::ownership(current, hub_uid, config) {
            apply::Ownership::Refuse(holder) => {
                let message = owner::conflict_message(key, &holder);
                tracing::warn!(namespace = %key.namespace, name = %key.name, %hub_uid, ?holder,
                    "refused: the Application on this cluster is not this hub Application's; left alone");
                self.metrics
                    .applies
                    .get_or_create(&OutcomeLabel {
                        outcome: "owner-conflict",
                    })
                    .inc();
                return Err((AckOutcome::Rejected, message));
            }
            apply::Ownership::Free => Precondition::Absent,
            apply::Ownership::Ours | apply::Ownership::Adopt => Precondition::Version(
                current
                    .and_then(|c| c.resource_version())
                    .unwrap_or_default(),
            ),
        })
    }

    fn counted(&self, outcome: Outcome) -> Outcome {
        let label = match outcome.0 {
            AckOutcome::Applied => "applied",
            AckOutcome::Rejected => "rejected",
            _ => "retry",
        };
        self.metrics
            .applies
            .get_or_create(&OutcomeLabel { outcome: label })
            .inc();
        outcome
    }

    /// Server-side applies `config`, then takes out spec fields someone else
    /// added (server-side apply leaves fields it does not own alone), and
    /// records the hash of the spec as the API server stored it. `Stale`
    /// when the Application is no longer as it was when `precondition` was
    /// decided (nothing was written then).
    async fn write(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        config: &Value,
        precondition: Precondition,
    ) -> Result<Outcome, Stale> {
        let (params, body) = match &precondition {
            // Not forced: a field someone else set meanwhile conflicts.
            Precondition::Absent => (PatchParams::apply(MANAGER), config.clone()),
            Precondition::Version(rv) => {
                let mut body = config.clone();
                body["metadata"]["resourceVersion"] = rv.clone().into();
                (PatchParams::apply(MANAGER).force(), body)
            }
        };
        let stored = match api.patch(&key.name, &params, &Patch::Apply(&body)).await {
            Ok(a) => a,
            Err(kube::Error::Api(s)) if s.code == 409 => return Err(Stale),
            Err(e) => return Ok(write_error(e)),
        };
        if precondition == Precondition::Absent
            && stored
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .any(|m| m.manager.as_deref() != Some(MANAGER))
        {
            // Someone else created it between the read and this write with
            // the same values (so nothing conflicted): it is not ours. Take
            // the markers back off and refuse.
            let _ = api
                .patch(
                    &key.name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(apply::release_patch()),
                )
                .await;
            return Err(Stale);
        }
        let stored = match take_out_others_spec_fields(api, key, config, stored).await {
            Ok(a) => a,
            Err(e) => return Ok(write_error(e)),
        };
        if let Err(e) = record_spec_hash(api, key, &stored).await {
            return Ok(write_error(e));
        }
        tracing::debug!(namespace = %key.namespace, name = %key.name, "applied");
        Ok(applied())
    }

    async fn revert_edit(&self, api: &Api<Application>, key: &ObjectKey) {
        let Some(current) = self.cached(key) else {
            return;
        };
        if !apply::is_managed(&current)
            || current.metadata.deletion_timestamp.is_some()
            || !apply::is_edited(&current)
        {
            return;
        }
        match self.state.remembered(key) {
            Some(u) => {
                tracing::info!(namespace = %key.namespace, name = %key.name, "reverting a local edit of an Application the hub manages");
                let meta = u.meta.clone().unwrap_or_default();
                if !apply::is_delivered_for(&current, &meta.uid) {
                    return;
                }
                let Ok(config) =
                    apply::applied_config(key, &u.application_json, &meta.uid, &meta.version)
                else {
                    return;
                };
                let rv = current.resource_version().unwrap_or_default();
                let (outcome, message) = self
                    .write(api, key, &config, Precondition::Version(rv))
                    .await
                    .unwrap_or_else(|Stale| {
                        (AckOutcome::Retry, "changed while being reverted".into())
                    });
                if outcome != AckOutcome::Applied {
                    tracing::warn!(namespace = %key.namespace, name = %key.name, %message, "could not revert a local edit; retrying");
                    self.queue.add_after(key.clone(), Duration::from_secs(2));
                }
            }
            None => {
                // Not applied by this process (it restarted): the hub sends
                // it again when asked for this bucket.
                tracing::info!(namespace = %key.namespace, name = %key.name, "local edit of an Application the hub manages; asking the hub for it");
                let bucket = bucket_of(key);
                let entries: Entries = self
                    .store
                    .state()
                    .iter()
                    .filter_map(|a| Some((apply::key_of(a), apply::replica_version(a)?)))
                    .filter(|(k, _)| bucket_of(k) == bucket)
                    .collect();
                for r in resync_requests(DigestSet::Desired, &entries, &[bucket]) {
                    self.state.control(AgentMessage {
                        kind: Some(agent_message::Kind::ResyncRequest(r)),
                    });
                }
            }
        }
    }

    /// Deletes the copy delivered for `hub_uid`; also says whether there
    /// is none (to be reported gone once the delete is acknowledged).
    async fn delete(
        &self,
        api: &Api<Application>,
        key: &ObjectKey,
        hub_uid: &str,
    ) -> (Outcome, bool) {
        self.state.forget(key);
        let current = match api.get_opt(&key.name).await {
            Ok(c) => c,
            Err(e) => return (write_error(e), false),
        };
        match current {
            // Only a copy this agent delivered for that hub Application; any
            // other Application of that name is left alone.
            Some(app) if apply::is_delivered_for(&app, hub_uid) => {
                if app.metadata.deletion_timestamp.is_none() {
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: app.metadata.uid.clone(),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match api.delete(&key.name, &dp).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                        Err(e) => return (write_error(e), false),
                    }
                    tracing::info!(namespace = %key.namespace, name = %key.name, "deleted for the hub");
                }
                // `gone` follows when the watch sees it disappear.
                (applied(), false)
            }
            // Nothing delivered for that hub Application is here.
            _ => (applied(), true),
        }
    }

    async fn release(&self, api: &Api<Application>, key: &ObjectKey, hub_uid: &str) -> Outcome {
        self.state.forget(key);
        let current = match api.get_opt(&key.name).await {
            Ok(c) => c,
            Err(e) => return write_error(e),
        };
        if let Some(app) = current
            && apply::is_delivered_for(&app, hub_uid)
        {
            if let Err(e) = api
                .patch(
                    &key.name,
                    &PatchParams::apply(MANAGER),
                    &Patch::Merge(apply::release_patch()),
                )
                .await
            {
                return write_error(e);
            }
            tracing::info!(namespace = %key.namespace, name = %key.name, "released: left running, no longer managed for the hub");
        }
        self.state.unreport(key);
        applied()
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

/// Takes out of the `stored` Application the spec fields that are not in
/// `config` (server-side apply leaves fields it does not own alone), at the
/// version just written; the Application as stored afterwards.
async fn take_out_others_spec_fields(
    api: &Api<Application>,
    key: &ObjectKey,
    config: &Value,
    stored: Application,
) -> kube::Result<Application> {
    let wanted = config.get("spec").cloned().unwrap_or(Value::Null);
    let Some(diff) = content::merge_diff(stored.data.get("spec").unwrap_or(&Value::Null), &wanted)
    else {
        return Ok(stored);
    };
    let patch = serde_json::json!({
        "metadata": { "resourceVersion": stored.resource_version() },
        "spec": diff,
    });
    api.patch(
        &key.name,
        &PatchParams::apply(MANAGER),
        &Patch::Merge(patch),
    )
    .await
}

/// Records the hash of the spec as the API server stored it, when the
/// annotation does not hold it already.
async fn record_spec_hash(
    api: &Api<Application>,
    key: &ObjectKey,
    stored: &Application,
) -> kube::Result<()> {
    let hash = content::hash(stored.data.get("spec").unwrap_or(&Value::Null));
    if stored.annotations().get(keys::SPEC_HASH) != Some(&hash) {
        // The API server changed the spec (a field this cluster's Argo CD
        // does not know): remember what it keeps, or the agent would
        // take its own write for a local edit forever.
        let patch = serde_json::json!({ "metadata": { "annotations": { keys::SPEC_HASH: hash } } });
        api.patch(
            &key.name,
            &PatchParams::apply(MANAGER),
            &Patch::Merge(patch),
        )
        .await?;
    }
    Ok(())
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
        Some(operation_request::Kind::Refresh(r)) => Command::Refresh(
            argocd_pull_proto::v1::RefreshKind::try_from(r.kind).unwrap_or_default(),
        ),
        Some(operation_request::Kind::Terminate(_)) => Command::Terminate,
        None => return Err((AckOutcome::Rejected, "no command".into())),
    })
}

/// What a write was decided on: nothing there, or this resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Precondition {
    Absent,
    Version(String),
}

/// The Application changed since its ownership was decided.
struct Stale;

/// What the hub should do about a failed write: a request the API server
/// will never accept is refused with its message; anything else is retried.
fn write_error(e: kube::Error) -> Outcome {
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 404 | 422) => (
            AckOutcome::Rejected,
            format!("the cluster's API server refused it: {}", s.message),
        ),
        e => (AckOutcome::Retry, e.to_string()),
    }
}
