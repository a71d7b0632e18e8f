//! The whole pull model on this one machine, as `make demo` shows it and
//! the end-to-end tests use it: a hub running OCM and Argo CD's
//! applicationset-controller, managed clusters joined to it for real, each
//! running its own Argo CD, a Git server, and argocd-pull installed from
//! `deploy/hub` and enabled with `clusteradm addon enable`.
//!
//! argocd-pull runs as pods from its built images, on a real node per
//! cluster ([`pods`]): the hub-controller from `deploy/hub`'s Deployment on
//! the hub's node, the spoke-agent from the Deployment OCM's addon manager
//! renders from the AddOnTemplate on each managed cluster's node. The
//! agents dial the hub at [`pods::HUB_GRPC`] (set in the
//! AddOnDeploymentConfig and the certificate's SANs, as a user sets the
//! address their load balancer gives the gRPC Service).

pub mod helm;
pub mod pods;
mod rows;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::keys;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use crate::argocd::{self, GitServer, Repo};
use crate::node::Node;
use crate::ocm::{Fleet, JoinOptions};
use crate::{Cluster, Error, Result, paths};
pub use pods::{ContainerMemory, HUB_GRPC, Status};
pub use rows::{AppRow, applications, render_table};

/// The hub's cluster name.
pub const HUB: &str = "hub";
/// Namespace of argocd-pull on the hub (`deploy/hub`).
pub const HUB_NAMESPACE: &str = "argocd-pull";
/// The hub-controller's Deployment there.
pub const HUB_CONTROLLER: &str = "argocd-pull-hub-controller";
/// The hub's gRPC Service there, and the name of its port.
pub const HUB_GRPC_SERVICE: (&str, &str) = ("argocd-pull-grpc", "grpc");
/// The addon's AddOnDeploymentConfig (in [`HUB_NAMESPACE`]).
pub const DEPLOYMENT_CONFIG: &str = "argocd-pull";
/// Namespace and name of the spoke-agent's Deployment on a managed cluster.
pub const AGENT_NAMESPACE: &str = "argocd-pull-agent";
pub const AGENT: &str = "argocd-pull-agent";
/// The Git repository the example deploys from (`example/guestbook`).
pub const REPO: &str = "guestbook";

const TIMEOUT: Duration = Duration::from_secs(180);

/// What to start.
#[derive(Clone, Debug)]
pub struct StackOptions {
    /// Managed clusters, joined in this order.
    pub managed: Vec<String>,
    /// The Git server's port (`None`: a free one).
    pub git_port: Option<u16>,
    /// Work agents with feature gate `RawFeedbackJsonString`, and the
    /// hub-controller with `--raw-feedback` (ManifestWork clusters bring
    /// their conditions and managed resources back).
    pub raw_feedback: bool,
    /// How argocd-pull goes onto the hub.
    pub install: Install,
}

/// How argocd-pull goes onto the hub.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Install {
    /// `kubectl apply -k` of an overlay on `deploy/hub` ([`pods::hub_overlay`]):
    /// this build.
    #[default]
    Kustomize,
    /// `helm install` of the previous release's chart with its images
    /// ([`helm`]), where an upgrade starts from.
    PreviousChart,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            managed: vec!["cluster1".into(), "cluster2".into()],
            git_port: None,
            raw_feedback: false,
            install: Install::Kustomize,
        }
    }
}

/// argocd-pull's Deployments as their pods show them: `hub` for the
/// hub-controller, the cluster's name for its agent.
pub type Pods = BTreeMap<String, Status>;

/// The running stack; everything stops when it is dropped.
pub struct Stack {
    /// Argo CD of every managed cluster, in the order of `managed`.
    pub spokes: Vec<argocd::Spoke>,
    /// The hub's applicationset-controller.
    pub argocd: argocd::Hub,
    /// The hub's Argo CD API server and UI (with its own Redis), showing
    /// the hub copies of the pulled Applications.
    pub argocd_server: argocd::Server,
    /// The Git server and the example's repository on it.
    pub repo: Repo,
    pub git: GitServer,
    /// Where the agents dial the hub.
    pub grpc: SocketAddr,
    /// The hub-controller's admin port (`/status`, `/metrics`), relayed to
    /// this machine's loopback, as `kubectl port-forward` would give it:
    /// `kubectl argocd-pull --admin http://<admin>`.
    pub admin: SocketAddr,
    proxy: tokio::task::JoinHandle<()>,
    /// What keeps [`Self::admin`] and the live endpoint pointed at the
    /// hub-controller's pod.
    forwards: Vec<tokio::task::JoinHandle<()>>,
    /// The hub's node first, then each managed cluster's, in order.
    nodes: Vec<Node>,
    fleet: Arc<Fleet>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.proxy.abort();
        for f in &self.forwards {
            f.abort();
        }
    }
}

impl Stack {
    /// Starts everything and returns once argocd-pull runs on the hub and
    /// every managed cluster's agent is connected. `progress` hears about
    /// each step (and the commands a user would type for it).
    pub async fn start(options: StackOptions, progress: &(dyn Fn(&str) + Sync)) -> Result<Self> {
        let testenv = paths::own_binary("testenv")?;
        paths::own_binary("hub-controller")?;
        paths::own_binary("spoke-agent")?;

        progress(&format!(
            "starting a hub and {} managed clusters (etcd, kube-apiserver, kube-controller-manager each); OCM's registration, placement and addon-manager on the hub; each cluster joins with its registration and work agents",
            options.managed.len()
        ));
        progress(
            "meanwhile: building argocd-pull's images (deploy/images/build.sh, what `make images` runs) and starting a node per cluster (containerd + runc in a network namespace of its own), the images imported from their OCI archives",
        );
        let names: Vec<String> = std::iter::once(HUB.to_string())
            .chain(options.managed.iter().cloned())
            .collect();
        let previous = options.install == Install::PreviousChart;
        let nodes = tokio::spawn(pods::start_nodes(names, previous));
        let joins: Vec<(&str, JoinOptions)> = options
            .managed
            .iter()
            .map(|m| {
                (
                    m.as_str(),
                    JoinOptions {
                        raw_feedback: options.raw_feedback,
                    },
                )
            })
            .collect();
        let fleet = Arc::new(Fleet::start(HUB, &joins).await?);
        let shared = fleet.clone();
        let hub = shared.hub.cluster();
        let mut nodes = nodes.await.expect("starting the nodes does not panic")?;

        progress(
            "joining each node to its cluster (kubelet, kube-scheduler, pods on a CNI bridge in 10.213.<k>.0/24); the agents' way to the hub's gRPC Service",
        );
        let clusters: Vec<&Cluster> = std::iter::once(hub).chain(&shared.clusters).collect();
        pods::join(&mut nodes, &clusters, &testenv).await?;

        progress(
            "starting a Git server on 127.0.0.1 with the example application (example/guestbook)",
        );
        let git = GitServer::start_on(options.git_port).await?;
        let repo = git.create_repo(REPO)?;
        commit_example_app(&repo)?;

        progress(
            "starting Argo CD: the applicationset-controller on the hub; application-controller, repo-server and Redis on every managed cluster",
        );
        let argocd = argocd::Hub::start(
            hub,
            argocd::HubOptions {
                progressive_syncs: true,
                ..Default::default()
            },
        )
        .await?;
        progress(
            "starting the hub's Argo CD API server and UI (argocd-server with its own Redis, on 127.0.0.1), logged in as the local admin",
        );
        let argocd_server = argocd::Server::start(hub, argocd::ServerOptions::default()).await?;
        let mut spokes = Vec::new();
        for c in &shared.clusters {
            spokes.push(argocd::Spoke::start(c, argocd::SpokeOptions::default()).await?);
        }
        if options.install == Install::Kustomize {
            progress(&format!(
                "each cluster's Argo CD Redis at {} inside its node, as argocd-redis.argocd.svc:6379 would be: the hub-controller writes the trees into argocd-server's, the agents read theirs",
                pods::ARGOCD_REDIS
            ));
            pods::open_argocd_redis(&mut nodes[0], &testenv, argocd_server.redis())?;
            for (node, spoke) in nodes[1..].iter_mut().zip(&spokes) {
                pods::open_argocd_redis(node, &testenv, spoke.redis())?;
            }
        }

        let install = install_dir(hub);
        // The live endpoint, on a loopback port of this machine, where the
        // hub's argocd-server (here too) reads a gRPC cluster's objects
        // and pods' logs through its agent (docs/ui.md).
        let live = crate::net::free_addr()?;
        match options.install {
            Install::Kustomize => {
                let overlay = pods::hub_overlay(
                    &install,
                    options.raw_feedback,
                    &format!("https://{live}"),
                    &live_token()?,
                )?;
                progress(&format!(
                    "installing argocd-pull on the hub:  kubectl apply -k {}  (deploy/hub, one replica, {} in the gRPC certificate's SANs, the live endpoint at https://{live})",
                    overlay.display(),
                    HUB_GRPC.ip()
                ));
                kubectl(hub, &["apply", "-k", &overlay.display().to_string()]).await?;
            }
            Install::PreviousChart => {
                let chart = helm::previous_chart(&install)?;
                let values = helm::values(&install)?;
                let (chart, values) = (chart.display().to_string(), values.display().to_string());
                progress(&format!(
                    "installing the previous release {} on the hub:  helm install {} {chart} -f {values}",
                    paths::previous_release(),
                    helm::RELEASE
                ));
                helm::helm(hub, &["install", helm::RELEASE, &chart, "-f", &values]).await?;
            }
        }
        let proxy = tokio::spawn(pods::follow_service(
            hub.client().await?,
            nodes[0].netns().to_string(),
            HUB_NAMESPACE,
            HUB_GRPC_SERVICE.0,
            HUB_GRPC_SERVICE.1,
        ));
        let mut forwards = Vec::new();
        let admin = crate::net::free_addr()?;
        for (inside, local) in [(pods::HUB_ADMIN, admin), (pods::HUB_LIVE, live)] {
            forwards.push(tokio::spawn(pods::follow_pods(
                hub.client().await?,
                nodes[0].netns().to_string(),
                HUB_NAMESPACE,
                format!("app.kubernetes.io/name={HUB_CONTROLLER}"),
                inside,
            )));
            pods::forward(&mut nodes[0], &testenv, inside, local)?;
        }
        let grpc = HUB_GRPC;
        if options.install == Install::Kustomize {
            // The chart takes it from its values (`grpc.address`).
            progress(&format!(
                "telling the agents where the hub and their Argo CD's Redis are, and to serve the live views: HUB_GRPC_ADDRESS=https://{grpc}, ARGOCD_REDIS={} and LIVE_VIEWS=true in AddOnDeploymentConfig {HUB_NAMESPACE}/{DEPLOYMENT_CONFIG}",
                pods::ARGOCD_REDIS
            ));
            set_variables(
                hub,
                DEPLOYMENT_CONFIG,
                &[
                    ("HUB_GRPC_ADDRESS", &format!("https://{grpc}")),
                    ("ARGOCD_REDIS", &pods::ARGOCD_REDIS.to_string()),
                    ("LIVE_VIEWS", "true"),
                ],
            )
            .await?;
        }
        let stack = Self {
            spokes,
            argocd,
            argocd_server,
            repo,
            git,
            grpc,
            admin,
            proxy,
            forwards,
            nodes,
            fleet,
        };

        progress("the hub-controller's pod starts on the hub's node");
        stack
            .wait_pods("the hub-controller to be ready", |p| {
                p.get(HUB).is_some_and(|s| s.ready)
            })
            .await?;

        let names = stack.managed_names().join(",");
        progress(&format!(
            "enabling the addon:  clusteradm addon enable --names {} --clusters {names}",
            keys::ADDON_NAME
        ));
        clusteradm(
            hub,
            &[
                "addon",
                "enable",
                "--names",
                keys::ADDON_NAME,
                "--clusters",
                &names,
            ],
        )
        .await?;
        progress(
            "OCM deploys the spoke-agent on every cluster and signs its certificate; waiting for the agents to connect",
        );
        let managed = stack.managed_names();
        stack
            .wait_pods("every agent to connect to the hub", |p| {
                managed.iter().all(|m| p.get(m).is_some_and(|s| s.ready))
            })
            .await?;
        Ok(stack)
    }

    /// The values file of the hub's Helm release ([`Install::PreviousChart`]).
    pub fn helm_values(&self) -> PathBuf {
        helm::values_path(&install_dir(self.hub()))
    }

    /// The hub cluster.
    pub fn hub(&self) -> &Cluster {
        self.fleet.hub.cluster()
    }

    /// The managed clusters.
    pub fn clusters(&self) -> &[Cluster] {
        &self.fleet.clusters
    }

    /// The managed cluster called `name`.
    pub fn cluster(&self, name: &str) -> &Cluster {
        self.fleet.cluster(name)
    }

    fn managed_names(&self) -> Vec<String> {
        self.fleet
            .clusters
            .iter()
            .map(|c| c.name().to_string())
            .collect()
    }

    /// argocd-pull's Deployments now, as their pods show them.
    pub async fn pods(&self) -> Result<Pods> {
        let mut pods = Pods::new();
        let hub = self.hub().client().await?;
        pods.insert(
            HUB.to_string(),
            pods::status(&hub, HUB_NAMESPACE, HUB_CONTROLLER).await?,
        );
        for c in self.clusters() {
            let client = c.client().await?;
            pods.insert(
                c.name().to_string(),
                pods::status(&client, AGENT_NAMESPACE, AGENT).await?,
            );
        }
        Ok(pods)
    }

    /// The container logs of argocd-pull's pods, by
    /// `<cluster>/<pod>/<container>/<file>` (the kubelet removes a pod's
    /// logs with the pod).
    pub fn logs(&self) -> BTreeMap<String, PathBuf> {
        self.cluster_nodes()
            .flat_map(|(cluster, node)| pods::logs(cluster.name(), node))
            .collect()
    }

    /// Each cluster with its node, the hub first.
    pub fn cluster_nodes(&self) -> impl Iterator<Item = (&Cluster, &Node)> {
        std::iter::once(self.hub())
            .chain(self.clusters())
            .zip(&self.nodes)
    }

    /// Every running argocd-pull container and its memory (peak and
    /// limit) as its cgroup counts it.
    pub async fn memory(&self) -> Result<Vec<ContainerMemory>> {
        let mut out = Vec::new();
        for (i, (cluster, node)) in self.cluster_nodes().enumerate() {
            let namespace = if i == 0 {
                HUB_NAMESPACE
            } else {
                AGENT_NAMESPACE
            };
            out.extend(pods::memory(cluster, node, namespace).await?);
        }
        Ok(out)
    }

    /// `kubectl apply -f <file>` on the hub, with the example's repository
    /// URL pointed at this stack's Git server if it does not run on the
    /// example's port.
    pub async fn apply(&self, file: &Path) -> Result<()> {
        self.apply_on(self.hub(), file).await
    }

    /// [`Stack::apply`] on `cluster`.
    pub async fn apply_on(&self, cluster: &Cluster, file: &Path) -> Result<()> {
        let url = self.repo.url().to_string();
        if url == EXAMPLE_REPO_URL {
            kubectl(cluster, &["apply", "-f", &file.display().to_string()]).await?;
            return Ok(());
        }
        let text = std::fs::read_to_string(file)?;
        let copy = cluster.dir().join(
            file.file_name()
                .unwrap_or_else(|| std::ffi::OsStr::new("example.yaml")),
        );
        std::fs::write(&copy, text.replace(EXAMPLE_REPO_URL, &url))?;
        kubectl(cluster, &["apply", "-f", &copy.display().to_string()]).await?;
        Ok(())
    }

    /// Sets `HUB_GRPC_ADDRESS` in AddOnDeploymentConfig `config` (in the
    /// hub's argocd-pull namespace) to where this stack's hub listens.
    pub async fn set_hub_address(&self, config: &str) -> Result<()> {
        set_hub_address(self.hub(), config, &format!("https://{}", self.grpc)).await
    }

    /// Waits until OCM's placement controller has decided on `count`
    /// clusters for Placement `namespace/name`. (An ApplicationSet that
    /// finds no PlacementDecision yet retries only after three minutes.)
    pub async fn wait_placement(&self, namespace: &str, name: &str, count: usize) -> Result<()> {
        let api = Api::<DynamicObject>::namespaced_with(
            self.hub().client().await?,
            namespace,
            &argocd_pull_apis::ocm::placement_decision_resource(),
        );
        let selector = format!("{}={name}", keys::PLACEMENT_LABEL);
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let list = api
                .list(&kube::api::ListParams::default().labels(&selector))
                .await?;
            let decided: usize = list
                .items
                .iter()
                .map(|d| d.data["status"]["decisions"].as_array().map_or(0, Vec::len))
                .sum();
            if decided >= count {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(Error::Command {
                    command: format!("waiting for Placement {namespace}/{name}"),
                    output: format!("{decided} of {count} clusters decided after {TIMEOUT:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// One row per pull-model Application on the hub in `namespace`, with
    /// its copy on its cluster.
    pub async fn applications(&self, namespace: &str) -> Result<Vec<AppRow>> {
        let mut clusters = Vec::new();
        for c in &self.fleet.clusters {
            clusters.push((c.name().to_string(), c.client().await?));
        }
        applications(&self.hub().client().await?, &clusters, namespace).await
    }

    /// Waits until argocd-pull's pods satisfy `check`.
    pub async fn wait_pods(&self, what: &str, mut check: impl FnMut(&Pods) -> bool) -> Result<()> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        loop {
            let pods = self.pods().await;
            if pods.as_ref().is_ok_and(&mut check) {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                let hub = self.hub();
                let all = kubectl(hub, &["get", "pods", "-A", "-o", "wide"]).await;
                return Err(Error::Command {
                    command: format!("waiting for {what}"),
                    output: format!(
                        "not within {TIMEOUT:?}; the pods: {pods:?}\n{all:?}\n{}",
                        self.log_tails(20)
                    ),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The end of every argocd-pull process's log, for error messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for (name, log) in &self.logs() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name}: {}\n{}\n",
                log.display(),
                all[all.len().saturating_sub(lines)..].join("\n")
            ));
        }
        out
    }
}

/// A pull-model Application on the hub (namespace `argocd`) for `cluster`
/// of this topology, from the example's repository `repo` into namespace
/// `destination` there, its spec carrying `round` in `spec.info`; no
/// automated sync. cluster2's go in ManifestWorks, as `example/` has it.
pub fn application(
    name: &str,
    cluster: &str,
    repo: &str,
    destination: &str,
    round: u64,
) -> DynamicObject {
    let mut annotations = json!({
        keys::MANAGED_CLUSTER: cluster,
        keys::SKIP_RECONCILE: "true",
    });
    if cluster == "cluster2" {
        annotations[keys::TRANSPORT] = json!("manifestwork");
    }
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": argocd::NAMESPACE,
            "labels": { keys::PULL_LABEL: "true" },
            "annotations": annotations,
        },
        "spec": {
            "project": "default",
            "source": { "repoURL": repo, "targetRevision": "main", "path": REPO },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": destination },
            "info": [{ "name": "round", "value": round.to_string() }],
        },
    }))
    .expect("an Application")
}

/// The repository URL in `example/` (the demo's Git server).
pub const EXAMPLE_REPO_URL: &str = "git://127.0.0.1:9418/guestbook.git";

/// Commits `example/guestbook` into `repo` under `guestbook/`.
fn commit_example_app(repo: &Repo) -> Result<()> {
    let dir = paths::workspace_dir().join("example").join(REPO);
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        files.push((format!("{REPO}/{name}"), std::fs::read_to_string(&path)?));
    }
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_str()))
        .collect();
    // A pod that writes a line a second, so that the hub's Argo CD has a
    // pod's logs to show (the harness's image, test/tools/node/ticker.c;
    // a user's guestbook would have its own pods).
    let ticker = ticker_deployment("guestbook-ticker", &[TICKER_LINE]);
    let mut refs = refs;
    refs.push((TICKER_FILE, &ticker));
    repo.commit("the guestbook example", &refs)?;
    Ok(())
}

/// Where the harness puts its [`ticker_deployment`] in the example's
/// repository.
const TICKER_FILE: &str = "guestbook/ticker.yaml";

/// What each line of the guestbook's ticker pod starts with (then a
/// counter).
pub const TICKER_LINE: &str = "guestbook ticker line";

/// A Deployment `name` of one pod of the image the nodes import
/// (`argocd-pull-ticker`, test/tools/node/ticker.c) run with `args`: the
/// line it writes (then a counter) every second, and how many it writes at
/// once first.
pub fn ticker_deployment(name: &str, args: &[&str]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: 2
      containers:
        - name: ticker
          image: argocd-pull-ticker:{version}
          imagePullPolicy: Never
          args: [{args}]
          securityContext:
            runAsNonRoot: true
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{drop: [ALL]}}
"#,
        args = args.join(", "),
        version = env!("CARGO_PKG_VERSION")
    )
}

/// A token for the live endpoint (what the chart's `lookup` keeps at
/// random): 24 random bytes, in hex.
fn live_token() -> Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where the stack keeps what it installs argocd-pull on the hub from
/// (the kustomization, or the chart and values file).
fn install_dir(hub: &Cluster) -> PathBuf {
    hub.dir().join("install")
}

async fn set_hub_address(hub: &Cluster, config: &str, address: &str) -> Result<()> {
    set_variables(hub, config, &[("HUB_GRPC_ADDRESS", address)]).await
}

/// Sets `variables` on AddOnDeploymentConfig `config`, as the platform
/// team would (server-side apply, so the controller's `HUB_CA` stays).
async fn set_variables(hub: &Cluster, config: &str, variables: &[(&str, &str)]) -> Result<()> {
    let api = Api::<DynamicObject>::namespaced_with(
        hub.client().await?,
        HUB_NAMESPACE,
        &kube::api::ApiResource::erase::<argocd_pull_apis::ocm::AddOnDeploymentConfig>(&()),
    );
    let patch = json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1",
        "kind": "AddOnDeploymentConfig",
        "spec": { "customizedVariables": variables
            .iter()
            .map(|(name, value)| json!({ "name": name, "value": value }))
            .collect::<Vec<_>>() },
    });
    api.patch(
        config,
        &PatchParams::apply("platform-team").force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// Runs the built kubectl against `cluster`; its standard output.
pub async fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    tool(&paths::bin_dir().join("kubectl"), cluster, args).await
}

/// Runs the built clusteradm against `cluster`; its standard output.
pub async fn clusteradm(cluster: &Cluster, args: &[&str]) -> Result<String> {
    tool(&paths::bin_dir().join("clusteradm"), cluster, args).await
}

async fn tool(path: &Path, cluster: &Cluster, args: &[&str]) -> Result<String> {
    tool_with(path, cluster, args, &[]).await
}

/// Runs the command at `path` with `args` and `env` against `cluster`
/// (`--kubeconfig`); its standard output, or its output in the error.
async fn tool_with(
    path: &Path,
    cluster: &Cluster,
    args: &[&str],
    env: &[(&str, PathBuf)],
) -> Result<String> {
    let out = tokio::process::Command::new(path)
        .args(args)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig().display()))
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .await?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::Command {
            command: format!("{} {}", path.display(), args.join(" ")),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}
