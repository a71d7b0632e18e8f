//! The leader's share of the work, term by term: the ManifestWork
//! transport, the Argo CD cluster Secrets, the sweep, and the writes for
//! clusters no replica holds ([`crate::transport::grpc::claims`]).
//!
//! A replica that loses the leader Lease steps down and stands again; it
//! does not exit. Every replica serves gRPC, so an exit would also drop
//! the agents connected to it, and under a stalled API server (the usual
//! reason a Lease is not renewed in time) every replica's agents would
//! reconnect elsewhere at once, which stalls it more.

use std::sync::Arc;

use argocd_pull_runtime::lease::{self, Leadership, LeaseConfig};
use argocd_pull_runtime::shutdown::{self, Shutdown};

use crate::transport::{grpc, manifestwork};
use crate::{metrics, report};

/// What a term needs.
pub(crate) struct Share {
    pub client: kube::Client,
    pub argocd_namespace: String,
    /// The hosts the hub's API server is known by (the cluster Secrets
    /// never point there).
    pub hub_hosts: Vec<String>,
    pub sweep_interval: std::time::Duration,
    pub ctx: Arc<manifestwork::Context>,
    pub gate: Arc<manifestwork::triggers::Gate>,
    pub grpc: Option<Arc<grpc::Hub>>,
    pub claims: Option<Arc<grpc::claims::Claims>>,
    pub metrics: metrics::Metrics,
    pub page: report::StatusPage,
    /// The live endpoint, which the cluster Secrets point at when it is on.
    pub live: grpc::live::LiveArgs,
}

/// Leads whenever this replica holds the Lease of `election` (always
/// without one) until `shutdown`; the Leadership still held then, for its
/// release once everything else has stopped.
pub(crate) async fn run(
    share: Share,
    election: Option<LeaseConfig>,
    shutdown: Shutdown,
) -> Option<Leadership> {
    let Some(config) = election else {
        share.term(shutdown).await;
        return None;
    };
    loop {
        let leadership =
            lease::acquire(share.client.clone(), config.clone(), shutdown.clone()).await?;
        // The term ends on the first of: the Lease lost, shutdown.
        let (end, term) = shutdown::channel();
        let ending = {
            let (lost, down) = (leadership.lost(), shutdown.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost => {}
                    _ = down.wait() => {}
                }
                end.fire();
            })
        };
        share.term(term).await;
        let _ = ending.await;
        if shutdown.is_down() {
            return Some(leadership);
        }
        share.metrics.leader_terms_lost.inc();
        tracing::warn!(
            lease = %config.name,
            "lost the leader Lease: stepped down; this replica keeps serving its agents and stands again"
        );
    }
}

impl Share {
    /// One term, until `down`: the leader's tasks start, and stop before
    /// this returns.
    async fn term(&self, down: Shutdown) {
        tracing::info!(
            "leading: the ManifestWork transport, the cluster Secrets and the clusters no replica holds are this replica's"
        );
        self.metrics.leader.set(1);
        self.page.set_leader(true);
        if let Some(c) = &self.claims {
            c.set_leader(true);
        }
        if let Some(hub) = &self.grpc {
            hub.requeue_all();
        }
        let triggered = self.gate.open();
        let recording = self.grpc.as_ref().map(|hub| {
            tokio::spawn(grpc::issued::lead(
                hub.config.issued.clone(),
                self.client.clone(),
                down.clone().wait(),
            ))
        });
        let tasks = [
            tokio::spawn(manifestwork::cluster_secrets::run(
                self.client.clone(),
                self.argocd_namespace.clone(),
                self.hub_hosts.clone(),
                self.live.clone(),
                down.clone(),
            )),
            tokio::spawn(manifestwork::sweep::run(
                self.client.clone(),
                self.ctx.caches.clone(),
                self.metrics.clone(),
                self.sweep_interval,
                down.clone().wait(),
            )),
            tokio::spawn(manifestwork::projects::run(self.ctx.clone(), down.clone())),
            tokio::spawn(manifestwork::controller::run(
                self.ctx.clone(),
                triggered,
                || {},
                down.clone(),
            )),
        ];
        down.wait().await;
        // No new work from here on; what is in flight finishes below.
        self.gate.close();
        if let Some(c) = &self.claims {
            c.set_leader(false);
        }
        self.page.set_leader(false);
        self.metrics.leader.set(0);
        for t in tasks.into_iter().chain(recording) {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "a task of the leader's share failed");
            }
        }
    }
}
