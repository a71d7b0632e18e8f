//! Logging set-up (structured `tracing` output, plain or JSON) and, when an
//! OTLP endpoint is given, OpenTelemetry traces.
//!
//! Traces are off by default and cost nothing then: the spans that make a
//! trace are created only through [`span`], which returns a disabled span
//! unless [`init`] installed an exporter. Only those spans (target
//! [`TARGET`]) are exported, never the many spans of the libraries below
//! (kube-client, hyper). A trace crosses the gRPC stream as a W3C
//! `traceparent` string in the messages ([`traceparent`], [`continue_from`]).

use std::sync::OnceLock;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::args::{LogArgs, LogFormat};

/// The `tracing` target of the spans that are exported.
pub const TARGET: &str = "argocd_pull::trace";

/// Set once traces are exported.
static TRACING: OnceLock<()> = OnceLock::new();

/// Whether traces are exported (an OTLP endpoint was given).
pub fn enabled() -> bool {
    TRACING.get().is_some()
}

/// Flushes the traces still buffered when dropped (at the end of `main`).
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take()
            && let Err(e) = p.shutdown()
        {
            eprintln!("flushing the last traces failed: {e}");
        }
    }
}

/// Installs the global subscriber for `service` (`hub-controller`,
/// `spoke-agent`). Fails on an invalid filter so that a typo in
/// `--log-level` is reported instead of silently logging nothing, and on an
/// OTLP endpoint that is not a URL.
pub fn init(args: &LogArgs, service: &'static str) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_new(&args.level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", args.level))?;
    // Logs go to stderr; colours only when a person is watching.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = match args.format {
        LogFormat::Plain => fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(filter);
    let provider = match args
        .otlp_endpoint
        .as_deref()
        .filter(|e| !e.is_empty() && *e != "none")
    {
        None => None,
        Some(endpoint) => {
            // No TLS in the exporter: a collector next to the binary.
            if !endpoint.starts_with("http://") {
                anyhow::bail!(
                    "invalid --otlp-endpoint {endpoint:?}: a plain OTLP/gRPC URL, such as http://otel-collector.observability:4317 (TLS to the collector is not supported: run one next to this binary)"
                );
            }
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .build()
                .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint}: {e}"))?;
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name(service)
                            .build(),
                    )
                    .build(),
            )
        }
    };
    let traces = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("argocd-pull"))
            .with_filter(filter_fn(|m| m.target() == TARGET))
    });
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))?;
    if provider.is_some() {
        let _ = TRACING.set(());
        tracing::info!(
            endpoint = args.otlp_endpoint.as_deref().unwrap_or_default(),
            service,
            "exporting traces over OTLP"
        );
    }
    Ok(Telemetry { provider })
}

/// A span of a trace named `name`, disabled (and free) unless traces are
/// exported.
/// Its `cluster`, `namespace` and `name` say which Application it is
/// about; `parent` is a span of the same trace in this process (`None`: a
/// root, or one continued from a message with [`continue_from`]).
pub fn span(
    name: SpanName,
    parent: Option<&Span>,
    cluster: &str,
    namespace: &str,
    app: &str,
) -> Span {
    if !enabled() {
        return Span::none();
    }
    let parent = parent.and_then(Span::id);
    // One call site: the exported name is `otel.name`.
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "argocd_pull",
        otel.name = name.as_str(),
        cluster,
        namespace,
        name = app
    )
}

/// The spans of a trace, in the order a delivery goes through them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanName {
    /// Hub: one change of a hub Application, from its decision to the
    /// agent's acknowledgement (the root of a delivery's trace).
    Deliver,
    /// Hub: waiting in the cluster's outbox for the stream.
    Queue,
    /// Hub: on the stream until the agent acknowledges it.
    Send,
    /// Agent: the write on the managed cluster.
    Apply,
    /// Agent: a status report that follows no delivery (the root of its
    /// own trace).
    Report,
    /// Hub: the write of a reported status onto the hub copy.
    StatusWrite,
    /// Hub, with several replicas: from an agent's connection to this
    /// replica being allowed to write for its cluster (the root of its own
    /// trace, one per connection): status writes wait for it.
    Claim,
}

impl SpanName {
    /// The span's name in the trace.
    pub fn as_str(self) -> &'static str {
        match self {
            SpanName::Deliver => "deliver",
            SpanName::Queue => "queue",
            SpanName::Send => "send",
            SpanName::Apply => "apply",
            SpanName::Report => "report",
            SpanName::StatusWrite => "status_write",
            SpanName::Claim => "claim",
        }
    }
}

/// `span`'s W3C `traceparent`, empty when it is not traced.
pub fn traceparent(span: &Span) -> String {
    if !enabled() {
        return String::new();
    }
    struct Out(String);
    impl Injector for Out {
        fn set(&mut self, key: &str, value: String) {
            if key == "traceparent" {
                self.0 = value;
            }
        }
    }
    let mut out = Out(String::new());
    TraceContextPropagator::new().inject_context(&span.context(), &mut out);
    out.0
}

/// Makes `span` a child of the remote span `traceparent` (from a message),
/// if there is one.
pub fn continue_from(span: &Span, traceparent: &str) {
    if traceparent.is_empty() || !enabled() {
        return;
    }
    struct In<'a>(&'a str);
    impl Extractor for In<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            (key == "traceparent").then_some(self.0)
        }
        fn keys(&self) -> Vec<&str> {
            vec!["traceparent"]
        }
    }
    let parent = TraceContextPropagator::new().extract(&In(traceparent));
    let _ = span.set_parent(parent);
}
