//! Latency, one change at a time, and one agent's throughput (see main.rs).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_proto::content;
use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, Heartbeat, ObjectAck, ObjectKey, ObjectMeta,
    ObservedApplication, StatusReport, agent_message, hub_message, status_report,
};
use argocd_pull_runtime::Readiness;
use argocd_pull_spoke_agent::{AgentConfig, Mode, metrics::AgentMetrics};
use futures::StreamExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, ClusterConfig, CrdSet};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::hub::{self, HubOptions, HubProcess, Pki, SPOKE_NS, agent_subject};

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

pub fn app(name: &str, cluster: &str) -> Application {
    serde_json::from_value(hub::application(NS, name, cluster)).expect("a valid Application")
}

pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
    pub max: Duration,
}

pub fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
    samples.sort();
    let at =
        |q: f64| samples[((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1];
    Percentiles {
        p50: at(0.50),
        p99: at(0.99),
        max: *samples.last().expect("samples"),
    }
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

async fn until_seen(
    rx: &mut mpsc::UnboundedReceiver<(String, Instant)>,
    want: &str,
) -> Result<Instant> {
    let deadline = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut deadline => bail!("{want:?} not seen within 30s"),
            got = rx.recv() => match got {
                Some((v, at)) if v == want => return Ok(at),
                Some(_) => {}
                None => bail!("the watch ended"),
            }
        }
    }
}

/// Runs the latency and throughput parts and prints their tables.
pub async fn run(args: LatencyArgs, hub_bin: &Path) -> Result<()> {
    eprintln!("bench-grpc: starting a hub and a managed cluster");
    let (hub, spoke) = tokio::join!(
        Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)),
        Cluster::start(ClusterConfig::new("spoke1", CrdSet::Managed)),
    );
    let (hub, spoke) = (hub?, spoke?);
    let hub_client = hub.client().await?;
    let spoke_client = spoke.client().await?;
    spoke.ensure_namespace(SPOKE_NS).await?;
    hub.ensure_namespace(NS).await?;
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
    })?;
    hub_process.ready(Duration::from_secs(60)).await?;

    // ---------------------------------------------------------------- latency
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    let readiness = Readiness::default();
    let agent = tokio::spawn(argocd_pull_spoke_agent::run_agent(
        AgentConfig {
            cluster_name: "spoke1".into(),
            hub_address: format!("https://{grpc_addr}"),
            tls: spoke_tls,
            argocd_namespace: SPOKE_NS.into(),
            mode: Mode::Managed,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            tls_reload_interval: Duration::from_secs(10),
            workers: 16,
        },
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
    until_seen(&mut on_spoke, "v0")
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
        down.push(until_seen(&mut on_spoke, &revision).await? - start);
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
        up.push(until_seen(&mut on_hub, &message).await? - start);
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

    let (d, u) = (percentiles(down), percentiles(up));
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!();
    println!(
        "gRPC transport, real API servers ({} {}), {} changes each way",
        hub.name(),
        hub.version(),
        args.changes
    );
    println!();
    println!("| latency | p50 | p99 | max | target p99 |");
    println!("|---|---|---|---|---|");
    println!(
        "| hub change -> applied on the spoke | {} | {} | {} | < 50 ms |",
        ms(d.p50),
        ms(d.p99),
        ms(d.max)
    );
    println!(
        "| spoke status -> on the hub copy | {} | {} | {} | < 50 ms |",
        ms(u.p50),
        ms(u.p99),
        ms(u.max)
    );
    println!();
    println!("| throughput, one agent | value |");
    println!("|---|---|");
    println!(
        "| status reports taken in (acknowledged) | {} in {:.2} s = {:.0}/s (target >= 1,000/s) |",
        args.updates,
        outcome.elapsed.as_secs_f64(),
        args.updates as f64 / outcome.elapsed.as_secs_f64()
    );
    println!("| hub status writes for them (coalesced) | {writes:.0} |");
    println!(
        "| every hub copy shows its last status | {} ({} wrong), {:.2} s after the last acknowledgement |",
        if wrong == 0 { "yes" } else { "NO" },
        wrong,
        converged.as_secs_f64()
    );
    if wrong != 0 {
        bail!("{wrong} hub Applications do not show the last status sent");
    }
    Ok(())
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
