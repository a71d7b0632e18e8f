//! The trace of each delivery on its way to the agent, when traces are
//! exported (`--otlp-endpoint`): a root span `deliver` from the decision
//! to the agent's acknowledgement, with `queue` (in the outbox) and then
//! `send` (on the stream until acknowledged) under it. The `send` span's
//! W3C context travels in the `ApplicationUpsert`, so the agent's `apply`
//! continues the same trace; its next status report carries the trace on,
//! and the hub's `status_write` ends it. At most one trace per key: a newer
//! desired state starts a new one.

use argocd_pull_proto::v1::ObjectKey;
use argocd_pull_runtime::telemetry::{self, SpanName};
use tracing::Span;

/// One delivery's spans.
#[derive(Debug)]
pub struct Trace {
    root: Span,
    /// `queue`, then `send`: dropping it closes it.
    stage: Span,
}

impl Trace {
    /// A delivery to `cluster` of `key` starts: queued.
    pub fn queued(cluster: &str, key: &ObjectKey) -> Option<Self> {
        if !telemetry::enabled() {
            return None;
        }
        let root = telemetry::span(SpanName::Deliver, None, cluster, &key.namespace, &key.name);
        let stage = telemetry::span(
            SpanName::Queue,
            Some(&root),
            cluster,
            &key.namespace,
            &key.name,
        );
        Some(Self { root, stage })
    }

    /// Taken from the outbox onto the stream: the `traceparent` for the
    /// message.
    pub fn sent(&mut self, cluster: &str, key: &ObjectKey) -> String {
        self.stage = telemetry::span(
            SpanName::Send,
            Some(&self.root),
            cluster,
            &key.namespace,
            &key.name,
        );
        telemetry::traceparent(&self.stage)
    }
}
