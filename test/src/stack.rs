//! The whole pull model on this one machine, as `make demo` shows it and
//! the end-to-end tests use it: a hub running OCM and Argo CD's
//! applicationset-controller, managed clusters joined to it for real, each
//! running its own Argo CD, a Git server, and argocd-pull installed from
//! `deploy/hub` and enabled with `clusteradm addon enable`.
//!
//! Nothing inside a Deployment runs by itself here (there is no kubelet),
//! so [`kubelet::Runner`]s play the kubelet for argocd-pull's two
//! Deployments only: the hub-controller's on the hub and, once OCM has
//! deployed it, the spoke-agent's on every managed cluster. Each runs as a
//! local process with exactly its Deployment's command line, files and
//! service account; only its listen addresses change (127.0.0.1 and free
//! ports, since there is no pod network), and the agents dial the hub at
//! `https://127.0.0.1:<port>` (set in the AddOnDeploymentConfig, the way a
//! user sets the address agents reach the hub at).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_apis::keys;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::argocd::{self, GitServer, Repo};
use crate::ocm::{Fleet, JoinOptions};
use crate::{Cluster, Error, Result, kubelet, net, paths};

/// The hub's cluster name.
pub const HUB: &str = "hub";
/// Namespace of argocd-pull on the hub (`deploy/hub`).
pub const HUB_NAMESPACE: &str = "argocd-pull";
/// The hub-controller's Deployment there.
pub const HUB_CONTROLLER: &str = "argocd-pull-hub-controller";
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
    /// Work agents with feature gate `RawFeedbackJsonString`.
    pub raw_feedback: bool,
}

impl Default for StackOptions {
    fn default() -> Self {
        Self {
            managed: vec!["cluster1".into(), "cluster2".into()],
            git_port: None,
            raw_feedback: false,
        }
    }
}

/// Where the kubelet stand-ins are: per Deployment (`hub` for the
/// hub-controller, the cluster's name for its agent).
pub type Pods = BTreeMap<String, kubelet::Status>;

/// The running stack; everything stops when it is dropped.
pub struct Stack {
    /// Argo CD of every managed cluster, in the order of `managed`.
    pub spokes: Vec<argocd::Spoke>,
    /// The hub's applicationset-controller.
    pub argocd: argocd::Hub,
    /// The Git server and the example's repository on it.
    pub repo: Repo,
    pub git: GitServer,
    /// Where the agents dial the hub.
    pub grpc: SocketAddr,
    pods: watch::Receiver<Pods>,
    logs: BTreeMap<String, PathBuf>,
    admin: watch::Receiver<Option<SocketAddr>>,
    kubelets: tokio::task::JoinHandle<()>,
    fleet: Arc<Fleet>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // The runners (and with them argocd-pull's processes) go first.
        self.kubelets.abort();
    }
}

impl Stack {
    /// Starts everything and returns once argocd-pull runs on the hub and
    /// every managed cluster's agent is connected. `progress` hears about
    /// each step (and the commands a user would type for it).
    pub async fn start(options: StackOptions, progress: &(dyn Fn(&str) + Sync)) -> Result<Self> {
        let hub_controller = paths::own_binary("hub-controller")?;
        let spoke_agent = paths::own_binary("spoke-agent")?;

        progress(&format!(
            "starting a hub and {} managed clusters (etcd, kube-apiserver, kube-controller-manager each); OCM's registration, placement and addon-manager on the hub; each cluster joins with its registration and work agents",
            options.managed.len()
        ));
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
        let mut spokes = Vec::new();
        for c in &fleet.clusters {
            spokes.push(argocd::Spoke::start(c, argocd::SpokeOptions::default()).await?);
        }

        progress("installing argocd-pull on the hub:  kubectl apply -k deploy/hub");
        kubectl(
            hub,
            &[
                "apply",
                "-k",
                &paths::workspace_dir()
                    .join("deploy/hub")
                    .display()
                    .to_string(),
            ],
        )
        .await?;
        // No Service network here: the agents reach the hub-controller's
        // gRPC port on loopback, and its certificate must name that.
        let grpc = net::free_addr()?;
        progress(&format!(
            "telling the agents where the hub is: HUB_GRPC_ADDRESS=https://{grpc} in AddOnDeploymentConfig {HUB_NAMESPACE}/{DEPLOYMENT_CONFIG}"
        ));
        set_hub_address(hub, DEPLOYMENT_CONFIG, &format!("https://{grpc}")).await?;

        let dir = hub.dir().join("kubelet");
        let mut runners = vec![(
            HUB.to_string(),
            kubelet::Runner::new(
                HUB_NAMESPACE,
                HUB_CONTROLLER,
                "hub-controller",
                hub_controller,
                vec![
                    ("--grpc-addr", grpc.to_string()),
                    ("--grpc-san", grpc.ip().to_string()),
                    ("--log-format", "plain".into()),
                ],
                dir.join(HUB_CONTROLLER),
            )?,
        )];
        for c in &fleet.clusters {
            runners.push((
                c.name().to_string(),
                kubelet::Runner::new(
                    AGENT_NAMESPACE,
                    AGENT,
                    "spoke-agent",
                    spoke_agent.clone(),
                    vec![("--log-format", "plain".into())],
                    c.dir().join("kubelet").join(AGENT),
                )?,
            ));
        }
        let logs = runners
            .iter()
            .map(|(name, r)| (name.clone(), r.log()))
            .collect();
        let (pods_tx, pods) = watch::channel(Pods::new());
        let (admin_tx, admin) = watch::channel(None);
        let kubelets = tokio::spawn(run_kubelets(fleet.clone(), runners, pods_tx, admin_tx));
        let stack = Self {
            spokes,
            argocd,
            repo,
            git,
            grpc,
            pods,
            logs,
            admin,
            kubelets,
            fleet,
        };

        progress("starting the hub-controller from its Deployment (as the kubelet would)");
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

    /// What the kubelet stand-ins see now.
    pub fn pods(&self) -> Pods {
        self.pods.borrow().clone()
    }

    /// Logs of argocd-pull's processes: `hub` (the hub-controller) and each
    /// managed cluster's name (its agent).
    pub fn logs(&self) -> &BTreeMap<String, PathBuf> {
        &self.logs
    }

    /// The hub-controller's admin address (`/metrics`, `/readyz`).
    pub fn hub_admin(&self) -> Option<SocketAddr> {
        *self.admin.borrow()
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

    /// Waits until what the kubelet stand-ins see satisfies `check`.
    pub async fn wait_pods(&self, what: &str, check: impl FnMut(&Pods) -> bool) -> Result<()> {
        let mut rx = self.pods.clone();
        let done = matches!(
            tokio::time::timeout(TIMEOUT, rx.wait_for(check)).await,
            Ok(Ok(_))
        );
        match done {
            true => Ok(()),
            false => Err(Error::Command {
                command: format!("waiting for {what}"),
                output: format!(
                    "not within {TIMEOUT:?}; the pods: {:?}\n{}",
                    *rx.borrow(),
                    self.log_tails(20)
                ),
            }),
        }
    }

    /// The end of every argocd-pull process's log, for error messages.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for (name, log) in &self.logs {
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

/// One row per pull-model Application on the hub in `namespace`, with its
/// copy on its cluster (one of `clusters`: name and client).
pub async fn applications(
    hub: &kube::Client,
    clusters: &[(String, kube::Client)],
    namespace: &str,
) -> Result<Vec<AppRow>> {
    let resource = argocd_pull_apis::argocd::application_resource();
    let apps = Api::<DynamicObject>::namespaced_with(hub.clone(), namespace, &resource);
    let mut rows = Vec::new();
    for app in apps.list(&Default::default()).await?.items {
        let labels = app.metadata.labels.clone().unwrap_or_default();
        if !labels
            .get(keys::PULL_LABEL)
            .and_then(|v| keys::parse_bool(v))
            .unwrap_or(false)
        {
            continue;
        }
        let annotations = app.metadata.annotations.clone().unwrap_or_default();
        let name = app.metadata.name.clone().unwrap_or_default();
        let cluster = annotations
            .get(keys::MANAGED_CLUSTER)
            .cloned()
            .unwrap_or_default();
        let spoke_ns = annotations
            .get(keys::MANAGED_CLUSTER_APP_NAMESPACE)
            .cloned()
            .unwrap_or_else(|| namespace.to_string());
        let spoke = match clusters.iter().find(|(n, _)| *n == cluster) {
            Some((_, client)) => {
                Api::<DynamicObject>::namespaced_with(client.clone(), &spoke_ns, &resource)
                    .get_opt(&name)
                    .await?
                    .map(|a| (a.metadata.labels.unwrap_or_default(), a.data))
            }
            None => None,
        };
        let transport = match &spoke {
            Some((labels, _)) if labels.contains_key(keys::HUB_MANAGED) => "grpc",
            Some(_) => "manifestwork",
            None => "-",
        };
        rows.push(AppRow::new(
            &name,
            &cluster,
            transport,
            &app.data,
            spoke.as_ref().map(|(_, d)| d),
        ));
    }
    rows.sort_by(|a, b| (&a.cluster, &a.name).cmp(&(&b.cluster, &b.name)));
    Ok(rows)
}

/// The repository URL in `example/` (the demo's Git server).
pub const EXAMPLE_REPO_URL: &str = "git://127.0.0.1:9418/guestbook.git";

/// One pull-model Application: its hub copy and its copy on the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppRow {
    pub name: String,
    pub cluster: String,
    /// `grpc`, `manifestwork`, or `-` while not delivered.
    pub transport: String,
    pub hub_sync: String,
    pub hub_health: String,
    pub hub_revision: String,
    pub spoke_sync: String,
    pub spoke_health: String,
}

impl AppRow {
    fn new(name: &str, cluster: &str, transport: &str, hub: &Value, spoke: Option<&Value>) -> Self {
        let field = |v: &Value, path: &[&str]| {
            let mut v = v;
            for p in path {
                v = &v[*p];
            }
            v.as_str().unwrap_or("-").to_string()
        };
        let short = |r: String| r.chars().take(7).collect::<String>();
        Self {
            name: name.to_string(),
            cluster: cluster.to_string(),
            transport: transport.to_string(),
            hub_sync: field(hub, &["status", "sync", "status"]),
            hub_health: field(hub, &["status", "health", "status"]),
            hub_revision: short(field(hub, &["status", "sync", "revision"])),
            spoke_sync: spoke.map_or("-".into(), |s| field(s, &["status", "sync", "status"])),
            spoke_health: spoke.map_or("-".into(), |s| field(s, &["status", "health", "status"])),
        }
    }

    /// Synced and Healthy on the hub copy (so, reported back).
    pub fn converged(&self) -> bool {
        self.hub_sync == "Synced" && self.hub_health == "Healthy"
    }
}

/// The rows as an aligned text table.
pub fn render_table(rows: &[AppRow]) -> String {
    let header = [
        "CLUSTER",
        "APPLICATION",
        "TRANSPORT",
        "SPOKE SYNC",
        "SPOKE HEALTH",
        "HUB SYNC",
        "HUB HEALTH",
        "REVISION",
    ];
    let cells: Vec<[&str; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.cluster.as_str(),
                r.name.as_str(),
                r.transport.as_str(),
                r.spoke_sync.as_str(),
                r.spoke_health.as_str(),
                r.hub_sync.as_str(),
                r.hub_health.as_str(),
                r.hub_revision.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let line = |row: &[&str; 8]| {
        row.iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&header);
    for row in &cells {
        out.push('\n');
        out.push_str(&line(row));
    }
    out
}

/// Plays the kubelet for every runner until aborted.
async fn run_kubelets(
    fleet: Arc<Fleet>,
    mut runners: Vec<(String, kubelet::Runner)>,
    pods: watch::Sender<Pods>,
    admin: watch::Sender<Option<SocketAddr>>,
) {
    loop {
        for (name, runner) in &mut runners {
            let cluster = if name == HUB {
                fleet.hub.cluster()
            } else {
                fleet.cluster(name)
            };
            match runner.tick(cluster).await {
                Ok(status) => {
                    pods.send_if_modified(|p| p.insert(name.clone(), status) != Some(status));
                }
                Err(e) => tracing::debug!(%name, error = %e, "kubelet stand-in: will retry"),
            }
            if name == HUB {
                admin.send_if_modified(|a| std::mem::replace(a, runner.admin()) != runner.admin());
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

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
    repo.commit("the guestbook example", &refs)?;
    Ok(())
}

async fn set_hub_address(hub: &Cluster, config: &str, address: &str) -> Result<()> {
    let api = Api::<DynamicObject>::namespaced_with(
        hub.client().await?,
        HUB_NAMESPACE,
        &kube::api::ApiResource::erase::<argocd_pull_apis::ocm::AddOnDeploymentConfig>(&()),
    );
    let patch = json!({
        "apiVersion": "addon.open-cluster-management.io/v1alpha1",
        "kind": "AddOnDeploymentConfig",
        "spec": { "customizedVariables": [
            { "name": "HUB_GRPC_ADDRESS", "value": address },
        ] },
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
    let out = tokio::process::Command::new(path)
        .args(args)
        .arg(format!("--kubeconfig={}", cluster.kubeconfig().display()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_read_both_copies_and_render_aligned() {
        let hub = json!({ "status": {
            "sync": { "status": "Synced", "revision": "0123456789abcdef" },
            "health": { "status": "Healthy" } } });
        let spoke = json!({ "status": { "sync": { "status": "OutOfSync" } } });
        let row = AppRow::new("guestbook-cluster1", "cluster1", "grpc", &hub, Some(&spoke));
        assert!(row.converged());
        assert_eq!(row.hub_revision, "0123456");
        assert_eq!(row.spoke_health, "-");
        let pending = AppRow::new("guestbook-cluster2", "cluster2", "-", &json!({}), None);
        assert!(!pending.converged());
        let table = render_table(&[row, pending]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("CLUSTER   APPLICATION         TRANSPORT"));
        assert!(lines[1].starts_with("cluster1  guestbook-cluster1  grpc"));
        assert!(lines[2].starts_with("cluster2  guestbook-cluster2  -"));
        assert_eq!(lines[1].find("Synced"), lines[0].find("HUB SYNC"));
    }
}
