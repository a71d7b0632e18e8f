//! `bench-grpc`: the gRPC transport's latency and one agent's throughput,
//! on real API servers (a hub and a managed cluster from `testenv`), with
//! the hub-controller binary serving gRPC.
//!
//! - Latency, one change at a time: a hub Application's spec is changed and
//!   the time until the managed cluster's watch shows it applied is taken;
//!   then the spoke copy's status is changed and the time until the hub's
//!   watch shows it on the hub copy. p50 and p99 over `--changes` each way,
//!   with a real spoke-agent (in this process).
//! - Throughput of one agent: a synthetic agent (a plain gRPC client with
//!   the agent's certificate, so that the benchmark measures the hub and not
//!   a managed API server) sends `--updates` status reports over `--apps`
//!   Applications as fast as the hub acknowledges them, one in flight per
//!   Application as the protocol says. Reported: reports taken in per second,
//!   the hub's status writes (coalescing), and whether every hub copy ends up
//!   with the last status sent for it (the run fails if not).
//!
//! `make bench-grpc` builds everything and runs this; see docs/grpc.md.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_proto::content;
use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AckOutcome, AgentMessage, AgentMode, Heartbeat, ObjectAck, ObjectKey, ObjectMeta,
    ObservedApplication, StatusReport, agent_message, hub_message, status_report,
};
use argocd_pull_runtime::Readiness;
use argocd_pull_spoke_agent::{AgentConfig, Mode, metrics::AgentMetrics, tls::TlsFiles};
use clap::Parser;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, ClusterConfig, CrdSet, net};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

#[derive(Parser, Debug)]
#[command(about = "Benchmark the gRPC transport: latency both ways and one agent's throughput")]
struct Args {
    /// The hub-controller binary (default: target/release/hub-controller).
    #[arg(long)]
    hub_controller: Option<PathBuf>,
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
const SPOKE_NS: &str = "argocd";

fn subject(cluster: &str) -> String {
    format!("system:open-cluster-management:cluster:{cluster}:addon:argocd-pull:agent:bench")
}

fn write_pair(dir: &Path, name: &str, pair: &CertKey) -> Result<(PathBuf, PathBuf)> {
    let (crt, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&crt, &pair.cert_pem)?;
    std::fs::write(&key, &pair.key_pem)?;
    Ok((crt, key))
}

fn app(name: &str, cluster: &str) -> Application {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": NS,
            "labels": { keys::PULL_LABEL: "true" },
            "annotations": { keys::MANAGED_CLUSTER: cluster, keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
                             keys::SKIP_RECONCILE: "true" } },
        "spec": { "project": "default",
            "source": { "repoURL": "https://git.example/bench.git", "path": "app", "targetRevision": "v0" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": name } }
    }))
    .expect("a valid Application")
}

async fn dynamic(client: &kube::Client, obj: Value, plural: &str) -> Result<()> {
    let (group, version) = obj["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
        .unwrap_or(("", "v1"));
    let gvk =
        kube::api::GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap_or_default());
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let obj: DynamicObject = serde_json::from_value(obj)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What OCM leaves on the hub for a joined cluster with the addon enabled.
async fn join(hub: &Cluster, client: &kube::Client, cluster: &str) -> Result<()> {
    hub.ensure_namespace(cluster).await?;
    dynamic(
        client,
        json!({ "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
                "metadata": { "name": cluster }, "spec": { "hubAcceptsClient": true } }),
        "managedclusters",
    )
    .await?;
    dynamic(
        client,
        json!({ "apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn",
                "metadata": { "name": keys::ADDON_NAME, "namespace": cluster }, "spec": {} }),
        "managedclusteraddons",
    )
    .await
}

struct Percentiles {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

fn percentiles(mut samples: Vec<Duration>) -> Percentiles {
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
fn watch_one(
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

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let hub_bin = args
        .hub_controller
        .clone()
        .unwrap_or_else(|| PathBuf::from("target/release/hub-controller"));
    if !hub_bin.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p argocd-pull-hub-controller`",
            hub_bin.display()
        );
    }

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
    join(&hub, &hub_client, "spoke1").await?;
    join(&hub, &hub_client, "bench").await?;

    let dir = tempfile::tempdir()?;
    let ca = Ca::new("bench-grpc-ca")?;
    std::fs::write(dir.path().join("ca.crt"), &ca.pem.cert_pem)?;
    let serving = ca.serving(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
    let (hub_crt, hub_key) = write_pair(dir.path(), "hub", &serving)?;
    let (spoke_crt, spoke_key) =
        write_pair(dir.path(), "spoke1", &ca.client(&subject("spoke1"), None)?)?;
    let synthetic = ca.client(&subject("bench"), None)?;

    let grpc_addr = net::free_addr()?;
    let admin = net::free_addr()?;
    let mut hub_process = tokio::process::Command::new(&hub_bin)
        .arg("--kubeconfig")
        .arg(hub.kubeconfig())
        .args(["--admin-addr", &admin.to_string(), "--leader-elect=false"])
        .args([
            "--grpc-addr",
            &grpc_addr.to_string(),
            "--allowed-target",
            &format!("{NS}=*"),
        ])
        .arg("--grpc-tls-cert")
        .arg(&hub_crt)
        .arg("--grpc-tls-key")
        .arg(&hub_key)
        .arg("--grpc-client-ca")
        .arg(dir.path().join("ca.crt"))
        .env(
            "ARGOCD_PULL_LOG",
            std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .kill_on_drop(true)
        .spawn()
        .context("starting the hub-controller")?;
    let ready = Instant::now();
    while net::http_get(admin, "/readyz")
        .await
        .map(|r| r.0)
        .unwrap_or(0)
        != 200
    {
        if ready.elapsed() > Duration::from_secs(60) {
            bail!("the hub-controller is not ready after 60s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // ---------------------------------------------------------------- latency
    let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
    let readiness = Readiness::default();
    let agent = tokio::spawn(argocd_pull_spoke_agent::run_agent(
        AgentConfig {
            cluster_name: "spoke1".into(),
            hub_address: format!("https://{grpc_addr}"),
            tls: TlsFiles {
                cert: spoke_crt,
                key: spoke_key,
                ca: dir.path().join("ca.crt"),
            },
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
    let writes_before = metric(admin, "argocd_pull_hub_grpc_status_writes_total").await;
    let outcome = throughput(grpc_addr, &ca, &synthetic, &names, args.updates).await?;
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
    let writes = metric(admin, "argocd_pull_hub_grpc_status_writes_total").await - writes_before;
    let _ = hub_process.start_kill();

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

async fn metric(admin: SocketAddr, name: &str) -> f64 {
    let body = net::http_get(admin, "/metrics")
        .await
        .map(|r| r.1)
        .unwrap_or_default();
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
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
