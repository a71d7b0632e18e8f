//! Real Open Cluster Management: a hub running OCM's registration
//! controller, placement controller and addon manager, and managed clusters
//! joined to it the way `clusteradm join` / `clusteradm accept` join them
//! (bootstrap token, CSR, acceptance), each running OCM's registration and
//! work agents against its own API server.
//!
//! There is no kubelet: the upstream binaries built by `test/tools/build.sh`
//! run as processes of their cluster (the hub's on the hub, the klusterlet's
//! on the managed cluster), so they stop when it stops and its reaper kills
//! them if the test process dies. Their TLS scratch files go to the
//! cluster's folder, their logs to `<cluster dir>/<component>.log`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use argocd_pull_apis::ocm::ManagedCluster;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::net::free_addr;
use crate::{Cluster, ClusterConfig, CrdSet, Error, Result, paths};

/// Where OCM's hub components run (their events go there).
pub const HUB_NAMESPACE: &str = "open-cluster-management-hub";
/// The klusterlet's namespace on a managed cluster: the agents keep the
/// hub kubeconfig Secret there.
pub const AGENT_NAMESPACE: &str = "open-cluster-management-agent";
/// The Secret in [`AGENT_NAMESPACE`] with the agent's hub credentials.
pub const HUB_KUBECONFIG_SECRET: &str = "hub-kubeconfig-secret";
/// The bootstrap identity `clusteradm init` creates and `clusteradm accept`
/// trusts: the CSRs it files are the ones accepted.
const BOOTSTRAP_NAMESPACE: &str = "open-cluster-management";
const BOOTSTRAP_SA: &str = "agent-registration-bootstrap";
const FEATURE_RAW_FEEDBACK: &str = "RawFeedbackJsonString";

const START_TIMEOUT: Duration = Duration::from_secs(60);
const JOIN_TIMEOUT: Duration = Duration::from_secs(120);
const PORT_ATTEMPTS: usize = 3;
/// Restarts of a registration agent that exits while joining.
const AGENT_RESTARTS: usize = 2;

/// How a managed cluster's klusterlet runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JoinOptions {
    /// Start the work agent with feature gate `RawFeedbackJsonString`, so
    /// that feedback rules on maps and lists come back as `JsonRaw`.
    pub raw_feedback: bool,
}

/// A hub cluster with OCM running. Dropping it stops everything.
pub struct Hub {
    cluster: Cluster,
    bootstrap_kubeconfig: PathBuf,
}

impl Hub {
    /// Starts a cluster with the hub CRDs, and OCM on it.
    pub async fn start(name: impl Into<String>) -> Result<Self> {
        Self::start_with(ClusterConfig::new(name, CrdSet::Hub)).await
    }

    /// Starts a cluster from `config` (its CRDs should be [`CrdSet::Hub`];
    /// the controller-manager is always on, it signs the agents' CSRs), and
    /// OCM on it.
    pub async fn start_with(mut config: ClusterConfig) -> Result<Self> {
        for tool in ["registration", "placement", "addon", "work"] {
            require(&paths::ocm_bin_dir().join(tool))?;
        }
        require(&paths::bin_dir().join("clusteradm"))?;
        config.controller_manager = true;
        let cluster = Cluster::start(config).await?;
        cluster.ensure_namespace(HUB_NAMESPACE).await?;
        let bootstrap_kubeconfig = bootstrap_identity(&cluster).await?;
        let kubeconfig = cluster.kubeconfig().display().to_string();
        for (name, bin, sub) in [
            ("registration-controller", "registration", "controller"),
            ("placement-controller", "placement", "controller"),
            ("addon-manager", "addon", "manager"),
        ] {
            start_component(&cluster, name, |listen| {
                let mut cmd = Command::new(paths::ocm_bin_dir().join(bin));
                cmd.arg(sub)
                    .arg(format!("--kubeconfig={kubeconfig}"))
                    .arg(format!("--namespace={HUB_NAMESPACE}"))
                    .arg(format!("--listen={listen}"))
                    .arg("--disable-leader-election");
                cmd
            })
            .await?;
        }
        Ok(Self {
            cluster,
            bootstrap_kubeconfig,
        })
    }

    /// The hub's cluster (API server, kubeconfig, namespaces).
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// Joins `managed` to this hub for real, and returns once its
    /// ManagedCluster is accepted, joined and `Available` and its work agent
    /// is running:
    ///
    /// 1. the registration agent starts on `managed` with a bootstrap
    ///    kubeconfig (the bootstrap service account's token), creates the
    ///    ManagedCluster and a CSR on the hub;
    /// 2. `clusteradm accept` approves the CSR and accepts the cluster; the
    ///    hub's controller-manager signs the certificate and OCM's
    ///    registration controller gives the agent its RBAC on the hub;
    /// 3. the agent writes its hub kubeconfig (Secret
    ///    [`HUB_KUBECONFIG_SECRET`], and files in the klusterlet folder),
    ///    which the work agent then uses.
    pub async fn join(&self, managed: &Cluster, options: JoinOptions) -> Result<()> {
        let name = managed.name();
        managed.ensure_namespace(AGENT_NAMESPACE).await?;
        let dir = managed.dir().join("klusterlet");
        let hub_dir = dir.join("hub-kubeconfig");
        std::fs::create_dir_all(&hub_dir)?;
        let bootstrap = dir.join("bootstrap-kubeconfig");
        std::fs::copy(&self.bootstrap_kubeconfig, &bootstrap)?;
        let spoke_kubeconfig = managed.kubeconfig().display().to_string();

        let registration = |listen: SocketAddr| {
            let mut cmd = Command::new(paths::ocm_bin_dir().join("registration"));
            cmd.arg("agent")
                .arg(format!("--cluster-name={name}"))
                .arg(format!("--bootstrap-kubeconfig={}", bootstrap.display()))
                .arg(format!("--hub-kubeconfig-dir={}", hub_dir.display()))
                .arg(format!("--kubeconfig={spoke_kubeconfig}"))
                // The URL the hub records for the cluster (and that Argo CD
                // cluster Secrets built from ManagedClusters show).
                .arg(format!("--spoke-external-server-urls={}", managed.server()))
                .arg(format!("--namespace={AGENT_NAMESPACE}"))
                .arg(format!("--listen={listen}"))
                .arg("--disable-leader-election");
            cmd
        };
        start_component(managed, "registration-agent", registration).await?;
        self.accept(managed).await?;
        let mut restarts = 0;
        loop {
            match self.wait_available(managed).await {
                // As a kubelet restarts a container that exits: OCM's agent
                // exits when it reads the hub kubeconfig its own controller
                // is still writing ("kubeconfig does not contains
                // context"), and comes up joined once restarted.
                Err(Error::Exited { log, .. }) if restarts < AGENT_RESTARTS => {
                    restarts += 1;
                    let last = log.lines().last().unwrap_or_default().to_string();
                    eprintln!("testenv: {name}'s registration agent exited, restarting it: {last}");
                    managed.stop("registration-agent");
                    start_component(managed, "registration-agent", registration).await?;
                }
                joined => break joined?,
            }
        }

        let hub_kubeconfig = hub_dir.join("kubeconfig").display().to_string();
        start_component(managed, "work-agent", |listen| {
            let mut cmd = Command::new(paths::ocm_bin_dir().join("work"));
            cmd.arg("agent")
                .arg(format!("--spoke-cluster-name={name}"))
                .arg(format!("--hub-kubeconfig={hub_kubeconfig}"))
                .arg(format!("--workload-source-config={hub_kubeconfig}"))
                .arg(format!("--kubeconfig={spoke_kubeconfig}"))
                .arg(format!(
                    "--feature-gates={FEATURE_RAW_FEEDBACK}={}",
                    options.raw_feedback
                ))
                .arg(format!("--namespace={AGENT_NAMESPACE}"))
                .arg(format!("--listen={listen}"))
                .arg("--disable-leader-election");
            cmd
        })
        .await
    }

    /// `clusteradm accept --wait`: approves the cluster's CSR once the agent
    /// has filed it and sets `hubAcceptsClient`.
    async fn accept(&self, managed: &Cluster) -> Result<()> {
        let out = tokio::process::Command::new(paths::bin_dir().join("clusteradm"))
            .arg("accept")
            .arg(format!("--clusters={}", managed.name()))
            .arg("--wait")
            .arg(format!("--timeout={}", JOIN_TIMEOUT.as_secs()))
            .arg(format!(
                "--kubeconfig={}",
                self.cluster.kubeconfig().display()
            ))
            .kill_on_drop(true)
            .output()
            .await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(
            self.cluster
                .dir()
                .join(format!("clusteradm-accept-{}.log", managed.name())),
            &text,
        )?;
        if out.status.success() {
            Ok(())
        } else {
            Err(Error::NotJoined {
                cluster: managed.name().to_string(),
                why: format!(
                    "`clusteradm accept` failed:\n{text}\nregistration agent:\n{}",
                    managed.log_tail("registration-agent", 20)
                ),
            })
        }
    }

    async fn wait_available(&self, managed: &Cluster) -> Result<()> {
        let api: Api<ManagedCluster> = Api::all(self.cluster.client().await?);
        let deadline = Instant::now() + JOIN_TIMEOUT;
        loop {
            if let Some(e) = managed.exited(Some("registration-agent")) {
                return Err(e);
            }
            let conditions = api
                .get_opt(managed.name())
                .await?
                .and_then(|mc| mc.status)
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            let is_true = |t: &str| {
                conditions
                    .iter()
                    .any(|c| c.type_ == t && c.status == "True")
            };
            if is_true("HubAcceptedManagedCluster")
                && is_true("ManagedClusterJoined")
                && is_true("ManagedClusterConditionAvailable")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotJoined {
                    cluster: managed.name().to_string(),
                    why: format!(
                        "not Available within {JOIN_TIMEOUT:?}; conditions {conditions:?}\nregistration agent:\n{}",
                        managed.log_tail("registration-agent", 20)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn require(tool: &Path) -> Result<()> {
    if tool.is_file() {
        Ok(())
    } else {
        Err(Error::MissingTool(tool.to_path_buf()))
    }
}

/// What `clusteradm init` sets up for joining clusters: the bootstrap
/// service account with OCM's bootstrap ClusterRole (taken from OCM's
/// cluster-manager chart by build.sh). Returns the path of a bootstrap
/// kubeconfig with a token of that service account.
async fn bootstrap_identity(hub: &Cluster) -> Result<PathBuf> {
    let client = hub.client().await?;
    hub.ensure_namespace(BOOTSTRAP_NAMESPACE).await?;
    let pp = PatchParams::apply("argocd-pull-testenv").force();
    let role_file = paths::ocm_dir().join("bootstrap-clusterrole.yaml");
    let role: ClusterRole = serde_yaml::from_str(
        &std::fs::read_to_string(&role_file).map_err(|_| Error::MissingTool(role_file.clone()))?,
    )?;
    let role_name = role.metadata.name.clone().unwrap_or_default();
    Api::<ClusterRole>::all(client.clone())
        .patch(&role_name, &pp, &Patch::Apply(&role))
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": { "name": "open-cluster-management:bootstrap:agent-registration" },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name },
        "subjects": [{ "kind": "ServiceAccount", "name": BOOTSTRAP_SA, "namespace": BOOTSTRAP_NAMESPACE }]
    }))
    .expect("a valid ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            binding.metadata.name.as_deref().unwrap_or_default(),
            &pp,
            &Patch::Apply(&binding),
        )
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client, BOOTSTRAP_NAMESPACE);
    let sa: ServiceAccount = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": { "name": BOOTSTRAP_SA, "namespace": BOOTSTRAP_NAMESPACE }
    }))
    .expect("a valid ServiceAccount");
    sas.patch(BOOTSTRAP_SA, &pp, &Patch::Apply(&sa)).await?;
    let path = hub.dir().join("ocm-bootstrap-kubeconfig");
    hub.write_kubeconfig_for_service_account(BOOTSTRAP_NAMESPACE, BOOTSTRAP_SA, &path)
        .await?;
    Ok(path)
}

/// Starts an OCM component as a process of `cluster`, serving its health
/// endpoint on a free port, and waits until it listens. `command` builds the
/// command line for a given listen address; a port taken in the meantime is
/// retried with another.
async fn start_component(
    cluster: &Cluster,
    name: &'static str,
    command: impl Fn(SocketAddr) -> Command,
) -> Result<()> {
    // Each component writes self-signed serving certificates to a temporary
    // folder; keep them with the cluster's data so they go with it.
    let tmp = cluster.dir().join("tmp");
    std::fs::create_dir_all(&tmp)?;
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let listen = free_addr()?;
        let mut cmd = command(listen);
        cmd.env("TMPDIR", &tmp);
        cluster.spawn(name, cmd)?;
        match wait_listening(cluster, name, listen).await {
            Ok(()) => return Ok(()),
            Err(e @ Error::PortClash(_)) => {
                cluster.stop(name);
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

async fn wait_listening(cluster: &Cluster, name: &'static str, addr: SocketAddr) -> Result<()> {
    crate::process::wait_listening(
        name,
        addr,
        START_TIMEOUT,
        || cluster.exited(Some(name)),
        || cluster.log_tail(name, 30),
    )
    .await
}

/// A hub with OCM and managed clusters joined to it.
pub struct Fleet {
    pub hub: Hub,
    pub clusters: Vec<Cluster>,
}

impl Fleet {
    /// Starts the hub and the managed clusters (with the managed CRDs) side
    /// by side, then joins each with its options.
    pub async fn start(hub: &str, managed: &[(&str, JoinOptions)]) -> Result<Self> {
        let (hub, clusters) = tokio::join!(
            Hub::start(hub),
            futures::future::try_join_all(
                managed
                    .iter()
                    .map(|(name, _)| Cluster::start(ClusterConfig::new(*name, CrdSet::Managed)))
            )
        );
        let (hub, clusters) = (hub?, clusters?);
        futures::future::try_join_all(
            clusters
                .iter()
                .zip(managed)
                .map(|(cluster, (_, options))| hub.join(cluster, *options)),
        )
        .await?;
        Ok(Self { hub, clusters })
    }

    /// The managed cluster called `name`.
    pub fn cluster(&self, name: &str) -> &Cluster {
        self.clusters
            .iter()
            .find(|c| c.name() == name)
            .unwrap_or_else(|| panic!("no managed cluster {name} in this fleet"))
    }
}

static SHARED: crate::Shared<Fleet> = LazyLock::new(Default::default);

/// A fleet shared by every test of this test binary that asks for the same
/// hub name, started on first use (with the managed clusters of that first
/// call); removed when the test process exits, like [`crate::shared`].
pub async fn shared(hub: &str, managed: &[(&str, JoinOptions)]) -> Result<&'static Fleet> {
    crate::shared_entry(&SHARED, hub, || Fleet::start(hub, managed)).await
}
