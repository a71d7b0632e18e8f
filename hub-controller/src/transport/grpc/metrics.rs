//! Metrics of the gRPC transport (prefix `argocd_pull_hub_grpc_`).
//!
//! Fleet-level by default: how many agents are connected, how far behind
//! the slowest is, messages by kind, refusals by reason; the number of
//! series does not grow with the number of clusters. With
//! `--metrics-per-cluster` the counters also carry a `cluster` label and
//! five gauges per cluster are exported (docs/operations.md, Metrics).
//!
//! The per-cluster gauges are kept either way: the status page
//! ([`crate::report`]) reads them. The fleet figures are plain values that
//! the transport sets ([`GrpcMetrics::set_fleet`], and the serving
//! certificate's expiry when the TLS layer loads it); a scrape reads them
//! and nothing else.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
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
pub struct KindLabel {
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

/// The values of [`AnswerLabel::answer`].
pub const LIVE_ANSWERS: [&str; 5] = ["cluster", "cache", "forwarded", "refused", "failed"];

/// Who answered a read of the live endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabel {
    /// `cluster` (through its agent), `cache` (a discovery answer kept on
    /// the hub), `refused` (by the endpoint, before any cluster) or
    /// `failed` (the agent went or did not answer in time).
    pub answer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// The `cluster` label of a refusal before any certificate was verified
/// and mapped to a cluster (refused handshakes, unknown identities).
pub const UNVERIFIED: &str = "unverified";

type FloatGauge = Gauge<f64, AtomicU64>;

#[derive(Clone, Default)]
pub struct GrpcMetrics {
    /// Whether the per-cluster series are exported.
    per_cluster: bool,
    /// Each cluster's agent: its stream and its backlog.
    pub agents: AgentGauges,
    /// What passes on the streams: messages, refusals, repairs.
    traffic: Traffic,
    /// What reaches agents and the hub API server.
    pub writes: Writes,
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
    /// Reads of the live endpoint, by who answered.
    pub live_reads: Family<AnswerLabel, Counter>,
    /// The fleet figures as last set, read by the scrape.
    fleet: Arc<Mutex<Figures>>,
}

/// The gauges of each cluster's agent, kept with or without
/// `--metrics-per-cluster` (the status page reads them).
#[derive(Clone, Default)]
pub struct AgentGauges {
    pub connected: Family<ClusterLabel, Gauge>,
    pub last_seen: Family<ClusterLabel, FloatGauge>,
    pub lag: Family<ClusterLabel, FloatGauge>,
    pub pending: Family<ClusterLabel, Gauge>,
    /// Acknowledgements waiting to be sent, per cluster (bounded by
    /// `--grpc-control-queue`).
    pub control_queue: Family<ClusterLabel, Gauge>,
}

/// The counters of the streams, for the whole fleet or by cluster
/// (`--metrics-per-cluster`): only one of each pair is registered.
#[derive(Clone, Default)]
struct Traffic {
    messages: Family<KindLabel, Counter>,
    cluster_messages: Family<MessageLabel, Counter>,
    refused: Family<ReasonLabel, Counter>,
    cluster_refused: Family<RefusalLabel, Counter>,
    resyncs: Counter,
    cluster_resyncs: Family<ClusterLabel, Counter>,
}

/// Deliveries to agents and writes to the hub API server.
#[derive(Clone)]
pub struct Writes {
    /// From an object message sent to its acknowledgement.
    pub delivery: Histogram,
    pub status_writes: Counter,
    /// Status and mirror writes that failed (retried).
    pub write_errors: Counter,
}

impl Default for Writes {
    fn default() -> Self {
        Self {
            // 10 ms to about 160 s.
            delivery: Histogram::new(exponential_buckets(0.01, 2.0, 15)),
            status_writes: Counter::default(),
            write_errors: Counter::default(),
        }
    }
}

impl GrpcMetrics {
    /// Registers the fleet-level series, and the per-cluster ones when
    /// `per_cluster` (`--metrics-per-cluster`).
    pub fn register(registry: &mut Registry, per_cluster: bool) -> Self {
        let m = Self {
            per_cluster,
            ..Self::default()
        };
        let r = registry.sub_registry_with_prefix("grpc");
        if per_cluster {
            m.register_per_cluster(r);
        } else {
            m.register_fleet_totals(r);
        }
        m.register_delivery(r);
        m.register_connections(r);
        r.register_collector(Box::new(Fleet {
            figures: m.fleet.clone(),
        }));
        m
    }

    /// The series by cluster (`--metrics-per-cluster`): each agent's
    /// stream and backlog, and the message, resync and refusal counters
    /// with a `cluster` label.
    fn register_per_cluster(&self, r: &mut Registry) {
        r.register(
            "agent_connected",
            "1 while the cluster's agent has a stream open",
            self.agents.connected.clone(),
        );
        r.register(
            "agent_last_seen_seconds",
            "Unix time of the last message from the cluster's agent",
            self.agents.last_seen.clone(),
        );
        r.register(
            "agent_lag_seconds",
            "Age of the oldest message to the agent not yet acknowledged",
            self.agents.lag.clone(),
        );
        r.register(
            "agent_pending_objects",
            "Applications with a change for the agent not yet acknowledged",
            self.agents.pending.clone(),
        );
        r.register(
            "agent_control_queue",
            "Acknowledgements waiting to be sent to the cluster's agent",
            self.agents.control_queue.clone(),
        );
        r.register(
            "messages",
            "Messages exchanged with agents, by cluster, direction and kind",
            self.traffic.cluster_messages.clone(),
        );
        r.register(
            "resyncs",
            "Digest mismatches that started a repair, by cluster",
            self.traffic.cluster_resyncs.clone(),
        );
        r.register(
            "refused",
            "Streams, messages and objects refused, by cluster and reason",
            self.traffic.cluster_refused.clone(),
        );
    }

    /// Without `--metrics-per-cluster`: the message, resync and refusal
    /// counters of the whole fleet.
    fn register_fleet_totals(&self, r: &mut Registry) {
        r.register(
            "messages",
            "Messages exchanged with agents, by direction and kind",
            self.traffic.messages.clone(),
        );
        r.register(
            "resyncs",
            "Digest mismatches that started a repair",
            self.traffic.resyncs.clone(),
        );
        r.register(
            "refused",
            "Streams, messages and objects refused, by reason",
            self.traffic.refused.clone(),
        );
    }

    /// What reaches agents and the hub API server: delivery times, status
    /// writes and failed writes.
    fn register_delivery(&self, r: &mut Registry) {
        r.register(
            "delivery_seconds",
            "Time from an object message sent to an agent until the agent acknowledged it",
            self.writes.delivery.clone(),
        );
        r.register(
            "status_writes",
            "Writes of reported status onto hub Applications and mirrors",
            self.writes.status_writes.clone(),
        );
        r.register(
            "write_errors",
            "Writes of status and mirrors to the hub API server that failed and are retried",
            self.writes.write_errors.clone(),
        );
    }

    /// The TLS layer's limits at work: handshakes, connections and denied
    /// certificates.
    fn register_connections(&self, r: &mut Registry) {
        r.register(
            "handshakes_in_flight",
            "TLS handshakes under way",
            self.handshakes_in_flight.clone(),
        );
        r.register(
            "handshakes_dropped",
            "Connections closed unanswered because --grpc-max-handshakes were under way",
            self.handshakes_dropped.clone(),
        );
        r.register(
            "handshakes_paced",
            "Connections left waiting in the accept queue for their turn under --grpc-max-handshake-rate",
            self.handshakes_paced.clone(),
        );
        r.register(
            "connections_open",
            "Client connections open (handshaking or past it)",
            self.connections_open.clone(),
        );
        r.register(
            "connections_dropped",
            "Connections closed unanswered because --grpc-max-connections were open",
            self.connections_dropped.clone(),
        );
        r.register(
            "denied_certificates",
            "Client certificate fingerprints on the deny list",
            self.denied_certificates.clone(),
        );
        r.register(
            "live_reads",
            "Reads of the live endpoint, by who answered: the cluster (through its agent), the hub's discovery cache, the endpoint's refusal, or none in time",
            self.live_reads.clone(),
        );
        // Known from the start, so a rate over them starts at zero.
        for answer in LIVE_ANSWERS {
            let _ = self.live_reads.get_or_create(&AnswerLabel { answer });
        }
    }

    /// The fleet figures as they stand now (the serving certificate's
    /// expiry aside: [`GrpcMetrics::serving_certificate`] sets it).
    pub fn set_fleet(&self, figures: FleetFigures) {
        self.fleet.lock().expect("never poisoned").fleet = figures;
    }

    /// The serving certificate in use expires at `not_after` (Unix time;
    /// `None`: unreadable).
    pub fn serving_certificate(&self, not_after: Option<i64>) {
        self.fleet.lock().expect("never poisoned").serving_not_after = not_after;
    }

    /// What the serving certificate's gauge shows.
    #[cfg(test)]
    pub(crate) fn serving_not_after(&self) -> Option<i64> {
        self.fleet.lock().expect("never poisoned").serving_not_after
    }

    pub fn message(&self, cluster: &str, direction: &'static str, kind: &'static str) {
        if self.per_cluster {
            self.traffic
                .cluster_messages
                .get_or_create(&MessageLabel {
                    cluster: cluster.into(),
                    direction,
                    kind,
                })
                .inc();
        } else {
            self.traffic
                .messages
                .get_or_create(&KindLabel { direction, kind })
                .inc();
        }
    }

    /// Counts a read of the live endpoint answered by `answer`.
    pub fn live_read(&self, answer: &'static str) {
        self.live_reads.get_or_create(&AnswerLabel { answer }).inc();
    }

    /// Counts a refusal; `cluster` must come from a verified certificate
    /// (else pass [`UNVERIFIED`]).
    pub fn refuse(&self, cluster: &str, reason: &'static str) {
        if self.per_cluster {
            self.traffic
                .cluster_refused
                .get_or_create(&RefusalLabel {
                    cluster: cluster.into(),
                    reason,
                })
                .inc();
        } else {
            self.traffic
                .refused
                .get_or_create(&ReasonLabel { reason })
                .inc();
        }
    }

    /// Counts a repair started for `cluster`.
    pub fn resync(&self, cluster: &str) {
        if self.per_cluster {
            self.traffic
                .cluster_resyncs
                .get_or_create(&self.cluster(cluster))
                .inc();
        } else {
            self.traffic.resyncs.inc();
        }
    }

    pub fn cluster(&self, cluster: &str) -> ClusterLabel {
        ClusterLabel {
            cluster: cluster.into(),
        }
    }
}

/// What the fleet-level gauges say, summed over one replica's clusters
/// by the transport.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetFigures {
    pub connected: i64,
    pub disconnected: i64,
    pub disconnected_longest: f64,
    pub lag_longest: f64,
    pub pending: i64,
    pub control_queue: i64,
    pub queue_depth: i64,
    /// Unix time; `None` when no agent is connected.
    pub agent_not_after: Option<i64>,
}

/// The values the fleet-level gauges show.
#[derive(Debug, Default)]
struct Figures {
    fleet: FleetFigures,
    /// Unix time; `None` before a serving certificate is loaded.
    serving_not_after: Option<i64>,
}

/// The fleet-level gauges: the figures as last set.
#[derive(Debug)]
struct Fleet {
    figures: Arc<Mutex<Figures>>,
}

/// A gauge of one value, or with no sample when `v` is `None`.
fn gauge<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: Option<N>,
) -> Result<(), std::fmt::Error> {
    let m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    match v {
        Some(v) => ConstGauge::new(v).encode(m),
        None => Ok(()),
    }
}

impl Collector for Fleet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (f, serving_not_after) = {
            let figures = self.figures.lock().expect("never poisoned");
            (figures.fleet.clone(), figures.serving_not_after)
        };
        let e = &mut encoder;
        gauge(
            e,
            "agents_connected",
            "Agents with a stream open to this replica",
            Some(f.connected),
        )?;
        gauge(
            e,
            "agents_disconnected",
            "Clusters this replica writes for, with gRPC Applications or an agent seen here, and no agent connected",
            Some(f.disconnected),
        )?;
        gauge(
            e,
            "agent_disconnected_longest_seconds",
            "Of the clusters without their agent, the longest time since it was last heard from here",
            Some(f.disconnected_longest),
        )?;
        gauge(
            e,
            "agent_lag_longest_seconds",
            "Age of the oldest object message to an agent not yet acknowledged",
            Some(f.lag_longest),
        )?;
        gauge(
            e,
            "pending_objects",
            "Applications with a change for an agent not yet acknowledged, all agents together",
            Some(f.pending),
        )?;
        gauge(
            e,
            "control_queue",
            "Acknowledgements waiting to be sent to the agents, all agents together",
            Some(f.control_queue),
        )?;
        gauge(
            e,
            "queue_depth",
            "Status and mirror writes waiting for a gRPC worker",
            Some(f.queue_depth),
        )?;
        gauge(
            e,
            "serving_certificate_expiry_timestamp_seconds",
            "Unix time at which the gRPC serving certificate expires",
            serving_not_after,
        )?;
        gauge(
            e,
            "agent_certificate_expiry_earliest_timestamp_seconds",
            "Unix time at which the first client certificate of a connected agent expires",
            f.agent_not_after,
        )
    }
}
