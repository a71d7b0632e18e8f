//! Latency, one change at a time, and one agent's throughput (see main.rs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_bench::stats::{Percentiles, percentiles};
use argocd_pull_proto::content;
use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, Heartbeat, ObjectAck, ObjectKey, ObjectMeta,
    ObservedApplication, StatusReport, agent_message, hub_message, status_report,
};
use argocd_pull_runtime::Readiness;
use argocd_pull_spoke_agent::metrics::AgentMetrics;
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, ClusterConfig, CrdSet};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::compare::seen;
use crate::hub::{self, HubOptions, HubProcess, Pki, SPOKE_NS, agent_subject};
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Debug)]
pub struct LatencyArgs {
    /// Changes timed one at a time, each way.
    #[arg(long, default_value_t = 1000)]
    changes: usize,
    /// Applications of the synthetic agent in the throughput run.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// Status reports the synthetic agent sends in the throughput run.
    #[arg(long, default_value_t = 20_000)]
    updates: usize,
}

const NS: &str = "bench";
/// How long a change may take to be seen on the other side.
const WITHIN: Duration = Duration::from_secs(30);

pub fn app(name: &str, cluster: &str) -> Application {
    serde_json::from_value(hub::application(NS, name, cluster)).expect("a valid Application")
}

/// Watches one Application and sends `extract` of every version seen, with
/// the moment it arrived; stops when the receiver is dropped.
pub fn watch_one(
    client: kube::Client,
    ns: &str,
    name: &str,
    extract: fn(&Value) -> Option<String>,
) -> mpsc::UnboundedReceiver<(String, Instant)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let api: Api<Application> = Api::namespaced_with(client, ns, &application_resource());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(a) | watcher::Event::InitApply(a)) = event {
                let at = Instant::now();
                if let Some(v) = extract(&serde_json::to_value(&a).unwrap_or_default())
                    && tx.send((v, at)).is_err()
                {
                    return;
                }
            }
            if tx.is_closed() {
                return;
            }
        }
    });
    rx
}

/// What one run measured.
struct Figures {
    down: Percentiles,
    up: Percentiles,
    /// Status reports of the synthetic agent, and how long the hub took to
    /// acknowledge them all.
    updates: usize,
    intake: Duration,
    /// The hub's status writes for them.
    writes: f64,
    /// Hub copies not showing the last status sent, once settled (or after
    /// two minutes), and how long after the last acknowledgement.
    wrong: usize,
    converged: Duration,
}

/// Runs the latency and throughput parts `repeat` times, each on fresh API
/// servers and a fresh hub-controller, and prints every figure over the runs.
pub async fn run(args: LatencyArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let mut version = String::new();
    let runs = report::each_round("latency", repeat, async |_| {
        one_run(&args, hub_bin, &mut version).await
    })
    .await;
    let of = |f: fn(&Figures) -> f64| report::per_run(&runs, |r| Some(f(r)));
    // p50, p99 (under 50 ms) and max of one way's latencies.
    let way = |what: &str, pick: fn(&Figures) -> &Percentiles| {
        let at = |p: fn(&Percentiles) -> Duration| {
            report::per_run(&runs, move |f| Some(p(pick(f)).as_secs_f64()))
        };
        [
            Row::new(format!("{what}, p50"), at(|p| p.p50), report::ms),
            Row::new(format!("{what}, p99"), at(|p| p.p99), report::ms)
                .target("< 50 ms", |v| v < 0.050),
            Row::new(format!("{what}, max"), at(|p| p.max), report::ms),
        ]
    };
    let mut rows = Vec::new();
    rows.extend(way("hub change -> applied on the spoke", |f| &f.down));
    rows.extend(way("spoke status -> on the hub copy", |f| &f.up));
    rows.extend([
        Row::new(
            "one agent: status reports taken in (acknowledged) per second",
            of(|f| f.updates as f64 / f.intake.as_secs_f64()),
            report::rate,
        )
        .target(">= 1,000/s", |v| v >= 1000.0),
        Row::new(
            "one agent: hub status writes for them (coalesced)",
            of(|f| f.writes),
            report::count,
        ),
        Row::new(
            "one agent: every hub copy shows its last status, after the last acknowledgement",
            of(|f| f.converged.as_secs_f64()),
            report::secs,
        ),
        Row::new(
            "one agent: status updates per second, final state correct",
            report::per_run(&runs, |f| {
                (f.wrong == 0).then(|| f.updates as f64 / (f.intake + f.converged).as_secs_f64())
            }),
            report::rate,
        ),
        Row::new(
            "one agent: hub copies not showing the last status sent",
            of(|f| f.wrong as f64),
            report::count,
        )
        .target("0", |v| v == 0.0),
    ]);
    print_runs(
        &format!(
            "gRPC transport, real API servers (kube-apiserver {version}), {} changes each way, \
             a synthetic agent's {} status reports over {} Applications; {repeat} run(s), each on \
             fresh API servers and a fresh hub-controller",
            args.changes, args.updates, args.apps
        ),
        &rows,
    );
    let mut failed = false;
    for (i, r) in runs.iter().enumerate() {
        match r {
            Err(e) => {
                println!("\nrun {}: {e:#}", i + 1);
                failed = true;
            }
            Ok(f) if f.wrong != 0 => failed = true,
            Ok(_) => {}
        }
    }
    if failed {
        bail!("a run failed, or hub Applications did not show the last status sent");
    }
    Ok(())
}

/// One run on fresh API servers: latency both ways, then the synthetic
/// agent's throughput.
async fn one_run(args: &LatencyArgs, hub_bin: &Path, version: &mut String) -> Result<Figures> {
    eprintln!("bench-grpc: starting a hub and a managed cluster");
    let (hub, spoke) = tokio::join!(
        Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)),
        Cluster::start(ClusterConfig::new("spoke1", CrdSet::Managed)),
    );
    let (hub, spoke) = (hub?, spoke?);
    *version = hub.version().to_string();
    let hub_client = hub.client().await?;
    let spoke_client = spoke.client().await?;
    spoke.ensure_namespace(SPOKE_NS).await?;
    hub.ensure_namespace(NS).await?;
    hub.ensure_namespace(hub::CONTROLLER_NS).await?;
    hub::join(&hub_client, "spoke1").await?;
    hub::join(&hub_client, "bench").await?;

    let pki = Pki::new()?;
    let spoke_tls = pki.agent_files("spoke1", &agent_subject("spoke1", "bench"))?;
    let synthetic = pki.client(&agent_subject("bench", "bench"))?;

    let grpc_addr = testenv::net::free_addr()?;
    let mut hub_process = HubProcess::start(&HubOptions {
        bin: hub_bin,
        hub: &hub,
        pki: &pki,
        grpc_addr,
        allowed_targets: &[format!("{NS}=*")],
        log: None,
        max_connections: None,
        extra_args: &[],
    })?;
    hub_process.ready(Duration::from_secs(60)).await?;

    // ---------------------------------------------------------------- latency
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    let readiness = Readiness::default();
    let agent = tokio::spawn(argocd_pull_spoke_agent::run_agent(
        hub::agent_config(grpc_addr, spoke_tls, None),
        spoke_client.clone(),
        AgentMetrics::default(),
        readiness.clone(),
        shutdown,
    ));
    let hub_apps: Api<Application> =
        Api::namespaced_with(hub_client.clone(), NS, &application_resource());
    let spoke_apps: Api<Application> =
        Api::namespaced_with(spoke_client.clone(), SPOKE_NS, &application_resource());
    hub_apps
        .create(&PostParams::default(), &app("latency", "spoke1"))
        .await?;
    let mut on_spoke = watch_one(spoke_client.clone(), SPOKE_NS, "latency", |v| {
        v.pointer("/spec/source/targetRevision")?
            .as_str()
            .map(str::to_string)
    });
    let mut on_hub = watch_one(hub_client.clone(), NS, "latency", |v| {
        v.pointer("/status/health/message")?
            .as_str()
            .map(str::to_string)
    });
    seen(&mut on_spoke, "v0", WITHIN)
        .await
        .context("the first delivery")?;
    eprintln!("bench-grpc: timing {} hub -> spoke changes", args.changes);
    let mut down = Vec::with_capacity(args.changes);
    for i in 1..=args.changes {
        let revision = format!("v{i}");
        let start = Instant::now();
        hub_apps
            .patch(
                "latency",
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "source": { "targetRevision": revision } } })),
            )
            .await?;
        down.push(seen(&mut on_spoke, &revision, WITHIN).await? - start);
    }
    eprintln!(
        "bench-grpc: timing {} spoke -> hub status changes",
        args.changes
    );
    let mut up = Vec::with_capacity(args.changes);
    for i in 1..=args.changes {
        let message = format!("m{i}");
        let start = Instant::now();
        spoke_apps
            .patch(
                "latency",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({ "status": { "health": { "status": "Healthy", "message": message } } }),
                ),
            )
            .await?;
        up.push(seen(&mut on_hub, &message, WITHIN).await? - start);
    }
    stop.fire();
    let _ = agent.await;
    drop((on_spoke, on_hub));

    // ------------------------------------------------------------- throughput
    eprintln!(
        "bench-grpc: throughput of one agent, {} reports over {} Applications",
        args.updates, args.apps
    );
    let names: Vec<String> = (0..args.apps).map(|i| format!("tp-{i}")).collect();
    futures::stream::iter(names.iter())
        .for_each_concurrent(16, |n| {
            let hub_apps = hub_apps.clone();
            async move {
                let _ = hub_apps
                    .create(&PostParams::default(), &app(n, "bench"))
                    .await;
            }
        })
        .await;
    let writes_before = hub_process
        .metric("argocd_pull_hub_grpc_status_writes_total")
        .await;
    let outcome = throughput(grpc_addr, &pki.ca, &synthetic, &names, args.updates).await?;
    // Every hub copy must end with the last status sent for it.
    let converge_start = Instant::now();
    let mut wrong;
    loop {
        let listed = hub_apps.list(&ListParams::default()).await?;
        wrong = 0;
        for a in &listed.items {
            let Some(name) = a.metadata.name.as_ref() else {
                continue;
            };
            if let Some(want) = outcome.last.get(name) {
                let got = a
                    .data
                    .pointer("/status/health/message")
                    .and_then(Value::as_str);
                if got != Some(want.as_str()) {
                    wrong += 1;
                }
            }
        }
        if wrong == 0 || converge_start.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let converged = converge_start.elapsed();
    let writes = hub_process
        .metric("argocd_pull_hub_grpc_status_writes_total")
        .await
        - writes_before;
    hub_process.kill().await?;
    let (Some(down), Some(up)) = (percentiles(down), percentiles(up)) else {
        bail!("no change was timed (--changes 0)");
    };
    eprintln!(
        "bench-grpc: p50/p99 down {:?}/{:?}, up {:?}/{:?}; {} reports in {:.2} s, {writes:.0} hub writes, {wrong} wrong",
        down.p50,
        down.p99,
        up.p50,
        up.p99,
        args.updates,
        outcome.elapsed.as_secs_f64()
    );
    Ok(Figures {
        down,
        up,
        updates: args.updates,
        intake: outcome.elapsed,
        writes,
        wrong,
        converged,
    })
}

struct Outcome {
    elapsed: Duration,
    /// The last health message sent per Application.
    last: HashMap<String, String>,
}

/// A synthetic agent: acknowledges what the hub delivers, then streams
/// `updates` status reports over `names`, one in flight per Application.
async fn throughput(
    addr: SocketAddr,
    ca: &Ca,
    identity: &CertKey,
    names: &[String],
    updates: usize,
) -> Result<Outcome> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca.pem.cert_pem))
        .identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    let channel = Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let mut client = TransportClient::new(channel);
    let (tx, rx) = mpsc::channel::<AgentMessage>(1024);
    let hello = argocd_pull_proto::version::hello(AgentMode::Managed, "bench");
    tx.send(AgentMessage {
        kind: Some(agent_message::Kind::Hello(hello)),
    })
    .await?;
    let mut inbound = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    // Deliveries first: acknowledge every upsert until all Applications arrived.
    let mut delivered = std::collections::HashSet::new();
    while delivered.len() < names.len() {
        let m = tokio::time::timeout(Duration::from_secs(60), inbound.message())
            .await
            .context("waiting for the hub's deliveries")??
            .context("the hub closed the stream")?;
        if let Some(hub_message::Kind::Upsert(u)) = m.kind {
            delivered.insert(u.key.clone().map(|k| k.name));
            tx.send(AgentMessage {
                kind: Some(agent_message::Kind::ObjectAck(ObjectAck {
                    key: u.key,
                    seq: u.seq,
                    outcome: AckOutcome::Applied as i32,
                    message: String::new(),
                })),
            })
            .await?;
        }
    }
    let key = |n: &str| ObjectKey {
        namespace: SPOKE_NS.into(),
        name: n.into(),
    };
    let mut seq = 0u64;
    let mut sent = 0usize;
    let mut last: HashMap<String, String> = HashMap::new();
    let mut in_flight: HashMap<u64, String> = HashMap::new();
    let mut report = |name: &str, sent: usize, seq: &mut u64| {
        *seq += 1;
        let message = format!("u{sent}");
        let status = content::canonical(
            &json!({ "health": { "status": "Healthy", "message": message },
                                                 "sync": { "status": "Synced" } }),
        );
        let version = content::hash_bytes(&status);
        last.insert(name.to_string(), message);
        AgentMessage {
            kind: Some(agent_message::Kind::Status(StatusReport {
                key: Some(key(name)),
                seq: *seq,
                state: Some(status_report::State::Observed(ObservedApplication {
                    meta: Some(ObjectMeta {
                        version,
                        ..Default::default()
                    }),
                    status_json: status,
                    ..Default::default()
                })),
                trace_parent: String::new(),
            })),
        }
    };
    let start = Instant::now();
    for name in names.iter().take(updates) {
        let m = report(name, sent, &mut seq);
        in_flight.insert(seq, name.clone());
        sent += 1;
        tx.send(m).await?;
    }
    let mut acked = 0usize;
    let mut heartbeat = Instant::now();
    while acked < updates {
        let m = tokio::time::timeout(Duration::from_secs(60), inbound.message())
            .await
            .context("waiting for acknowledgements")??
            .context("the hub closed the stream")?;
        let Some(hub_message::Kind::ObjectAck(ack)) = m.kind else {
            continue;
        };
        let Some(name) = in_flight.remove(&ack.seq) else {
            continue;
        };
        if ack.outcome != AckOutcome::Applied as i32 {
            bail!("the hub refused a report of {name}: {}", ack.message);
        }
        acked += 1;
        if sent < updates {
            let m = report(&name, sent, &mut seq);
            in_flight.insert(seq, name);
            sent += 1;
            tx.send(m).await?;
        }
        if heartbeat.elapsed() > Duration::from_secs(5) {
            heartbeat = Instant::now();
            tx.send(AgentMessage {
                kind: Some(agent_message::Kind::Heartbeat(Heartbeat::default())),
            })
            .await?;
        }
    }
    Ok(Outcome {
        elapsed: start.elapsed(),
        last,
    })
}
