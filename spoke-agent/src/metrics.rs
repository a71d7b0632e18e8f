//! The agent's metrics (prefix `argocd_pull_agent_`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MessageLabel {
    /// `in` (hub to agent) or `out`.
    pub direction: &'static str,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WireLabel {
    /// `grpc` or `websocket`.
    pub wire: &'static str,
}

/// The wires the agent dials on.
const WIRES: [&str; 2] = ["grpc", "websocket"];

#[derive(Clone, Default)]
pub struct AgentMetrics {
    pub connected: Gauge,
    pub last_seen: Gauge<f64, AtomicU64>,
    pub lag: Gauge<f64, AtomicU64>,
    pub pending: Gauge,
    pub messages: Family<MessageLabel, Counter>,
    pub resyncs: Counter,
    pub reconnects: Counter,
    pub certificate_reloads: Counter,
    pub applies: Family<OutcomeLabel, Counter>,
    wire: Family<WireLabel, Gauge>,
    dial_failures: Family<WireLabel, Counter>,
}

impl AgentMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "hub_connected",
            "1 while a stream to the hub is open",
            m.connected.clone(),
        );
        registry.register(
            "hub_last_seen_seconds",
            "Unix time of the last message from the hub",
            m.last_seen.clone(),
        );
        registry.register(
            "lag_seconds",
            "Age of the oldest status report the hub has not acknowledged",
            m.lag.clone(),
        );
        registry.register(
            "pending_reports",
            "Applications with a status report not yet acknowledged",
            m.pending.clone(),
        );
        registry.register(
            "messages",
            "Messages exchanged with the hub, by direction and kind",
            m.messages.clone(),
        );
        registry.register(
            "resyncs",
            "Digest mismatches that started a repair",
            m.resyncs.clone(),
        );
        registry.register(
            "reconnects",
            "Connection attempts to the hub after the first",
            m.reconnects.clone(),
        );
        registry.register(
            "certificate_reloads",
            "Times the client certificate changed on disk and was picked up",
            m.certificate_reloads.clone(),
        );
        registry.register(
            "applies",
            "Applications applied for the hub, by outcome",
            m.applies.clone(),
        );
        registry.register(
            "wire",
            "1 for the wire the last stream to the hub was opened on (grpc or websocket)",
            m.wire.clone(),
        );
        registry.register(
            "dial_failures",
            "Dials of the hub that failed before the handshake, by wire",
            m.dial_failures.clone(),
        );
        m
    }

    /// A stream was opened on `wire`.
    pub fn use_wire(&self, wire: &'static str) {
        for w in WIRES {
            self.wire
                .get_or_create(&WireLabel { wire: w })
                .set(i64::from(w == wire));
        }
    }

    /// A dial on `wire` failed.
    pub fn dial_failed(&self, wire: &'static str) {
        self.dial_failures.get_or_create(&WireLabel { wire }).inc();
    }

    pub fn message(&self, direction: &'static str, kind: &'static str) {
        self.messages
            .get_or_create(&MessageLabel { direction, kind })
            .inc();
    }
}
