//! The hub-controller's Prometheus metrics (prefix `argocd_pull_hub_`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    pub transport: &'static str,
    pub trigger: &'static str,
}

#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    /// Reconciles by what triggered them: a storm shows here (many
    /// requeues or error retries per Application change) without logs.
    pub triggers: Family<TriggerLabels, Counter>,
    /// Decisions put off because the cache did not show our own last
    /// write yet (taken again when its echo arrives).
    pub echo_waits: Counter,
    pub reconcile_errors: Counter,
    pub reconcile_seconds: Histogram,
    pub refused: Family<ReasonLabel, Counter>,
    pub works_swept: Counter,
    pub works_adopted: Counter,
    pub works_managed: Gauge,
    pub queue_depth: Gauge,
    pub leader: Gauge,
    /// Terms as leader that ended with the Lease lost (not a shutdown).
    pub leader_terms_lost: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Counter::default(),
            triggers: Family::default(),
            echo_waits: Counter::default(),
            reconcile_errors: Counter::default(),
            // 1 ms to about 16 s.
            reconcile_seconds: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 15),
            ),
            refused: Family::default(),
            works_swept: Counter::default(),
            works_adopted: Counter::default(),
            works_managed: Gauge::default(),
            queue_depth: Gauge::default(),
            leader: Gauge::default(),
            leader_terms_lost: Counter::default(),
        }
    }
}

impl Metrics {
    /// Registers every metric in `registry` and returns the handles.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "application_reconciles",
            "Application reconciles started",
            m.reconciles.clone(),
        );
        registry.register(
            "reconciles",
            "Reconciles by transport and trigger (application, work, cluster, placement, transport-switch, holder-change, requeue-*, error-retry)",
            m.triggers.clone(),
        );
        registry.register(
            "echo_waits",
            "Decisions put off until the watch shows this process's own last write of the object",
            m.echo_waits.clone(),
        );
        registry.register(
            "application_reconcile_errors",
            "Application reconciles that failed and will be retried",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "application_reconcile_duration_seconds",
            "Time taken by one Application reconcile",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "applications_refused",
            "Applications not delivered, by reason (bad input, unknown cluster, ...)",
            m.refused.clone(),
        );
        registry.register(
            "manifestworks_swept",
            "Orphaned ManifestWorks deleted by the sweep",
            m.works_swept.clone(),
        );
        registry.register(
            "manifestworks_adopted",
            "argocd-pull-integration ManifestWorks whose Application was taken over (orphan-deleted)",
            m.works_adopted.clone(),
        );
        registry.register(
            "manifestworks",
            "ManifestWorks managed by argocd-pull, as of the last sweep",
            m.works_managed.clone(),
        );
        registry.register(
            "queue_depth",
            "Applications triggered for a reconcile that has not started yet",
            m.queue_depth.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease and runs the leader's share",
            m.leader.clone(),
        );
        registry.register(
            "leader_terms_lost",
            "Times this replica lost the leader Lease and stepped down (it stands again)",
            m.leader_terms_lost.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_are_exposed_with_the_prefix() {
        let mut registry = Registry::with_prefix("argocd_pull_hub");
        let m = Metrics::register(&mut registry);
        m.reconciles.inc();
        m.refused
            .get_or_create(&ReasonLabel {
                reason: "UnknownCluster".into(),
            })
            .inc();
        m.works_managed.set(7);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(
            out.contains("argocd_pull_hub_application_reconciles_total 1"),
            "{out}"
        );
        assert!(
            out.contains("argocd_pull_hub_applications_refused_total{reason=\"UnknownCluster\"} 1"),
            "{out}"
        );
        assert!(out.contains("argocd_pull_hub_manifestworks 7"), "{out}");
    }
}
