//! The gRPC transport end to end: one hub and two managed clusters (real
//! API servers), the hub-controller binary serving gRPC, a spoke-agent per
//! managed cluster (in-process, so that a test can kill it), certificates
//! from a test CA, and a stand-in for each managed cluster's Argo CD that
//! does what Argo CD does to an Application: reports health, runs a sync
//! set in `.operation` (recording it in `status.history`), honours a
//! refresh request, and releases its finalizer on deletion.
#![allow(dead_code)]

pub mod live;
pub mod mode;
pub mod replicas;
pub mod series;
pub mod terminal;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_pull_apis::argocd::{Application, application_resource};
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::ManagedClusterAddOn;
use argocd_pull_runtime::Readiness;
use argocd_pull_runtime::shutdown::{self, Trigger};
use argocd_pull_spoke_agent::{AgentConfig, Mode, metrics::AgentMetrics, tls::TlsFiles};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use testenv::pki::{Ca, CertKey};
use testenv::{Cluster, ClusterConfig, CrdSet, net, wait};

pub const TIMEOUT: Duration = Duration::from_secs(60);
/// Where delivered Applications go on the managed clusters.
pub const SPOKE_NS: &str = "argocd";

/// The certificate subject OCM issues to the argocd-pull addon's agent.
pub fn agent_subject(cluster: &str) -> String {
    format!("system:open-cluster-management:cluster:{cluster}:addon:argocd-pull:agent:spoke-agent")
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub ca: Ca,
    pub hub: Cluster,
    pub hub_client: kube::Client,
    pub spokes: Vec<Spoke>,
    /// Namespace of the test's Applications; its Placement selects both clusters.
    pub team: String,
    pub grpc_addr: SocketAddr,
    pub hub_process: Option<HubProcess>,
    /// The kubeconfig hub-controllers started from now on use, when not
    /// the hub's own (one through a proxy).
    pub hub_kubeconfig: Option<PathBuf>,
    hub_starts: usize,
    agent_starts: usize,
}

impl Drop for Env {
    fn drop(&mut self) {
        // A failed test shows what the hub-controllers and agent processes said.
        if std::thread::panicking() {
            let d = self.dir.path();
            for n in 1..=self.hub_starts {
                print_tail(
                    &format!("hub-controller log {n}"),
                    &d.join(format!("hub-{n}.log")),
                    80,
                );
            }
            for n in 1..=self.agent_starts {
                for s in &self.spokes {
                    let log = d.join(format!("agent-{}-{n}.log", s.name));
                    print_tail(&format!("spoke-agent {} log {n}", s.name), &log, 40);
                }
            }
        }
    }
}

/// The last `lines` lines of the log at `path`, if there is one.
fn print_tail(title: &str, path: &Path, lines: usize) {
    let Ok(log) = std::fs::read_to_string(path) else {
        return;
    };
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    eprintln!("--- {title} (last lines) ---");
    for line in tail.into_iter().rev() {
        eprintln!("{line}");
    }
}

pub struct Spoke {
    pub name: String,
    pub cluster: Cluster,
    pub client: kube::Client,
    pub agent: Option<Agent>,
    pub argocd: FakeArgoCd,
    pub certs: TlsFiles,
}

pub struct HubProcess {
    pub child: tokio::process::Child,
    pub admin: SocketAddr,
    /// Its log (stderr).
    pub log: PathBuf,
}

impl HubProcess {
    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails unless its log so far contains `text`.
    pub fn assert_logged(&self, text: &str) {
        let log = self.log_text();
        assert!(log.contains(text), "{text:?} not logged:\n{log}");
    }

    /// Waits until its log has a line containing `text`.
    pub async fn wait_logged(&self, what: &str, text: &str, timeout: Duration) {
        wait::until(what, timeout, || async {
            self.log_text()
                .contains(text)
                .then_some(())
                .ok_or("not yet")
        })
        .await;
    }

    pub async fn metrics(&self) -> String {
        net::http_get(self.admin, "/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default()
    }
}

/// An in-process spoke-agent; dropping or [`Agent::kill`]ing it stops
/// everything it runs at once, as a crash would.
pub struct Agent {
    trigger: Trigger,
    task: tokio::task::JoinHandle<()>,
    pub readiness: Readiness,
    pub metrics: AgentMetrics,
}

impl Agent {
    /// Stops it the way a crash would: every task dropped mid-flight.
    pub fn kill(self) {
        self.task.abort();
    }

    pub async fn stop(mut self) {
        self.trigger.fire();
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }

    pub fn connected(&self) -> bool {
        self.readiness.report().0
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The variables through which an agent process may pick up a proxy.
pub const PROXY_VARIABLES: [&str; 7] = [
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ARGOCD_PULL_PROXY",
];

/// A spoke-agent process: its admin port and its log; killed on drop.
pub struct AgentProcess {
    pub child: tokio::process::Child,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

impl AgentProcess {
    /// What it has logged so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until its log contains `text`.
    pub async fn wait_logged(&self, text: &str, timeout: Duration) {
        wait::until(&format!("the agent to log {text:?}"), timeout, || async {
            let log = self.log_text();
            match log.contains(text) {
                true => Ok(()),
                false => Err(log.lines().last().unwrap_or_default().to_string()),
            }
        })
        .await;
    }

    /// Whether its `/readyz` passes: connected to the hub.
    pub async fn connected(&self) -> bool {
        matches!(net::http_get(self.admin, "/readyz").await, Ok((200, _)))
    }

    /// Waits until it is connected to the hub.
    pub async fn wait_connected(&self, timeout: Duration) {
        wait::until("the agent process to connect", timeout, || async {
            if self.connected().await {
                Ok(())
            } else {
                // Its first words (an exit's error) and its last.
                let log = self.log_text();
                let lines: Vec<&str> = log.lines().collect();
                let head = lines.iter().take(3).copied().collect::<Vec<_>>().join("\n");
                let last = lines.last().copied().unwrap_or_default();
                Err(format!("{head}\n...\n{last}"))
            }
        })
        .await;
    }

    /// The value of an unlabelled metric, if the admin port answers.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        super::common::metric_at(self.admin, name).await
    }
}

/// Writes a PEM pair to `dir/name.{crt,key}` and returns the paths.
pub fn write_pair(dir: &Path, name: &str, pair: &CertKey) -> (PathBuf, PathBuf) {
    let (crt, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&crt, &pair.cert_pem).unwrap();
    std::fs::write(&key, &pair.key_pem).unwrap();
    (crt, key)
}

impl Env {
    /// A hub and `clusters` managed clusters, their ManagedClusters and
    /// addons on the hub, a team namespace whose Placement selects them, and
    /// the certificates; nothing running yet.
    pub async fn new(clusters: &[&str]) -> Env {
        testenv::init_tracing();
        let mut starts = vec![Cluster::start(ClusterConfig::new("hub", CrdSet::Hub))];
        for c in clusters {
            starts.push(Cluster::start(ClusterConfig::new(*c, CrdSet::Managed)));
        }
        let mut started = futures::future::join_all(starts).await.into_iter();
        let hub = started.next().unwrap().unwrap();
        let hub_client = hub.client().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("argocd-pull-test-grpc-ca").unwrap();
        std::fs::write(dir.path().join("ca.crt"), &ca.pem.cert_pem).unwrap();
        let serving = ca
            .serving(
                &["localhost"],
                &[std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)],
            )
            .unwrap();
        write_pair(dir.path(), "hub", &serving);

        let mut spokes = Vec::new();
        for (name, cluster) in clusters.iter().zip(started) {
            let cluster = cluster.unwrap();
            cluster.ensure_namespace(SPOKE_NS).await.unwrap();
            super::common::managed_cluster(&hub, name).await;
            enable_addon(&hub_client, name).await;
            let (cert, key) = write_pair(
                dir.path(),
                name,
                &ca.client(&agent_subject(name), None).unwrap(),
            );
            let client = cluster.client().await.unwrap();
            spokes.push(Spoke {
                name: name.to_string(),
                argocd: FakeArgoCd::start(client.clone()),
                client,
                cluster,
                agent: None,
                certs: TlsFiles {
                    cert,
                    key,
                    ca: dir.path().join("ca.crt"),
                },
            });
        }
        let team = hub.namespace("team").await.unwrap();
        super::common::placement_selects(&hub_client, &team, clusters).await;
        Env {
            dir,
            ca,
            hub,
            hub_client,
            spokes,
            team,
            grpc_addr: net::free_addr().unwrap(),
            hub_process: None,
            hub_kubeconfig: None,
            hub_starts: 0,
            agent_starts: 0,
        }
    }

    /// [`Env::new`] with the hub-controller serving and every cluster's
    /// agent connected in managed mode.
    pub async fn managed(clusters: &[&str]) -> Env {
        let mut env = Env::new(clusters).await;
        env.start_hub(&[]).await;
        for i in 0..clusters.len() {
            env.start_agent(i, Mode::Managed);
        }
        env.wait_connected().await;
        env
    }

    /// Starts the hub-controller binary serving gRPC, waits until ready.
    pub async fn start_hub(&mut self, extra: &[&str]) {
        let mut args = vec!["--leader-elect=false"];
        args.extend_from_slice(extra);
        let process = self.spawn_hub(self.grpc_addr, &args, &[]).await;
        self.hub_process = Some(process);
    }

    /// The hub-controller binary serving gRPC on `grpc` with the test's
    /// certificates, its admin port on a free address, `args` and `envs`
    /// added, logging to the next `hub-<n>.log`; once `/readyz` passes.
    pub(crate) async fn spawn_hub(
        &mut self,
        grpc: SocketAddr,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> HubProcess {
        let binary = Path::new(env!("CARGO_BIN_EXE_hub-controller"));
        self.spawn_hub_from(binary, grpc, args, envs).await
    }

    /// [`Env::spawn_hub`] with another build of the hub-controller (the
    /// previous release's, in the upgrade test).
    pub(crate) async fn spawn_hub_from(
        &mut self,
        binary: &Path,
        grpc: SocketAddr,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> HubProcess {
        let admin = net::free_addr().unwrap();
        // The hub-controller's own namespace (`--leader-election-namespace`'s
        // default), where it keeps its Leases: a Deployment's always exists.
        self.hub.ensure_namespace("argocd-pull").await.unwrap();
        let d = self.dir.path();
        self.hub_starts += 1;
        let log = d.join(format!("hub-{}.log", self.hub_starts));
        let mut child = tokio::process::Command::new(binary)
            .arg("--kubeconfig")
            .arg(
                self.hub_kubeconfig
                    .as_deref()
                    .unwrap_or_else(|| self.hub.kubeconfig()),
            )
            .args(["--admin-addr", &admin.to_string()])
            .args(["--grpc-addr", &grpc.to_string()])
            .arg("--grpc-tls-cert")
            .arg(d.join("hub.crt"))
            .arg("--grpc-tls-key")
            .arg(d.join("hub.key"))
            .arg("--grpc-client-ca")
            .arg(d.join("ca.crt"))
            // Short intervals, unless a test sets its own.
            .args(
                [("--grpc-heartbeat", "2s"), ("--grpc-digest-interval", "5s")]
                    .into_iter()
                    .filter(|(flag, _)| !args.iter().any(|a| a.starts_with(flag)))
                    .flat_map(|(flag, value)| [flag, value]),
            )
            .args(args)
            // The tests read per-cluster series; a test of the default
            // passes `false` in `envs`.
            .env("ARGOCD_PULL_METRICS_PER_CLUSTER", "true")
            .envs(envs.iter().copied())
            .env("ARGOCD_PULL_LOG", "info,kube_client=off")
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        loop {
            let last = net::http_get(admin, "/readyz").await;
            if matches!(last, Ok((200, _))) {
                break;
            }
            // An exit (a port taken, a bad flag) fails at once, with the
            // log that says why; so does a process that never gets ready.
            let exited = child.try_wait().unwrap();
            if exited.is_some() || started.elapsed() > TIMEOUT {
                panic!(
                    "the hub-controller did not get ready (exited: {exited:?}, last /readyz: {last:?}); its log {}:\n{}",
                    log.display(),
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        HubProcess { child, admin, log }
    }

    /// Kills the hub-controller with SIGKILL: no goodbye to anyone.
    pub async fn kill_hub(&mut self) {
        if let Some(mut p) = self.hub_process.take() {
            p.child.start_kill().unwrap();
            let _ = p.child.wait().await;
        }
    }

    /// Everything every hub-controller process of this test has logged.
    /// Fails unless the hub-controllers' logs contain `text`.
    pub fn assert_logged(&self, text: &str) {
        let log = self.hub_log();
        assert!(log.contains(text), "{text:?} not logged:\n{log}");
    }

    pub fn hub_log(&self) -> String {
        (1..=self.hub_starts)
            .map(|n| {
                std::fs::read_to_string(self.dir.path().join(format!("hub-{n}.log")))
                    .unwrap_or_default()
            })
            .collect()
    }

    pub fn hub_address(&self) -> String {
        format!("https://{}", self.grpc_addr)
    }

    /// The agent configuration of spoke `i`, dialling `address`.
    pub fn agent_config(&self, i: usize, address: &str, mode: Mode) -> AgentConfig {
        let s = &self.spokes[i];
        AgentConfig {
            cluster_name: s.name.clone(),
            hub_address: address.to_string(),
            tls: s.certs.clone(),
            argocd_namespace: SPOKE_NS.into(),
            mode,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            heartbeat: Duration::ZERO,
            tls_reload_interval: Duration::from_millis(500),
            workers: 8,
            argocd_redis: None,
            live: Default::default(),
            route: Default::default(),
        }
    }

    /// Starts spoke `i`'s agent with `config`.
    pub fn start_agent_with(&mut self, i: usize, config: AgentConfig) {
        let (trigger, stop) = shutdown::channel();
        let readiness = Readiness::default();
        readiness.set("cluster-api", true);
        let metrics = AgentMetrics::default();
        let task = tokio::spawn(argocd_pull_spoke_agent::run_agent(
            config,
            self.spokes[i].client.clone(),
            metrics.clone(),
            readiness.clone(),
            stop,
        ));
        self.spokes[i].agent = Some(Agent {
            trigger,
            task,
            readiness,
            metrics,
        });
    }

    /// Spoke `i`'s agent as a process of another build of the spoke-agent
    /// (the previous release's, in the upgrade test), dialling `address`,
    /// logging to `agent-<cluster>-<n>.log`.
    pub fn spawn_agent_from(
        &mut self,
        binary: &Path,
        i: usize,
        address: &str,
    ) -> tokio::process::Child {
        self.spawn_agent_process(binary, i, address, &[], &[]).child
    }

    /// [`Env::spawn_agent_from`] with `envs` and `args` added, and none of
    /// the proxy variables of the test's own environment.
    pub fn spawn_agent_process(
        &mut self,
        binary: &Path,
        i: usize,
        address: &str,
        envs: &[(&str, &str)],
        args: &[&str],
    ) -> AgentProcess {
        let command = tokio::process::Command::new(binary);
        self.spawn_agent_command(command, i, address, envs, args)
    }

    /// [`Env::spawn_agent_process`] with `command`: the binary, perhaps
    /// run inside a network namespace.
    pub fn spawn_agent_command(
        &mut self,
        mut command: tokio::process::Command,
        i: usize,
        address: &str,
        envs: &[(&str, &str)],
        args: &[&str],
    ) -> AgentProcess {
        let s = &self.spokes[i];
        self.agent_starts += 1;
        let log = self
            .dir
            .path()
            .join(format!("agent-{}-{}.log", s.name, self.agent_starts));
        let admin = net::free_addr().unwrap();
        for v in PROXY_VARIABLES {
            command.env_remove(v);
        }
        let child = command
            .arg("--kubeconfig")
            .arg(s.cluster.kubeconfig())
            .args(["--admin-addr", &admin.to_string()])
            .args(["--cluster-name", &s.name, "--hub-address", address])
            .arg("--tls-cert")
            .arg(&s.certs.cert)
            .arg("--tls-key")
            .arg(&s.certs.key)
            .arg("--hub-ca")
            .arg(&s.certs.ca)
            .args(["--argocd-namespace", SPOKE_NS])
            .args(["--reconnect-min", "100ms", "--reconnect-max", "2s"])
            .args(args)
            .env("ARGOCD_PULL_LOG", "info,kube_client=off")
            .envs(envs.iter().copied())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        AgentProcess { child, admin, log }
    }

    pub fn start_agent(&mut self, i: usize, mode: Mode) {
        let config = self.agent_config(i, &self.hub_address(), mode);
        self.start_agent_with(i, config);
    }

    /// Starts cluster `i`'s agent in managed mode and waits until every
    /// running agent is connected.
    pub async fn connect_agent(&mut self, i: usize) {
        self.start_agent(i, Mode::Managed);
        self.wait_connected().await;
    }

    /// Waits until every running agent is connected.
    pub async fn wait_connected(&self) {
        wait::until("the agents to connect", TIMEOUT, || async {
            let down: Vec<&str> = self
                .spokes
                .iter()
                .filter(|s| s.agent.as_ref().is_some_and(|a| !a.connected()))
                .map(|s| s.name.as_str())
                .collect();
            if down.is_empty() {
                Ok(())
            } else {
                Err(down.join(","))
            }
        })
        .await;
    }

    pub fn hub_apps(&self) -> Api<Application> {
        Api::namespaced_with(self.hub_client.clone(), &self.team, &application_resource())
    }

    pub fn spoke_apps(&self, i: usize) -> Api<Application> {
        Api::namespaced_with(
            self.spokes[i].client.clone(),
            SPOKE_NS,
            &application_resource(),
        )
    }

    /// Creates [`Env::app`]`(name, i, extra)` on the hub.
    pub async fn create(&self, name: &str, i: usize, extra: Value) -> Application {
        super::common::create(&self.hub_apps(), &self.app(name, i, extra)).await
    }

    /// A pull-model Application for cluster `i`, delivered to `argocd` there.
    pub fn app(&self, name: &str, i: usize, extra: Value) -> Application {
        let mut annotations = json!({
            keys::MANAGED_CLUSTER: self.spokes[i].name,
            keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
            keys::SKIP_RECONCILE: "true",
        });
        if let Some(Value::Object(more)) = extra.pointer("/metadata/annotations") {
            for (k, v) in more {
                annotations[k] = v.clone();
            }
        }
        // Only annotations may be given under metadata (finalizers go at
        // the top level, as `common::app` takes them).
        let mut rest = extra.clone();
        if let Value::Object(m) = &mut rest {
            m.remove("metadata");
        }
        super::common::app(name, &self.team, annotations, rest)
    }

    /// Every hub Application of the team, by name.
    pub async fn hub_state(&self) -> BTreeMap<String, Application> {
        super::common::by_name(&self.hub_apps(), &Default::default())
            .await
            .unwrap()
    }

    /// Converged: for every hub Application of the team on a spoke in
    /// `expected` (name -> spoke index), the spoke copy exists with the hub's
    /// spec, the hub copy shows the spoke's status and carries no command;
    /// no other Application is managed for the hub on any spoke.
    pub async fn converged(&self, expected: &BTreeMap<String, usize>) -> Result<(), String> {
        let hub = self.hub_state().await;
        if hub.keys().collect::<Vec<_>>() != expected.keys().collect::<Vec<_>>() {
            return Err(format!("hub has {:?}", hub.keys().collect::<Vec<_>>()));
        }
        for (i, _) in self.spokes.iter().enumerate() {
            let managed =
                kube::api::ListParams::default().labels(&format!("{}=true", keys::HUB_MANAGED));
            let spoke = super::common::by_name(&self.spoke_apps(i), &managed).await?;
            let want: Vec<&String> = expected
                .iter()
                .filter(|(_, s)| **s == i)
                .map(|(n, _)| n)
                .collect();
            if spoke.keys().collect::<Vec<_>>() != want {
                return Err(format!(
                    "spoke {i} has {:?}, want {want:?}",
                    spoke.keys().collect::<Vec<_>>()
                ));
            }
            for name in want {
                let (h, s) = (&hub[name], &spoke[name]);
                let mut hub_spec = h.data["spec"].clone();
                hub_spec["destination"] = json!({ "server": "https://kubernetes.default.svc", "namespace": hub_spec["destination"]["namespace"] });
                if s.data["spec"] != hub_spec {
                    return Err(format!(
                        "{name}: spoke spec {} != hub spec {}",
                        s.data["spec"], hub_spec
                    ));
                }
                if s.metadata.deletion_timestamp.is_some() {
                    return Err(format!("{name}: being deleted on spoke {i}"));
                }
                let hub_status = h.data.get("status").cloned().unwrap_or_default();
                let spoke_status = s.data.get("status").cloned().unwrap_or_default();
                if hub_status != spoke_status {
                    return Err(format!(
                        "{name}: hub status {hub_status} != spoke status {spoke_status}"
                    ));
                }
                if h.data.get("operation").is_some_and(|o| !o.is_null())
                    || h.annotations().contains_key(keys::REFRESH)
                    || h.annotations().contains_key(keys::SYNC_REQUEST)
                {
                    return Err(format!("{name}: a command is still pending on the hub"));
                }
            }
        }
        Ok(())
    }
}

/// What OCM's `clusteradm addon enable` does: a ManagedClusterAddOn named
/// after the addon in the cluster's namespace.
pub async fn enable_addon(hub: &kube::Client, cluster: &str) {
    let addon: ManagedClusterAddOn = serde_json::from_value(json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1", "kind": "ManagedClusterAddOn",
        "metadata": { "name": keys::ADDON_NAME, "namespace": cluster },
        "spec": {}
    }))
    .unwrap();
    match Api::<ManagedClusterAddOn>::namespaced(hub.clone(), cluster)
        .create(&PostParams::default(), &addon)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("{e}"),
    }
}

pub async fn disable_addon(hub: &kube::Client, cluster: &str) {
    Api::<ManagedClusterAddOn>::namespaced(hub.clone(), cluster)
        .delete(keys::ADDON_NAME, &Default::default())
        .await
        .unwrap();
}

/// A stand-in for a managed cluster's Argo CD, acting on every Application
/// of the cluster as its application controller would.
pub struct FakeArgoCd {
    task: tokio::task::JoinHandle<()>,
    /// Sync operations run, by Application name, in order (their revisions).
    pub syncs: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    /// Refreshes done, by Application name.
    pub refreshes: Arc<Mutex<BTreeMap<String, u32>>>,
}

impl Drop for FakeArgoCd {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeArgoCd {
    pub fn start(client: kube::Client) -> Self {
        let syncs: Arc<Mutex<BTreeMap<String, Vec<String>>>> = Arc::default();
        let refreshes: Arc<Mutex<BTreeMap<String, u32>>> = Arc::default();
        let (s, r) = (syncs.clone(), refreshes.clone());
        let task = tokio::spawn(async move {
            let api: Api<Application> = Api::all_with(client.clone(), &application_resource());
            let events = watcher::watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects();
            tokio::pin!(events);
            while let Some(Ok(app)) = events.next().await {
                act(&client, &app, &s, &r).await;
            }
        });
        Self {
            task,
            syncs,
            refreshes,
        }
    }

    /// Stops acting, for a test that plays Argo CD's status writes itself.
    pub fn stop(&self) {
        self.task.abort();
    }

    pub fn syncs_of(&self, name: &str) -> Vec<String> {
        self.syncs
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    pub fn refreshes_of(&self, name: &str) -> u32 {
        self.refreshes
            .lock()
            .unwrap()
            .get(name)
            .copied()
            .unwrap_or(0)
    }
}

async fn act(
    client: &kube::Client,
    app: &Application,
    syncs: &Mutex<BTreeMap<String, Vec<String>>>,
    refreshes: &Mutex<BTreeMap<String, u32>>,
) {
    let api: Api<Application> = Api::namespaced_with(
        client.clone(),
        &app.namespace().unwrap_or_default(),
        &application_resource(),
    );
    let name = app.name_any();
    let rv = app.resource_version();
    let patch = if app.metadata.deletion_timestamp.is_some() {
        if app.finalizers().is_empty() {
            return;
        }
        // Cascade-deleted the resources; lets the Application go.
        json!({ "metadata": { "finalizers": null, "resourceVersion": rv } })
    } else if let Some(op) = app.data.get("operation").filter(|o| !o.is_null()) {
        let revision = op
            .pointer("/sync/revision")
            .and_then(Value::as_str)
            .unwrap_or("HEAD")
            .to_string();
        let mut history = app
            .data
            .pointer("/status/history")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let id = history.len() as i64 + 1;
        let started = format!("2026-01-01T00:{:02}:{:02}Z", id / 60 % 60, id % 60);
        history.push(json!({ "id": id, "revision": revision, "deployedAt": started }));
        json!({
            "metadata": { "resourceVersion": rv },
            "operation": null,
            "status": {
                "health": { "status": "Healthy" },
                "sync": { "status": "Synced", "revision": revision },
                "operationState": { "operation": op, "phase": "Succeeded", "startedAt": started, "finishedAt": started },
                "history": history,
            }
        })
    } else if let Some(kind) = app.annotations().get(keys::REFRESH) {
        let _ = kind;
        json!({
            "metadata": { "resourceVersion": rv, "annotations": { keys::REFRESH: null } },
            "status": { "reconciledAt": "2026-01-01T01:00:00Z" },
        })
    } else if app.data.pointer("/status/health").is_none() {
        json!({
            "metadata": { "resourceVersion": rv },
            "status": { "health": { "status": "Healthy" }, "sync": { "status": "Synced" } },
        })
    } else {
        return;
    };
    let ran_sync = patch.get("operation").is_some();
    let ran_refresh = patch.pointer("/status/reconciledAt").is_some();
    if api
        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .is_ok()
    {
        if ran_sync {
            let revision = app
                .data
                .pointer("/operation/sync/revision")
                .and_then(Value::as_str)
                .unwrap_or("HEAD");
            syncs
                .lock()
                .unwrap()
                .entry(name.clone())
                .or_default()
                .push(revision.to_string());
        }
        if ran_refresh {
            *refreshes.lock().unwrap().entry(name).or_default() += 1;
        }
    }
}

/// A TCP proxy between agents and the hub that a test can cut: every
/// connection through it is dropped at once, as a broken network would.
pub struct Proxy {
    pub addr: SocketAddr,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
    refuse: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

impl Proxy {
    pub async fn start(to: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (c, r) = (conns.clone(), refuse.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if r.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                c.lock().unwrap().push(conn.abort_handle());
            }
        });
        Proxy {
            addr,
            conns,
            refuse,
            task,
        }
    }

    /// Drops every open connection.
    pub fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// While down, new connections are dropped as soon as accepted.
    pub fn set_down(&self, down: bool) {
        self.refuse.store(down, std::sync::atomic::Ordering::SeqCst);
        if down {
            self.cut();
        }
    }

    pub fn address(&self) -> String {
        format!("https://{}", self.addr)
    }
}
