//! The workers: everything the gRPC transport writes to the hub API
//! server for a hub Application (status and condition, command stamps and
//! completion, finalizer release), one keyed work queue, parallel across
//! Applications, each through the one writer ([`crate::status::writer`]).

use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_proto::owner::{Holder, parse_conflict};
use argocd_pull_proto::v1::{AgentMode, ObjectKey};
use argocd_pull_runtime::telemetry::{self, SpanName};
use argocd_pull_runtime::workqueue::WorkQueue;
use kube::runtime::events::EventType;
use serde_json::Value;
use tracing::Instrument;

use super::super::cluster::{ClusterState, Observation, Work};
use super::super::metrics::GrpcMetrics;
use super::claimed::Acting;
use super::clusters::Clusters;
use super::granted::Granted;
use super::mirror::Mirrors;
use super::relay::CommandRelay;
use super::routes::{Routes, app_ref};
use crate::status::condition::condition_of;
use crate::status::observed::hub_status;
use crate::status::writer::holds_argocd_finalizer;
use crate::status::{AppWriter, Reason};
use crate::transport::grpc::assign::{Assignment, HubRef};
use crate::watch::caches::Caches;

/// The workers and what they read: the index, the clusters' state and the
/// caches; what they write goes through the one writer.
pub struct Workers {
    pub(super) routes: Arc<Routes>,
    pub(super) clusters: Arc<Clusters>,
    pub(super) caches: Caches,
    pub(super) writer: Arc<AppWriter>,
    pub(super) metrics: GrpcMetrics,
    pub(super) queue: WorkQueue<Work>,
    pub(super) acting: Arc<Acting>,
    pub(super) relay: Arc<CommandRelay>,
    pub(super) mirrors: Arc<Mirrors>,
    pub(super) granted: Arc<Granted>,
}

impl Workers {
    /// Runs `n` workers until the queue is closed.
    pub async fn run(self: Arc<Self>, n: usize) {
        let workers: Vec<_> = (0..n.max(1))
            .map(|_| {
                let hub = self.clone();
                tokio::spawn(async move {
                    while let Some(work) = hub.queue.next().await {
                        if let Err(e) = hub.reconcile(&work).await {
                            tracing::warn!(?work, error = %e, "gRPC transport: write failed; retrying");
                            hub.metrics.writes.write_errors.inc();
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
        self.routes.wait_built().await;
        match work {
            Work::App(r) => self.reconcile_app(r).await,
            // With several replicas, one writes for a cluster.
            Work::Mirror { cluster, .. } if !self.acting.acts_for(cluster) => Ok(()),
            Work::Mirror { cluster, key } => self.mirrors.reconcile(cluster, key).await,
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
                let cs = self.clusters.get(&cluster);
                let owner = self.routes.owner(&cluster, &key);
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
        let cs = self.clusters.get(&verdict.cluster);
        // Commands follow from the record: only for the spoke key whose
        // grant was made for this hub copy (a refused claimant, or a copy
        // whose grant went, sends none).
        if verdict.reason.is_none()
            && self
                .granted
                .owned_by(&verdict.cluster, &verdict.key, app.metadata.uid.as_deref())
        {
            self.relay
                .commands(&app, Work::App(r.clone()), &cs, &verdict.key)
                .await?;
        }
        self.write_app_status(r, &app, &cs, &verdict).await
    }

    /// The assignment of `r`, unless its cluster is another replica's to
    /// write for.
    fn acting_assignment(&self, r: &HubRef) -> Option<Assignment> {
        let assignment = self.routes.assignment(r);
        // With several replicas, one writes for a cluster (see `claims`).
        if let Some((cluster, _)) = assignment.as_ref().and_then(|a| a.slot())
            && !matches!(assignment, Some(Assignment::NotOurs { .. }))
            && !self.acting.acts_for(cluster)
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
        self.metrics.writes.status_writes.inc();
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
        let holds = self.routes.winner(&verdict.cluster, &verdict.key).as_ref() == Some(r);
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
        let gone_for = cs.lock().deletes.gone.get(key).cloned();
        if gone_for.as_deref() != app.metadata.uid.as_deref() {
            return Ok(());
        }
        self.writer.release_finalizers(app).await
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
