//! The hub-controller: watches pull-model Argo CD Applications on the hub,
//! delivers each to its managed cluster and writes the spoke's status back
//! onto the dormant hub copy.

#![forbid(unsafe_code)]

pub mod authorized;
pub mod certs;
pub mod compact;
#[cfg(test)]
mod fixtures;
mod leading;
pub mod lease_records;
pub mod metrics;
pub mod report;
pub mod status;
pub mod transport;
pub mod watch;

/// The pure core's routing and rendering, which the hub's modules and
/// tests name as this crate's `route` and `render`.
pub use argocd_pull_core::{render, route};

use transport::{grpc, manifestwork};

use argocd_pull_runtime::{
    AdminArgs, ClientArgs, LeaderElectionArgs, LogArgs, Readiness, admin::Admin, lease,
    parse_duration, shutdown,
};
use std::time::Duration;

use clap::Parser;
use prometheus_client::registry::Registry;

#[derive(Parser, Clone, Debug)]
#[command(
    name = "hub-controller",
    version,
    about = "Delivers pull-model Argo CD Applications from the OCM hub to managed clusters and writes their status back"
)]
pub struct Args {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub leader: LeaderElectionArgs,
    /// Namespace of the hub's Argo CD.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_NAMESPACE", default_value = "argocd")]
    pub argocd_namespace: String,
    /// How often to delete ManifestWorks whose hub Application is gone.
    #[arg(long, env = "ARGOCD_PULL_SWEEP_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// Also ask the work agent for the health and operation messages and the
    /// conditions; the conditions (a list) come back only from work agents
    /// with the `RawFeedbackJsonString` feature gate.
    #[arg(long, env = "ARGOCD_PULL_RAW_FEEDBACK")]
    pub raw_feedback: bool,
    /// ManifestWork reconciles that run at once. Each holds a parsed
    /// Application and its work while it waits for the API server, so this
    /// bounds memory when thousands are triggered together (start-up, a
    /// Placement change); more than `--api-max-in-flight` gains little.
    #[arg(long, env = "ARGOCD_PULL_WORKERS", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub workers: u16,
    /// How long the work agent may take to apply a ManifestWork before the
    /// hub Application shows `WorkNotApplied` (a cluster down or cut off,
    /// a work agent not running).
    #[arg(long, env = "ARGOCD_PULL_WORK_APPLY_TIMEOUT", default_value = "5m", value_parser = parse_duration)]
    pub work_apply_timeout: Duration,
    /// How a namespace is allowed to target a cluster: `placement` (a
    /// PlacementDecision in the Application's namespace must select it) or
    /// `none` (any namespace may target any cluster).
    #[arg(long, env = "ARGOCD_PULL_AUTHORIZATION", value_enum, default_value_t = AuthorizationMode::Placement)]
    pub authorization: AuthorizationMode,
    /// Extra allowed targets, `NAMESPACE=CLUSTER` (either may be `*`);
    /// repeat the flag or separate with commas.
    #[arg(
        long = "allowed-target",
        env = "ARGOCD_PULL_ALLOWED_TARGETS",
        value_delimiter = ','
    )]
    pub allowed_targets: Vec<route::authz::AllowRule>,
    /// Whether Applications are checked against their AppProject (in
    /// `--argocd-namespace`) before delivery, as Argo CD checks them:
    /// `enforce`, or `ignore` (nothing on the hub checks projects; only
    /// for a migration, see docs/migration.md).
    #[arg(long, env = "ARGOCD_PULL_APP_PROJECTS", value_enum, default_value_t = AppProjectsMode::Enforce)]
    pub app_projects: AppProjectsMode,
    /// Deliver each project's project-scoped `repository` and `repo-creds`
    /// Secrets (those with a `project` key) with the AppProject, to the
    /// clusters that have an Application of that project (both transports;
    /// over gRPC to agents that offer the `projects` capability). Needs read access to Secrets in `--argocd-namespace`
    /// (docs/security.md says what that costs).
    #[arg(long, env = "ARGOCD_PULL_PROJECT_CREDENTIALS")]
    pub project_credentials: bool,
    /// Also export per-cluster series (a `cluster` label on the gRPC
    /// message, refusal and resync counters, and five gauges per cluster):
    /// about 14 series per cluster. Off, every series is fleet-level.
    #[arg(long, env = "ARGOCD_PULL_METRICS_PER_CLUSTER")]
    pub metrics_per_cluster: bool,
    #[command(flatten)]
    pub grpc: grpc::GrpcArgs,
    #[command(flatten)]
    pub certs: certs::CertArgs,
    #[command(flatten)]
    pub trees: status::trees::TreeArgs,
    #[command(flatten)]
    pub live: grpc::live::LiveArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AppProjectsMode {
    Enforce,
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthorizationMode {
    Placement,
    None,
}

/// Name of the leader Lease unless `--leader-election-id` says otherwise.
pub const LEASE_NAME: &str = "argocd-pull-hub-controller";

/// Runs until SIGTERM or SIGINT.
///
/// Every replica serves gRPC (its agents, from its own watches, writing
/// for the clusters it holds: [`grpc::claims`]); the leader also runs the
/// ManifestWork transport, the Argo CD cluster Secrets and the sweep, and
/// writes for the clusters no replica holds.
pub async fn run(args: Args) -> anyhow::Result<()> {
    // A password file that cannot be read stops the start, before anything runs.
    let tree_redis = args.trees.redis()?;
    let signals = shutdown::on_signals()?;
    let (stop, shutdown) = shutdown::channel();
    let readiness = Readiness::default();
    let mut registry = Registry::with_prefix("argocd_pull_hub");
    let metrics = metrics::Metrics::register(&mut registry);
    let grpc_metrics =
        grpc::metrics::GrpcMetrics::register(&mut registry, args.metrics_per_cluster);
    let wire_metrics = grpc::tls::WireMetrics::register(&mut registry);
    let api_metrics = argocd_pull_runtime::client::ApiMetrics::register(&mut registry);
    let page = report::StatusPage::default();
    let admin = Admin::new(readiness.clone(), registry).with_routes(page.routes());
    let server = tokio::spawn(admin.serve(args.admin.addr, shutdown.clone()));

    let client = match args.client.client(api_metrics).await {
        Ok(c) => c,
        Err(e) => {
            stop.fire();
            return Err(e);
        }
    };
    let version = match client.apiserver_version().await {
        Ok(v) => v,
        Err(e) => {
            stop.fire();
            anyhow::bail!("cannot reach the hub API server: {e}");
        }
    };
    tracing::info!(server = %version.git_version, argocd_namespace = %args.argocd_namespace, "connected to the hub");
    readiness.set("hub-api", true);
    // What a replica waits for before it is Ready: every replica serves
    // what the Service sends it (gRPC), leader or not.
    readiness.set("applications-synced", false);
    if args.grpc.grpc_addr.is_some() {
        readiness.set("grpc-synced", false);
    }

    // The leader Lease, in the background: serving does not wait for it.
    let lease_config = args.leader.enabled.then(|| args.leader.config(LEASE_NAME));
    // Checked at start, whether or not other replicas will use it.
    let live_peer = args.live.peer_address()?;
    let claims = match (&lease_config, args.grpc.grpc_addr) {
        (Some(c), Some(_)) => Some(grpc::claims::Claims::new(
            client.clone(),
            grpc::claims::ClaimsConfig {
                abandoned_after: args.grpc.abandoned_claim_after,
                live_address: live_peer,
                ..grpc::claims::ClaimsConfig::new(&c.namespace, &c.identity)
            },
        )),
        _ => None,
    };
    page.set_serving(true);
    // Only a signal stops a replica: one that loses the leader Lease steps
    // down and keeps serving ([`leading`]).
    tokio::spawn(async move {
        signals.wait().await;
        stop.fire();
    });
    let leadership = run_controllers(
        &args,
        client,
        metrics,
        (grpc_metrics, wire_metrics),
        readiness,
        &page,
        shutdown,
        lease_config,
        claims,
        tree_redis,
    )
    .await?;
    page.set_serving(false);
    server.await??;
    // The controllers have stopped: only now may the Lease go to another.
    if let Some(l) = leadership {
        l.release().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Every replica's work, until `shutdown` resolves, and the leader's
/// whenever this replica holds the Lease of `election` (always without
/// one); the Leadership held at the end, to release.
#[allow(clippy::too_many_arguments)]
async fn run_controllers(
    args: &Args,
    client: kube::Client,
    metrics: metrics::Metrics,
    (grpc_metrics, wires): (grpc::metrics::GrpcMetrics, grpc::tls::WireMetrics),
    readiness: Readiness,
    page: &report::StatusPage,
    shutdown: shutdown::Shutdown,
    election: Option<lease::LeaseConfig>,
    claims: Option<std::sync::Arc<grpc::claims::Claims>>,
    tree_redis: Option<argocd_pull_runtime::redis::Redis>,
) -> anyhow::Result<Option<lease::Leadership>> {
    let authorization = route::authz::Authorization {
        require_placement: args.authorization == AuthorizationMode::Placement,
        allow: args.allowed_targets.clone(),
        projects: (args.app_projects == AppProjectsMode::Enforce)
            .then(|| args.argocd_namespace.clone()),
    };
    let grpc_config = args
        .grpc
        .config_managed(authorization.clone(), args.certs.manage)
        .map(|config| grpc::GrpcConfig { wires, ..config });
    page.set_authorization(&authorization);
    let watches = watch::watches::Watches::new(watch::watches::Scope {
        grpc: grpc_config.is_some(),
        default_config: watch::mode::ConfigRef {
            namespace: args.certs.addon_namespace.clone(),
            name: args.certs.addon_deployment_config.clone(),
        },
        projects: authorization.projects.clone(),
        credentials: args.project_credentials,
    });
    let make_trees = tree_redis.map(|redis| {
        tracing::info!(
            redis = redis.addr(),
            "writing the hub copies' resource trees for the hub's argocd-server"
        );
        let (caches, namespace, tree_args) = (
            watches.caches(),
            args.argocd_namespace.clone(),
            args.trees.clone(),
        );
        move |grpc| status::trees::Trees::new(redis, caches, &namespace, &tree_args, grpc)
    });
    // The record of what each agent holds, given to the hub before its
    // index is built and before the ManifestWork transport decides
    // anything: a key an agent holds is not handed to an older claimant
    // while the record is still on its way.
    let holders = grpc_config
        .is_some()
        .then(|| grpc::holders::Holders::new(client.clone(), &args.leader.namespace));
    // The record of what the hub authorized, read before the index is
    // built and any project is sent: a copy kept after a refusal keeps
    // the project it was delivered with, and only that.
    let records = authorized::Records::new(client.clone(), &args.leader.namespace);
    let live = args.live.enabled()?;
    // The tree writer asks the gRPC transport which copies it delivers, so
    // with one the transport builds it.
    // The ManifestWork side hears of Applications that move to or from the
    // gRPC transport on this channel (its gate is built after the hub).
    let (switches, switched) = tokio::sync::mpsc::unbounded_channel();
    let (grpc, trees) = match grpc_config {
        Some(config) => {
            let hub = grpc::Hub::new(grpc::hub::HubParts {
                config,
                client: client.clone(),
                metrics: grpc_metrics,
                caches: watches.caches(),
                claims: claims.clone(),
                holders: holders.clone(),
                authorized: Some(records.clone()),
                trees: make_trees
                    .map(|make| -> grpc::hub::MakeTrees { Box::new(move |view| make(Some(view))) }),
                live_url: live.then(|| args.live.live_url.clone()).flatten(),
                switches: Some(switches),
            });
            let trees = hub.trees().cloned();
            (Some(hub), trees)
        }
        None => (None, make_trees.map(|make| make(None))),
    };
    let publishing_fleet = grpc
        .as_ref()
        .map(|hub| tokio::spawn(hub.clone().publish_fleet()));
    let holding = holders.map(|holders| {
        let watching = tokio::spawn(holders.clone().watch());
        (holders, watching)
    });
    let recording = tokio::spawn(records.clone().watch());
    // Both first lists at once.
    let holders_listed = async {
        if let Some((holders, _)) = &holding {
            holders.wait_listed(Duration::from_secs(10)).await;
        }
    };
    tokio::join!(holders_listed, records.wait_listed(Duration::from_secs(10)));
    let holding = match (holding, &grpc) {
        (Some((_, watching)), Some(hub)) => {
            Some((watching, tokio::spawn(hub.clone().keep_holders())))
        }
        _ => None,
    };
    let mut claiming = None;
    if let (Some(hub), Some(claims)) = (&grpc, &claims) {
        claiming = Some((
            tokio::spawn(claims.clone().run(shutdown.clone().wait())),
            tokio::spawn(hub.clone().follow_claims()),
        ));
    }
    let mut keeper = None;
    if let (Some(hub), true) = (&grpc, args.certs.manage) {
        // Every replica issues its own serving certificate from the shared
        // CAs (the writes of the CAs carry the version read: one wins).
        let mut k = certs::Keeper::new(client.clone(), args.certs.config(hub.config.tls.clone()));
        // The server reads the files at start: they must be there.
        let mut attempt = 0;
        while let Err(e) = k.pass().await {
            attempt += 1;
            if attempt == 5 {
                return Err(anyhow::anyhow!("cannot set up the gRPC certificates: {e}"));
            }
            tracing::warn!(error = %e, "cannot set up the gRPC certificates yet; retrying");
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        keeper = Some(tokio::spawn(k.run(shutdown.clone().wait())));
    }
    let grpc_server = match &grpc {
        Some(hub) => {
            let server = grpc::start(hub.clone(), shutdown.clone().wait()).await?;
            page.set_grpc(hub.clone(), hub.config.tls.cert.clone());
            // Agents are welcomed only once the hub sees everything
            // (`run` registered the check).
            let (hub, ready, claims) = (hub.clone(), readiness.clone(), claims.clone());
            tokio::spawn(async move {
                hub.wait_synced().await;
                if let Some(c) = claims {
                    c.wait_synced().await;
                }
                ready.set("grpc-synced", true);
            });
            Some(server)
        }
        None => None,
    };
    let live_server = match (&grpc, live) {
        (_, false) => None,
        (None, true) => {
            anyhow::bail!("the live endpoint (--live-addr) needs the gRPC transport (--grpc-addr)")
        }
        (Some(hub), true) => Some(
            grpc::live::serve(
                hub.clone(),
                &args.live,
                hub.config.tls.cert.clone(),
                hub.config.tls.key.clone(),
                shutdown.clone().wait(),
            )
            .await?,
        ),
    };
    let ctx = manifestwork::Context::new(
        client.clone(),
        render::work::WorkOptions {
            raw_feedback: args.raw_feedback,
            apply_timeout: args.work_apply_timeout,
            workers: args.workers.into(),
        },
        authorization,
        metrics.clone(),
        watches.caches(),
        grpc.clone(),
    );
    let _ = ctx.authorized.set(records);
    // One set of watches feeds both transports; the ManifestWork side
    // hears them once this replica leads.
    let gate = manifestwork::triggers::Gate::new(ctx.clone());
    let mut consumers: Vec<std::sync::Arc<dyn watch::watches::Consumer>> = vec![gate.clone()];
    if let Some(hub) = &grpc {
        consumers.push(hub.clone());
    }
    if let Some(t) = &trees {
        consumers.push(t.clone());
    }
    let writing_trees = trees.map(|t| tokio::spawn(t.run(shutdown.clone().wait())));
    let watching = tokio::spawn(watches.run(client.clone(), consumers, shutdown.clone().wait()));
    {
        let (caches, ready) = (ctx.caches.clone(), readiness.clone());
        tokio::spawn(async move {
            caches.wait_synced().await;
            ready.set("applications-synced", true);
        });
    }

    if grpc.is_some() {
        tokio::spawn(manifestwork::triggers::Gate::hear_switches(
            std::sync::Arc::downgrade(&gate),
            switched,
        ));
    }
    let leadership = leading::run(
        leading::Share {
            client,
            argocd_namespace: args.argocd_namespace.clone(),
            hub_hosts: args.client.server_hosts().await,
            sweep_interval: args.sweep_interval,
            ctx,
            gate,
            grpc: grpc.clone(),
            claims: claims.clone(),
            metrics,
            page: page.clone(),
            live: args.live.clone(),
        },
        election,
        shutdown.clone(),
    )
    .await;
    watching.await?;
    if let Some(w) = writing_trees {
        w.await?;
    }
    if let Some(server) = grpc_server {
        server.await?;
    }
    if let Some(server) = live_server {
        server.await?;
    }
    if let Some((claiming, following)) = claiming {
        claiming.await?;
        following.abort();
    }
    recording.abort();
    if let Some(p) = publishing_fleet {
        p.abort();
    }
    if let Some((watching, keeping)) = holding {
        watching.abort();
        keeping.abort();
    }
    if let Some(c) = &claims {
        c.retire().await;
    }
    if let Some(keeper) = keeper {
        keeper.await?;
    }
    Ok(leadership)
}
