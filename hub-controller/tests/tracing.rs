//! One change, one trace: with `--otlp-endpoint`, a change of a hub
//! Application delivered over gRPC produces one connected trace across the
//! hub-controller and the spoke-agent (`deliver` > `queue`, `send` >
//! `apply` > `status_write`), and the agent's connection a `claim` of its
//! cluster by the replica, exported over OTLP/gRPC to a real OTLP
//! receiver (an in-process collector built from the OTLP protos). The hub
//! is the real binary; the agent runs in this process with the same
//! telemetry set-up its binary uses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use argocd_pull_runtime::args::{LogArgs, LogFormat};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use serde_json::json;
use testenv::wait;

mod common;
mod grpc_env;

/// One exported span, as the collector received it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    name: String,
    trace: Vec<u8>,
    id: Vec<u8>,
    parent: Vec<u8>,
    attributes: BTreeMap<String, String>,
    /// Start and end, in nanoseconds since the Unix epoch.
    start: u64,
    end: u64,
}

#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.as_ref()?.value.as_ref())
                .map(text)
                .unwrap_or_default();
            for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                got.push(Received {
                    service: service.clone(),
                    name: span.name,
                    trace: span.trace_id,
                    id: span.span_id,
                    parent: span.parent_span_id,
                    start: span.start_time_unix_nano,
                    end: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .iter()
                        .filter_map(|a| {
                            Some((a.key.clone(), text(a.value.as_ref()?.value.as_ref()?)))
                        })
                        .collect(),
                });
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: &AnyValue) -> String {
    match v {
        AnyValue::StringValue(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

async fn start_collector() -> (Collector, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (collector, addr)
}

/// The trace of `app`'s delivery: its spans by name, once it is connected
/// end to end.
fn delivery_trace(spans: &[Received], app: &str) -> Result<BTreeMap<String, Received>, String> {
    let deliver = spans
        .iter()
        .find(|s| s.name == "deliver" && s.attributes.get("name").map(String::as_str) == Some(app))
        .ok_or("no deliver span yet")?;
    let of_trace: Vec<&Received> = spans.iter().filter(|s| s.trace == deliver.trace).collect();
    let one = |name: &str| {
        of_trace
            .iter()
            .find(|s| s.name == name)
            .map(|s| (*s).clone())
            .ok_or_else(|| {
                format!(
                    "no {name} span in the trace yet; it has {:?}; every span: {:?}",
                    of_trace
                        .iter()
                        .map(|s| (&s.service, &s.name))
                        .collect::<Vec<_>>(),
                    spans
                        .iter()
                        .map(|s| (&s.service, &s.name, hex(&s.trace), hex(&s.parent)))
                        .collect::<Vec<_>>()
                )
            })
    };
    let by_name: BTreeMap<String, Received> = ["deliver", "queue", "send", "apply", "status_write"]
        .iter()
        .map(|n| one(n).map(|s| (n.to_string(), s)))
        .collect::<Result<_, _>>()?;
    Ok(by_name)
}

#[tokio::test]
async fn one_change_makes_one_connected_trace_across_hub_and_agent() {
    let (collector, addr) = start_collector().await;
    let endpoint = format!("http://{addr}");
    // The agent in this process exports as the spoke-agent binary does.
    let telemetry = argocd_pull_runtime::telemetry::init(
        &LogArgs {
            level: "info,kube_client=off".into(),
            format: LogFormat::Plain,
            otlp_endpoint: Some(endpoint.clone()),
        },
        "spoke-agent",
    )
    .unwrap();
    let mut env = grpc_env::Env::new(&["cluster1"]).await;
    let grpc = env.grpc_addr;
    let hub = env
        .spawn_hub(
            grpc,
            // As the Deployment runs it (leader election, so the cluster
            // claims of several replicas): the connection's `claim` span.
            &[
                "--leader-election-namespace",
                "argocd-pull",
                "--otlp-endpoint",
                &endpoint,
            ],
            &[("OTEL_BSP_SCHEDULE_DELAY", "200")],
        )
        .await;
    env.hub_process = Some(hub);
    env.connect_agent(0).await;
    env.create("traced", 0, json!({})).await;

    let trace = wait::until(
        "one connected trace of the delivery",
        grpc_env::TIMEOUT,
        || async { delivery_trace(&collector.0.lock().unwrap(), "traced") },
    )
    .await;
    let (deliver, queue, send, apply, write) = (
        &trace["deliver"],
        &trace["queue"],
        &trace["send"],
        &trace["apply"],
        &trace["status_write"],
    );
    // Who exported what.
    for (s, service) in [
        (deliver, "hub-controller"),
        (queue, "hub-controller"),
        (send, "hub-controller"),
        (apply, "spoke-agent"),
        (write, "hub-controller"),
    ] {
        assert_eq!(s.service, service, "{s:?}");
    }
    // Connected: each span's parent is the one before it, across the
    // stream both ways.
    assert!(
        deliver.parent.is_empty(),
        "deliver is the root: {deliver:?}"
    );
    assert_eq!(queue.parent, deliver.id);
    assert_eq!(send.parent, deliver.id);
    assert_eq!(apply.parent, send.id, "the agent continues the hub's trace");
    assert_eq!(
        write.parent, apply.id,
        "the hub continues the agent's trace"
    );
    assert_eq!(
        (
            deliver.attributes.get("cluster").map(String::as_str),
            apply.attributes.get("namespace").map(String::as_str),
        ),
        (Some("cluster1"), Some(grpc_env::SPOKE_NS))
    );
    // The trace as the collector received it, for the reader.
    for s in [deliver, queue, send, apply, write] {
        println!(
            "{:<13} {:<15} starts at +{:>7.1} ms, lasts {:>7.1} ms",
            s.name,
            s.service,
            s.start.saturating_sub(deliver.start) as f64 / 1e6,
            s.end.saturating_sub(s.start) as f64 / 1e6
        );
    }
    // The agent's connection claimed cluster1 for this replica: a trace of
    // its own, exported by the hub.
    let claims: Vec<Received> = collector
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.name == "claim")
        .cloned()
        .collect();
    assert!(
        claims.iter().any(|c| c.service == "hub-controller"
            && c.parent.is_empty()
            && c.attributes.get("cluster").map(String::as_str) == Some("cluster1")),
        "no claim span for cluster1: {claims:?}"
    );
    drop(env);
    drop(telemetry);
}
