//! The cluster's own tree and live states in the hub's Argo CD (capability
//! `trees`, docs/ui.md): how long a change on the managed cluster takes to
//! show through the hub's argocd-server, and how fast argocd-server serves
//! the tree and the live states the hub-controller wrote.
//!
//! One run: a hub and a managed cluster (real API servers), Argo CD on the
//! managed cluster (application-controller, repo-server, Redis) syncing one
//! ConfigMap from a local Git server, argocd-server with its Redis on the
//! hub, the hub-controller binary with `--argocd-redis`, and the agent
//! (in this process, as the latency part runs it) reading the cluster's
//! Redis. Each change sets the ConfigMap's data on the managed cluster
//! (behind Argo CD's back: the Application does not self-heal); the time is
//! until argocd-server's `managed-resources` (what `argocd app manifests
//! --source live` and `argocd app diff` read) shows the new value. The
//! path: Kubernetes watch -> the application-controller's cache -> its
//! Redis and `PUBLISH` -> the agent (within its 500 ms batch) -> the hub ->
//! the hub's Redis -> argocd-server.
//!
//! The same run times the live views (capability `live-views`): the hub's
//! argocd-server reading the ConfigMap's live manifest as the UI's LIVE
//! MANIFEST tab does (argocd-server -> the hub-controller's live endpoint
//! -> the agent's stream -> the cluster's API server, and back), next to
//! the same object read straight from the cluster's API server.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_bench::stats::{Percentiles, percentiles};
use argocd_pull_runtime::Readiness;
use argocd_pull_spoke_agent::metrics::AgentMetrics;
use argocd_pull_spoke_agent::trees::{Password, RedisConfig};
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::argocd::{GitServer, Server, ServerOptions, Spoke, SpokeOptions};
use testenv::{Cluster, ClusterConfig, CrdSet};

use crate::hub::{self, HubOptions, HubProcess, Pki, SPOKE_NS, agent_subject};
use crate::report::{self, Row, print_runs};

#[derive(clap::Args, Debug)]
pub struct TreesArgs {
    /// Changes on the managed cluster timed one at a time.
    #[arg(long, default_value_t = 50)]
    changes: usize,
    /// Reads of the tree and of the live states, each, for their latency.
    #[arg(long, default_value_t = 200)]
    reads: usize,
    /// Quiet time before each change (milliseconds), so that each is a
    /// change on its own: the agent reads a tree at once after a quiet
    /// spell and at most every 500 ms while changes keep coming (0 times
    /// changes back to back, which that limit paces).
    #[arg(long, default_value_t = 1000)]
    gap_ms: u64,
}

const NS: &str = "bench";
/// The Application, and the namespace of its resources on the cluster.
pub const APP: &str = "trees";
/// The Application's ConfigMap `settings`, at its first value.
pub const SETTINGS: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  value: v0\n";
/// How long a change may take to show through the hub.
const WITHIN: Duration = Duration::from_secs(60);

struct Figures {
    change: Percentiles,
    fastest: Duration,
    tree_read: Percentiles,
    live_read: Percentiles,
    manifest_read: Percentiles,
    direct_read: Percentiles,
}

pub async fn run(args: TreesArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let runs = report::each_round("trees", repeat, async |_| one_run(&args, hub_bin).await).await;
    let at = |pick: fn(&Figures) -> Duration| {
        report::per_run(&runs, move |f| Some(pick(f).as_secs_f64()))
    };
    let rows = vec![
        Row::new(
            "a change on the cluster -> in the hub's live states, p50",
            at(|f| f.change.p50),
            report::ms,
        ),
        Row::new(
            "a change on the cluster -> in the hub's live states, p99",
            at(|f| f.change.p99),
            report::ms,
        )
        .target("< 2 s", |v| v < 2.0),
        Row::new(
            "a change on the cluster -> in the hub's live states, min",
            at(|f| f.fastest),
            report::ms,
        ),
        Row::new(
            "a change on the cluster -> in the hub's live states, max",
            at(|f| f.change.max),
            report::ms,
        ),
        Row::new(
            "argocd-server resource-tree through the hub, p50",
            at(|f| f.tree_read.p50),
            report::ms,
        ),
        Row::new(
            "argocd-server resource-tree through the hub, p99",
            at(|f| f.tree_read.p99),
            report::ms,
        )
        .target("< 300 ms", |v| v < 0.300),
        Row::new(
            "argocd-server managed-resources (live states) through the hub, p50",
            at(|f| f.live_read.p50),
            report::ms,
        ),
        Row::new(
            "argocd-server managed-resources (live states) through the hub, p99",
            at(|f| f.live_read.p99),
            report::ms,
        )
        .target("< 300 ms", |v| v < 0.300),
        Row::new(
            "argocd-server live manifest (LIVE MANIFEST tab) through the hub and the agent, p50",
            at(|f| f.manifest_read.p50),
            report::ms,
        ),
        Row::new(
            "argocd-server live manifest (LIVE MANIFEST tab) through the hub and the agent, p99",
            at(|f| f.manifest_read.p99),
            report::ms,
        )
        .target("< 300 ms", |v| v < 0.300),
        Row::new(
            "... the same object read straight from the cluster's API server, p50",
            at(|f| f.direct_read.p50),
            report::ms,
        ),
        Row::new(
            "... the same object read straight from the cluster's API server, p99",
            at(|f| f.direct_read.p99),
            report::ms,
        ),
    ];
    print_runs(
        &format!(
            "The cluster's own tree in the hub's Argo CD: {} changes ({} ms apart) and {} reads of each per run, {repeat} run(s)",
            args.changes, args.gap_ms, args.reads
        ),
        &rows,
    );
    if report::print_failures("", &runs) {
        bail!("a run failed");
    }
    Ok(())
}

/// A hub and a managed cluster with the Application `trees` of `files`
/// delivered over gRPC: what [`one_run`] and the log benchmark start from.
pub struct Stage {
    /// A node of the managed cluster, when asked: it runs the pods.
    _node: Option<testenv::node::Node>,
    pub server: Server,
    pub token: String,
    pub spoke_client: kube::Client,
    stop: argocd_pull_runtime::shutdown::Trigger,
    agent: tokio::task::JoinHandle<()>,
    hub_process: HubProcess,
    /// The certificates the hub-controller reads while it runs.
    pub pki: Pki,
    /// The hub-controller's live endpoint.
    pub live_url: String,
    _live_dir: tempfile::TempDir,
    _git: GitServer,
    _argocd: Spoke,
    pub spoke: Cluster,
    pub hub: Cluster,
}

impl Stage {
    /// Hub, managed cluster (with a node joined by the harness's `testenv`
    /// binary when given), Argo CD on each, a Git server with `files` in
    /// `app/`, the hub-controller `hub_bin` with its live endpoint, the
    /// agent (in this process) reading the cluster's Argo CD Redis and
    /// serving live views, and the Application `trees` created on the hub
    /// (synced once, then left alone: a change on the cluster stays a diff).
    pub async fn start(
        what: &str,
        hub_bin: &Path,
        files: &[(&str, &str)],
        node: Option<&Path>,
    ) -> Result<Stage> {
        eprintln!("bench-grpc {what}: a hub and a managed cluster, Argo CD on each, a Git server");
        let (hub, spoke) = tokio::join!(
            Cluster::start(ClusterConfig::new("hub", CrdSet::Hub)),
            Cluster::start(ClusterConfig::new("spoke1", CrdSet::Managed)),
        );
        let (hub, spoke) = (hub?, spoke?);
        let joined = async {
            let Some(testenv) = node else {
                return anyhow::Ok(None);
            };
            let mut n = testenv::node::Node::start("bench").await?;
            n.join(&spoke, testenv).await?;
            anyhow::Ok(Some(n))
        };
        let (argocd, git, server, node) = tokio::join!(
            Spoke::start(&spoke, SpokeOptions::default()),
            GitServer::start(),
            Server::start(&hub, ServerOptions::default()),
            joined,
        );
        let (argocd, git, server, node) = (argocd?, git?, server?, node?);
        let hub_client = hub.client().await?;
        let spoke_client = spoke.client().await?;
        spoke.ensure_namespace(SPOKE_NS).await?;
        spoke.ensure_namespace(APP).await?;
        hub.ensure_namespace(NS).await?;
        hub.ensure_namespace(hub::CONTROLLER_NS).await?;
        hub::join(&hub_client, "spoke1").await?;
        let repo = git.create_repo(APP)?;
        let files: Vec<(String, &str)> = files
            .iter()
            .map(|(name, text)| (format!("app/{name}"), *text))
            .collect();
        let files: Vec<(&str, &str)> = files.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        repo.commit("the Application's files", &files)?;

        let pki = Pki::new()?;
        let spoke_tls = pki.agent_files("spoke1", &agent_subject("spoke1", "bench"))?;
        let grpc_addr = testenv::net::free_addr()?;
        // The live endpoint, which the cluster Secret points argocd-server at.
        let live_dir = tempfile::tempdir()?;
        let (live, live_url) = hub::live_endpoint(live_dir.path(), &pki)?;
        let mut extra = vec![format!("--argocd-redis={}", server.redis())];
        extra.extend(live);
        let mut hub_process = HubProcess::start(&HubOptions {
            bin: hub_bin,
            hub: &hub,
            pki: &pki,
            grpc_addr,
            allowed_targets: &[format!("{NS}=*")],
            // At `info` in a file, as in the comparisons.
            log: Some(crate::argocd_agent::logs_dir()?.join(format!("{what}-hub.log"))),
            max_connections: None,
            extra_args: &extra,
        })?;
        hub_process.ready(Duration::from_secs(60)).await?;

        let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
        let mut config = hub::agent_config(
            grpc_addr,
            spoke_tls,
            Some(RedisConfig {
                addr: argocd.redis().to_string(),
                password: Password::None,
            }),
        );
        config.live.views = true;
        let agent = tokio::spawn(argocd_pull_spoke_agent::run_agent(
            config,
            spoke_client.clone(),
            AgentMetrics::default(),
            Readiness::default(),
            shutdown,
        ));

        let mut app = hub::application(NS, APP, "spoke1");
        app["spec"]["source"] =
            json!({ "repoURL": repo.url(), "path": "app", "targetRevision": "main" });
        app["spec"]["syncPolicy"] = json!({ "automated": { "prune": true } });
        // The cluster's own Secret, which opens the live views.
        app["spec"]["destination"] = json!({ "name": "spoke1", "namespace": APP });
        let app: Application = serde_json::from_value(app)?;
        Api::<Application>::namespaced_with(hub_client.clone(), NS, &application_resource())
            .create(&PostParams::default(), &app)
            .await?;
        let token = server.login("admin", server.admin_password()).await?;
        Ok(Stage {
            _node: node,
            server,
            token,
            spoke_client,
            stop,
            agent,
            hub_process,
            pki,
            live_url,
            _live_dir: live_dir,
            _git: git,
            _argocd: argocd,
            spoke,
            hub,
        })
    }

    /// Stops the agent, then the rest.
    pub async fn stop(self) {
        self.stop.fire();
        let _ = self.agent.await;
        drop(self.hub_process);
    }
}

async fn one_run(args: &TreesArgs, hub_bin: &Path) -> Result<Figures> {
    let stage = Stage::start("trees", hub_bin, &[("cm.yaml", SETTINGS)], None).await?;
    let (server, token, spoke_client) = (&stage.server, &stage.token, &stage.spoke_client);
    let live = |value: String| async move {
        let (code, body) = server
            .api(
                Method::GET,
                &format!("/api/v1/applications/{APP}/managed-resources?appNamespace={NS}"),
                Some(token),
                None,
            )
            .await?;
        let shown = code == 200
            && body["items"].as_array().into_iter().flatten().any(|i| {
                i["liveState"]
                    .as_str()
                    .is_some_and(|s| s.contains(&format!("\"value\":\"{value}\"")))
            });
        anyhow::Ok(shown)
    };
    eprintln!("bench-grpc trees: waiting for the first sync to show through the hub");
    let deadline = Instant::now() + Duration::from_secs(180);
    while !live("v0".into()).await.unwrap_or(false) {
        if Instant::now() > deadline {
            bail!("the synced ConfigMap never showed in the hub's managed-resources");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    eprintln!(
        "bench-grpc trees: timing {} changes on the cluster",
        args.changes
    );
    let cms: Api<ConfigMap> = Api::namespaced(spoke_client.clone(), APP);
    let mut changes = Vec::with_capacity(args.changes);
    for i in 1..=args.changes {
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
        let value = format!("v{i}");
        let start = Instant::now();
        cms.patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "value": value } })),
        )
        .await?;
        loop {
            if live(value.clone()).await? {
                break;
            }
            if start.elapsed() > WITHIN {
                bail!("change {i} did not show through the hub within {WITHIN:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        changes.push(start.elapsed());
    }

    eprintln!("bench-grpc trees: {} reads of each", args.reads);
    let mut tree_reads = Vec::with_capacity(args.reads);
    let mut live_reads = Vec::with_capacity(args.reads);
    for _ in 0..args.reads {
        let start = Instant::now();
        let nodes = server
            .tree_nodes(token, NS, APP)
            .await
            .map_err(anyhow::Error::msg)?;
        tree_reads.push(start.elapsed());
        if nodes.is_empty() {
            bail!("resource-tree answered no nodes");
        }
        let start = Instant::now();
        if !live(format!("v{}", args.changes)).await? {
            bail!("managed-resources lost the last value");
        }
        live_reads.push(start.elapsed());
    }
    eprintln!(
        "bench-grpc trees: {} reads of the live manifest through the hub, and straight from the cluster",
        args.reads
    );
    let manifest = || async move {
        let (code, body) = server
                .api(
                    Method::GET,
                    &format!(
                        "/api/v1/applications/{APP}/resource?appNamespace={NS}&namespace={APP}&resourceName=settings&version=v1&kind=ConfigMap&group="
                    ),
                    Some(token),
                    None,
                )
                .await?;
        anyhow::Ok((code, body))
    };
    let deadline = Instant::now() + WITHIN;
    loop {
        match manifest().await? {
            (200, _) => break,
            other if Instant::now() > deadline => {
                bail!("the live manifest never came through the hub: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let want = format!("\"value\":\"v{}\"", args.changes);
    let mut manifest_reads = Vec::with_capacity(args.reads);
    let mut direct_reads = Vec::with_capacity(args.reads);
    // In turns, the direct read first every other time, so neither read
    // always finds the other's connections and caches just warmed.
    for i in 0..args.reads {
        for through_hub in [i % 2 == 0, i % 2 == 1] {
            let start = Instant::now();
            if through_hub {
                let (code, body) = manifest().await?;
                manifest_reads.push(start.elapsed());
                if code != 200 || !body["manifest"].as_str().is_some_and(|m| m.contains(&want)) {
                    bail!("the live manifest through the hub is not the cluster's: {code} {body}");
                }
            } else {
                cms.get("settings").await?;
                direct_reads.push(start.elapsed());
            }
        }
    }
    stage.stop().await;
    let fastest = *changes.iter().min().context("no changes timed")?;
    Ok(Figures {
        change: percentiles(changes).context("no changes timed")?,
        fastest,
        tree_read: percentiles(tree_reads).context("no reads")?,
        live_read: percentiles(live_reads).context("no reads")?,
        manifest_read: percentiles(manifest_reads).context("no reads")?,
        direct_read: percentiles(direct_reads).context("no reads")?,
    })
}
