//! The transport's side of [`super::super::holders`]: the replica that acts
//! for a cluster records what its agent holds; every replica's index, and
//! the ManifestWork transport, let a claimant the agent holds a key for
//! keep it; a change of the record decides the key again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_pull_proto::v1::ObjectKey;

use super::super::cluster::ClusterState;
use super::super::holders::{Holders, record};
use super::claimed::Acting;
use super::clusters::Clusters;
use super::routes::Routes;
use crate::watch::caches::Caches;

/// How often the replica looks for clusters whose agent's holdings
/// changed: one write per cluster at most this often, however many
/// deliveries changed meanwhile.
const WRITE_EVERY: Duration = Duration::from_secs(1);
/// How long a cluster whose record could not be written waits to be tried
/// again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The record of what each agent holds, kept and followed.
pub struct Holding {
    holders: Option<Arc<Holders>>,
    routes: Arc<Routes>,
    clusters: Arc<Clusters>,
    caches: Caches,
    acting: Arc<Acting>,
}

impl Holding {
    /// With `holders`, keys are decided with the record, and a change of
    /// it decides them again.
    pub fn new(
        routes: Arc<Routes>,
        clusters: Arc<Clusters>,
        caches: Caches,
        acting: Arc<Acting>,
        holders: Option<Arc<Holders>>,
    ) -> Self {
        if let Some(holders) = &holders {
            let lookup = holders.clone();
            routes.set_held_by(Arc::new(move |c, k| lookup.held_by(c, k)));
            let routes = Arc::downgrade(&routes);
            holders.on_holders_change(move |cluster, keys| {
                if let Some(routes) = routes.upgrade() {
                    holders_changed(&routes, cluster, keys);
                }
            });
        }
        Self {
            holders,
            routes,
            clusters,
            caches,
            acting,
        }
    }

    /// The uid of the hub Application `cluster`'s agent holds `key` for,
    /// as recorded.
    pub fn held_by(&self, cluster: &str, key: &ObjectKey) -> Option<String> {
        self.holders.as_ref()?.held_by(cluster, key)
    }

    /// `cluster` left OCM: its record goes (a cluster joined again under
    /// the same name starts from its agent's reports). Every replica asks;
    /// the first delete wins, the others find nothing.
    pub fn forget_holders(&self, cluster: &str) {
        let Some(holders) = self.holders.clone() else {
            return;
        };
        let cluster = cluster.to_string();
        tokio::spawn(async move {
            if let Err(e) = holders.delete(&cluster).await {
                tracing::warn!(%cluster, error = %e, "cannot delete the record of what a deleted cluster's agent held");
            }
        });
    }

    /// Writes the record of every cluster this replica acts for whose
    /// agent's holdings changed, until the process ends.
    pub async fn keep_holders(self: Arc<Self>) {
        let Some(holders) = self.holders.clone() else {
            return;
        };
        self.routes.wait_built().await;
        let mut tick = tokio::time::interval(WRITE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A cluster whose write failed is tried again after RETRY_AFTER,
        // not at every tick: a namespace that does not exist, or RBAC
        // without Leases, must not cost an API call per cluster a second.
        let mut failed: HashMap<String, Instant> = HashMap::new();
        let mut warned: Option<Instant> = None;
        loop {
            tick.tick().await;
            failed.retain(|_, at| at.elapsed() < RETRY_AFTER);
            for cs in self.clusters.all() {
                if failed.contains_key(&cs.name)
                    || !self.acting.acts_for(&cs.name)
                    || !cs.take_holders_dirty()
                {
                    continue;
                }
                match self.write_holders(&holders, &cs.name).await {
                    Ok(()) => {}
                    // Another replica wrote it meanwhile (a claim moving):
                    // merged again with what the watch shows, next tick.
                    Err(kube::Error::Api(e)) if e.code == 409 => cs.mark_holders_dirty(),
                    Err(e) => self.holders_write_failed(&cs, e, &mut failed, &mut warned),
                }
            }
        }
    }

    /// A write of `cs`'s record failed: tried again after [`RETRY_AFTER`],
    /// with one warning per such period.
    fn holders_write_failed(
        &self,
        cs: &ClusterState,
        e: kube::Error,
        failed: &mut HashMap<String, Instant>,
        warned: &mut Option<Instant>,
    ) {
        cs.mark_holders_dirty();
        failed.insert(cs.name.clone(), Instant::now());
        if warned.is_none_or(|w| w.elapsed() >= RETRY_AFTER) {
            *warned = Some(Instant::now());
            tracing::warn!(cluster = %cs.name, error = %e, failing = failed.len(), "cannot record what clusters' agents hold (a Lease in the hub-controller's namespace); retrying each in 30 s, until then their keys are decided without it");
        }
    }

    /// Merges `cluster`'s record with its agent's latest reports and
    /// writes it when that changed it.
    async fn write_holders(&self, holders: &Holders, cluster: &str) -> Result<(), kube::Error> {
        if !self.caches.cluster_exists(cluster) {
            // Gone from OCM: its record was deleted ([`Holding::forget_holders`]).
            return Ok(());
        }
        let (old, version) = holders.record(cluster);
        let reports = self.clusters.get(cluster).holders_reported();
        let (next, left_out) =
            record::merge(&old, reports.iter().map(|(k, h)| (k, h.as_deref())), |k| {
                self.routes.has_slot(cluster, k)
            });
        if left_out > 0 {
            tracing::warn!(
                %cluster,
                left_out,
                max_bytes = record::MAX_BYTES,
                "the record of what the cluster's agent holds is full: these keys are decided by age alone"
            );
        }
        if next == *old {
            return Ok(());
        }
        holders.write(cluster, &next, &version).await
    }
}

/// The recorded holder of `keys` changed: each is decided again, and every
/// Application that names one whose owner changed is looked at again (by
/// the ManifestWork transport too).
fn holders_changed(routes: &Routes, cluster: &str, keys: &[ObjectKey]) {
    if !routes.is_built() {
        // The index is built from scratch once synced, with the record.
        return;
    }
    for key in keys {
        routes.holder_changed(cluster, key);
    }
}
