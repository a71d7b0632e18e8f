//! What every part of `bench-grpc` sets up on the hub: the certificates of
//! the gRPC server and of the agents (one test CA signs both), the objects
//! OCM leaves on the hub for a joined cluster with the `argocd-pull` addon
//! enabled, pull-model Applications, and the release hub-controller binary
//! running with its gRPC server on, seen only from the outside (its flags,
//! its admin port, `/proc`).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_apis::keys;
use argocd_pull_spoke_agent::tls::TlsFiles;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, net};

/// Where the agents put delivered Applications on their clusters.
pub const SPOKE_NS: &str = "argocd";
/// The hub-controller's own namespace (`--leader-election-namespace`), as
/// its Deployment has it: where it keeps its Leases, the record of what
/// each agent holds among them.
pub const CONTROLLER_NS: &str = "argocd-pull";

/// The subject OCM gives the client certificate of the `argocd-pull` addon's
/// agent on `cluster` (the identity the hub accepts by default).
pub fn agent_subject(cluster: &str, agent: &str) -> String {
    format!("system:open-cluster-management:cluster:{cluster}:addon:argocd-pull:agent:{agent}")
}

/// The test CA, the hub's serving certificate and the agents' certificates,
/// as files in a temporary folder (agents and the hub read them from disk,
/// as they do from their Secrets).
pub struct Pki {
    pub ca: Ca,
    dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new("bench-grpc-ca")?;
        std::fs::write(dir.path().join("ca.crt"), &ca.pem.cert_pem)?;
        let serving = ca.serving(&["localhost"], &[IpAddr::V4(Ipv4Addr::LOCALHOST)])?;
        write_pair(dir.path(), "hub", &serving)?;
        Ok(Self { ca, dir })
    }

    /// A Kubernetes client's configuration for a server at `url` whose
    /// certificate this CA signed, with no retries (every answer as the
    /// server gave it); no credentials yet.
    pub fn kube_config(&self, url: &str) -> Result<kube::Config> {
        use rustls::pki_types::{CertificateDer, pem::PemObject};
        let mut config = kube::Config::new(url.parse()?);
        let ca = CertificateDer::from_pem_slice(self.ca.pem.cert_pem.as_bytes())?;
        config.root_cert = Some(vec![ca.to_vec()]);
        config.default_retry = false;
        Ok(config)
    }

    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// A client certificate with `subject` written to files named `name`.
    pub fn agent_files(&self, name: &str, subject: &str) -> Result<TlsFiles> {
        let (cert, key) = write_pair(self.dir.path(), name, &self.client(subject)?)?;
        Ok(TlsFiles {
            cert,
            key,
            ca: self.ca_file(),
        })
    }

    pub fn client(&self, subject: &str) -> Result<CertKey> {
        Ok(self.ca.client(subject, None)?)
    }

    pub fn hub_files(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.path().join("hub.crt"),
            self.dir.path().join("hub.key"),
        )
    }
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

/// Creates `obj` (`plural` is its resource), leaving an existing one alone.
pub async fn create(client: &kube::Client, obj: Value, plural: &str) -> Result<()> {
    let (group, version) = obj["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .split_once('/')
        .unwrap_or(("", "v1"));
    let gvk = GroupVersionKind::gvk(group, version, obj["kind"].as_str().unwrap_or_default());
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
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

/// What OCM leaves on the hub for a joined cluster with the addon enabled:
/// its namespace, its ManagedCluster, and the ManagedClusterAddOn that makes
/// the hub deliver its Applications over gRPC.
pub async fn join(client: &kube::Client, cluster: &str) -> Result<()> {
    create(
        client,
        json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": cluster } }),
        "namespaces",
    )
    .await?;
    create(
        client,
        json!({ "apiVersion": "cluster.open-cluster-management.io/v1", "kind": "ManagedCluster",
                "metadata": { "name": cluster }, "spec": { "hubAcceptsClient": true } }),
        "managedclusters",
    )
    .await?;
    create(
        client,
        json!({ "apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn",
                "metadata": { "name": keys::ADDON_NAME, "namespace": cluster }, "spec": {} }),
        "managedclusteraddons",
    )
    .await
}

/// A pull-model hub Application for `cluster`, delivered to the cluster's
/// `argocd` namespace under the same name.
pub fn application(namespace: &str, name: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": { "name": name, "namespace": namespace,
            "labels": { keys::PULL_LABEL: "true" },
            "annotations": { keys::MANAGED_CLUSTER: cluster, keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
                             keys::SKIP_RECONCILE: "true" } },
        "spec": { "project": "default",
            "source": { "repoURL": "https://git.example/bench.git", "path": "app", "targetRevision": "v0" },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": name } }
    })
}

/// The hub-controller's log level when it logs to a file: `BENCH_HUB_LOG`,
/// or `info` (its default, and the level of argocd-agent's processes in
/// the comparisons).
pub fn file_log_level() -> String {
    std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "info".into())
}

/// How the hub-controller binary is run.
pub struct HubOptions<'a> {
    pub bin: &'a Path,
    pub hub: &'a Cluster,
    pub pki: &'a Pki,
    pub grpc_addr: SocketAddr,
    /// `--allowed-target` rules (`NAMESPACE=CLUSTER`).
    pub allowed_targets: &'a [String],
    /// Its log (stderr) goes here; `None`: to this process's stderr, at the
    /// level `BENCH_HUB_LOG` says (default `warn`).
    pub log: Option<PathBuf>,
    /// `--grpc-max-connections`; `None`: the hub's default (4096), which a
    /// fleet of more agents than that needs raised.
    pub max_connections: Option<usize>,
    /// Any other flags.
    pub extra_args: &'a [String],
}

/// The hub-controller process.
pub struct HubProcess {
    child: tokio::process::Child,
    pub admin: SocketAddr,
    pub pid: u32,
    pub started: Instant,
}

impl HubProcess {
    /// Starts it with the gRPC server on; returns at once (see [`Self::ready`]).
    pub fn start(o: &HubOptions<'_>) -> Result<Self> {
        Self::start_as(o, None)
    }

    /// Starts one of several replicas, as the Deployment runs them: leader
    /// election on (its Leases in namespace `argocd-pull`), `replica` its
    /// `POD_NAME`.
    pub fn start_replica(o: &HubOptions<'_>, replica: &str) -> Result<Self> {
        Self::start_as(o, Some(replica))
    }

    fn start_as(o: &HubOptions<'_>, replica: Option<&str>) -> Result<Self> {
        // Keep NOT_DEFAULT true to what this sets.
        let admin = net::free_addr()?;
        let (crt, key) = o.pki.hub_files();
        let mut cmd = tokio::process::Command::new(o.bin);
        cmd.arg("--kubeconfig")
            .arg(o.hub.kubeconfig())
            .args(["--admin-addr", &admin.to_string()]);
        match replica {
            Some(name) => {
                cmd.args(["--leader-election-namespace", "argocd-pull"])
                    .env("POD_NAME", name);
            }
            None => {
                cmd.arg("--leader-elect=false");
            }
        }
        cmd.args(["--grpc-addr", &o.grpc_addr.to_string()])
            .arg("--grpc-tls-cert")
            .arg(crt)
            .arg("--grpc-tls-key")
            .arg(key)
            .arg("--grpc-client-ca")
            .arg(o.pki.ca_file())
            .kill_on_drop(true);
        for rule in o.allowed_targets {
            cmd.args(["--allowed-target", rule]);
        }
        cmd.args(o.extra_args);
        if let Some(max) = o.max_connections {
            cmd.args(["--grpc-max-connections", &max.to_string()]);
        }
        match &o.log {
            Some(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                cmd.env("ARGOCD_PULL_LOG", file_log_level())
                    .stdout(Stdio::null())
                    .stderr(file);
            }
            None => {
                cmd.env(
                    "ARGOCD_PULL_LOG",
                    std::env::var("BENCH_HUB_LOG").unwrap_or_else(|_| "warn".into()),
                );
            }
        }
        let started = Instant::now();
        let child = cmd.spawn().context("starting the hub-controller")?;
        let pid = child.id().context("the hub-controller exited at once")?;
        // Killed with the hub's API server if this benchmark is.
        o.hub.adopt(pid);
        Ok(Self {
            child,
            admin,
            pid,
            started,
        })
    }

    /// Waits until `/readyz` answers 200 (the gRPC side's caches synced);
    /// returns when that was, from the start.
    pub async fn ready(&mut self, within: Duration) -> Result<Duration> {
        loop {
            if net::http_get(self.admin, "/readyz")
                .await
                .map(|r| r.0)
                .unwrap_or(0)
                == 200
            {
                return Ok(self.started.elapsed());
            }
            if let Some(status) = self.child.try_wait()? {
                bail!("the hub-controller exited before it was ready: {status}");
            }
            if self.started.elapsed() > within {
                bail!("the hub-controller is not ready after {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The sum of every sample of the metric `name` (all label sets).
    pub async fn metric(&self, name: &str) -> f64 {
        self.metric_with(name, &[]).await
    }

    /// The sum of metric `name`'s series whose labels include every one
    /// of `labels` (`verb="patch"`, ...).
    pub async fn metric_with(&self, name: &str, labels: &[&str]) -> f64 {
        let body = net::http_get(self.admin, "/metrics")
            .await
            .map(|r| r.1)
            .unwrap_or_default();
        body.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let (series, value) = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?,
                    None => ("", rest.strip_prefix(' ')?),
                };
                labels
                    .iter()
                    .all(|want| series.split(',').any(|have| have == *want))
                    .then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// A memory figure from `/proc/<pid>/status` in KiB: `VmHWM` is the
    /// peak resident set, `VmRSS` the current one.
    pub fn memory_kib(&self, field: &str) -> Option<u64> {
        testenv::procfs::memory_kib(self.pid, field)
    }

    /// Whether it has ended on its own (a crash, or an exit with an error).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Ends it the way a crash or an OOM kill would (SIGKILL).
    pub async fn kill(&mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// Stops it the way Kubernetes does (SIGTERM) and waits until it has
    /// exited; returns how long that took.
    pub async fn terminate(&mut self, within: Duration) -> Result<Duration> {
        let start = Instant::now();
        let status = net::terminate(&mut self.child, within).await;
        if !status.success() {
            bail!("the hub-controller exited with {status} after SIGTERM");
        }
        Ok(start.elapsed())
    }
}

/// What a single hub-controller of a comparison runs with other than its
/// defaults, besides the flags that say where things are (printed with
/// the settings). Without a Lease a restarted hub leads at once; with the
/// default one it would wait for its old Lease to expire before its
/// ManifestWork side and status writes resume.
pub const NOT_DEFAULT: &str = "--leader-elect=false (one replica, no Lease)";

/// The configuration of the one real agent the latency and trees parts
/// run in their own process: cluster `spoke1`, dialling `grpc_addr`,
/// managed mode, a quick reconnect; `argocd_redis` for trees.
pub fn agent_config(
    grpc_addr: SocketAddr,
    tls: argocd_pull_spoke_agent::tls::TlsFiles,
    argocd_redis: Option<argocd_pull_spoke_agent::trees::RedisConfig>,
) -> argocd_pull_spoke_agent::AgentConfig {
    argocd_pull_spoke_agent::AgentConfig {
        cluster_name: "spoke1".into(),
        hub_address: format!("https://{grpc_addr}"),
        tls,
        argocd_namespace: SPOKE_NS.into(),
        mode: argocd_pull_spoke_agent::Mode::Managed,
        backoff_min: Duration::from_millis(100),
        backoff_max: Duration::from_secs(2),
        heartbeat: Duration::ZERO,
        tls_reload_interval: Duration::from_secs(10),
        workers: 16,
        argocd_redis,
        live: Default::default(),
        route: Default::default(),
    }
}

/// The hub-controller's live endpoint on a free loopback port: its flags
/// (a token in `dir`, the benchmark's CA) and its URL.
pub fn live_endpoint(dir: &Path, pki: &Pki) -> anyhow::Result<(Vec<String>, String)> {
    let addr = testenv::net::free_addr()?;
    anyhow::ensure!(addr.ip().is_loopback(), "traffic stays on loopback");
    let tokens = dir.join("live-tokens");
    std::fs::write(&tokens, format!("{LIVE_TOKEN}\n"))?;
    let url = format!("https://{addr}");
    let flags = vec![
        format!("--live-addr={addr}"),
        format!("--live-url={url}"),
        format!("--live-token-file={}", tokens.display()),
        format!("--live-ca-file={}", pki.ca_file().display()),
    ];
    Ok((flags, url))
}

/// The token [`live_endpoint`] accepts.
const LIVE_TOKEN: &str = "bench-live-token";

/// A Kubernetes client of `url` (the live endpoint, or a cluster's path on
/// it: `<url>/clusters/<cluster>`) as argocd-server calls it: the token,
/// the benchmark's CA, no retries.
pub fn live_client(pki: &Pki, url: &str) -> anyhow::Result<kube::Client> {
    let mut config = pki.kube_config(url)?;
    config.auth_info.token = Some(LIVE_TOKEN.to_string().into());
    Ok(kube::Client::try_from(config)?)
}
