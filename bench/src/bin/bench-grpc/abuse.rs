//! `bench-grpc abuse`: does the hub keep serving good agents while it is
//! abused? One hub, `--good-agents` simulated agents (the fleet load
//! generator, `fleet_load_generator.rs`) with `--apps-per-agent`
//! Applications each, and two abusers, all on loopback:
//!
//! - `--bad-handshakes` TLS handshakes with certificates of a CA the hub
//!   does not trust, each claiming a good cluster's identity,
//!   `--bad-concurrency` at a time;
//! - one agent with a valid certificate that floods status reports
//!   (`--flood-report-bytes` each, for Applications the hub never sent it)
//!   and never reads what the hub sends; when the hub ends its stream it
//!   dials again and floods again.
//!
//! The figure: the time from creating a hub Application for a good cluster
//! until the hub copy shows the status its agent reported (delivery, the
//! agent's report, the hub's status write), `--samples` of them one after
//! another (about 20 a second), first with no abuse (quiet), then under
//! abuse (and on until the last bad handshake), on the same hub process. Printed: p50 and p99 of both, the ratio of the p99s, whether
//! any good Application was lost, and the hub's peak memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_bench::stats::{Percentiles, percentiles};
use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AgentMessage, AgentMode, ObjectKey, ObjectMeta, ObservedApplication, StatusReport,
    agent_message, status_report,
};
use argocd_pull_proto::version;
use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, ClusterConfig, CrdSet};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::fleet_load_generator::{LoadGenerator, carries_its_status};
use crate::hub::{self, HubOptions, HubProcess, agent_subject};
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Debug)]
pub struct AbuseArgs {
    /// Simulated good agents, one per managed cluster.
    #[arg(long, default_value_t = 100)]
    good_agents: usize,
    /// Applications per good cluster before the measurement.
    #[arg(long, default_value_t = 5)]
    apps_per_agent: usize,
    /// Applications created and timed in each phase (quiet, abused).
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// TLS handshakes with untrusted certificates during the abused phase.
    #[arg(long, default_value_t = 10_000)]
    bad_handshakes: usize,
    /// Of them, how many at once.
    #[arg(long, default_value_t = 32)]
    bad_concurrency: usize,
    /// Size of each flooded status report (bytes of status JSON).
    #[arg(long, default_value_t = 256 << 10)]
    flood_report_bytes: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

const NS: &str = "abuse";
const AGENT_NAME: &str = "fleet-load-generator";
const FLOODER: &str = "flooder";
const PEAK_RSS_TARGET_MIB: f64 = 512.0;

/// When each hub Application first carried its agent's status.
type Seen = Arc<Mutex<HashMap<String, Instant>>>;

fn watch_status(client: kube::Client) -> Seen {
    let seen: Seen = Arc::default();
    let shared = seen.clone();
    let api: Api<Application> = Api::namespaced_with(client, NS, &application_resource());
    tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default().labels(keys::PULL_LABEL))
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(Ok(app)) = events.next().await {
            if carries_its_status(&app) {
                let mut s = shared.lock().expect("never poisoned");
                s.entry(app.name_any()).or_insert_with(Instant::now);
            }
        }
    });
    seen
}

async fn wait_seen(seen: &Seen, names: &[String], timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let missing = {
            let s = seen.lock().expect("never poisoned");
            names.iter().filter(|n| !s.contains_key(*n)).count()
        };
        if missing == 0 {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!(
                "{missing} of {} Applications never showed their status",
                names.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates `n` Applications one after another, round robin over the good
/// clusters (and more while `busy` is set: the abuse is still going on),
/// and returns each one's time to show its status.
async fn sample(
    client: &kube::Client,
    seen: &Seen,
    clusters: &[String],
    phase: &str,
    n: usize,
    busy: &AtomicBool,
    timeout: Duration,
) -> Result<Vec<Duration>> {
    let mut created = Vec::with_capacity(n);
    for i in 0.. {
        if i >= n && !busy.load(Ordering::Relaxed) {
            break;
        }
        let cluster = &clusters[i % clusters.len()];
        let name = format!("{phase}-{i:04}");
        hub::create(client, hub::application(NS, &name, cluster), "applications").await?;
        created.push((name, Instant::now()));
        // About 20 a second: a steady trickle, not a burst.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let names: Vec<String> = created.iter().map(|(n, _)| n.clone()).collect();
    wait_seen(seen, &names, timeout).await?;
    let s = seen.lock().expect("never poisoned");
    Ok(created
        .iter()
        .map(|(name, at)| s[name].saturating_duration_since(*at))
        .collect())
}

async fn channel(
    address: &str,
    ca: &str,
    identity: &CertKey,
) -> Result<Channel, tonic::transport::Error> {
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .identity(Identity::from_pem(&identity.cert_pem, &identity.key_pem));
    Endpoint::from_shared(address.to_string())?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
}

/// Handshakes with untrusted certificates until `total` were tried; then
/// clears `busy`.
async fn bad_handshakes(
    busy: Arc<AtomicBool>,
    address: String,
    ca: String,
    total: usize,
    concurrency: usize,
) -> Result<Duration> {
    let rogue = Ca::new("rogue")?;
    let identity = rogue.client(&agent_subject("good-0001", AGENT_NAME), None)?;
    let start = Instant::now();
    futures::stream::iter(0..total)
        .for_each_concurrent(concurrency, |_| {
            let (address, ca, identity) = (&address, &ca, &identity);
            async move {
                // Refused: either at the handshake or at the first request.
                if let Ok(ch) = channel(address, ca, identity).await {
                    let mut client = TransportClient::new(ch);
                    let _ = client.connect(futures::stream::empty()).await;
                }
            }
        })
        .await;
    busy.store(false, Ordering::Relaxed);
    Ok(start.elapsed())
}

/// The valid agent that floods reports and never reads, until `stop`.
async fn flood(
    address: String,
    ca: String,
    identity: CertKey,
    bytes: usize,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) {
    let status =
        serde_json::to_vec(&serde_json::json!({ "pad": "x".repeat(bytes) })).expect("JSON");
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(ch) = channel(&address, &ca, &identity).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let (tx, rx) = tokio::sync::mpsc::channel::<AgentMessage>(16);
        let hello = AgentMessage {
            kind: Some(agent_message::Kind::Hello(version::hello(
                AgentMode::Managed,
                "flooder",
            ))),
        };
        let _ = tx.send(hello).await;
        let mut client = TransportClient::new(ch).max_encoding_message_size(8 << 20);
        // The response stream is kept and never read.
        let Ok(_never_read) = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
        else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let report = AgentMessage {
                kind: Some(agent_message::Kind::Status(StatusReport {
                    key: Some(ObjectKey {
                        namespace: "argocd".into(),
                        name: format!("forged-{}", seq % 10_000),
                    }),
                    seq,
                    state: Some(status_report::State::Observed(ObservedApplication {
                        meta: Some(ObjectMeta {
                            version: seq.to_string(),
                            ..Default::default()
                        }),
                        status_json: status.clone(),
                        ..Default::default()
                    })),
                    trace_parent: String::new(),
                })),
            };
            // Blocks once the hub stops reading (flow control); ends with the stream.
            match tokio::time::timeout(Duration::from_secs(1), tx.send(report)).await {
                Ok(Ok(())) => {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Err(_)) => break,
                Err(_) if tx.is_closed() => break,
                Err(_) => {}
            }
        }
    }
}

/// One run's figures.
struct Figures {
    quiet: Vec<Duration>,
    abused: Vec<Duration>,
    handshakes_took: Duration,
    flooded: u64,
    peak_quiet_kib: Option<u64>,
    peak_kib: Option<u64>,
    refused: f64,
}

async fn one_run(args: &AbuseArgs, hub_bin: &std::path::Path) -> Result<Figures> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)).await?;
    let client = hub.client().await?;
    hub.ensure_namespace(NS).await?;
    hub.ensure_namespace("argocd").await?;
    hub.ensure_namespace(hub::CONTROLLER_NS).await?;
    let clusters: Vec<String> = (1..=args.good_agents)
        .map(|i| format!("good-{i:04}"))
        .collect();
    futures::stream::iter(clusters.iter().chain([&FLOODER.to_string()]))
        .map(|c| hub::join(&client, c))
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .context("joining the clusters")?;
    let apps: Vec<(String, String)> = clusters
        .iter()
        .flat_map(|c| (0..args.apps_per_agent).map(move |i| (c.clone(), format!("{c}-app-{i:02}"))))
        .collect();
    futures::stream::iter(apps.iter())
        .map(|(c, name)| hub::create(&client, hub::application(NS, name, c), "applications"))
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await
        .context("creating the Applications")?;

    let (pki, grpc_addr, fleet) = LoadGenerator::on_loopback(
        &clusters,
        AGENT_NAME,
        (Duration::from_millis(500), Duration::from_secs(30)),
    )?;
    let address = format!("https://{grpc_addr}");
    let seen = watch_status(client.clone());
    let logs = testenv::paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let allowed = [format!("{NS}=*")];
    let mut hub_process = HubProcess::start(&HubOptions {
        bin: hub_bin,
        hub: &hub,
        pki: &pki,
        grpc_addr,
        allowed_targets: &allowed,
        log: Some(logs.join("grpc-abuse-hub.log")),
        max_connections: None,
        extra_args: &[],
    })?;
    hub_process.ready(timeout).await?;
    fleet.new_epoch();
    fleet.start();
    let names: Vec<String> = apps.iter().map(|(_, n)| n.clone()).collect();
    wait_seen(&seen, &names, timeout)
        .await
        .context("the good fleet in sync")?;
    eprintln!(
        "bench-grpc abuse: {} good agents in sync; quiet phase",
        clusters.len()
    );

    let idle = AtomicBool::new(false);
    let quiet = sample(
        &client,
        &seen,
        &clusters,
        "quiet",
        args.samples,
        &idle,
        timeout,
    )
    .await?;
    let peak_quiet_kib = hub_process.memory_kib("VmHWM");

    eprintln!(
        "bench-grpc abuse: abused phase: {} bad handshakes and one flooding agent",
        args.bad_handshakes
    );
    let ca = pki.ca.pem.cert_pem.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    // The abusers run on a runtime of their own, so that their work does
    // not hold up the good agents' tasks in this process (they still share
    // the machine's cores with everything else).
    let abusers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let flooder = abusers.spawn(flood(
        address.clone(),
        ca.clone(),
        pki.client(&agent_subject(FLOODER, AGENT_NAME))?,
        args.flood_report_bytes,
        stop.clone(),
        sent.clone(),
    ));
    let busy = Arc::new(AtomicBool::new(true));
    let handshakes = abusers.spawn(bad_handshakes(
        busy.clone(),
        address.clone(),
        ca,
        args.bad_handshakes,
        args.bad_concurrency,
    ));
    let abused = sample(
        &client,
        &seen,
        &clusters,
        "abused",
        args.samples,
        &busy,
        timeout,
    )
    .await?;
    let handshakes_took = handshakes.await??;
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(5), flooder).await;
    abusers.shutdown_background();
    // Nothing lost: every good Application still carries its status.
    wait_seen(&seen, &names, timeout)
        .await
        .context("the good fleet after the abuse")?;
    let figures = Figures {
        quiet,
        abused,
        handshakes_took,
        flooded: sent.load(Ordering::Relaxed),
        peak_quiet_kib,
        peak_kib: hub_process.memory_kib("VmHWM"),
        refused: hub_process
            .metric("argocd_pull_hub_grpc_refused_total")
            .await,
    };
    fleet.stop();
    hub_process.terminate(Duration::from_secs(30)).await?;
    Ok(figures)
}

pub async fn run(args: AbuseArgs, repeat: usize, hub_bin: &std::path::Path) -> Result<()> {
    let runs = report::each_round("abuse", repeat, async |_| one_run(&args, hub_bin).await).await;
    let of = |f: &dyn Fn(&Figures) -> f64| report::per_run(&runs, |r| Some(f(r)));
    // Runs always time at least one Application each phase.
    let p = |v: &[Duration], q: fn(&Percentiles) -> Duration| {
        percentiles(v.to_vec()).map_or(f64::NAN, |p| q(&p).as_secs_f64())
    };
    let rows = vec![
        Row::new(
            "quiet: p50, Application created to its status on the hub",
            of(&|f| p(&f.quiet, |p| p.p50)),
            report::ms,
        ),
        Row::new("quiet: p99", of(&|f| p(&f.quiet, |p| p.p99)), report::ms),
        Row::new("abused: p50", of(&|f| p(&f.abused, |p| p.p50)), report::ms),
        Row::new("abused: p99", of(&|f| p(&f.abused, |p| p.p99)), report::ms),
        Row::new(
            "abused p99 / quiet p99",
            of(&|f| p(&f.abused, |p| p.p99) / p(&f.quiet, |p| p.p99)),
            |v| format!("{v:.2}×"),
        )
        .target("< 2×", |v| v < 2.0),
        Row::new(
            format!("{} bad handshakes took", args.bad_handshakes),
            of(&|f| f.handshakes_took.as_secs_f64()),
            report::secs,
        ),
        Row::new(
            "flooded reports sent",
            of(&|f| f.flooded as f64),
            report::count,
        ),
        Row::new(
            "streams and reports refused (all reasons)",
            of(&|f| f.refused),
            report::count,
        ),
        Row::new(
            "hub peak RSS after the quiet phase",
            of(&|f| f.peak_quiet_kib.unwrap_or(0) as f64),
            report::mib,
        ),
        Row::new(
            "hub peak RSS over the run",
            of(&|f| f.peak_kib.unwrap_or(0) as f64),
            report::mib,
        )
        .target(format!("< {PEAK_RSS_TARGET_MIB:.0} MiB"), |v| {
            v / 1024.0 < PEAK_RSS_TARGET_MIB
        }),
    ];
    print_runs(
        &format!(
            "bench-grpc abuse: {} good agents x {} Applications, {} timed creations per phase; a run that lost a good Application fails",
            args.good_agents, args.apps_per_agent, args.samples
        ),
        &rows,
    );
    if runs.iter().any(Result::is_err) {
        bail!("a run failed (see above)");
    }
    Ok(())
}
