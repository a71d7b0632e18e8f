//! `bench-manifestwork`: the ManifestWork transport under load, ours next to
//! upstream's Go controller, on one real hub API server.
//!
//! For each Application count and each implementation in turn, on the same
//! hub: start the controller binary, create N labelled Applications spread
//! round-robin over the managed clusters and the team namespaces, time until
//! every ManifestWork exists, then play the OCM work agent for every work
//! (status feedback written through the status subresource, as the work
//! agent does) and time until every hub Application shows the fed-back
//! status. Then read the controller's reconcile counter from its metrics, its
//! peak resident memory (VmHWM) and CPU time from /proc, stop it and clean up
//! before the next run. Both controllers are only ever seen from the outside:
//! their binary, flags, metrics and the objects they write.
//!
//! `make bench-manifestwork` builds everything and runs this; see
//! docs/benchmarks.md.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::application_resource;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{ManagedCluster, ManifestWork, placement_decision_resource};
use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt, stream};
use kube::ResourceExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PartialObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::{Cluster, ClusterConfig, CrdSet, net, paths};
use tokio::io::AsyncReadExt;
use tokio::sync::Notify;

/// Marks every object the benchmark creates, with the run it belongs to.
const RUN_LABEL: &str = "bench.argocd-pull.io/run";

#[derive(Parser, Debug)]
#[command(
    about = "Benchmark the ManifestWork transport: our hub-controller and upstream's, on one real hub"
)]
struct Args {
    /// Application counts, one run per count and implementation.
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    apps: Vec<usize>,
    /// Managed clusters on the hub.
    #[arg(long, default_value_t = 50)]
    clusters: usize,
    /// Team namespaces the Applications are spread over.
    #[arg(long, default_value_t = 10)]
    namespaces: usize,
    /// Implementations to run, in this order, on the same hub.
    #[arg(long = "impl", value_delimiter = ',', default_value = "ours,upstream")]
    impls: Vec<Impl>,
    /// Our controller (default: target/release/hub-controller).
    #[arg(long)]
    hub_controller: Option<PathBuf>,
    /// Upstream's controller (default: <cache>/bin/argocd-pull-integration,
    /// built by test/tools/build-upstream.sh).
    #[arg(long)]
    upstream: Option<PathBuf>,
    /// Concurrent requests of the benchmark itself (creating Applications,
    /// writing the work agent's feedback).
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Give up on one phase of one run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// After convergence, wait until the reconcile counter has not moved for
    /// this many seconds before reading it (late and looping reconciles count).
    #[arg(long, default_value_t = 5)]
    settle: u64,
    /// Also write the results table (Markdown) to this file.
    #[arg(long)]
    output: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
enum Impl {
    /// argocd-pull's hub-controller.
    Ours,
    /// open-cluster-management.io/argocd-pull-integration, `--mode=basic`.
    Upstream,
}

impl Impl {
    fn label(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Upstream => "upstream",
        }
    }
}

/// What one run measured. `None`: not measured (timed out, not reachable).
#[derive(Default, Debug)]
struct Figures {
    /// Why the run did not happen, if it did not.
    skipped: Option<String>,
    create: Option<Duration>,
    works: Option<Duration>,
    works_seen: usize,
    feedback_written: Option<Duration>,
    status: Option<Duration>,
    status_seen: usize,
    reconciles: Option<f64>,
    /// Of `reconciles`, those before the first feedback write.
    delivery_reconciles: Option<f64>,
    reconcile_errors: Option<f64>,
    /// Writes by the controller seen through the watches (events minus the
    /// benchmark's own writes): on Applications and on ManifestWorks.
    app_writes: usize,
    work_writes: usize,
    peak_rss_kib: Option<u64>,
    /// Resident set once converged and settled.
    end_rss_kib: Option<u64>,
    cpu: Option<Duration>,
    log_errors: Option<usize>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    testenv::init_tracing_stderr("info,kube_client::client::builder=off");
    if args.apps.is_empty() || args.impls.is_empty() || args.clusters == 0 || args.namespaces == 0 {
        bail!("--apps, --impl, --clusters and --namespaces must not be empty or zero");
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test/ sits inside the workspace")
        .to_path_buf();
    let ours = args
        .hub_controller
        .clone()
        .unwrap_or_else(|| workspace.join("target/release/hub-controller"));
    let upstream = args
        .upstream
        .clone()
        .unwrap_or_else(|| paths::bin_dir().join("argocd-pull-integration"));

    let hub = Cluster::start(ClusterConfig::new("bench-hub", CrdSet::Hub)).await?;
    let client = hub.client().await?;
    let clusters = setup_clusters(&hub, &client, args.clusters).await?;
    // Both controllers keep an Argo CD cluster Secret per ManagedCluster there.
    hub.ensure_namespace("argocd").await?;

    let mut results: BTreeMap<usize, BTreeMap<Impl, Figures>> = BTreeMap::new();
    let mut run = 0;
    for &n in &args.apps {
        for &which in &args.impls {
            run += 1;
            let bin = match which {
                Impl::Ours => &ours,
                Impl::Upstream => &upstream,
            };
            let figures = if !bin.is_file() {
                let why = format!("{} is missing", bin.display());
                tracing::warn!(implementation = which.label(), "not run: {why}");
                Figures {
                    skipped: Some(why),
                    ..Default::default()
                }
            } else {
                eprintln!(
                    "bench: run {run}: {} with {n} Applications over {} clusters",
                    which.label(),
                    args.clusters
                );
                let figures = one_run(&hub, &client, &args, which, bin, n, run, &clusters).await?;
                eprintln!("bench: run {run} done: {figures:?}");
                figures
            };
            results.entry(n).or_default().insert(which, figures);
        }
    }

    let table = render(&args, &hub, &results);
    println!("{table}");
    if let Some(path) = &args.output {
        std::fs::write(path, &table).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// What OCM registration leaves on the hub for each joined cluster: the
/// ManagedCluster and its namespace.
async fn setup_clusters(hub: &Cluster, client: &kube::Client, n: usize) -> Result<Vec<String>> {
    let names: Vec<String> = (1..=n).map(|i| format!("cluster{i:03}")).collect();
    let api: Api<ManagedCluster> = Api::all(client.clone());
    for name in &names {
        hub.ensure_namespace(name).await?;
        let mc: ManagedCluster = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
            "metadata": { "name": name },
            "spec": { "hubAcceptsClient": true,
                      "managedClusterClientConfigs": [{ "url": format!("https://{name}.example:6443") }] }
        }))?;
        api.create(&PostParams::default(), &mc).await?;
    }
    Ok(names)
}

/// A team namespace whose Placement selects every cluster: what OCM's
/// placement controller leaves (PlacementDecisions of at most 100 clusters).
async fn team_namespace(
    hub: &Cluster,
    client: &kube::Client,
    name: &str,
    clusters: &[String],
) -> Result<()> {
    hub.ensure_namespace(name).await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), name, &placement_decision_resource());
    for (i, chunk) in clusters.chunks(100).enumerate() {
        let pd_name = format!("bench-decision-{}", i + 1);
        let pd: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.open-cluster-management.io/v1beta1", "kind": "PlacementDecision",
            "metadata": { "name": pd_name, "namespace": name,
                          "labels": { keys::PLACEMENT_LABEL: "bench" } }
        }))?;
        api.create(&PostParams::default(), &pd).await?;
        let decisions: Vec<Value> = chunk
            .iter()
            .map(|c| json!({ "clusterName": c, "reason": "" }))
            .collect();
        api.patch_status(
            &pd_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "decisions": decisions } })),
        )
        .await?;
    }
    Ok(())
}

fn application(name: &str, ns: &str, cluster: &str, run: usize) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": ns,
            "labels": { keys::PULL_LABEL: "true", RUN_LABEL: run.to_string() },
            "annotations": { keys::MANAGED_CLUSTER: cluster, keys::SKIP_RECONCILE: "true" } },
        "spec": {
            "project": "default",
            "source": { "repoURL": "https://git.example/fleet.git", "path": "guestbook", "targetRevision": "HEAD" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" },
            "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
        }
    }))?)
}

/// A delivered work as the benchmark's work agent needs it.
#[derive(Clone, Debug)]
struct SeenWork {
    namespace: String,
    name: String,
    /// The delivered Application's namespace and name (its resourceMeta).
    app_namespace: String,
    app_name: String,
}

/// Shared between the watch tasks and the run.
#[derive(Default)]
struct Progress {
    /// Hub Application (namespace/name) -> its work.
    works: Mutex<HashMap<String, SeenWork>>,
    /// Hub Applications that show the fed-back status.
    converged: Mutex<HashSet<String>>,
    /// Watch events (one per write) on the run's works and Applications.
    work_events: std::sync::atomic::AtomicUsize,
    app_events: std::sync::atomic::AtomicUsize,
    changed: Notify,
}

const REVISION: &str = "0123456789abcdef0123456789abcdef01234567";
const STARTED_AT: &str = "2026-01-01T00:00:00Z";

#[allow(clippy::too_many_arguments)]
async fn one_run(
    hub: &Cluster,
    client: &kube::Client,
    args: &Args,
    which: Impl,
    bin: &Path,
    n: usize,
    run: usize,
    clusters: &[String],
) -> Result<Figures> {
    let timeout = Duration::from_secs(args.timeout);
    let mut figures = Figures::default();
    let team: Vec<String> = (0..args.namespaces)
        .map(|i| format!("bench-r{run}-team{i:02}"))
        .collect();
    for ns in &team {
        team_namespace(hub, client, ns, clusters).await?;
    }
    let team_set: HashSet<String> = team.iter().cloned().collect();

    let logs = paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    let log = logs.join(format!("run{run}-{}-{n}.log", which.label()));
    let mut controller = Controller::start(which, bin, hub.kubeconfig(), &log).await?;
    let before = controller.reconciles().await?;

    // Watch every ManifestWork and this run's Applications from here on.
    let progress = Arc::new(Progress::default());
    let watches = [
        tokio::spawn(watch_works(
            client.clone(),
            team_set.clone(),
            progress.clone(),
        )),
        tokio::spawn(watch_apps(client.clone(), run, progress.clone())),
    ];

    // Phase 1: create the Applications; time until every work exists.
    let ar = application_resource();
    let t0 = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let ns = &team[i % team.len()];
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            let app = application(
                &format!("app-{i:05}"),
                ns,
                &clusters[i % clusters.len()],
                run,
            );
            async move {
                api.create(&PostParams::default(), &app?).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    figures.create = Some(t0.elapsed());
    let all_works = wait_for(&progress, t0 + timeout, &mut controller, |p| {
        p.works.lock().unwrap().len() >= n
    })
    .await?;
    figures.works_seen = progress.works.lock().unwrap().len();
    if all_works {
        figures.works = Some(t0.elapsed());
    }

    // Phase 2: the work agent feeds back every work's status; time until
    // every hub Application shows it.
    let works: Vec<SeenWork> = progress.works.lock().unwrap().values().cloned().collect();
    let delivered = controller.reconciles().await?;
    let t1 = Instant::now();
    stream::iter(works)
        .map(|w| feed_back(client.clone(), w))
        .buffer_unordered(args.concurrency)
        .try_collect::<()>()
        .await?;
    figures.feedback_written = Some(t1.elapsed());
    let all_status = wait_for(&progress, t1 + timeout, &mut controller, |p| {
        p.converged.lock().unwrap().len() >= n
    })
    .await?;
    figures.status_seen = progress.converged.lock().unwrap().len();
    if all_status {
        figures.status = Some(t1.elapsed());
    }

    // Reconciles that come after convergence (loops) count too.
    let mut last = controller.reconciles().await?;
    let mut still = Instant::now();
    let settle_deadline = Instant::now() + Duration::from_secs(120);
    while still.elapsed() < Duration::from_secs(args.settle) && Instant::now() < settle_deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = controller.reconciles().await?;
        if now != last {
            last = now;
            still = Instant::now();
        }
    }
    figures.reconciles = match (last.total, before.total) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    figures.delivery_reconciles = match (delivered.total, before.total) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    figures.reconcile_errors = match (last.errors, before.errors) {
        (Some(a), Some(b)) => Some(a - b),
        _ => None,
    };
    // The benchmark wrote each Application once (create) and each work once
    // (feedback); every other event is a write of the controller's.
    figures.app_writes = progress
        .app_events
        .load(Ordering::Relaxed)
        .saturating_sub(n);
    figures.work_writes = progress
        .work_events
        .load(Ordering::Relaxed)
        .saturating_sub(n);
    figures.peak_rss_kib = controller.rss_kib("VmHWM:");
    figures.end_rss_kib = controller.rss_kib("VmRSS:");
    figures.cpu = controller.cpu_time();
    controller.stop().await;
    figures.log_errors = count_error_lines(&log).ok();
    for w in watches {
        w.abort();
    }

    cleanup(client, &team, clusters, timeout).await?;
    Ok(figures)
}

/// Waits until `done` holds (true) or the deadline passes (false); fails if
/// the controller exits meanwhile.
async fn wait_for(
    progress: &Progress,
    deadline: Instant,
    controller: &mut Controller,
    done: impl Fn(&Progress) -> bool,
) -> Result<bool> {
    loop {
        // Register before checking, so a change in between is not missed.
        let changed = progress.changed.notified();
        if done(progress) {
            return Ok(true);
        }
        if let Some(status) = controller.exited() {
            bail!(
                "the {} controller exited ({status}) during the run; see {}",
                controller.which.label(),
                controller.log.display()
            );
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let _ =
            tokio::time::timeout((deadline - now).min(Duration::from_millis(250)), changed).await;
    }
}

fn manifestwork_resource() -> ApiResource {
    ApiResource::erase::<ManifestWork>(&())
}

/// Records every ManifestWork that points back at a hub Application in one of
/// `team` namespaces: whatever its name, whoever wrote it. A metadata-only
/// watch keeps the benchmark's own load on the API server low; the delivered
/// Application has the hub copy's namespace and name (the benchmark sets no
/// `ocm-managed-cluster-app-namespace`), which is what the feedback matches.
async fn watch_works(client: kube::Client, team: HashSet<String>, progress: Arc<Progress>) {
    let api: Api<PartialObjectMeta<ManifestWork>> = Api::all(client);
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(next) = events.next().await {
        let Ok(work) = next else { continue };
        let annotations = work.annotations();
        let (Some(app_ns), Some(app_name)) = (
            annotations.get(keys::HUB_APP_NAMESPACE),
            annotations.get(keys::HUB_APP_NAME),
        ) else {
            continue;
        };
        if !team.contains(app_ns) || work.metadata.deletion_timestamp.is_some() {
            continue;
        }
        progress.work_events.fetch_add(1, Ordering::Relaxed);
        let seen = SeenWork {
            namespace: work.namespace().unwrap_or_default(),
            name: work.name_any(),
            app_namespace: app_ns.clone(),
            app_name: app_name.clone(),
        };
        let key = format!("{app_ns}/{app_name}");
        let new = progress.works.lock().unwrap().insert(key, seen).is_none();
        if new {
            progress.changed.notify_waiters();
        }
    }
}

/// Records every Application of run `run` whose status shows the feedback.
async fn watch_apps(client: kube::Client, run: usize, progress: Arc<Progress>) {
    let api: Api<DynamicObject> = Api::all_with(client, &application_resource());
    let config = watcher::Config::default().labels(&format!("{RUN_LABEL}={run}"));
    let mut events = watcher::watcher(api, config)
        .default_backoff()
        .applied_objects()
        .boxed();
    while let Some(next) = events.next().await {
        let Ok(app) = next else { continue };
        progress.app_events.fetch_add(1, Ordering::Relaxed);
        let status = app.data.get("status");
        let at = |p: &str| status.and_then(|s| s.pointer(p)).and_then(Value::as_str);
        let shows = at("/health/status") == Some("Healthy")
            && at("/sync/status") == Some("Synced")
            && at("/sync/revision") == Some(REVISION);
        let key = format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any());
        let mut converged = progress.converged.lock().unwrap();
        let changed = if shows {
            converged.insert(key)
        } else {
            // Upstream passes through Progressing on its way to Healthy.
            converged.remove(&key)
        };
        drop(converged);
        if changed {
            progress.changed.notify_waiters();
        }
    }
}

/// What the OCM work agent writes once the spoke's Argo CD has synced the
/// Application: the Applied condition and the status feedback, through the
/// status subresource, the manifest matched by its resourceMeta.
async fn feed_back(client: kube::Client, w: SeenWork) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, &w.namespace, &manifestwork_resource());
    let values: Vec<Value> = [
        ("healthStatus", "Healthy"),
        ("syncStatus", "Synced"),
        ("syncRevision", REVISION),
        ("operationStatePhase", "Succeeded"),
        ("operationStateStartedAt", STARTED_AT),
    ]
    .iter()
    .map(|(n, v)| json!({ "name": n, "fieldValue": { "type": "String", "string": v } }))
    .collect();
    let status = json!({ "status": {
        "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestWorkComplete",
                         "message": "Apply manifest work complete", "lastTransitionTime": STARTED_AT }],
        "resourceStatus": { "manifests": [{
            "resourceMeta": { "group": "argoproj.io", "version": "v1alpha1", "kind": "Application",
                              "resource": "applications", "namespace": w.app_namespace,
                              "name": w.app_name, "ordinal": 0 },
            "conditions": [{ "type": "Applied", "status": "True", "reason": "AppliedManifestComplete",
                             "message": "Apply manifest complete", "lastTransitionTime": STARTED_AT }],
            "statusFeedback": { "values": values }
        }]}
    }});
    api.patch_status(&w.name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .with_context(|| format!("feedback for ManifestWork {}/{}", w.namespace, w.name))?;
    Ok(())
}

/// Removes the run's Applications and every ManifestWork, so that the next
/// run starts from the same hub state. The controller is stopped by then.
async fn cleanup(
    client: &kube::Client,
    team: &[String],
    clusters: &[String],
    timeout: Duration,
) -> Result<()> {
    let ar = application_resource();
    let mr = manifestwork_resource();
    let dp = DeleteParams::background();
    for ns in team {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        api.delete_collection(&dp, &ListParams::default()).await?;
    }
    for c in clusters {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), c, &mr);
        api.delete_collection(&dp, &ListParams::default()).await?;
    }
    let deadline = Instant::now() + timeout;
    let works: Api<DynamicObject> = Api::all_with(client.clone(), &mr);
    loop {
        let left = works.list_metadata(&ListParams::default().limit(1)).await?;
        if left.items.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            bail!("ManifestWorks were not deleted within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Each controller keeps its own Argo CD cluster Secrets; the next one
    // starts without the last one's.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "argocd");
    secrets
        .delete_collection(&dp, &ListParams::default())
        .await?;
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    for ns in team {
        namespaces.delete(ns, &dp).await?;
    }
    Ok(())
}

/// A controller under test, started through a small `sh` guard that kills it
/// when the benchmark goes away, however it goes away (the guard holds a pipe
/// from us and kills the controller when it reads end-of-file).
struct Controller {
    which: Impl,
    guard: tokio::process::Child,
    pid: u32,
    metrics: SocketAddr,
    log: PathBuf,
}

const GUARD: &str = r#"
exec 3<&0
"$@" </dev/null &
pid=$!
echo "$pid"
( read -r _ <&3; kill -TERM "$pid" 2>/dev/null ) &
wait "$pid"
"#;

/// Reconcile counters read from a controller's metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Counts {
    total: Option<f64>,
    errors: Option<f64>,
}

impl Controller {
    async fn start(which: Impl, bin: &Path, kubeconfig: &Path, log: &Path) -> Result<Self> {
        let metrics = net::free_addr()?;
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(GUARD).arg("bench-guard").arg(bin);
        let ready = match which {
            Impl::Ours => {
                cmd.arg("--kubeconfig")
                    .arg(kubeconfig)
                    .arg("--admin-addr")
                    .arg(metrics.to_string());
                // One replica, like upstream's run; versions before leader
                // election have no such flag.
                if has_flag(bin, "--leader-elect").await {
                    cmd.arg("--leader-elect=false");
                }
                metrics
            }
            Impl::Upstream => {
                let probe = net::free_addr()?;
                cmd.env("KUBECONFIG", kubeconfig)
                    .arg("--mode=basic")
                    .arg(format!("--metrics-bind-address={metrics}"))
                    .arg(format!("--health-probe-bind-address={probe}"))
                    .arg("--leader-elect=false")
                    .arg("--argocd-namespace=argocd")
                    .arg("--zap-log-level=info");
                probe
            }
        };
        let out = std::fs::File::create(log)?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(out)
            .kill_on_drop(true);
        let mut guard = cmd.spawn().context("starting the controller")?;
        let mut stdout = guard.stdout.take().expect("piped");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).await? == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let pid: u32 = String::from_utf8_lossy(&line)
            .trim()
            .parse()
            .context("the guard did not report the controller's PID")?;
        let mut controller = Controller {
            which,
            guard,
            pid,
            metrics,
            log: log.to_path_buf(),
        };
        // Ours is ready once its Application cache is synced; upstream's
        // probe only says the process is up, so give it the same settle time.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = controller.exited() {
                bail!(
                    "the {} controller exited at start ({status}); see {}",
                    which.label(),
                    log.display()
                );
            }
            if controller.ready(ready).await {
                break;
            }
            if Instant::now() > deadline {
                bail!("the {} controller was not ready in 120 s", which.label());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(controller)
    }

    /// Ours: `/readyz` on the admin port, which passes once its Application
    /// cache is synced. Upstream: its health probe, or, should that serve no
    /// checks, its metrics showing the Application controller.
    async fn ready(&self, probe: SocketAddr) -> bool {
        if let Ok((200, body)) = net::http_get(probe, "/readyz").await
            && body.trim() == "ok"
        {
            return true;
        }
        self.which == Impl::Upstream
            && matches!(
                net::http_get(self.metrics, "/metrics").await,
                Ok((200, body)) if body.contains("controller_runtime_reconcile_total{controller=\"application\"")
            )
    }

    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.guard.try_wait().ok().flatten()
    }

    /// Reconciles of the Application delivery and status paths. Ours counts
    /// them in one counter; upstream's controller-runtime counts per
    /// controller: `application` (delivery) plus `manifestwork` (status),
    /// without `managedcluster` (the cluster Secrets, which ours counts
    /// elsewhere).
    async fn reconciles(&self) -> Result<Counts> {
        let (code, body) = net::http_get(self.metrics, "/metrics").await?;
        if code != 200 {
            bail!("metrics answered {code}");
        }
        Ok(match self.which {
            Impl::Ours => Counts {
                total: metric_sum(
                    &body,
                    "argocd_pull_hub_application_reconciles_total",
                    |_| true,
                ),
                errors: metric_sum(
                    &body,
                    "argocd_pull_hub_application_reconcile_errors_total",
                    |_| true,
                ),
            },
            Impl::Upstream => {
                let not_clusters = |labels: &str| !labels.contains("controller=\"managedcluster\"");
                Counts {
                    total: metric_sum(&body, "controller_runtime_reconcile_total", not_clusters),
                    errors: metric_sum(
                        &body,
                        "controller_runtime_reconcile_errors_total",
                        not_clusters,
                    ),
                }
            }
        })
    }

    /// A memory figure of the controller from /proc (`VmHWM:` is the peak
    /// resident set, `VmRSS:` the current one), in KiB.
    fn rss_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }

    /// User plus system CPU time the controller used so far.
    fn cpu_time(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // Fields after the command name (which may hold spaces), from field 3 on.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        Some(Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64))
    }

    /// SIGTERM, then SIGKILL after 20 s.
    async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(20), self.guard.wait())
            .await
            .is_err()
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
            let _ = self.guard.wait().await;
        }
    }
}

/// Whether `bin --help` mentions `flag`.
async fn has_flag(bin: &Path, flag: &str) -> bool {
    tokio::process::Command::new(bin)
        .arg("--help")
        .output()
        .await
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

/// The sum of every sample of `name` (Prometheus text format) whose label set
/// passes `keep`; `None` when there is no such sample.
fn metric_sum(body: &str, name: &str, keep: impl Fn(&str) -> bool) -> Option<f64> {
    let mut sum = None;
    for line in body.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (labels, value) = if let Some(r) = rest.strip_prefix('{') {
            let Some(end) = r.find('}') else { continue };
            (&r[..end], &r[end + 1..])
        } else if rest.starts_with(' ') {
            ("", rest)
        } else {
            continue;
        };
        if !keep(labels) {
            continue;
        }
        if let Some(v) = value
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// Lines of a controller's log at error level (ours: plain `tracing` format;
/// upstream: zap's console format).
fn count_error_lines(log: &Path) -> std::io::Result<usize> {
    let text = std::fs::read_to_string(log)?;
    Ok(text
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains("\tERROR\t"))
        .count())
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn ratio(upstream: Option<f64>, ours: Option<f64>) -> String {
    match (upstream, ours) {
        (Some(u), Some(o)) if o > 0.0 => format!("{:.1}×", u / o),
        _ => "–".into(),
    }
}

/// The results as Markdown: one table per Application count, a column per
/// implementation, and upstream / ours when both ran.
fn render(
    args: &Args,
    hub: &Cluster,
    results: &BTreeMap<usize, BTreeMap<Impl, Figures>>,
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "ManifestWork transport, {} managed clusters, {} team namespaces, kube-apiserver {}, benchmark concurrency {}\n",
        args.clusters,
        args.namespaces,
        hub.version(),
        args.concurrency
    ));
    for (n, by_impl) in results {
        let impls: Vec<Impl> = by_impl.keys().copied().collect();
        let both = by_impl.len() == 2;
        out.push_str(&format!("\n| N = {n} |"));
        for i in &impls {
            out.push_str(&format!(" {} |", i.label()));
        }
        if both {
            out.push_str(" upstream / ours |");
        }
        out.push_str("\n|---|");
        for _ in &impls {
            out.push_str("---:|");
        }
        if both {
            out.push_str("---:|");
        }
        out.push('\n');
        type Row = (&'static str, fn(&Figures, usize) -> (String, Option<f64>));
        let rows: Vec<Row> = vec![
            (
                "Applications created (benchmark, not timed against the controller)",
                |f, _| (secs(f.create), None),
            ),
            (
                "every ManifestWork exists (from the first create)",
                |f, n| match f.works {
                    Some(d) => (secs(Some(d)), Some(d.as_secs_f64())),
                    None => (format!("timed out, {}/{n}", f.works_seen), None),
                },
            ),
            ("… of which after the last create", |f, _| {
                let lag = f.works.zip(f.create).map(|(w, c)| w.saturating_sub(c));
                (secs(lag), lag.map(|d| d.as_secs_f64()))
            }),
            ("work agent's feedback written (benchmark)", |f, _| {
                (secs(f.feedback_written), None)
            }),
            (
                "every status on its hub Application (from the first feedback write)",
                |f, n| match f.status {
                    Some(d) => (secs(Some(d)), Some(d.as_secs_f64())),
                    None => (format!("timed out, {}/{n}", f.status_seen), None),
                },
            ),
            ("… of which after the last feedback write", |f, _| {
                let lag = f
                    .status
                    .zip(f.feedback_written)
                    .map(|(s, w)| s.saturating_sub(w));
                (secs(lag), lag.map(|d| d.as_secs_f64()))
            }),
            (
                "reconciles per Application (until every work exists + after)",
                |f, n| {
                    let per = |r: f64| r / n as f64;
                    match (f.reconciles, f.delivery_reconciles) {
                        (Some(r), Some(d)) => (
                            format!("{:.2} ({:.2} + {:.2})", per(r), per(d), per(r - d)),
                            Some(per(r)),
                        ),
                        (Some(r), None) => (format!("{:.2}", per(r)), Some(per(r))),
                        _ => ("–".into(), None),
                    }
                },
            ),
            (
                "controller's writes to Applications, per Application",
                |f, n| {
                    let per = f.app_writes as f64 / n as f64;
                    (format!("{per:.2}"), Some(per))
                },
            ),
            (
                "controller's writes to ManifestWorks, per Application",
                |f, n| {
                    let per = f.work_writes as f64 / n as f64;
                    (format!("{per:.2}"), Some(per))
                },
            ),
            ("reconcile errors", |f, _| match f.reconcile_errors {
                Some(e) => (format!("{e}"), None),
                None => ("–".into(), None),
            }),
            ("controller peak RSS (VmHWM)", |f, _| match f.peak_rss_kib {
                Some(k) => (format!("{:.0} MiB", k as f64 / 1024.0), Some(k as f64)),
                None => ("–".into(), None),
            }),
            ("controller RSS once converged (VmRSS)", |f, _| {
                match f.end_rss_kib {
                    Some(k) => (format!("{:.0} MiB", k as f64 / 1024.0), Some(k as f64)),
                    None => ("–".into(), None),
                }
            }),
            ("controller CPU time (user + system)", |f, _| {
                (secs(f.cpu), f.cpu.map(|d| d.as_secs_f64()))
            }),
            ("error lines in the controller's log", |f, _| {
                (f.log_errors.map_or("–".into(), |e| e.to_string()), None)
            }),
        ];
        for (title, cell) in rows {
            out.push_str(&format!("| {title} |"));
            let mut values = HashMap::new();
            for i in &impls {
                let f = &by_impl[i];
                let (text, value) = match &f.skipped {
                    Some(_) => ("not run".to_string(), None),
                    None => cell(f, *n),
                };
                values.insert(*i, value);
                out.push_str(&format!(" {text} |"));
            }
            if both {
                out.push_str(&format!(
                    " {} |",
                    ratio(
                        values.get(&Impl::Upstream).copied().flatten(),
                        values.get(&Impl::Ours).copied().flatten()
                    )
                ));
            }
            out.push('\n');
        }
        for (i, f) in by_impl {
            if let Some(why) = &f.skipped {
                out.push_str(&format!("\n{} not run: {why}\n", i.label()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_the_samples_it_keeps() {
        let body = "# HELP x\n\
            controller_runtime_reconcile_total{controller=\"application\",result=\"success\"} 10\n\
            controller_runtime_reconcile_total{controller=\"application\",result=\"error\"} 2\n\
            controller_runtime_reconcile_total{controller=\"managedcluster\",result=\"success\"} 50\n\
            controller_runtime_reconcile_total{controller=\"manifestwork\",result=\"requeue\"} 3\n\
            controller_runtime_reconcile_time_seconds_count 99\n\
            argocd_pull_hub_application_reconciles_total 7\n";
        let not_clusters = |l: &str| !l.contains("managedcluster");
        assert_eq!(
            metric_sum(body, "controller_runtime_reconcile_total", not_clusters),
            Some(15.0)
        );
        assert_eq!(
            metric_sum(body, "argocd_pull_hub_application_reconciles_total", |_| {
                true
            }),
            Some(7.0)
        );
        assert_eq!(metric_sum(body, "absent_total", |_| true), None);
    }
}
