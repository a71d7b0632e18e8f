//! The argocd-pull addon on real OCM, for `addon.rs` and
//! `addon_lifecycle.rs`: a hub running OCM's registration, placement and
//! addon-manager with `cluster1` and `cluster2` joined for real, each with
//! a real node (kubelet, containerd, runc; `testenv::node`) holding the
//! spoke-agent image, the addon's hub side installed as a user installs it,
//! and the hub-controller binary keeping the certificates.
//!
//! Nothing plays OCM or the kubelet on the agents' path: OCM's
//! addon-manager renders the agent's Deployment, the work agent applies it,
//! the node's kubelet runs it from the built image with the Secret and
//! ConfigMap the real CSR flow and the hub-controller filled, and its
//! readiness probe is what OCM's health check reads. The agents dial the
//! hub at [`HUB_GRPC`] inside their node, which leads to the
//! hub-controller's loopback port (a relay, as a load balancer would).
//!
//! One step still runs the agent in the test process
//! (`testenv::kubelet::materialize` and [`Agent`]): an agent holding an
//! expired certificate, which OCM's registration agent would replace in
//! the pod's Secret before the agent could show what it does with it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use argocd_pull_apis::argocd::Application;
use argocd_pull_apis::keys;
use argocd_pull_apis::ocm::{AddOnDeploymentConfig, ManagedClusterAddOn, ManifestWork};
use argocd_pull_runtime::Readiness;
use argocd_pull_runtime::shutdown::{self, Trigger};
use argocd_pull_spoke_agent::AgentConfig;
use argocd_pull_spoke_agent::metrics::AgentMetrics;
use clap::Parser;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node as NodeObject, Pod, Secret};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::node::Node;
use testenv::ocm::{Fleet, JoinOptions};
use testenv::stack::pods::{self, HUB_GRPC};
use testenv::{Cluster, kubelet, net, paths, wait};

use super::{Binary, app, apps_api};

pub const TIMEOUT: Duration = Duration::from_secs(120);
/// The Argo CD namespace of the managed clusters.
pub const SPOKE_NS: &str = "argocd";
pub const AGENT_NS: &str = argocd_pull_addon::AGENT_NAMESPACE;
pub const AGENT: &str = argocd_pull_addon::AGENT_NAME;
pub const CLUSTERS: [&str; 2] = ["cluster1", "cluster2"];

pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// The name of the work OCM's addon-manager deploys the agent with.
pub fn deploy_work() -> String {
    format!("addon-{}-deploy-0", keys::ADDON_NAME)
}

/// The user OCM's CSR flow issues the agent of `cluster` a certificate for.
pub fn agent_subject(cluster: &str) -> String {
    format!(
        "system:open-cluster-management:cluster:{cluster}:addon:{}:agent:{AGENT}",
        keys::ADDON_NAME
    )
}

/// Runs a command line tool, failing the test with its output.
pub async fn run(tool: &Path, args: &[&str]) -> String {
    let mut cmd = tokio::process::Command::new(tool);
    cmd.args(args);
    output(cmd, &format!("{} {args:?}", tool.display())).await
}

/// Runs `cmd` (`what`), failing the test with its output.
async fn output(mut cmd: tokio::process::Command, what: &str) -> String {
    let out = cmd.output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

/// The commands of the `sh` block that follows `<!-- test: name -->` in
/// the document `doc` (a path in the repository): what the document tells
/// the user to type, so that the test types exactly that.
pub fn doc_commands(doc: &str, name: &str) -> String {
    let text = std::fs::read_to_string(repo_file(doc)).unwrap();
    let marker = format!("<!-- test: {name} -->");
    let (_, rest) = text
        .split_once(&marker)
        .unwrap_or_else(|| panic!("{doc} has no {marker}"));
    let block = rest
        .trim_start()
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("in {doc}, {marker} is not followed by a ```sh block"));
    let (commands, _) = block
        .split_once("\n```")
        .unwrap_or_else(|| panic!("in {doc}, the block after {marker} does not end"));
    commands.to_string()
}

/// Runs `commands` with `sh -eu` at the top of the repository, as a user
/// of the hub would: the harness's kubectl and clusteradm first on the
/// PATH, `KUBECONFIG` the hub's.
pub async fn sh(commands: &str, kubeconfig: &Path) -> String {
    let path = format!(
        "{}:{}",
        paths::bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args(["-euxc", commands])
        .current_dir(repo_file(""))
        .env("PATH", path)
        .env("KUBECONFIG", kubeconfig);
    output(cmd, commands).await
}

pub fn adc_api(client: &kube::Client) -> Api<AddOnDeploymentConfig> {
    Api::namespaced(client.clone(), argocd_pull_addon::HUB_NAMESPACE)
}

/// The agent's configuration from its pod's command line, as the binary
/// would parse it, with a faster reconnect and certificate reload.
pub fn agent_config(pod: &kubelet::Pod) -> AgentConfig {
    let mut argv = vec!["spoke-agent".to_string()];
    argv.extend(pod.args.iter().cloned());
    argv.push(format!("--kubeconfig={}", pod.kubeconfig.display()));
    argv.push("--reconnect-max=2s".into());
    argv.push("--tls-reload-interval=1s".into());
    argocd_pull_spoke_agent::Args::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("the Deployment's command line {argv:?}: {e}"))
        .config()
}

/// The hub's serving CA, as the agents on `cluster` get it.
pub async fn hub_ca(fleet: &Fleet, cluster: &str) -> String {
    let client = fleet.cluster(cluster).client().await.unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, AGENT_NS)
        .get(argocd_pull_addon::HUB_CA_CONFIGMAP)
        .await
        .unwrap()
        .data
        .unwrap_or_default()
        .remove("ca.crt")
        .unwrap_or_default()
}

/// The agent of `spoke`'s Deployment (its pod made in `dir`), with its
/// configuration, but holding `identity` and dialling `address`: the pod
/// dials HUB_GRPC, an address only inside the node; from here the hub is
/// its loopback port.
pub async fn agent_holding(
    spoke: &Cluster,
    dir: &Path,
    address: &str,
    identity: &testenv::pki::CertKey,
) -> (kubelet::Pod, AgentConfig) {
    let pod = kubelet::materialize(spoke, AGENT_NS, AGENT, dir)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{}'s agent Deployment", spoke.name()));
    let mut config = agent_config(&pod);
    config.hub_address = address.to_string();
    std::fs::write(&config.tls.cert, &identity.cert_pem).unwrap();
    std::fs::write(&config.tls.key, &identity.key_pem).unwrap();
    (pod, config)
}

/// A spoke-agent running in this process, on a runtime of its own: like
/// the process of a pod, stopping it ends everything it started (a task
/// it left behind would keep its stream to the hub open).
pub struct Agent {
    trigger: Trigger,
    task: tokio::task::JoinHandle<()>,
    runtime: Option<tokio::runtime::Runtime>,
    pub readiness: Readiness,
    pub metrics: AgentMetrics,
}

impl Agent {
    /// Starts an agent with `config`, as the service account of
    /// `kubeconfig`.
    pub async fn start(config: AgentConfig, kubeconfig: &Path) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("spoke-agent")
            .enable_all()
            .build()
            .unwrap();
        let (trigger, stop) = shutdown::channel();
        let readiness = Readiness::default();
        readiness.set("cluster-api", true);
        let metrics = AgentMetrics::default();
        let (kubeconfig, r, m) = (kubeconfig.to_path_buf(), readiness.clone(), metrics.clone());
        let task = runtime.spawn(async move {
            let client = testenv::client_for(&kubeconfig).await.unwrap();
            argocd_pull_spoke_agent::run_agent(config, client, m, r, stop).await;
        });
        Self {
            trigger,
            task,
            runtime: Some(runtime),
            readiness,
            metrics,
        }
    }

    pub fn connected(&self) -> bool {
        self.readiness.report().0
    }

    /// Stops it as the kubelet stops a pod: SIGTERM (the agent's graceful
    /// shutdown), then whatever is left is killed with the process.
    pub async fn stop(mut self) {
        self.trigger.fire();
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// What the agent's pods on a cluster show.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// A container of the agent runs (the Deployment's pod, or one still
    /// terminating).
    pub running: bool,
    /// The Deployment's pod is Ready, which its readiness probe (the
    /// agent's `/readyz`) says only while it is connected to the hub.
    pub connected: bool,
    /// Container restarts over the agent's pods.
    pub restarts: i32,
}

/// The agent OCM deploys on one cluster, as its pods on the cluster's real
/// node show it.
pub struct AgentPod {
    cluster: &'static Cluster,
    node: String,
}

impl AgentPod {
    /// What the agent's pods show now.
    pub async fn now(&self) -> Result<Seen, String> {
        let client = self.cluster.client().await.map_err(|e| e.to_string())?;
        let status = pods::status(&client, AGENT_NS, AGENT)
            .await
            .map_err(|e| e.to_string())?;
        let running = Api::<Pod>::namespaced(client, AGENT_NS)
            .list(&Default::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
            .flatten()
            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
        Ok(Seen {
            running,
            connected: status.ready,
            restarts: status.restarts,
        })
    }

    /// Waits until what the pods show satisfies `check`.
    pub async fn shows(&self, what: &str, mut check: impl FnMut(&Seen) -> bool) {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let seen = self.now().await;
            if seen.as_ref().is_ok_and(&mut check) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {TIMEOUT:?} waiting for {what}; last seen: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Takes the agent off its node, as when the node is drained: the node
    /// is cordoned and the pod deleted (its replacement stays Pending) until
    /// [`AgentPod::resume`].
    pub async fn hold(&self) {
        self.cordon(true).await;
        let pods: Api<Pod> = Api::namespaced(self.cluster.client().await.unwrap(), AGENT_NS);
        pods.delete_collection(&Default::default(), &Default::default())
            .await
            .unwrap();
    }

    /// Uncordons the node: the pending pod is scheduled and starts.
    pub async fn resume(&self) {
        self.cordon(false).await;
    }

    async fn cordon(&self, unschedulable: bool) {
        let nodes: Api<NodeObject> = Api::all(self.cluster.client().await.unwrap());
        nodes
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
            )
            .await
            .unwrap();
    }
}

/// `Ok` when the cluster's ManagedClusterAddOn has condition `type_` True.
pub async fn condition(hub: &kube::Client, cluster: &str, type_: &str) -> Result<(), String> {
    let mca = Api::<ManagedClusterAddOn>::namespaced(hub.clone(), cluster)
        .get_opt(keys::ADDON_NAME)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no ManagedClusterAddOn")?;
    let conditions = mca.status.and_then(|s| s.conditions).unwrap_or_default();
    if conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
    {
        Ok(())
    } else {
        Err(format!("{conditions:?}"))
    }
}

/// A key of a Secret, as text: the hub-controller's own reading of its
/// Secrets.
pub use argocd_pull_hub_controller::certs::secret_text;

pub fn client_cert(secret: &Secret) -> String {
    secret_text(secret, "tls.crt")
}

/// The fingerprint the hub logs and the deny list names, of a PEM certificate.
pub fn fingerprint_of(pem: &str) -> String {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    argocd_pull_hub_controller::transport::grpc::identity::fingerprint(
        &CertificateDer::from_pem_slice(pem.as_bytes()).unwrap(),
    )
}

pub fn subject_of(pem: &str) -> String {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    let cert = pem.parse_x509().unwrap();
    cert.subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A hub with OCM, `cluster1` and `cluster2` joined, the addon's hub side
/// installed and the hub-controller running.
pub struct AddonHub {
    pub fleet: &'static Fleet,
    pub client: kube::Client,
    pub kubeconfig: PathBuf,
    pub controller: Binary,
    /// The hub-controller's log.
    pub log: PathBuf,
    /// The hub-controller's gRPC port on the loopback (the test's own
    /// clients dial it; the agents reach it as [`HUB_GRPC`]).
    pub grpc: SocketAddr,
    /// cluster1's and cluster2's nodes.
    pub nodes: Vec<Node>,
    /// The hub-controller's command line (for [`AddonHub::restart`]).
    args: Vec<String>,
    _files: tempfile::TempDir,
}

impl Drop for AddonHub {
    fn drop(&mut self) {
        // A failed test shows what the hub-controller said.
        if std::thread::panicking() {
            let log = self.hub_log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!("--- hub-controller log (last lines) ---");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
}

impl AddonHub {
    /// `clusteradm addon <verb> --names argocd-pull --clusters <clusters>`
    /// against the hub: what a user types to enable or disable the addon.
    pub async fn clusteradm_addon(&self, verb: &str, clusters: &str) {
        let kubeconfig = self.kubeconfig.display().to_string();
        run(
            &paths::bin_dir().join("clusteradm"),
            &[
                "addon",
                verb,
                "--names",
                keys::ADDON_NAME,
                "--clusters",
                clusters,
                "--kubeconfig",
                &kubeconfig,
            ],
        )
        .await;
    }

    /// Starts the fleet, applies `deploy/hub/addon.yaml` as checked in,
    /// points the agents at a free address and starts the hub-controller
    /// there with `--grpc-manage-certificates`; returns once the signing CA
    /// exists and the serving CA is published to the agents.
    pub async fn start() -> Self {
        let testenv = paths::own_binary("testenv").unwrap();
        let nodes = tokio::spawn(pods::start_nodes(
            CLUSTERS.map(String::from).to_vec(),
            false,
        ));
        let fleet: &'static Fleet = Box::leak(Box::new(
            Fleet::start("hub", &CLUSTERS.map(|c| (c, JoinOptions::default())))
                .await
                .expect("the hub starts and the clusters join"),
        ));
        let mut nodes = nodes
            .await
            .unwrap()
            .expect("the nodes start with the images");
        let grpc = net::free_addr().unwrap();
        for (node, cluster) in nodes.iter_mut().zip(&fleet.clusters) {
            node.join(cluster, &testenv)
                .await
                .expect("the node joins its cluster");
            // HUB_GRPC inside the node -> a socket -> the hub's loopback port.
            let socket = node.dir().join("hub-grpc.sock");
            node.relay(
                &testenv,
                "relay-hub-grpc",
                false,
                &format!("unix:{}", socket.display()),
                &format!("tcp:{grpc}"),
                &[],
            )
            .unwrap();
            node.reach(&testenv, HUB_GRPC, &socket).unwrap();
        }
        let hub = fleet.hub.cluster();
        let client = hub.client().await.unwrap();
        hub.ensure_namespace(argocd_pull_addon::HUB_NAMESPACE)
            .await
            .unwrap();
        for c in &fleet.clusters {
            c.ensure_namespace(SPOKE_NS).await.unwrap();
        }
        let kubeconfig = hub.kubeconfig().to_path_buf();
        run(
            &paths::bin_dir().join("kubectl"),
            &[
                "--kubeconfig",
                kubeconfig.to_str().unwrap(),
                "apply",
                "--server-side",
                "-f",
                repo_file("deploy/hub/addon.yaml").to_str().unwrap(),
            ],
        )
        .await;
        adc_api(&client)
            .patch(
                argocd_pull_addon::DEPLOYMENT_CONFIG,
                &PatchParams::apply("platform-team").force(),
                &Patch::Apply(json!({
                    "apiVersion": "addon.open-cluster-management.io/v1alpha1",
                    "kind": "AddOnDeploymentConfig",
                    "spec": { "customizedVariables": [
                        { "name": "HUB_GRPC_ADDRESS", "value": format!("https://{HUB_GRPC}") },
                    ] },
                })),
            )
            .await
            .unwrap();

        // The hub-controller keeps the CAs and its serving certificate.
        let files = tempfile::tempdir().unwrap();
        let log = hub.dir().join("hub-controller.log");
        let mut args = vec!["--leader-elect=false".to_string()];
        args.extend(super::kept_certificates(grpc, files.path()));
        args.push(format!("--grpc-san={}", HUB_GRPC.ip()));
        args.push("--certificate-check-interval=2s".into());
        let controller = start_controller(hub.kubeconfig(), &args, &log).await;
        let secrets: Api<Secret> =
            Api::namespaced(client.clone(), argocd_pull_addon::HUB_NAMESPACE);
        let signing = wait::exists(&secrets, argocd_pull_addon::SIGNING_CA_SECRET, TIMEOUT).await;
        assert_eq!(signing.type_.as_deref(), Some("kubernetes.io/tls"));
        wait::until(
            "the serving CA in the AddOnDeploymentConfig",
            TIMEOUT,
            || async {
                let adc = adc_api(&client)
                    .get(argocd_pull_addon::DEPLOYMENT_CONFIG)
                    .await
                    .map_err(|e| e.to_string())?;
                let vars = adc.spec.customized_variables.unwrap_or_default();
                let value = |name: &str| {
                    vars.iter()
                        .find(|v| v.name == name)
                        .and_then(|v| v.value.clone())
                        .unwrap_or_default()
                };
                if value(argocd_pull_addon::HUB_CA_VARIABLE).contains("BEGIN CERTIFICATE")
                    && !value("HUB_GRPC_ADDRESS").is_empty()
                {
                    Ok(())
                } else {
                    Err(format!("{vars:?}"))
                }
            },
        )
        .await;
        Self {
            fleet,
            client,
            kubeconfig,
            controller,
            log,
            grpc,
            nodes,
            args,
            _files: files,
        }
    }

    /// Stops the hub-controller (as a crash would: killed) and starts it
    /// again with the same command line and files; its log starts anew.
    pub async fn restart(&mut self) {
        let _ = self.controller.child.kill().await;
        let _ = self.controller.child.wait().await;
        self.controller =
            start_controller(self.fleet.hub.cluster().kubeconfig(), &self.args, &self.log).await;
    }

    /// Another replica of the hub-controller, with leader election (in the
    /// addon's namespace), on its own gRPC port and certificate
    /// files, logging to `hub-controller-<name>.log`; once Ready. Returns
    /// it, its gRPC address and its files (kept while it runs).
    pub async fn replica(&self, name: &str) -> (Binary, SocketAddr, tempfile::TempDir) {
        let grpc = net::free_addr().unwrap();
        let files = tempfile::tempdir().unwrap();
        let mut args = vec![
            "--leader-elect=true".to_string(),
            format!(
                "--leader-election-namespace={}",
                argocd_pull_addon::HUB_NAMESPACE
            ),
        ];
        args.extend(super::kept_certificates(grpc, files.path()));
        args.push(format!("--grpc-san={}", HUB_GRPC.ip()));
        args.push("--certificate-check-interval=2s".into());
        let log = self
            .fleet
            .hub
            .cluster()
            .dir()
            .join(format!("hub-controller-{name}.log"));
        let replica = start_controller(self.fleet.hub.cluster().kubeconfig(), &args, &log).await;
        (replica, grpc, files)
    }

    pub fn hub_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn metrics(&self) -> String {
        net::http_get(self.controller.admin, "/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// The value of one series of the hub-controller's metrics (its name
    /// and labels as exposed, e.g. `foo_total{a="b"}`); 0 if it has none.
    pub async fn series(&self, series: &str) -> f64 {
        let metrics = self.metrics().await;
        assert!(!metrics.is_empty(), "the hub-controller serves no metrics");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits until the hub-controller's metric says whether `cluster`'s
    /// agent is connected.
    pub async fn hub_sees_connected(&self, cluster: &str, connected: bool) {
        let line = format!(
            "argocd_pull_hub_grpc_agent_connected{{cluster=\"{cluster}\"}} {}",
            u8::from(connected)
        );
        wait::until(
            &format!("the hub to see {cluster}'s agent connected={connected}"),
            TIMEOUT,
            || async {
                let metrics = self.metrics().await;
                if metrics.contains(&line) {
                    Ok(())
                } else {
                    Err(metrics
                        .lines()
                        .filter(|l| l.starts_with("argocd_pull_hub_grpc_agent_connected"))
                        .collect::<Vec<_>>()
                        .join("\n"))
                }
            },
        )
        .await;
    }

    /// Once the clusters' ManagedClusterAddOns exist: OCM's addon-manager
    /// renders the deploy work and the real work agent applies it, the
    /// real CSR flow issues each agent a certificate with the identity the
    /// hub accepts, the agents (pods on each cluster's node) connect with
    /// it, and OCM reports the addon Available. The agents, in cluster
    /// order.
    pub async fn agents_deployed_and_connected(&self) -> Vec<AgentPod> {
        let deploy_work = deploy_work();
        for cluster in CLUSTERS {
            let works: Api<ManifestWork> = Api::namespaced(self.client.clone(), cluster);
            wait::until(
                &format!("{deploy_work} applied on {cluster}"),
                TIMEOUT,
                || async {
                    let w = works
                        .get_opt(&deploy_work)
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or("no work yet")?;
                    let applied = w.status.and_then(|s| s.conditions).unwrap_or_default();
                    if applied
                        .iter()
                        .any(|c| c.type_ == "Applied" && c.status == "True")
                    {
                        Ok(())
                    } else {
                        Err(format!("{applied:?}"))
                    }
                },
            )
            .await;
        }

        // The certificates come through the real CSR flow, signed with the
        // CA the hub-controller keeps, for the identity the hub accepts.
        let csrs: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        wait::until("two signed CSRs of the addon's signer", TIMEOUT, || async {
            let list = csrs
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let signed = list
                .items
                .iter()
                .filter(|c| c.spec.signer_name == argocd_pull_addon::SIGNER_NAME)
                .filter(|c| {
                    c.status
                        .as_ref()
                        .and_then(|s| s.certificate.as_ref())
                        .is_some()
                })
                .count();
            if signed >= 2 {
                Ok(())
            } else {
                Err(format!("{signed} signed"))
            }
        })
        .await;
        let mut agents = Vec::new();
        let mut issued = Vec::new();
        for (c, node) in self.fleet.clusters.iter().zip(&self.nodes) {
            let spoke_secrets: Api<Secret> = Api::namespaced(c.client().await.unwrap(), AGENT_NS);
            let secret = wait::exists(
                &spoke_secrets,
                &argocd_pull_addon::client_cert_secret(),
                TIMEOUT,
            )
            .await;
            assert_eq!(subject_of(&client_cert(&secret)), agent_subject(c.name()));
            issued.push(client_cert(&secret));
            agents.push(AgentPod {
                cluster: c,
                node: node.name.clone(),
            });
        }

        // Connected with that certificate, and OCM reports the addon Available.
        for (i, cluster) in CLUSTERS.iter().enumerate() {
            agents[i]
                .shows(&format!("{cluster}'s agent pod Ready"), |s| s.connected)
                .await;
            self.hub_sees_connected(cluster, true).await;
            self.connected_with(cluster, &issued[i]).await;
            wait::until(&format!("{cluster}'s addon Available"), TIMEOUT, || {
                condition(&self.client, cluster, "Available")
            })
            .await;
        }
        agents
    }

    /// Waits until the hub-controller logs `cluster`'s agent connected with
    /// the certificate `cert_pem`.
    pub async fn connected_with(&self, cluster: &str, cert_pem: &str) {
        let fingerprint = fingerprint_of(cert_pem);
        let cluster_field = format!("cluster={cluster} ");
        wait::until(
            &format!("{cluster}'s agent connected with certificate {fingerprint}"),
            TIMEOUT,
            || async {
                let log = self.hub_log();
                let connected: Vec<&str> = log
                    .lines()
                    .filter(|l| l.contains("agent connected") && l.contains(&cluster_field))
                    .collect();
                if connected.iter().any(|l| l.contains(&fingerprint)) {
                    Ok(())
                } else {
                    Err(connected.join("\n"))
                }
            },
        )
        .await;
    }

    /// Creates an Application for each cluster in the hub namespace `team`
    /// (`guestbook-<cluster>`), checks it goes over gRPC (no ManifestWork
    /// but the deploy work) and that the status the spoke writes reaches
    /// the hub copy. The spoke Applications' uids, in cluster order.
    pub async fn deliver_over_grpc(&self, team: &str) -> Vec<String> {
        let hub_apps = apps_api(&self.client, team);
        for cluster in CLUSTERS {
            let a = app(
                &format!("guestbook-{cluster}"),
                team,
                json!({
                    keys::MANAGED_CLUSTER: cluster,
                    keys::MANAGED_CLUSTER_APP_NAMESPACE: SPOKE_NS,
                    keys::SKIP_RECONCILE: "true",
                }),
                json!({}),
            );
            hub_apps.create(&PostParams::default(), &a).await.unwrap();
        }
        let mut spoke_uids = Vec::new();
        for c in &self.fleet.clusters {
            let name = format!("guestbook-{}", c.name());
            let spoke = apps_api(&c.client().await.unwrap(), SPOKE_NS);
            let delivered = wait::exists(&spoke, &name, TIMEOUT).await;
            spoke_uids.push(delivered.metadata.uid.clone().unwrap());
            let works: Api<ManifestWork> = Api::namespaced(self.client.clone(), c.name());
            let list = works.list(&Default::default()).await.unwrap();
            assert!(
                list.items
                    .iter()
                    .all(|w| w.metadata.name.as_deref() == Some(&deploy_work())),
                "{name} went over gRPC, not in a ManifestWork"
            );
            self.status_reaches_hub(team, c.name(), "Healthy").await;
        }
        spoke_uids
    }

    /// The spoke's Argo CD reports `guestbook-<cluster>` Synced with
    /// health `health`; waits until the hub copy in `team` shows it.
    pub async fn status_reaches_hub(&self, team: &str, cluster: &str, health: &str) {
        let name = self
            .spoke_reports(
                cluster,
                json!({ "sync": { "status": "Synced", "revision": "abc" },
                        "health": { "status": health } }),
            )
            .await;
        hub_app_shows(&apps_api(&self.client, team), &name, health).await;
    }

    /// The spoke's Argo CD reports `guestbook-<cluster>` at sync revision
    /// `revision`; waits until the hub copy in `team` shows it: the way
    /// back from the cluster, whichever the transport, has handled
    /// everything that came before.
    pub async fn revision_reaches_hub(&self, team: &str, cluster: &str, revision: &str) {
        let name = self
            .spoke_reports(cluster, json!({ "sync": { "revision": revision } }))
            .await;
        let hub_apps = apps_api(&self.client, team);
        wait::until(
            &format!("{name}'s revision {revision} on the hub"),
            TIMEOUT,
            || async {
                let a = hub_apps.get(&name).await.map_err(|e| e.to_string())?;
                if a.data["status"]["sync"]["revision"] == revision {
                    Ok(())
                } else {
                    Err(a.data["status"].to_string())
                }
            },
        )
        .await;
    }

    /// The spoke's Argo CD writes `status` on `guestbook-<cluster>`;
    /// returns that name.
    async fn spoke_reports(&self, cluster: &str, status: serde_json::Value) -> String {
        let name = format!("guestbook-{cluster}");
        let spoke = apps_api(
            &self.fleet.cluster(cluster).client().await.unwrap(),
            SPOKE_NS,
        );
        super::merge(&spoke, &name, json!({ "status": status })).await;
        name
    }

    /// Waits until `cluster`'s Application `guestbook-<cluster>` (in hub
    /// namespace `team`) travels in a ManifestWork the real work agent
    /// applied, with the deploy work gone, and checks the hand-over did not
    /// delete and recreate the spoke's Application (whose uid was `uid`).
    pub async fn fell_back_to_manifest_work(&self, team: &str, cluster: &str, uid: &str) {
        let works: Api<ManifestWork> = Api::namespaced(self.client.clone(), cluster);
        let deploy_work = deploy_work();
        wait::until(
            &format!("{cluster}'s Application in an applied ManifestWork"),
            TIMEOUT,
            || async {
                let list = works
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let names: Vec<_> = list
                    .items
                    .iter()
                    .filter_map(|w| w.metadata.name.clone())
                    .collect();
                let applied = list.items.iter().any(|w| {
                    w.metadata.name.as_deref() != Some(&deploy_work)
                        && w.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Applied" && c.status == "True")
                            })
                });
                if applied && !names.contains(&deploy_work) {
                    Ok(())
                } else {
                    Err(format!("applied {applied}: {names:?}"))
                }
            },
        )
        .await;
        // What could delete the spoke's Application has had its chance:
        // the work agent has finished removing the deploy work from the
        // spoke (its AppliedManifestWork is gone), and a status change has
        // come back through the new work to the hub copy.
        let spoke_client = self.fleet.cluster(cluster).client().await.unwrap();
        let applied_works: Api<kube::api::DynamicObject> = Api::all_with(
            spoke_client.clone(),
            &kube::discovery::ApiResource::from_gvk_with_plural(
                &kube::api::GroupVersionKind::gvk(
                    "work.open-cluster-management.io",
                    "v1",
                    "AppliedManifestWork",
                ),
                "appliedmanifestworks",
            ),
        );
        wait::until(
            &format!("the deploy work removed from {cluster} by its work agent"),
            TIMEOUT,
            || async {
                let names = super::names(&applied_works).await?;
                if names.iter().any(|n| n.ends_with(&deploy_work)) {
                    Err(format!("{names:?}"))
                } else {
                    Ok(())
                }
            },
        )
        .await;
        self.revision_reaches_hub(team, cluster, "handed-over")
            .await;
        let still = apps_api(&spoke_client, SPOKE_NS)
            .get(&format!("guestbook-{cluster}"))
            .await
            .unwrap();
        assert_eq!(
            still.metadata.uid.as_deref(),
            Some(uid),
            "{cluster}'s Application was deleted and recreated in the hand-over"
        );
        assert!(
            still.metadata.deletion_timestamp.is_none(),
            "{cluster}'s Application is being deleted after the hand-over"
        );
    }
}

/// Starts the hub-controller binary with `args` against `kubeconfig`,
/// logging to `log`, and waits until it is ready.
async fn start_controller(kubeconfig: &Path, args: &[String], log: &Path) -> Binary {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let controller = Binary::start_as(
        kubeconfig,
        &args,
        Stdio::from(std::fs::File::create(log).unwrap()),
    );
    wait::until("the hub-controller to be ready", TIMEOUT, || async {
        match net::http_get(controller.admin, "/readyz").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!(
                "{other:?}\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )),
        }
    })
    .await;
    controller
}

/// Waits until the hub copy `name` reports health `health`.
pub async fn hub_app_shows(hub_apps: &Api<Application>, name: &str, health: &str) {
    wait::until(
        &format!("{name}'s health {health} on the hub"),
        TIMEOUT,
        || async {
            let a: Application = hub_apps.get(name).await.map_err(|e| e.to_string())?;
            if a.data["status"]["health"]["status"] == health {
                Ok(())
            } else {
                Err(a.data["status"].to_string())
            }
        },
    )
    .await;
}
