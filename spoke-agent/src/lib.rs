//! The spoke-agent: dials the hub, applies the Applications it is sent for
//! the local Argo CD, and streams their status back.
//!
//! An Application's way, from the hub and back:
//!
//! 1. [`session`]: the connection to the hub; what it receives goes to
//! 2. [`worker`]: the passes over this cluster's Applications, parallel
//!    across them: [`worker::Applier`] writes them, [`worker::Commands`]
//!    runs the hub's commands on them;
//! 3. [`cache`]: the watch of this cluster's Applications, which the
//!    worker reads;
//! 4. [`reports`]: their status reports and digest, queued in
//! 5. [`state`]: what the agent holds across connections (instructions
//!    in, reports and acknowledgements out), which the session sends.
//!
//! Besides: [`apply`], the pure decisions (what is applied and reported,
//! how a command runs once); [`projects`], the AppProjects and credentials
//! the hub sends; [`tls`]: certificates reloaded from disk (reconnect
//! delays are the shared [`argocd_pull_runtime::backoff`]).

#![forbid(unsafe_code)]

pub mod apply;
pub mod args;
pub mod cache;
pub mod live;
pub mod metrics;
pub mod projects;
pub mod reports;
pub mod session;
pub mod state;
pub mod tls;
pub mod trees;
pub mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_runtime::{AdminArgs, ClientArgs, LogArgs, Readiness, admin::Admin, shutdown};
use clap::{Parser, ValueEnum};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use prometheus_client::registry::Registry;

#[derive(Parser, Clone, Debug)]
#[command(
    name = "spoke-agent",
    version,
    about = "Pulls Argo CD Applications from the argocd-pull hub into this cluster and reports their status back"
)]
pub struct Args {
    #[command(flatten)]
    pub log: LogArgs,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    /// Name of this managed cluster, as known to OCM. Only used in logs: the
    /// hub takes the cluster's identity from the client certificate.
    #[arg(long, env = "ARGOCD_PULL_CLUSTER_NAME")]
    pub cluster_name: String,
    /// gRPC address of the hub-controller, e.g. `https://hub.example.com:8443`.
    #[arg(long, env = "ARGOCD_PULL_HUB_ADDRESS")]
    pub hub_address: String,
    /// Client certificate (PEM) issued by OCM; reloaded when it changes.
    #[arg(
        long,
        env = "ARGOCD_PULL_TLS_CERT",
        default_value = "/managed/argocd-pull/tls.crt"
    )]
    pub tls_cert: PathBuf,
    /// Private key (PEM) of the client certificate; reloaded when it changes.
    #[arg(
        long,
        env = "ARGOCD_PULL_TLS_KEY",
        default_value = "/managed/argocd-pull/tls.key"
    )]
    pub tls_key: PathBuf,
    /// CA bundle (PEM) that signed the hub's serving certificate.
    #[arg(
        long,
        env = "ARGOCD_PULL_HUB_CA",
        default_value = "/managed/argocd-pull/ca.crt"
    )]
    pub hub_ca: PathBuf,
    /// Namespace of this cluster's Argo CD, where Applications are applied.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_NAMESPACE", default_value = "argocd")]
    pub argocd_namespace: String,
    /// Who owns the Applications: the hub (`managed`) or this cluster (`autonomous`).
    #[arg(long, env = "ARGOCD_PULL_MODE", value_enum, default_value_t = Mode::Managed)]
    pub mode: Mode,
    /// Shortest wait before reconnecting to the hub; it doubles with every
    /// failed attempt, with jitter, up to `--reconnect-max`.
    #[arg(long, env = "ARGOCD_PULL_RECONNECT_MIN", default_value = "500ms", value_parser = parse_duration)]
    pub reconnect_min: Duration,
    /// Longest wait before reconnecting to the hub.
    #[arg(long, env = "ARGOCD_PULL_RECONNECT_MAX", default_value = "30s", value_parser = parse_duration)]
    pub reconnect_max: Duration,
    /// The heartbeat interval to ask the hub for: shorter than three of
    /// them must be the idle timeout of every proxy and NAT on the way to
    /// the hub. `hub`: the hub's (`--grpc-heartbeat`, 10 s by default). The
    /// hub grants at most its own and at least its floor
    /// (`--grpc-heartbeat-min`, 2 s by default).
    #[arg(long, env = "ARGOCD_PULL_HEARTBEAT", default_value = "hub", value_parser = parse_heartbeat)]
    pub heartbeat: Duration,
    /// How often the certificate files are checked for a renewal.
    #[arg(long, env = "ARGOCD_PULL_TLS_RELOAD_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub tls_reload_interval: Duration,
    /// Writers to this cluster's API server, in parallel across Applications.
    #[arg(long, env = "ARGOCD_PULL_WORKERS", default_value_t = 16)]
    pub workers: usize,
    /// This cluster's Argo CD Redis (`host:port`, what its
    /// application-controller's `--redis` names, such as
    /// `argocd-redis.argocd.svc:6379`): report each Application's resource
    /// tree and managed resources from there to a hub that writes trees
    /// (capability `trees`, docs/ui.md). Unset, empty or `none`: only
    /// statuses go.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_REDIS")]
    pub argocd_redis: Option<String>,
    /// A file holding that Redis's password. Unset, the password is the
    /// `auth` key of `--argocd-redis-secret`.
    #[arg(long, env = "ARGOCD_PULL_ARGOCD_REDIS_PASSWORD_FILE")]
    pub argocd_redis_password_file: Option<PathBuf>,
    /// The Secret in `--argocd-namespace` whose `auth` key is that Redis's
    /// password (Argo CD's own), read through the API; none when it does
    /// not exist.
    #[arg(
        long,
        env = "ARGOCD_PULL_ARGOCD_REDIS_SECRET",
        default_value = "argocd-redis"
    )]
    pub argocd_redis_secret: String,
    /// What the agent serves of the hub's live endpoint.
    #[command(flatten)]
    pub live: args::LiveArgs,
    /// How the agent reaches the hub: the egress proxy and the wire.
    #[command(flatten)]
    pub route: args::RouteArgs,
}

/// A switch's value: `true`, `false`, or empty (`false`), as an
/// AddOnDeploymentConfig variable gives it.
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "false" | "0" | "no" | "off" => Ok(false),
        "true" | "1" | "yes" | "on" => Ok(true),
        _ => Err(format!("{s:?} is neither true nor false")),
    }
}

/// Durations like `500ms`, `30s`, `5m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 30s or 5m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{s:?} is not a duration such as 500ms, 30s or 5m")),
    };
    if d.is_zero() {
        return Err("the duration must be positive".into());
    }
    Ok(d)
}

/// What [`run_agent`] needs, from the flags (or a test).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    pub cluster_name: String,
    pub hub_address: String,
    pub tls: tls::TlsFiles,
    pub argocd_namespace: String,
    pub mode: Mode,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// `--heartbeat`: the interval asked of the hub (zero: the hub's).
    pub heartbeat: Duration,
    pub tls_reload_interval: Duration,
    pub workers: usize,
    /// `--argocd-redis` and its password file.
    pub argocd_redis: Option<trees::RedisConfig>,
    /// `--live-views` and `--terminal`.
    pub live: args::LiveArgs,
    /// `--proxy`, `--proxy-credentials-file` and the proxy variables;
    /// `--transport`, `--websocket-url` and `--websocket-ca-file`.
    pub route: session::wire::Route,
}

impl Args {
    /// The configuration from the flags and this process's environment
    /// (the proxy variables).
    pub fn config(&self) -> AgentConfig {
        self.config_with_env(|name| std::env::var(name).ok())
    }

    /// [`Args::config`] with the environment `env` reads.
    pub fn config_with_env(&self, env: impl Fn(&str) -> Option<String>) -> AgentConfig {
        AgentConfig {
            cluster_name: self.cluster_name.clone(),
            hub_address: self.hub_address.clone(),
            tls: tls::TlsFiles {
                cert: self.tls_cert.clone(),
                key: self.tls_key.clone(),
                ca: self.hub_ca.clone(),
            },
            argocd_namespace: self.argocd_namespace.clone(),
            mode: self.mode,
            backoff_min: self.reconnect_min,
            backoff_max: self.reconnect_max,
            heartbeat: self.heartbeat,
            tls_reload_interval: self.tls_reload_interval,
            workers: self.workers,
            argocd_redis: self
                .argocd_redis
                .clone()
                .filter(|a| !a.is_empty() && a != "none")
                .map(|addr| trees::RedisConfig {
                    addr,
                    password: match &self.argocd_redis_password_file {
                        Some(file) => trees::Password::File(file.clone()),
                        None => trees::Password::Secret(self.argocd_redis_secret.clone()),
                    },
                }),
            live: self.live.clone(),
            route: self.route.resolve(&self.hub_address, env),
        }
    }
}

/// `--heartbeat`: a duration, or `hub` (zero: ask for nothing).
fn parse_heartbeat(s: &str) -> Result<Duration, String> {
    match s {
        "hub" | "" => Ok(Duration::ZERO),
        _ => parse_duration(s).map_err(|e| format!("{e}, or hub")),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// The hub owns spec; this agent owns status and reverts local edits.
    Managed,
    /// Applications are defined here; the hub shows a read-only mirror.
    Autonomous,
}

/// What `/metrics` serves: the agent's own metrics and its API client's
/// (docs/operations.md lists them; hub-controller/tests/metrics.rs checks
/// that list against this).
pub fn registry() -> (
    Registry,
    metrics::AgentMetrics,
    argocd_pull_runtime::client::ApiMetrics,
) {
    let mut registry = Registry::with_prefix("argocd_pull_agent");
    let metrics = metrics::AgentMetrics::register(&mut registry);
    let api_metrics = argocd_pull_runtime::client::ApiMetrics::register(&mut registry);
    (registry, metrics, api_metrics)
}

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let shutdown = shutdown::on_signals()?;
    let readiness = Readiness::default();
    let (registry, metrics, api_metrics) = registry();
    let admin = Admin::new(readiness.clone(), registry);
    let server = tokio::spawn(admin.serve(args.admin.addr, shutdown.clone()));

    let client = args.client.client(api_metrics).await?;
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the managed cluster's API server: {e}"))?;
    tracing::info!(cluster = %args.cluster_name, server = %version.git_version, mode = ?args.mode, "connected to the managed cluster");
    readiness.set("cluster-api", true);

    run_agent(args.config(), client, metrics, readiness, shutdown).await;
    server.await??;
    tracing::info!("stopped");
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watched {
    Managed,
    Namespace,
}

/// The agent proper, until `shutdown`: the watch of this cluster's
/// Applications, the workers, and the connection to the hub. Everything it
/// starts stops when it returns or is dropped.
pub async fn run_agent(
    config: AgentConfig,
    client: kube::Client,
    metrics: metrics::AgentMetrics,
    readiness: Readiness,
    shutdown: shutdown::Shutdown,
) {
    readiness.set(session::HUB_CONNECTED, false);
    let ar = application_resource();
    let (api, watch_config, watched) = watched_applications(&config, &client, &ar);
    tracing::info!(cluster = %config.cluster_name, mode = ?config.mode, watched = ?watched, proxy = ?config.route.proxy, transport = ?config.route.wire.transport, "starting");
    let writer = reflector::store::Writer::new(ar);
    let store = writer.as_reader();
    let state = Arc::new(state::AgentState::default());
    let worker = Arc::new(worker::Worker::new(
        client.clone(),
        state.clone(),
        store.clone(),
        config.mode,
        metrics.clone(),
    ));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(queue_applications(
        writer,
        api,
        watch_config,
        worker.clone(),
    ));
    tasks.spawn(worker.clone().run(config.workers));
    let _ = store.wait_until_ready().await;
    let projects = (config.mode == Mode::Managed).then(|| {
        let p = projects::Projects::new(client.clone(), &config.argocd_namespace, state.clone());
        tasks.spawn(p.clone().run(shutdown.clone()));
        p
    });
    if let (Mode::Managed, Some(redis)) = (config.mode, &config.argocd_redis) {
        match redis.open(&client, &config.argocd_namespace).await {
            Ok(redis) => {
                let reporter = trees::Reporter::new(
                    redis,
                    &config.argocd_namespace,
                    store.clone(),
                    state.clone(),
                );
                tasks.spawn(reporter.run(shutdown.clone()));
            }
            Err(e) => tracing::error!(error = %e, "not reporting resource trees"),
        }
    }
    let live = (config.mode == Mode::Managed && config.live.views).then(|| {
        live::Reader::new(
            client.clone(),
            store.clone(),
            state.clone(),
            &config.cluster_name,
            &config.argocd_namespace,
        )
    });
    let terminal = live
        .as_ref()
        .filter(|_| config.live.terminal)
        .map(|reader| live::Terminals::new(reader.clone()));
    let connection = Arc::new(session::Connection {
        config,
        state,
        worker: worker.clone(),
        metrics,
        readiness,
        projects,
        live,
        terminal,
    });
    tasks.spawn(connection.run(shutdown.clone()));
    shutdown.wait().await;
    worker.stop();
    tasks.abort_all();
}

/// Which Applications the agent watches, by mode: in managed mode only those
/// it manages for the hub, anywhere; in autonomous mode everything in the
/// namespace of this cluster's Argo CD.
fn watched_applications(
    config: &AgentConfig,
    client: &kube::Client,
    ar: &kube::core::ApiResource,
) -> (Api<Application>, watcher::Config, Watched) {
    match config.mode {
        // Only what it manages for the hub.
        Mode::Managed => (
            Api::<Application>::all_with(client.clone(), ar),
            watcher::Config::default().labels(&format!("{}=true", keys::HUB_MANAGED)),
            Watched::Managed,
        ),
        // Everything the cluster's Argo CD reconciles.
        Mode::Autonomous => (
            Api::<Application>::namespaced_with(client.clone(), &config.argocd_namespace, ar),
            watcher::Config::default(),
            Watched::Namespace,
        ),
    }
}

/// Feeds the worker's store from the watch of Applications and queues every
/// Application that changes, until the task is aborted.
async fn queue_applications(
    writer: reflector::store::Writer<Application>,
    api: Api<Application>,
    watch_config: watcher::Config,
    worker: Arc<worker::Worker>,
) {
    let events = reflector(writer, watcher::watcher(api, watch_config)).default_backoff();
    tokio::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(
                watcher::Event::Apply(a) | watcher::Event::InitApply(a) | watcher::Event::Delete(a),
            ) => worker.changed(apply::key_of(&a)),
            // Applications gone while the watch was down have no delete
            // event: look at everything known again.
            Ok(watcher::Event::InitDone) => worker.look_again(),
            Ok(watcher::Event::Init) => {}
            Err(e) => tracing::warn!(error = %e, "watch of Applications failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(flags: &[&str]) -> AgentConfig {
        let required = [
            "spoke-agent",
            "--cluster-name",
            "c1",
            "--hub-address",
            "https://hub:8443",
        ];
        Args::try_parse_from(required.iter().chain(flags))
            .expect("the flags parse")
            .config_with_env(|_| None)
    }

    /// What `parse(&[])` must give: the required flags, and the
    /// documented defaults.
    fn defaults() -> AgentConfig {
        AgentConfig {
            cluster_name: "c1".into(),
            hub_address: "https://hub:8443".into(),
            tls: tls::TlsFiles {
                cert: "/managed/argocd-pull/tls.crt".into(),
                key: "/managed/argocd-pull/tls.key".into(),
                ca: "/managed/argocd-pull/ca.crt".into(),
            },
            argocd_namespace: "argocd".into(),
            mode: Mode::Managed,
            backoff_min: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            heartbeat: Duration::ZERO,
            tls_reload_interval: Duration::from_secs(10),
            workers: 16,
            argocd_redis: None,
            live: args::LiveArgs::default(),
            route: Default::default(),
        }
    }

    #[test]
    fn flags_have_the_documented_defaults() {
        Args::command().debug_assert();
        assert_eq!(parse(&[]), defaults());
    }

    #[test]
    fn the_argocd_redis_is_off_unless_named_and_its_password_argocds_secret() {
        for off in [
            &[][..],
            &["--argocd-redis", ""],
            &["--argocd-redis", "none"],
        ] {
            assert_eq!(parse(off).argocd_redis, None, "{off:?}");
        }
        assert_eq!(
            parse(&["--argocd-redis", "argocd-redis.argocd.svc:6379"]).argocd_redis,
            Some(trees::RedisConfig {
                addr: "argocd-redis.argocd.svc:6379".into(),
                password: trees::Password::Secret("argocd-redis".into()),
            })
        );
        assert_eq!(
            parse(&[
                "--argocd-redis",
                "r:6379",
                "--argocd-redis-password-file",
                "/p"
            ])
            .argocd_redis
            .map(|r| r.password),
            Some(trees::Password::File("/p".into()))
        );
    }

    #[test]
    fn flags_override_every_default() {
        let config = parse(&[
            "--reconnect-min",
            "250ms",
            "--reconnect-max",
            "2m",
            "--tls-reload-interval",
            "1h",
            "--workers",
            "4",
            "--mode",
            "autonomous",
            "--argocd-namespace",
            "gitops",
            "--tls-cert",
            "/c",
            "--tls-key",
            "/k",
            "--hub-ca",
            "/ca",
            "--live-views",
            "--terminal",
            "--proxy",
            "http://proxy:3128",
            "--proxy-credentials-file",
            "/p",
            "--heartbeat",
            "5s",
            "--transport",
            "websocket",
            "--websocket-url",
            "wss://ingress.example.com/hub",
            "--websocket-ca-file",
            "/ingress-ca",
        ]);
        let overridden = AgentConfig {
            tls: tls::TlsFiles {
                cert: "/c".into(),
                key: "/k".into(),
                ca: "/ca".into(),
            },
            argocd_namespace: "gitops".into(),
            mode: Mode::Autonomous,
            backoff_min: Duration::from_millis(250),
            backoff_max: Duration::from_secs(120),
            heartbeat: Duration::from_secs(5),
            tls_reload_interval: Duration::from_secs(3600),
            workers: 4,
            live: args::LiveArgs {
                views: true,
                terminal: true,
            },
            route: session::wire::Route {
                proxy: session::proxy::ProxyConfig {
                    url: Some("http://proxy:3128".into()),
                    source: "--proxy",
                    no_proxy: String::new(),
                    credentials_file: Some("/p".into()),
                },
                wire: session::wire::WireConfig {
                    transport: session::wire::Transport::Websocket,
                    url: Some("wss://ingress.example.com/hub".into()),
                    ca_file: Some("/ingress-ca".into()),
                },
            },
            ..defaults()
        };
        assert_eq!(config, overridden);
    }

    #[test]
    fn a_switch_is_true_false_or_empty() {
        for (v, want) in [
            ("", false),
            ("false", false),
            ("True", true),
            ("true", true),
        ] {
            assert_eq!(parse_switch(v), Ok(want), "{v:?}");
        }
        assert!(parse_switch("maybe").is_err());
        assert!(!parse(&["--live-views=false"]).live.views);
        assert!(parse(&["--live-views"]).live.views);
        assert!(!parse(&[]).live.terminal);
        assert!(parse(&["--terminal"]).live.terminal);
    }

    #[test]
    fn durations_must_be_positive_and_known() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        for bad in ["0s", "1d", "ms", "-1s", ""] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(Args::try_parse_from(["spoke-agent", "--cluster-name", "c1"]).is_err());
    }
}
