//! The transport's side of [`super::super::claims`]: with several replicas,
//! this one writes for a cluster only while it acts for it; a session
//! claims its cluster, lets go when it ends, and everything the cluster's
//! writes depend on is looked at again whenever who acts for it changes.

use std::collections::BTreeSet;
use std::sync::Arc;

use argocd_pull_runtime::telemetry::{self, SpanName};
use argocd_pull_runtime::workqueue::WorkQueue;
use tracing::Instrument;

use super::super::claims::Claims;
use super::super::cluster::{ClusterState, Work};
use super::clusters::Clusters;
use super::mirror::Mirrors;
use super::routes::Routes;

/// Which clusters this replica acts for, and what follows when that
/// changes.
pub struct Acting {
    /// With several replicas: who writes for a cluster.
    claims: Option<Arc<Claims>>,
    clusters: Arc<Clusters>,
    routes: Arc<Routes>,
    mirrors: Arc<Mirrors>,
    queue: WorkQueue<Work>,
}

impl Acting {
    /// With `claims` (several replicas serve gRPC) this replica writes for
    /// a cluster only while [`Claims::acts_for`] says so; without, always.
    pub fn new(
        clusters: Arc<Clusters>,
        routes: Arc<Routes>,
        mirrors: Arc<Mirrors>,
        queue: WorkQueue<Work>,
        claims: Option<Arc<Claims>>,
    ) -> Self {
        Self {
            claims,
            clusters,
            routes,
            mirrors,
            queue,
        }
    }

    pub fn claims(&self) -> Option<&Arc<Claims>> {
        self.claims.as_ref()
    }

    /// Whether this replica writes for `cluster` (always, with one replica).
    pub fn acts_for(&self, cluster: &str) -> bool {
        self.claims.as_ref().is_none_or(|c| c.acts_for(cluster))
    }

    /// Session `id` of `cluster` attached here: claims the cluster in the
    /// background, for as long as that session is the current one.
    pub fn claim_for(&self, cluster: &str, cs: &Arc<ClusterState>, id: u64) {
        let Some(claims) = self.claims.as_ref().cloned() else {
            return;
        };
        let (cluster, cs) = (cluster.to_string(), cs.clone());
        // Exported with `--otlp-endpoint`: how long the writes for the
        // cluster waited (8 s when the previous holder was killed, until
        // its presence is dead).
        let span = telemetry::span(SpanName::Claim, None, &cluster, "", "");
        tokio::spawn(
            async move {
                if claims.claim(&cluster, || cs.is_current(id)).await {
                    tracing::debug!(%cluster, session = id, "this replica writes for the cluster");
                }
            }
            .instrument(span),
        );
    }

    /// A session of `cluster` ended here: unless another one attached
    /// meanwhile, forget what its agent reported and let go of the claim.
    pub fn session_ended(&self, cluster: &str, cs: &Arc<ClusterState>) {
        let Some(claims) = self.claims.as_ref().cloned() else {
            return;
        };
        let (cluster, cs) = (cluster.to_string(), cs.clone());
        let mirrors = self.mirrors.clone();
        tokio::spawn(async move {
            let free = || !cs.has_session();
            if !free() {
                return;
            }
            if cs.forget_reports() {
                mirrors.seed_all(&cluster);
            }
            claims.release(&cluster, free).await;
        });
    }

    /// Follows who acts for each cluster until the claims' changes end:
    /// a holder asked to let go ends its (stale) session; a replica that no
    /// longer acts forgets; the cluster's work is looked at again.
    pub async fn follow_claims(self: Arc<Self>) {
        let Some(claims) = self.claims.as_ref().cloned() else {
            return;
        };
        let Some(mut changes) = claims.changes() else {
            return;
        };
        while let Some(first) = changes.recv().await {
            // Everything that changed meanwhile, in one pass over the index
            // (a fleet connecting changes thousands of claims at once).
            let mut changed = BTreeSet::from([first]);
            while let Ok(c) = changes.try_recv() {
                changed.insert(c);
            }
            for cluster in &changed {
                let cs = self.clusters.get(cluster);
                if claims.asked_to_let_go(cluster) && !cs.moved_away() {
                    // No session here, yet held (a release that failed).
                    self.session_ended(cluster, &cs);
                }
                if !claims.holds(cluster) && !cs.has_session() && cs.forget_reports() {
                    self.mirrors.seed_all(cluster);
                }
            }
            self.requeue_clusters(&changed);
        }
    }

    /// Looks again at everything of `clusters`: their hub Applications and
    /// their mirrors.
    pub fn requeue_clusters(&self, clusters: &BTreeSet<String>) {
        self.requeue_where(|c| clusters.contains(c));
    }

    /// Looks again at everything of every cluster (this replica now leads,
    /// and acts for the clusters nobody holds).
    pub fn requeue_all(&self) {
        self.requeue_where(|_| true);
    }

    /// Queues every hub Application assigned to, and every mirror of, a
    /// cluster `wanted` accepts: one pass over the index.
    fn requeue_where(&self, wanted: impl Fn(&str) -> bool) {
        for r in self.routes.refs_where(&wanted) {
            self.queue.add(Work::App(r));
        }
        for work in self.mirrors.works_where(&wanted) {
            self.queue.add(work);
        }
    }
}
