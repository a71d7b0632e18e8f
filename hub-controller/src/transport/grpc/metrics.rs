//! Per-agent metrics of the gRPC transport (prefix `argocd_pull_hub_grpc_`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabel {
    pub cluster: String,
    /// `in` (agent to hub) or `out`.
    pub direction: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabel {
    /// The cluster of a verified certificate, or [`UNVERIFIED`]: a name
    /// nobody vouched for never becomes a series of its own.
    pub cluster: String,
    pub reason: &'static str,
}

/// The `cluster` label of a refusal before any certificate was verified
/// and mapped to a cluster (refused handshakes, unknown identities).
pub const UNVERIFIED: &str = "unverified";

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Default)]
pub struct GrpcMetrics {
    pub connected: Family<ClusterLabel, Gauge>,
    pub last_seen: Family<ClusterLabel, FloatGauge>,
    pub lag: Family<ClusterLabel, FloatGauge>,
    pub pending: Family<ClusterLabel, Gauge>,
    pub messages: Family<MessageLabel, Counter>,
    pub resyncs: Family<ClusterLabel, Counter>,
    pub refused: Family<RefusalLabel, Counter>,
    pub status_writes: Counter,
    /// Acknowledgements waiting to be sent, per cluster (bounded by
    /// `--grpc-control-queue`).
    pub control_queue: Family<ClusterLabel, Gauge>,
    pub handshakes_in_flight: Gauge,
    /// Connections closed before their TLS handshake because
    /// `--grpc-max-handshakes` were already in flight.
    pub handshakes_dropped: Counter,
    /// Accepts that waited for `--grpc-max-handshake-rate`.
    pub handshakes_paced: Counter,
    pub connections_open: Gauge,
    pub connections_dropped: Counter,
    /// Entries of the deny list of client certificates in force.
    pub denied_certificates: Gauge,
}

impl GrpcMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("grpc");
        r.register(
            "agent_connected",
            "1 while the cluster's agent has a stream open",
            m.connected.clone(),
        );
        r.register(
            "agent_last_seen_seconds",
            "Unix time of the last message from the cluster's agent",
            m.last_seen.clone(),
        );
        r.register(
            "agent_lag_seconds",
            "Age of the oldest message to the agent not yet acknowledged",
            m.lag.clone(),
        );
        r.register(
            "agent_pending_objects",
            "Applications with a change for the agent not yet acknowledged",
            m.pending.clone(),
        );
        r.register(
            "messages",
            "Messages exchanged with agents, by direction and kind",
            m.messages.clone(),
        );
        r.register(
            "resyncs",
            "Digest mismatches that started a repair, by cluster",
            m.resyncs.clone(),
        );
        r.register(
            "refused",
            "Streams, messages and objects refused, by reason",
            m.refused.clone(),
        );
        r.register(
            "status_writes",
            "Writes of reported status onto hub Applications and mirrors",
            m.status_writes.clone(),
        );
        r.register(
            "agent_control_queue",
            "Acknowledgements waiting to be sent to the cluster's agent",
            m.control_queue.clone(),
        );
        r.register(
            "handshakes_in_flight",
            "TLS handshakes under way",
            m.handshakes_in_flight.clone(),
        );
        r.register(
            "handshakes_dropped",
            "Connections closed unanswered because --grpc-max-handshakes were under way",
            m.handshakes_dropped.clone(),
        );
        r.register(
            "handshakes_paced",
            "Connections left waiting in the accept queue for their turn under --grpc-max-handshake-rate",
            m.handshakes_paced.clone(),
        );
        r.register(
            "connections_open",
            "Client connections open (handshaking or past it)",
            m.connections_open.clone(),
        );
        r.register(
            "connections_dropped",
            "Connections closed unanswered because --grpc-max-connections were open",
            m.connections_dropped.clone(),
        );
        r.register(
            "denied_certificates",
            "Client certificate fingerprints on the deny list",
            m.denied_certificates.clone(),
        );
        m
    }

    pub fn message(&self, cluster: &str, direction: &'static str, kind: &'static str) {
        self.messages
            .get_or_create(&MessageLabel {
                cluster: cluster.into(),
                direction,
                kind,
            })
            .inc();
    }

    /// Counts a refusal; `cluster` must come from a verified certificate
    /// (else pass [`UNVERIFIED`]).
    pub fn refuse(&self, cluster: &str, reason: &'static str) {
        self.refused
            .get_or_create(&RefusalLabel {
                cluster: cluster.into(),
                reason,
            })
            .inc();
    }

    pub fn cluster(&self, cluster: &str) -> ClusterLabel {
        ClusterLabel {
            cluster: cluster.into(),
        }
    }
}
