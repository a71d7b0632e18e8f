//! One real Kubernetes control plane: etcd, kube-apiserver and (optionally)
//! kube-controller-manager, built from upstream by `test/tools/build.sh`,
//! listening on free loopback ports, with an admin kubeconfig on disk.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::crds::{self, CrdSet};
use crate::net::free_addr;
use crate::pki::{self, Ca, CertKey};
use crate::process::Group;
use crate::{Error, Result, paths};

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// A short name, used in folder names, logs and kubeconfig contexts.
    pub name: String,
    /// Which upstream CRDs to install once the API server is ready.
    pub crds: CrdSet,
    /// Run kube-controller-manager too: namespace deletion, garbage
    /// collection, default service accounts and CSR signing need it.
    pub controller_manager: bool,
    /// Where to keep the data; a fresh folder under [`paths::run_dir`] when
    /// `None`. A given folder is emptied first (the `testenv` command uses
    /// this so that kubeconfig paths stay stable). Either way it is removed
    /// when the cluster stops, unless `ARGOCD_PULL_KEEP_DATA` is set.
    pub dir: Option<PathBuf>,
}

impl ClusterConfig {
    pub fn new(name: impl Into<String>, crds: CrdSet) -> Self {
        Self {
            name: name.into(),
            crds,
            controller_manager: true,
            dir: None,
        }
    }
}

/// A running cluster. Dropping it stops every process and removes its data.
pub struct Cluster {
    name: String,
    server: String,
    kubeconfig: PathBuf,
    version: String,
    ca: Ca,
    dir: PathBuf,
    // Behind a lock so that components started later (OCM's, by
    // `crate::ocm`) can join a shared cluster's processes.
    group: Mutex<Group>,
}

const START_ATTEMPTS: usize = 3;
const READY_TIMEOUT: Duration = Duration::from_secs(90);

impl Cluster {
    /// Starts a cluster and waits until it is ready and its CRDs are established.
    pub async fn start(config: ClusterConfig) -> Result<Self> {
        let bin = paths::bin_dir();
        for tool in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            if !bin.join(tool).is_file() {
                return Err(Error::MissingTool(bin.join(tool)));
            }
        }
        let dir = match &config.dir {
            Some(d) => {
                let _ = std::fs::remove_dir_all(d);
                std::fs::create_dir_all(d)?;
                d.clone()
            }
            None => {
                let base = paths::run_dir();
                std::fs::create_dir_all(&base)?;
                let tmp = tempfile::Builder::new()
                    .prefix(&format!("{}-", config.name))
                    .tempdir_in(&base)?;
                tmp.keep()
            }
        };
        let keep = std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some();
        let group = Group::new(dir.clone(), keep)?;
        let (ca, admin) = write_pki(&dir)?;
        let mut cluster = Cluster {
            name: config.name.clone(),
            server: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            version: String::new(),
            ca,
            dir,
            group: Mutex::new(group),
        };

        // Ports are picked free but can be taken before the server binds
        // them (tests start clusters in parallel), so retry on a clash.
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match cluster.start_control_plane(&admin, &bin).await {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e @ Error::PortClash(_)) => {
                    cluster.stop("kube-apiserver");
                    cluster.stop("etcd");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        if config.controller_manager {
            cluster.start_controller_manager(&bin)?;
        }
        let client = cluster.client().await?;
        crds::install(&client, config.crds).await?;
        if config.crds == CrdSet::Hub {
            crate::argocd::default_project(&cluster).await?;
        }
        // Straight to stderr, past the test runner's output capture, so that
        // every test log names the real server it ran against.
        let _ = writeln!(
            std::io::stderr(),
            "testenv: cluster {} ready: kube-apiserver {} at {} ({})",
            cluster.name,
            cluster.version,
            cluster.server,
            cluster.dir().display()
        );
        Ok(cluster)
    }

    async fn start_control_plane(&mut self, admin: &CertKey, bin: &Path) -> Result<()> {
        let dir = self.dir.clone();
        let etcd_port = free_addr()?.port();
        let peer_port = free_addr()?.port();
        let api_port = free_addr()?.port();
        let etcd_data = dir.join("etcd");
        let _ = std::fs::remove_dir_all(&etcd_data);

        let mut etcd = Command::new(bin.join("etcd"));
        let client_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        etcd.arg(format!("--name={}", self.name))
            .arg(format!("--data-dir={}", etcd_data.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={}={peer_url}", self.name))
            // Test data is thrown away; fsync only slows the tests down.
            .arg("--unsafe-no-fsync")
            // The default 2 GiB fills with the revisions of a 100,000
            // Application benchmark before the API server compacts them.
            .arg("--quota-backend-bytes=8589934592")
            .arg("--log-level=warn");
        self.spawn("etcd", etcd)?;

        let p = |f: &str| dir.join(f).display().to_string();
        let mut api = Command::new(bin.join("kube-apiserver"));
        api.arg(format!("--etcd-servers={client_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={api_port}"))
            .arg(format!("--cert-dir={}", p("serving")))
            .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
            .arg(format!("--client-ca-file={}", p("ca.crt")))
            // Only so that aggregated-API style servers (OCM's components
            // serve their health endpoints that way) find a request-header
            // CA; nothing holds its key, so no proxy can use it.
            .arg(format!(
                "--requestheader-client-ca-file={}",
                p("front-proxy-ca.crt")
            ))
            .arg("--requestheader-allowed-names=front-proxy-client")
            .arg("--requestheader-username-headers=X-Remote-User")
            .arg("--requestheader-group-headers=X-Remote-Group")
            .arg("--requestheader-extra-headers-prefix=X-Remote-Extra-")
            .arg("--authorization-mode=RBAC")
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg("--allow-privileged=true")
            // Its way to the kubelets (`kubectl logs`, `exec`): through
            // the egress proxy a node starts when it joins, inside the
            // node's network namespace (testenv::node), never a dial
            // from this machine's own to a node's address.
            .arg(format!(
                "--egress-selector-config-file={}",
                write_egress_config(&dir)?.display()
            ))
            // Off unless asked for: `ARGOCD_PULL_APISERVER_PROFILING=1`
            // serves /debug/pprof to the admin, to profile a benchmark's
            // API server (docs/benchmarks.md).
            .arg(format!(
                "--profiling={}",
                std::env::var_os("ARGOCD_PULL_APISERVER_PROFILING").is_some()
            ))
            .arg("--v=1");
        self.spawn("kube-apiserver", api)?;

        self.server = format!("https://127.0.0.1:{api_port}");
        write_kubeconfig(
            &self.kubeconfig,
            &self.name,
            &self.server,
            &self.ca.pem.cert_pem,
            admin,
        )?;
        self.wait_ready().await
    }

    fn start_controller_manager(&mut self, bin: &Path) -> Result<()> {
        let dir = self.dir.clone();
        let p = |f: &str| dir.join(f).display().to_string();
        let mut kcm = Command::new(bin.join("kube-controller-manager"));
        kcm.arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg("--leader-elect=false")
            // No serving port: nothing scrapes it, and it would need one
            // more free port per cluster.
            .arg("--secure-port=0")
            .arg(format!("--cluster-name={}", self.name))
            .arg(format!("--root-ca-file={}", p("ca.crt")))
            .arg(format!(
                "--service-account-private-key-file={}",
                p("sa.key")
            ))
            .arg(format!("--cluster-signing-cert-file={}", p("ca.crt")))
            .arg(format!("--cluster-signing-key-file={}", p("ca.key")))
            .arg("--use-service-account-credentials=false")
            .arg("--v=1");
        self.spawn("kube-controller-manager", kcm)
    }

    fn group(&self) -> MutexGuard<'_, Group> {
        // A panic while holding the lock leaves the group consistent: every
        // change to it is a single push or retain.
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `cmd` as one more process of this cluster, logging to
    /// `<dir>/<name>.log`: stopped when the cluster stops, and reaped with it.
    pub(crate) fn spawn(&self, name: &'static str, cmd: Command) -> Result<()> {
        self.group().spawn(name, cmd)?;
        Ok(())
    }

    /// Has this cluster's reaper kill `pid`, a process the caller started
    /// and stops itself, should the caller die first (SIGTERM or SIGKILL
    /// run no destructor, and a `kill_on_drop` child would outlive it).
    pub fn adopt(&self, pid: u32) {
        self.group().adopt(pid);
    }

    /// Kills and forgets the processes called `name`.
    pub(crate) fn stop(&self, name: &str) {
        self.group().stop(name);
    }

    /// Why the process `name` (or, with `None`, any process of this cluster)
    /// is no longer running, if it is not.
    pub(crate) fn exited(&self, name: Option<&str>) -> Option<Error> {
        self.group().exited(name)
    }

    /// The last lines the process `name` logged.
    pub(crate) fn log_tail(&self, name: &str, lines: usize) -> String {
        self.group().log_tail(name, lines)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = self.client().await?;
        loop {
            if let Some(e) = self.exited(None) {
                return Err(e);
            }
            let req = http::Request::get("/readyz").body(Vec::new())?;
            if let Ok(body) = client.request_text(req).await
                && body.trim() == "ok"
            {
                let info = client.apiserver_version().await?;
                self.version = info.git_version;
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(self.name.clone(), READY_TIMEOUT));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A new client with the admin (system:masters) identity. Make one per
    /// test: a client belongs to the async runtime it was first used on.
    pub async fn client(&self) -> Result<kube::Client> {
        client_for(&self.kubeconfig).await
    }

    /// The admin client's configuration, to build a client with layers.
    pub async fn config(&self) -> Result<kube::Config> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin kubeconfig, usable by kubectl.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The API server's reported version, e.g. `v1.35.4`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The cluster CA (PEM), which also signs CSRs approved in the cluster.
    pub fn ca(&self) -> &CertKey {
        &self.ca.pem
    }

    /// The cluster's data folder (logs, certificates, kubeconfig).
    /// The unix socket of this API server's egress proxy to its nodes'
    /// kubelets (served once a node joins).
    pub fn egress_socket(&self) -> PathBuf {
        egress_socket(&self.dir)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Creates a namespace with a server-generated name starting with `prefix`.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let api: Api<Namespace> = Api::all(self.client().await?);
        let ns = Namespace {
            metadata: ObjectMeta {
                generate_name: Some(format!("{prefix}-")),
                ..Default::default()
            },
            ..Default::default()
        };
        let created = api.create(&PostParams::default(), &ns).await?;
        Ok(created.metadata.name.expect("the server names it"))
    }

    /// Writes a kubeconfig for this cluster that authenticates as `identity`
    /// (a client certificate the cluster trusts, e.g. one signed through a CSR).
    pub fn write_kubeconfig_for(&self, identity: &CertKey, path: &Path) -> Result<()> {
        write_kubeconfig(
            path,
            &self.name,
            &self.server,
            &self.ca.pem.cert_pem,
            identity,
        )
    }

    /// Writes a kubeconfig for this cluster that authenticates with a bearer
    /// token (e.g. a service account's, from the TokenRequest API).
    pub fn write_kubeconfig_with_token(&self, token: &str, path: &Path) -> Result<()> {
        write_kubeconfig_user(
            path,
            &self.name,
            &self.server,
            &self.ca.pem.cert_pem,
            serde_json::json!({ "token": token }),
        )
    }

    /// Writes a kubeconfig that authenticates as `user` in `group` with a
    /// client certificate signed by this cluster's CA. A service account's
    /// user name (`system:serviceaccount:<ns>:<name>`) gets exactly the
    /// RBAC of that service account.
    pub fn write_kubeconfig_as(&self, user: &str, group: Option<&str>, path: &Path) -> Result<()> {
        let identity = self.ca.client(user, group)?;
        self.write_kubeconfig_for(&identity, path)
    }

    /// Writes a kubeconfig with a day-long token of the service account
    /// `namespace/name` (which must exist), as a pod of it would get.
    pub async fn write_kubeconfig_for_service_account(
        &self,
        namespace: &str,
        name: &str,
        path: &Path,
    ) -> Result<()> {
        let request = TokenRequest {
            spec: TokenRequestSpec {
                audiences: Vec::new(),
                expiration_seconds: Some(24 * 3600),
                ..Default::default()
            },
            ..Default::default()
        };
        let token = Api::<ServiceAccount>::namespaced(self.client().await?, namespace)
            .create_token_request(name, &PostParams::default(), &request)
            .await?
            .status
            .map(|s| s.token)
            .unwrap_or_default();
        self.write_kubeconfig_with_token(&token, path)
    }

    /// Creates a namespace with exactly this name, if it is not there yet.
    pub async fn ensure_namespace(&self, name: &str) -> Result<()> {
        let api: Api<Namespace> = Api::all(self.client().await?);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}

/// Writes the cluster's certificates and keys; returns the CA and the admin identity.
fn write_pki(dir: &Path) -> Result<(Ca, CertKey)> {
    let ca = Ca::new("argocd-pull-test-ca")?;
    let (dns, ips) = pki::apiserver_sans();
    let serving = ca.serving(&dns, &ips)?;
    let admin = ca.client("argocd-pull-admin", Some("system:masters"))?;
    let (sa_key, sa_pub) = pki::signing_key()?;
    let front_proxy = Ca::new("argocd-pull-test-front-proxy-ca")?;
    let files = [
        ("ca.crt", &ca.pem.cert_pem),
        ("front-proxy-ca.crt", &front_proxy.pem.cert_pem),
        ("ca.key", &ca.pem.key_pem),
        ("apiserver.crt", &serving.cert_pem),
        ("apiserver.key", &serving.key_pem),
        ("sa.key", &sa_key),
        ("sa.pub", &sa_pub),
    ];
    for (name, content) in files {
        if name.ends_with(".key") {
            pki::write_private(&dir.join(name), content.as_bytes())?;
        } else {
            std::fs::write(dir.join(name), content)?;
        }
    }
    Ok((ca, admin))
}

fn write_kubeconfig(
    path: &Path,
    name: &str,
    server: &str,
    ca_pem: &str,
    user: &CertKey,
) -> Result<()> {
    let user = serde_json::json!({
        "client-certificate-data": B64.encode(&user.cert_pem),
        "client-key-data": B64.encode(&user.key_pem),
    });
    write_kubeconfig_user(path, name, server, ca_pem, user)
}

fn write_kubeconfig_user(
    path: &Path,
    name: &str,
    server: &str,
    ca_pem: &str,
    user: serde_json::Value,
) -> Result<()> {
    let config = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": name, "cluster": {
            "server": server,
            "certificate-authority-data": B64.encode(ca_pem),
        }}],
        "users": [{ "name": name, "user": user }],
        "contexts": [{ "name": name, "context": { "cluster": name, "user": name }}],
        "current-context": name,
    });
    // It holds a private key or a token.
    pki::write_private(path, serde_yaml::to_string(&config)?.as_bytes())?;
    Ok(())
}

fn egress_socket(dir: &Path) -> PathBuf {
    dir.join("egress.sock")
}

/// The API server's EgressSelectorConfiguration: what it sends to the
/// cluster (kubelets, pods, Services) goes as an HTTP `CONNECT` over
/// [`egress_socket`]; the rest (etcd, webhooks by URL) as before.
fn write_egress_config(dir: &Path) -> Result<PathBuf> {
    let file = dir.join("egress.yaml");
    std::fs::write(
        &file,
        format!(
            r#"apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
  - name: cluster
    connection:
      proxyProtocol: HTTPConnect
      transport:
        uds:
          udsName: {}
"#,
            egress_socket(dir).display()
        ),
    )?;
    Ok(file)
}
