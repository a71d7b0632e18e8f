//! The agent's passes over its own cluster: one key at a time per
//! Application, many Applications in parallel. Each pass carries out the
//! hub's latest instruction for the key (apply, delete, release) with the
//! [`Applier`], or reverts a local edit; runs the hub's [`Commands`]; and
//! queues a status report ([`Reports`]) when what the hub should see has
//! changed.

mod applier;
mod commands;

pub use applier::Applier;
pub use commands::Commands;

use argocd_pull_runtime::telemetry::{self, SpanName};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_proto::digest::{Entries, bucket_of, resync_requests};
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, ApplicationUpsert, DigestSet, ObjectKey, OperationRequest,
    agent_message,
};
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::api::Api;
use kube::runtime::reflector::Store;

use crate::Mode;
use crate::apply;
use crate::cache::Cache;
use crate::metrics::AgentMetrics;
use crate::reports::Reports;
use crate::state::{AgentState, Instruction};

/// The queue of keys to look at, and the passes that take them from it.
pub struct Worker {
    state: Arc<AgentState>,
    queue: WorkQueue<ObjectKey>,
    mode: Mode,
    cache: Cache,
    applier: Applier,
    commands: Commands,
    reports: Reports,
}

/// An answer to the hub: its outcome and what to tell it.
pub type Outcome = (AckOutcome, String);

fn applied() -> Outcome {
    (AckOutcome::Applied, String::new())
}

/// The Applications of `key`'s namespace.
fn api(client: &kube::Client, key: &ObjectKey) -> Api<Application> {
    Api::namespaced_with(client.clone(), &key.namespace, &application_resource())
}

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

impl Worker {
    /// Writes to the cluster with `client`, reads it from `store` (the
    /// watch's), and takes its work from, and gives its answers to, `state`.
    pub fn new(
        client: kube::Client,
        state: Arc<AgentState>,
        store: Store<Application>,
        mode: Mode,
        metrics: AgentMetrics,
    ) -> Self {
        let cache = Cache::new(store);
        Self {
            applier: Applier::new(client.clone(), cache.clone(), metrics),
            commands: Commands::new(client, state.clone(), cache.clone(), mode),
            reports: Reports::new(state.clone(), cache.clone(), mode),
            queue: WorkQueue::new(),
            state,
            mode,
            cache,
        }
    }

    /// This cluster's Applications, as the worker sees them.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// What the hub hears from the worker.
    pub fn reports(&self) -> &Reports {
        &self.reports
    }

    /// The hub's latest instruction for `key`, carried out by the next
    /// pass over it (a newer one replaces one not carried out yet).
    pub fn instruct(&self, key: ObjectKey, seq: u64, instruction: Instruction) {
        self.state.instruct(key.clone(), seq, instruction);
        self.queue.add(key);
    }

    /// A command of the hub for `key`, run by the next pass over it.
    pub fn command(&self, key: ObjectKey, op: OperationRequest) {
        self.state.add_op(key.clone(), op);
        self.queue.add(key);
    }

    /// The Application at `key` changed on the cluster.
    pub fn changed(&self, key: ObjectKey) {
        self.queue.add(key);
    }

    /// Looks at every Application again: those reported and those cached
    /// (one gone while the watch was down has no delete event).
    pub fn look_again(&self) {
        for key in self.state.reported_keys() {
            self.queue.add(key);
        }
        for a in self.cache.all() {
            self.queue.add(apply::key_of(&a));
        }
    }

    /// Lets [`Worker::run`] return once the passes under way are done.
    pub fn stop(&self) {
        self.queue.close();
    }

    /// Runs `n` passes in parallel until [`Worker::stop`].
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

    /// One pass over `key`.
    pub async fn reconcile(&self, key: &ObjectKey) {
        if let Some((seq, instruction)) = self.state.take_instruction(key) {
            self.carry_out(key, seq, instruction).await;
        } else if self.mode == Mode::Managed {
            self.revert_edit(key).await;
        }
        self.commands.run(key).await;
        self.reports.report(key, false);
    }

    /// Carries out the hub's instruction `seq` for `key` and acknowledges it.
    async fn carry_out(&self, key: &ObjectKey, seq: u64, instruction: Instruction) {
        let mut nothing_here = false;
        let (outcome, message) = match instruction {
            Instruction::Upsert(u) => self.upsert(key, u).await,
            Instruction::Delete { hub_uid } => {
                self.state.forget(key);
                let (outcome, absent) = self.applier.delete(key, &hub_uid).await;
                nothing_here = absent;
                outcome
            }
            Instruction::Release { hub_uid } => {
                self.state.forget(key);
                let outcome = self.applier.release(key, &hub_uid).await;
                if outcome.0 == AckOutcome::Applied {
                    self.state.unreport(key);
                }
                outcome
            }
        };
        self.state.object_ack(key.clone(), seq, outcome, message);
        if nothing_here {
            // Nothing delivered for that hub Application is here: it is
            // gone, said after the acknowledgement (control messages go
            // out first), as the protocol orders a delete's answers.
            self.reports.gone(key);
        }
    }

    /// Applies `u`, remembered once applied (to revert a local edit).
    async fn upsert(&self, key: &ObjectKey, u: Arc<ApplicationUpsert>) -> Outcome {
        // The apply continues the hub's trace of the delivery, and the
        // key's reports carry it on. A repair the hub sends again untraced
        // is a trace of its own, and the reports stay with the delivery's.
        let span = telemetry::span(SpanName::Apply, None, "", &key.namespace, &key.name);
        telemetry::continue_from(&span, &u.trace_parent);
        let trace = if u.trace_parent.is_empty() {
            String::new()
        } else {
            telemetry::traceparent(&span)
        };
        let outcome = self.applier.upsert(key, &u).instrument(span).await;
        if outcome.0 == AckOutcome::Applied {
            self.state.remember(key, u);
        }
        self.state.trace_report(key, trace);
        outcome
    }

    /// Puts an Application the hub manages back as it was delivered when it
    /// was edited on the cluster; asks the hub for it when this process
    /// has not applied it.
    async fn revert_edit(&self, key: &ObjectKey) {
        let Some(current) = self.cache.get(key) else {
            return;
        };
        if !apply::is_managed(&current)
            || current.metadata.deletion_timestamp.is_some()
            || !apply::is_edited(&current)
        {
            return;
        }
        let Some(u) = self.state.remembered(key) else {
            // Not applied by this process (it restarted): the hub sends
            // it again when asked for this bucket.
            tracing::info!(namespace = %key.namespace, name = %key.name, "local edit of an Application the hub manages; asking the hub for it");
            self.ask_for_bucket_of(key);
            return;
        };
        tracing::info!(namespace = %key.namespace, name = %key.name, "reverting a local edit of an Application the hub manages");
        if let Err(message) = self.applier.revert(key, &current, &u).await {
            tracing::warn!(namespace = %key.namespace, name = %key.name, %message, "could not revert a local edit; retrying");
            self.queue.add_after(key.clone(), Duration::from_secs(2));
        }
    }

    /// Asks the hub to repair the bucket of the desired set `key` is in.
    fn ask_for_bucket_of(&self, key: &ObjectKey) {
        let bucket = bucket_of(key);
        let entries: Entries = self
            .cache
            .desired_replica()
            .into_iter()
            .filter(|(k, _)| bucket_of(k) == bucket)
            .collect();
        for r in resync_requests(DigestSet::Desired, &entries, &[bucket]) {
            self.state.control(AgentMessage {
                kind: Some(agent_message::Kind::ResyncRequest(r)),
            });
        }
    }
}
