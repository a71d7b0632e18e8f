//! The rollout part of `bench-grpc`: a fleet-wide change as users make it.
//! One real hub API server with `--agents` ManagedClusters (the addon on
//! each, so every cluster is served over gRPC), Argo CD's own
//! applicationset-controller generating `--apps-per-agent` pull-model
//! Applications per cluster from one ApplicationSet, the release
//! hub-controller, and the fleet load generator playing every cluster's
//! agent (`fleet_load_generator.rs`; its simulated Argo CD reports each
//! Application synced at the revision its spec names). With `--transport
//! manifestwork` the Applications go to the clusters as ManifestWorks
//! instead, and the benchmark plays OCM's work agent
//! (`argocd_pull_bench::work_agent`), writing each work's status feedback
//! as the work agent does.
//!
//! 1. The API server's write ceiling, measured first on the same server
//!    (`argocd_pull_bench::ceiling`): Application status writes per second
//!    from 64 writers, bare and with two watches open.
//! 2. Set-up: the clusters, the ApplicationSet (`targetRevision: v0`), and
//!    the applicationset-controller until every Application exists.
//! 3. First start: the hub-controller and the agents start together; timed
//!    until every hub copy carries the status its agent sent.
//! 4. The rollout: one edit of the ApplicationSet's template
//!    (`targetRevision: v1`); timed from the edit until the
//!    applicationset-controller has written every Application, and until
//!    every hub copy shows its agent's status at `v1`.
//!
//! Writes are counted twice: by the API server (`apiserver_request_total`
//! for `applications`, every writer, and for `manifestworks`) and by a watch of the hub copies,
//! which tells a write of the spec (the applicationset-controller's) from a
//! write of the status only (the hub-controller's). With `--repeat N` it
//! runs N times, each on a fresh hub API server.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_bench::ceiling::{self, Ceiling};
use argocd_pull_bench::work_agent;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use std::time::Instant;
use testenv::{Cluster, ClusterConfig, CrdSet};

use crate::fleet::{self, AGENT_NAME, NS, fleet_connections, join_clusters};
use crate::fleet_load_generator::{LoadGenerator, carries_its_status, target_revision};
use crate::hub::{self, HubOptions, HubProcess};
use crate::report::{self, Row, print_runs};

/// The ApplicationSet's name.
const APPSET: &str = "rollout";
/// The revision the template names at first, and after the edit.
const FIRST: &str = "v0";
const NEXT: &str = "v1";

/// How the Applications reach their clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    /// Over gRPC to the simulated agents.
    Grpc,
    /// As ManifestWorks, the benchmark playing OCM's work agent.
    Manifestwork,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Grpc => "grpc",
            Transport::Manifestwork => "manifestwork",
        }
    }

    /// Whether a hub copy carries what its cluster reported for its spec.
    fn carries(self) -> fn(&Application) -> bool {
        match self {
            Transport::Grpc => carries_its_status,
            Transport::Manifestwork => work_agent::shows_feedback,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct RolloutArgs {
    /// How the Applications reach their clusters: `grpc` (the addon's
    /// agents) or `manifestwork` (OCM's work agent).
    #[arg(long, value_enum, default_value_t = Transport::Grpc)]
    pub transport: Transport,
    /// Simulated agents, one per managed cluster.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Applications per managed cluster (a matrix of the clusters and this
    /// many list elements in one ApplicationSet).
    #[arg(long, default_value_t = 10)]
    pub apps_per_agent: usize,
    /// The applicationset-controller's `--concurrent-application-updates`
    /// (Argo CD's default: 1).
    #[arg(long, default_value_t = 32)]
    pub appset_updates: usize,
    /// The applicationset-controller's client rate (`ARGOCD_K8S_CLIENT_QPS`;
    /// Argo CD's default: 50, burst twice that).
    #[arg(long, default_value_t = 1000)]
    pub appset_qps: usize,
    /// Creates in flight while setting up the hub, and writers of the
    /// ceiling measurement.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Give up on a phase after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout_secs: u64,
}

/// What one run measured.
struct Figures {
    ceiling: Ceiling,
    /// From the hub-controller's start until every hub copy carries its
    /// agent's status.
    first_start: Duration,
    first: Writes,
    /// From the edit until the applicationset-controller wrote every
    /// Application's new spec.
    specs_written: Duration,
    /// From the edit until every hub copy shows its agent's status at the
    /// new revision.
    rolled_out: Duration,
    rollout: Writes,
    end: fleet::End,
}

/// Writes to Applications in a phase.
#[derive(Clone, Copy, Default)]
struct Writes {
    /// `apiserver_request_total` of `applications`, every writing verb.
    api_server: f64,
    /// The same of `manifestworks` (the hub's writes and the work agent's
    /// feedback).
    works: f64,
    /// Seen by the watch: writes that changed the spec.
    spec: u64,
    /// Seen by the watch: writes that changed the status only.
    status: u64,
    /// The hub-controller's own count of its writes to Applications.
    hub_metric: f64,
}

impl Writes {
    fn since(self, before: Writes) -> Writes {
        Writes {
            api_server: self.api_server - before.api_server,
            works: self.works - before.works,
            spec: self.spec - before.spec,
            status: self.status - before.status,
            hub_metric: self.hub_metric - before.hub_metric,
        }
    }
}

/// The ApplicationSet: every cluster times `per` elements, each Application
/// pulled to its cluster at `revision`.
fn application_set(clusters: &[String], per: usize, revision: &str, transport: Transport) -> Value {
    let cluster_elements: Vec<Value> = clusters.iter().map(|c| json!({ "cluster": c })).collect();
    let app_elements: Vec<Value> = (0..per)
        .map(|i| json!({ "i": format!("{i:02}") }))
        .collect();
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": { "name": APPSET, "namespace": NS },
        "spec": {
            "goTemplate": true,
            "goTemplateOptions": ["missingkey=error"],
            "generators": [{ "matrix": { "generators": [
                { "list": { "elements": cluster_elements } },
                { "list": { "elements": app_elements } }
            ] } }],
            "template": {
                "metadata": {
                    // The load generator's and the fleet's names: fleet::app_name.
                    "name": "{{.cluster}}-app-{{.i}}",
                    "labels": { keys::PULL_LABEL: "true" },
                    "annotations": { keys::MANAGED_CLUSTER: "{{.cluster}}",
                                     keys::MANAGED_CLUSTER_APP_NAMESPACE: hub::SPOKE_NS,
                                     keys::SKIP_RECONCILE: "true",
                                     keys::TRANSPORT: transport.name() }
                },
                "spec": {
                    "project": "default",
                    "source": { "repoURL": "https://git.example/bench.git", "path": "app",
                                "targetRevision": revision },
                    "destination": { "server": testenv::argocd::IN_CLUSTER,
                                     "namespace": "{{.cluster}}-app-{{.i}}" }
                }
            }
        }
    })
}

/// What the watch of the hub copies knows.
#[derive(Default)]
struct Seen {
    /// Per Application: its spec's revision and whether it carries its
    /// agent's status for that spec.
    apps: HashMap<String, (String, bool)>,
    spec_writes: u64,
    status_writes: u64,
}

impl Seen {
    fn writes(&self) -> (u64, u64) {
        (self.spec_writes, self.status_writes)
    }

    /// How many Applications name `revision`, and how many of those carry
    /// their status.
    fn at(&self, revision: &str) -> (usize, usize) {
        let at: Vec<&(String, bool)> = self.apps.values().filter(|(r, _)| r == revision).collect();
        (at.len(), at.iter().filter(|(_, ok)| *ok).count())
    }
}

/// Watches the hub copies: each event after the first list is one write,
/// of the spec when the spec changed, else of the status.
fn watch(client: kube::Client, carries: fn(&Application) -> bool) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let shared = seen.clone();
    let api: Api<Application> = Api::namespaced_with(client, NS, &application_resource());
    tokio::spawn(async move {
        let config = watcher::Config::default().labels(keys::PULL_LABEL);
        let mut specs: HashMap<String, Value> = HashMap::new();
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let (app, initial) = match event {
                Ok(watcher::Event::Apply(a)) => (a, false),
                Ok(watcher::Event::InitApply(a)) => (a, true),
                _ => continue,
            };
            let name = app.name_any();
            let spec = app.data.get("spec").cloned().unwrap_or_default();
            let spec_changed = specs.get(&name) != Some(&spec);
            specs.insert(name.clone(), spec);
            let entry = (target_revision(&app).to_string(), carries(&app));
            let mut s = shared.lock().expect("never poisoned");
            if !initial {
                if spec_changed {
                    s.spec_writes += 1;
                } else {
                    s.status_writes += 1;
                }
            }
            s.apps.insert(name, entry);
        }
    });
    seen
}

/// `apiserver_request_total` of `resource`, every verb that writes (as
/// the API server names them: `POST` creates, `PUT` updates).
async fn api_server_writes(client: &kube::Client, resource: &str) -> Result<f64> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains(&format!("resource=\"{resource}\"")))
        .filter(|l| {
            ["POST", "PUT", "PATCH", "APPLY"]
                .iter()
                .any(|v| l.contains(&format!("verb=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Writes so far: the API server's, the watch's, the hub's own count
/// (`None`: before the hub started).
async fn writes(
    client: &kube::Client,
    seen: &Mutex<Seen>,
    hub: Option<(&HubProcess, Transport)>,
) -> Result<Writes> {
    let (spec, status) = seen.lock().expect("never poisoned").writes();
    let hub_metric = match hub {
        None => 0.0,
        Some((hub, Transport::Grpc)) => {
            hub.metric("argocd_pull_hub_grpc_status_writes_total").await
        }
        Some((hub, Transport::Manifestwork)) => {
            hub.metric_with(
                "argocd_pull_hub_api_requests_total",
                &["resource=\"applications\"", "verb=\"patch\""],
            )
            .await
        }
    };
    Ok(Writes {
        api_server: api_server_writes(client, "applications").await?,
        works: api_server_writes(client, "manifestworks").await?,
        spec,
        status,
        hub_metric,
    })
}

/// Waits until `done` holds of what the watch has seen; its time, or an
/// error with `what` and the last counts after `timeout`.
async fn until(
    what: &str,
    seen: &Mutex<Seen>,
    since: Instant,
    timeout: Duration,
    done: impl Fn(&Seen) -> Option<String>,
) -> Result<Duration> {
    let mut last_print = Instant::now();
    loop {
        let waiting = done(&seen.lock().expect("never poisoned"));
        let Some(waiting) = waiting else {
            return Ok(since.elapsed());
        };
        if since.elapsed() > timeout {
            bail!("{what}: not done after {timeout:?}: {waiting}");
        }
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            eprintln!(
                "bench-grpc rollout: {what}, {:.0} s: {waiting}",
                since.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `Some(what is missing)` until all `total` Applications name `revision`
/// (and, with `status`, carry their agent's status for it).
fn all_at(total: usize, revision: &str, status: bool) -> impl Fn(&Seen) -> Option<String> {
    let revision = revision.to_string();
    move |s| {
        let (at, ok) = s.at(&revision);
        let done = at == total && (!status || ok == total);
        (!done).then(|| format!("{at}/{total} at {revision}, {ok} carry their status"))
    }
}

async fn one_run(args: &RolloutArgs, hub_bin: &Path, round: usize) -> Result<Figures> {
    let (n, per) = (args.agents, args.apps_per_agent);
    let total = n * per;
    let timeout = Duration::from_secs(args.timeout_secs);
    eprintln!("bench-grpc rollout: starting a hub API server for {n} clusters x {per}");
    let hub = Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)).await?;
    let client = hub.client().await?;
    for ns in [NS, testenv::argocd::NAMESPACE, hub::CONTROLLER_NS] {
        hub.ensure_namespace(ns).await?;
    }

    eprintln!("bench-grpc rollout: the API server's write ceiling ({total} Applications)");
    let ceiling = ceiling::measure(&hub, &client, total, args.concurrency, round).await?;
    eprintln!(
        "bench-grpc rollout: ceiling {:.0} writes/s bare, {:.0} with two watches",
        ceiling.bare, ceiling.watched
    );

    // ---------------------------------------------------------------- set-up
    let clusters = join_clusters(&client, n, args.concurrency).await?;
    eprintln!(
        "bench-grpc rollout: {n} ManagedClusters with the addon; starting the applicationset-controller"
    );
    let seen = watch(client.clone(), args.transport.carries());
    let appset_options = testenv::argocd::HubOptions {
        applicationset_namespaces: vec![NS.into()],
        args: vec![format!(
            "--concurrent-application-updates={}",
            args.appset_updates
        )],
        env: vec![
            ("ARGOCD_K8S_CLIENT_QPS".into(), args.appset_qps.to_string()),
            (
                "ARGOCD_K8S_CLIENT_BURST".into(),
                (2 * args.appset_qps).to_string(),
            ),
        ],
        ..Default::default()
    };
    let argocd = testenv::argocd::Hub::start(&hub, appset_options).await?;
    eprintln!("bench-grpc rollout: creating the ApplicationSet ({total} Applications)");
    hub::create(
        &client,
        application_set(&clusters, per, FIRST, args.transport),
        "applicationsets",
    )
    .await?;
    let created = Instant::now();
    until(
        "the ApplicationSet's Applications",
        &seen,
        created,
        timeout,
        all_at(total, FIRST, false),
    )
    .await
    .with_context(|| argocd.log_tail(20))?;

    // ----------------------------------------------------------- first start
    let (pki, grpc_addr, load) = LoadGenerator::on_loopback(
        &clusters,
        AGENT_NAME,
        (Duration::from_millis(500), Duration::from_secs(30)),
    )?;
    let logs = testenv::paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!("grpc-rollout-run{round}-hub.log"));
    let allowed = [format!("{NS}=*")];
    let options = HubOptions {
        bin: hub_bin,
        hub: &hub,
        pki: &pki,
        grpc_addr,
        allowed_targets: &allowed,
        log: Some(log.clone()),
        max_connections: fleet_connections(n),
        extra_args: &[],
    };
    let before = writes(&client, &seen, None).await?;
    load.new_epoch();
    let mut hub_process = HubProcess::start(&options)?;
    let started = hub_process.started;
    let work_agent = match args.transport {
        Transport::Grpc => {
            load.start();
            None
        }
        Transport::Manifestwork => Some(work_agent::play(client.clone(), args.concurrency)),
    };
    hub_process.ready(timeout).await?;
    let first_start = until(
        "first start",
        &seen,
        started,
        timeout,
        all_at(total, FIRST, true),
    )
    .await?;
    // Whatever the last writes' echoes bring is counted with the first start.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let counted = Some((&hub_process, args.transport));
    let after_first = writes(&client, &seen, counted).await?;
    let first = after_first.since(before);

    // --------------------------------------------------------------- rollout
    eprintln!("bench-grpc rollout: the template's targetRevision {FIRST} -> {NEXT}");
    let appsets = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NS,
        &testenv::argocd::applicationset_resource(),
    );
    let edit =
        json!({ "spec": { "template": { "spec": { "source": { "targetRevision": NEXT } } } } });
    let edited = Instant::now();
    appsets
        .patch(APPSET, &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    let specs_written = until(
        "the new specs",
        &seen,
        edited,
        timeout,
        all_at(total, NEXT, false),
    )
    .await?;
    let rolled_out = until(
        "the rollout",
        &seen,
        edited,
        timeout,
        all_at(total, NEXT, true),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rollout = writes(&client, &seen, counted).await?.since(after_first);

    let connected = hub_process
        .metric("argocd_pull_hub_grpc_agents_connected")
        .await;
    let pending = hub_process
        .metric("argocd_pull_hub_grpc_pending_objects")
        .await;
    let (_, matching) = seen.lock().expect("never poisoned").at(NEXT);
    load.stop();
    if let Some(work_agent) = work_agent {
        work_agent.abort();
    }
    hub_process.terminate(Duration::from_secs(60)).await?;
    drop(argocd);
    Ok(Figures {
        ceiling,
        first_start,
        first,
        specs_written,
        rolled_out,
        rollout,
        end: fleet::End::new(matching, connected, pending, vec![log]),
    })
}

pub async fn run(args: RolloutArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let (n, per) = (args.agents, args.apps_per_agent);
    let total = n * per;
    let runs = report::each_round("rollout", repeat, async |round| {
        one_run(&args, hub_bin, round).await
    })
    .await;
    let of = |f: &dyn Fn(&Figures) -> f64| report::per_run(&runs, |r| Some(f(r)));
    let two = |v: f64| format!("{v:.2}");
    let pct = |v: f64| format!("{:.0} %", v * 100.0);
    let per_app = |w: fn(&Writes) -> f64, phase: fn(&Figures) -> Writes| {
        of(&move |f| w(&phase(f)) / total as f64)
    };
    // What the ceiling allows for a phase's writes, every writer's.
    let allowed = |f: &Figures, w: Writes| (w.api_server + w.works) / f.ceiling.watched;
    let rows = vec![
        Row::new(
            "the API server's ceiling: Application status writes/s, bare",
            of(&|f| f.ceiling.bare),
            report::rate,
        ),
        Row::new(
            "the API server's ceiling: the same with two watches open",
            of(&|f| f.ceiling.watched),
            report::rate,
        ),
        Row::new(
            format!("first start: every one of the {total} hub copies carries its agent's status"),
            of(&|f| f.first_start.as_secs_f64()),
            report::secs,
        ),
        Row::new(
            "first start: what the ceiling (watched) allows for its writes",
            of(&|f| allowed(f, f.first)),
            report::secs,
        ),
        Row::new(
            "first start: time over what the ceiling allows",
            of(&|f| f.first_start.as_secs_f64() / allowed(f, f.first)),
            two,
        )
        .target("< 1.5", |v| v < 1.5),
        Row::new(
            "first start: the hub's status writes per Application (watch)",
            per_app(|w| w.status as f64, |f| f.first),
            two,
        )
        .target("1.00", |v| v <= 1.0),
        Row::new(
            "first start: the hub's status writes per Application (its metric)",
            per_app(|w| w.hub_metric, |f| f.first),
            two,
        ),
        Row::new(
            "first start: Application writes per Application (API server, every writer)",
            per_app(|w| w.api_server, |f| f.first),
            two,
        ),
        Row::new(
            "first start: ManifestWork writes per Application (API server, the hub's and the work agent's)",
            per_app(|w| w.works, |f| f.first),
            two,
        ),
        Row::new(
            "rollout: the applicationset-controller wrote every new spec",
            of(&|f| f.specs_written.as_secs_f64()),
            report::secs,
        ),
        Row::new(
            format!("rollout: every hub copy shows its agent's status at {NEXT}"),
            of(&|f| f.rolled_out.as_secs_f64()),
            report::secs,
        ),
        Row::new(
            "rollout: what the ceiling (watched) allows for its writes",
            of(&|f| allowed(f, f.rollout)),
            report::secs,
        ),
        Row::new(
            "rollout: time over what the ceiling allows",
            of(&|f| f.rolled_out.as_secs_f64() / allowed(f, f.rollout)),
            two,
        )
        .target("< 1.5", |v| v < 1.5),
        Row::new(
            "rollout: share of the ceiling the whole rollout used",
            of(&|f| {
                (f.rollout.api_server + f.rollout.works)
                    / f.rolled_out.as_secs_f64()
                    / f.ceiling.watched
            }),
            pct,
        ),
        Row::new(
            "rollout: the applicationset-controller's spec writes per Application (watch)",
            per_app(|w| w.spec as f64, |f| f.rollout),
            two,
        ),
        Row::new(
            "rollout: the hub's status writes per Application (watch)",
            per_app(|w| w.status as f64, |f| f.rollout),
            two,
        )
        .target("1.00", |v| v <= 1.0),
        Row::new(
            "rollout: the hub's status writes per Application (its metric)",
            per_app(|w| w.hub_metric, |f| f.rollout),
            two,
        ),
        Row::new(
            "rollout: Application writes per Application (API server, every writer)",
            per_app(|w| w.api_server, |f| f.rollout),
            two,
        ),
        Row::new(
            "rollout: ManifestWork writes per Application (API server, the hub's and the work agent's)",
            per_app(|w| w.works, |f| f.rollout),
            two,
        ),
    ];
    // Over ManifestWorks no agent connects.
    let agents = match args.transport {
        Transport::Grpc => n,
        Transport::Manifestwork => 0,
    };
    let mut rows = rows;
    rows.extend(fleet::end_rows(
        &runs,
        |f| &f.end,
        "the hub counts",
        agents,
        total,
    ));
    print_runs(
        &format!(
            "{} transport, rollout: one ApplicationSet over {n} clusters x {per} Applications = {total}, {}, applicationset-controller with --concurrent-application-updates={} and client QPS {}; {repeat} run(s), each on a fresh hub API server",
            args.transport.name(),
            match args.transport {
                Transport::Grpc => "fleet load generator",
                Transport::Manifestwork => "the benchmark as OCM's work agent",
            },
            args.appset_updates,
            args.appset_qps
        ),
        &rows,
    );
    fleet::check_runs(&runs, "rollout", |f| &f.end, agents, total)
}
