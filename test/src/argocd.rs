//! Real Argo CD in the harness, the way the pull model deploys it: each
//! managed cluster runs its own application-controller and repo-server (with
//! its own Redis) against its own API server, and the hub runs only the
//! applicationset-controller (the hub's copies of Applications are dormant).
//! Git repositories are served by `git daemon` on 127.0.0.1.
//!
//! The components are upstream's, built by `test/tools/build.sh` from the
//! pinned Argo CD module into one multi-call binary (`$CACHE/bin/argocd`),
//! with Redis from Debian's packages (`$CACHE/bin/redis-server`). There is
//! no pod: each component is a process with its own ports, logging to
//! `<folder>/<component>.log`, killed when its [`Spoke`], [`Hub`] or
//! [`GitServer`] is dropped, or by its reaper when the test process dies.
//!
//! What upstream's install manifests would otherwise provide, and what it
//! takes to run them outside a pod:
//! - namespace [`NAMESPACE`] with `argocd-cm` and `argocd-secret` (labelled
//!   `app.kubernetes.io/part-of: argocd`, or Argo CD does not see them;
//!   `server.secretkey` set, as Argo CD's API server would set it) and the
//!   `default` AppProject (which the API server would create);
//! - the in-cluster destination [`IN_CLUSTER`] normally means "the service
//!   account of my pod"; `ARGOCD_FAKE_IN_CLUSTER=true` makes Argo CD take
//!   `$KUBECONFIG` instead, which points at the cluster's admin kubeconfig;
//! - per process: the repo-server's askpass socket (`ARGOCD_ASK_PASS_SOCK`,
//!   a fixed `/tmp` path by default) and clone folder (`$TMPDIR`) in the
//!   component's folder, GnuPG off (`ARGOCD_GPG_ENABLED=false`: it expects
//!   the image's `/app/config/gpg`), plain gRPC between controller and
//!   repo-server, and every port on loopback instead of its fixed default.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::json;

use crate::net::free_addr;
use crate::process::Group;
use crate::{Cluster, Error, Result, paths};

/// Where Argo CD runs and keeps its settings, Applications and projects.
pub const NAMESPACE: &str = "argocd";
/// The destination server that means "the cluster this Argo CD runs in".
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";
/// The project every Application may use: any repository, any destination.
pub const DEFAULT_PROJECT: &str = "default";

const START_TIMEOUT: Duration = Duration::from_secs(60);
const PORT_ATTEMPTS: usize = 3;
const FIELD_MANAGER: &str = "argocd-pull-testenv";

/// How a managed cluster's Argo CD runs.
#[derive(Clone, Debug, Default)]
pub struct SpokeOptions {
    /// Namespaces besides [`NAMESPACE`] whose Applications the
    /// application-controller reconciles (`--application-namespaces`).
    pub application_namespaces: Vec<String>,
}

/// How the hub's applicationset-controller runs.
#[derive(Clone, Debug, Default)]
pub struct HubOptions {
    /// Namespaces besides [`NAMESPACE`] whose ApplicationSets it reconciles
    /// (`--applicationset-namespaces`).
    pub applicationset_namespaces: Vec<String>,
    /// `--enable-progressive-syncs` (RollingSync strategies).
    pub progressive_syncs: bool,
    /// Further flags (a benchmark's `--concurrent-application-updates`).
    pub args: Vec<String>,
    /// Further environment variables (a benchmark's
    /// `ARGOCD_K8S_CLIENT_QPS`).
    pub env: Vec<(String, String)>,
}

/// A managed cluster's Argo CD: Redis, repo-server and application-controller.
pub struct Spoke {
    procs: Processes,
    repo_server: SocketAddr,
    redis: SocketAddr,
}

impl Spoke {
    /// Installs Argo CD's settings and default project on `cluster` and
    /// starts its Redis, repo-server and application-controller, which
    /// deploys to `cluster` itself as [`IN_CLUSTER`]. Returns once all three
    /// are listening.
    pub async fn start(cluster: &Cluster, options: SpokeOptions) -> Result<Self> {
        let argocd = require(&paths::bin_dir().join("argocd"))?;
        let redis_bin = require(&paths::bin_dir().join("redis-server"))?;
        install(cluster).await?;
        let procs = Processes::new(cluster.dir().join("argocd"))?;

        let redis = procs.start_redis(&redis_bin).await?;
        let redis = SocketAddr::from(([127, 0, 0, 1], redis));

        let repo_server = start_repo_server(&procs, &argocd, redis).await?;

        let kubeconfig = cluster.kubeconfig().to_path_buf();
        procs
            .start("application-controller", 1, |ports| {
                let mut cmd = component(&argocd, "argocd-application-controller");
                cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .arg(format!("--namespace={NAMESPACE}"))
                    .arg(format!("--repo-server={repo_server}"))
                    .arg("--repo-server-plaintext")
                    .arg(format!("--redis={redis}"))
                    .arg(format!("--metrics-port={}", ports[0]))
                    // No periodic refresh (default every 3 min): a new
                    // commit reaches an Application only through a refresh
                    // or an event, so tests of refresh cannot pass by waiting.
                    .arg("--app-resync=3600")
                    .arg("--status-processors=4")
                    .arg("--operation-processors=2")
                    .env("KUBECONFIG", &kubeconfig)
                    .env("ARGOCD_FAKE_IN_CLUSTER", "true");
                application_namespaces(&mut cmd, &options.application_namespaces);
                cmd
            })
            .await?;
        Ok(Self {
            procs,
            repo_server,
            redis,
        })
    }

    /// The repo-server's gRPC address (plain text).
    pub fn repo_server(&self) -> SocketAddr {
        self.repo_server
    }

    /// This Argo CD's Redis.
    pub fn redis(&self) -> SocketAddr {
        self.redis
    }

    /// The last lines `component` (`redis`, `repo-server`,
    /// `application-controller`) logged.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        self.procs.log_tail(component, lines)
    }

    /// Where the components keep their logs and scratch files.
    pub fn dir(&self) -> &Path {
        &self.procs.dir
    }
}

/// The hub's Argo CD as the pull model runs it: the applicationset-controller
/// only. The Applications it generates stay on the hub for argocd-pull to
/// deliver; nothing on the hub deploys them.
pub struct Hub {
    procs: Processes,
}

impl Hub {
    /// Installs Argo CD's settings and default project on `cluster` and
    /// starts the applicationset-controller; returns once it is listening.
    pub async fn start(cluster: &Cluster, options: HubOptions) -> Result<Self> {
        let argocd = require(&paths::bin_dir().join("argocd"))?;
        install(cluster).await?;
        let procs = Processes::new(cluster.dir().join("argocd"))?;
        let kubeconfig = cluster.kubeconfig().to_path_buf();
        procs
            .start("applicationset-controller", 3, |ports| {
                let mut cmd = component(&argocd, "argocd-applicationset-controller");
                cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .arg(format!("--namespace={NAMESPACE}"))
                    .arg(format!("--probe-addr=127.0.0.1:{}", ports[0]))
                    .arg(format!("--metrics-addr=127.0.0.1:{}", ports[1]))
                    .arg(format!("--webhook-addr=127.0.0.1:{}", ports[2]))
                    // Only the Git and plugin generators ask a repo-server;
                    // the hub has none.
                    .arg("--argocd-repo-server=127.0.0.1:1")
                    .arg("--repo-server-plaintext")
                    // Required with more than one namespace; no SCM here.
                    .arg("--enable-scm-providers=false")
                    // Its controller-runtime client reads only $KUBECONFIG.
                    .env("KUBECONFIG", &kubeconfig);
                if !options.applicationset_namespaces.is_empty() {
                    cmd.arg(format!(
                        "--applicationset-namespaces={}",
                        options.applicationset_namespaces.join(",")
                    ));
                }
                if options.progressive_syncs {
                    cmd.arg("--enable-progressive-syncs");
                }
                cmd.args(&options.args);
                cmd.envs(options.env.iter().map(|(k, v)| (k, v)));
                cmd
            })
            .await?;
        Ok(Self { procs })
    }

    /// The last lines the applicationset-controller logged.
    pub fn log_tail(&self, lines: usize) -> String {
        self.procs.log_tail("applicationset-controller", lines)
    }

    /// Where the controller keeps its log.
    pub fn dir(&self) -> &Path {
        &self.procs.dir
    }
}

/// How the hub's argocd-server runs.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The local `admin` account's password.
    pub admin_password: String,
    /// Namespaces besides [`NAMESPACE`] whose Applications it shows
    /// (`--application-namespaces`, globs).
    pub application_namespaces: Vec<String>,
    /// The port of its API and UI on 127.0.0.1 (`None`: a free one).
    pub port: Option<u16>,
    /// Keys of `argocd-cm` set before it starts (`exec.enabled`,
    /// `exec.shells`: argocd-server reads the shells once, at start).
    pub settings: Vec<(String, String)>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            admin_password: "argocd-pull-admin".into(),
            application_namespaces: vec!["*".into()],
            port: None,
            settings: Vec::new(),
        }
    }
}

/// The hub's Argo CD API server with its UI (and its own Redis), as a user
/// runs it next to the pull model: it shows the hub copies of the pulled
/// Applications, whose status the clusters report. Plain HTTP on loopback
/// (`--insecure`); the `admin` account logs in with
/// [`ServerOptions::admin_password`].
pub struct Server {
    procs: Processes,
    addr: SocketAddr,
    redis: SocketAddr,
    admin_password: String,
}

impl Server {
    /// Installs Argo CD's settings (as [`Hub::start`] does), sets the admin
    /// password in `argocd-secret`, and starts Redis and
    /// argocd-server on `cluster`, with the UI `test/tools/build.sh` built
    /// into it. Returns once the API answers.
    pub async fn start(cluster: &Cluster, options: ServerOptions) -> Result<Self> {
        let server = require(&paths::bin_dir().join("argocd-server"))?;
        let redis_bin = require(&paths::bin_dir().join("redis-server"))?;
        // Idempotent; the Hub may have done it already.
        install(cluster).await?;
        set_admin_password(cluster, &options.admin_password).await?;
        settings(cluster, &options.settings).await?;
        let procs = Processes::new(cluster.dir().join("argocd-server"))?;
        let redis = procs.start_redis(&redis_bin).await?;
        // What the UI asks a repo-server for (a commit's author and
        // message under LAST SYNC, the manifests of Git): a hub's Argo CD
        // runs one, as here.
        let argocd = require(&paths::bin_dir().join("argocd"))?;
        let repo_server =
            start_repo_server(&procs, &argocd, SocketAddr::from(([127, 0, 0, 1], redis))).await?;
        let kubeconfig = cluster.kubeconfig().to_path_buf();
        let ports = procs
            .start_on("argocd-server", 2, options.port, |ports| {
                let mut cmd = Command::new(&server);
                cmd.arg("--logformat=text")
                    .arg("--loglevel=info")
                    .arg(format!("--kubeconfig={}", kubeconfig.display()))
                    .arg(format!("--namespace={NAMESPACE}"))
                    .arg("--address=127.0.0.1")
                    .arg(format!("--port={}", ports[0]))
                    .arg("--metrics-address=127.0.0.1")
                    .arg(format!("--metrics-port={}", ports[1]))
                    .arg("--insecure")
                    .arg(format!("--redis=127.0.0.1:{redis}"))
                    .arg(format!("--repo-server={repo_server}"))
                    .arg("--repo-server-plaintext")
                    .arg("--dex-server=")
                    .arg("--repo-server-timeout-seconds=5")
                    .env("KUBECONFIG", &kubeconfig)
                    .env("ARGOCD_BINARY_NAME", "argocd-server");
                application_namespaces(&mut cmd, &options.application_namespaces);
                cmd
            })
            .await?;
        Ok(Self {
            procs,
            addr: SocketAddr::from(([127, 0, 0, 1], ports[0])),
            redis: SocketAddr::from(([127, 0, 0, 1], redis)),
            admin_password: options.admin_password,
        })
    }

    /// Where its API and UI listen (plain HTTP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its Redis (no password), where it reads the Applications' trees.
    pub fn redis(&self) -> SocketAddr {
        self.redis
    }

    /// The `admin` account's password.
    pub fn admin_password(&self) -> &str {
        &self.admin_password
    }

    /// Logs in through the API as the UI and CLI do (`POST
    /// /api/v1/session`); the session token.
    pub async fn login(&self, username: &str, password: &str) -> Result<String> {
        let body = json!({ "username": username, "password": password });
        let (code, reply) = self
            .api(http::Method::POST, "/api/v1/session", None, Some(&body))
            .await?;
        match reply["token"].as_str() {
            Some(token) if code == 200 => Ok(token.to_string()),
            _ => Err(Error::Command {
                command: format!("POST {}/api/v1/session as {username}", self.url()),
                output: format!("{code}: {reply}"),
            }),
        }
    }

    /// The nodes of the resource tree argocd-server answers for
    /// Application `namespace/app` (its API's `resource-tree`, what the UI
    /// and `argocd app resources` read); the status and body when it has
    /// none. Ask only once the tree is in Redis: on a miss argocd-server
    /// waits for a refresh.
    pub async fn tree_nodes(
        &self,
        token: &str,
        namespace: &str,
        app: &str,
    ) -> std::result::Result<Vec<serde_json::Value>, String> {
        let (code, tree) = self
            .api(
                http::Method::GET,
                &format!("/api/v1/applications/{app}/resource-tree?appNamespace={namespace}"),
                Some(token),
                None,
            )
            .await
            .map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("{code}: {tree}"));
        }
        Ok(tree["nodes"].as_array().cloned().unwrap_or_default())
    }

    /// One call of Argo CD's REST API with bearer `token`: its status code
    /// and JSON body (`null` when the body is empty or not JSON).
    pub async fn api(
        &self,
        method: http::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value)> {
        use http_body_util::BodyExt;
        let (response, conn) = self.send(method.clone(), path, token, body).await?;
        let code = response.status().as_u16();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| self.failed(&method, path, &e))?
            .to_bytes();
        conn.abort();
        Ok((
            code,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        ))
    }

    /// A `GET` of Argo CD's REST API whose answer streams (a followed log:
    /// one JSON object a line), read line by line as it comes.
    pub async fn stream(&self, path: &str, token: &str) -> Result<(u16, Lines)> {
        let (response, conn) = self
            .send(http::Method::GET, path, Some(token), None)
            .await?;
        let code = response.status().as_u16();
        Ok((
            code,
            Lines {
                body: response.into_body(),
                buffer: Vec::new(),
                conn,
            },
        ))
    }

    fn failed(&self, method: &http::Method, path: &str, e: &dyn std::fmt::Display) -> Error {
        Error::Command {
            command: format!("{method} {}{path}", self.url()),
            output: e.to_string(),
        }
    }

    /// Sends one request on a connection of its own; its answer's head,
    /// and the connection's task (aborted when done with).
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        token: Option<&str>,
        body: Option<&serde_json::Value>,
    ) -> Result<(
        http::Response<hyper::body::Incoming>,
        tokio::task::JoinHandle<std::result::Result<(), hyper::Error>>,
    )> {
        use http_body_util::Full;
        let failed = |e: &dyn std::fmt::Display| self.failed(&method, path, e);
        let stream = tokio::net::TcpStream::connect(self.addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .map_err(|e| failed(&e))?;
        let conn = tokio::spawn(conn);
        let mut request = http::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = token {
            request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let request = request
            .body(Full::new(bytes::Bytes::from(payload)))
            .map_err(|e| failed(&e))?;
        let response = tokio::time::timeout(START_TIMEOUT, sender.send_request(request))
            .await
            .map_err(|e| failed(&e))?
            .map_err(|e| failed(&e))?;
        Ok((response, conn))
    }

    /// The Applications argocd-server lists to session `token` (`GET
    /// /api/v1/applications`, answered from its informer's cache, which
    /// sees a write a moment after the API server stored it: poll it); the
    /// status and body as the error when it does not answer 200.
    pub async fn list_applications(
        &self,
        token: &str,
    ) -> std::result::Result<Vec<serde_json::Value>, String> {
        let (code, list) = self
            .api(http::Method::GET, "/api/v1/applications", Some(token), None)
            .await
            .map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("{code}: {list}"));
        }
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// `argocd app get <app> -o json` with Argo CD's CLI against this
    /// server, as a user runs it with the session `token`.
    pub fn app_get(&self, token: &str, app: &str) -> Result<serde_json::Value> {
        let out = self.cli(token, &["app", "get", app, "-o", "json"])?;
        serde_json::from_str(&out).map_err(|e| Error::Command {
            command: format!("argocd app get {app}"),
            output: format!("not JSON ({e}): {out}"),
        })
    }

    /// `argocd <args>` with Argo CD's CLI against this server, as a user
    /// runs it with the session `token`: what it printed, or what it said
    /// on stderr when it failed.
    pub fn cli(&self, token: &str, args: &[&str]) -> Result<String> {
        let out = Command::new(cli()?)
            .args(args)
            .arg("--plaintext")
            .args(["--server", &self.addr().to_string(), "--auth-token", token])
            .env("HOME", self.dir())
            .output()?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("argocd {}", args.join(" ")),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Logs in as the local admin on the UI's login page in `page`, as a
    /// person does, and waits for the Applications list.
    pub async fn ui_login(&self, page: &mut crate::browser::Page, within: Duration) -> Result<()> {
        page.navigate(&format!("{}/login", self.url())).await?;
        page.wait_for(
            "the login page",
            "document.querySelector('input[name=username]') !== null",
            within,
        )
        .await?;
        page.type_into("input[name=username]", "admin").await?;
        page.type_into("input[name=password]", self.admin_password())
            .await?;
        page.click("button[type=submit]").await?;
        page.wait_for(
            "the Applications list after the login",
            "location.pathname.startsWith('/applications')",
            within,
        )
        .await?;
        Ok(())
    }

    /// Waits until `expr` holds on `page` of this server's UI; the error
    /// says what the page showed and what argocd-server last logged.
    pub async fn ui_wait_for(
        &self,
        page: &mut crate::browser::Page,
        what: &str,
        expr: &str,
        within: Duration,
    ) -> Result<()> {
        match page.wait_for(what, expr, within).await {
            Ok(_) => Ok(()),
            Err(Error::Command { command, output }) => Err(Error::Command {
                command,
                output: format!(
                    "{output}\nargocd-server: {}",
                    self.log_tail("argocd-server", 20)
                ),
            }),
            Err(e) => Err(e),
        }
    }

    /// The last lines `component` (`argocd-server`, `redis`) logged.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        self.procs.log_tail(component, lines)
    }

    /// Where it keeps its logs.
    pub fn dir(&self) -> &Path {
        &self.procs.dir
    }
}

/// The Applications in [`NAMESPACE`].
pub fn applications(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &argocd_pull_apis::argocd::application_resource(),
    )
}

/// The hub copy of a pulled Application `name` in [`NAMESPACE`], as
/// `example/` makes it for cluster1 (labelled for the pull model, with
/// `skip-reconcile`), with `status` written as the hub-controller writes a
/// cluster's report (by the test's own field manager: this copy stands in
/// for a delivered one; the end-to-end test checks really delivered ones).
pub async fn pulled_application(
    client: &kube::Client,
    name: &str,
    status: serde_json::Value,
) -> Result<()> {
    let apps = applications(client);
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {
            "name": name, "namespace": NAMESPACE,
            "labels": { "apps.open-cluster-management.io/pull-to-ocm-managed-cluster": "true" },
            "annotations": {
                "apps.open-cluster-management.io/ocm-managed-cluster": "cluster1",
                "argocd.argoproj.io/skip-reconcile": "true",
            },
        },
        "spec": {
            "project": DEFAULT_PROJECT,
            "source": { "repoURL": "git://127.0.0.1:9418/guestbook.git", "targetRevision": "main", "path": "guestbook" },
            "destination": { "server": IN_CLUSTER, "namespace": "guestbook" },
            "syncPolicy": { "automated": {} },
        },
    }))
    .expect("a valid Application");
    apps.create(&kube::api::PostParams::default(), &app).await?;
    set_status(client, name, status).await
}

/// Writes `status` onto hub copy `name` in [`NAMESPACE`] (Argo CD's
/// Application has no status subresource: the status is part of the
/// object, as the hub-controller writes it).
pub async fn set_status(
    client: &kube::Client,
    name: &str,
    status: serde_json::Value,
) -> Result<()> {
    let apps = applications(client);
    let patch = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "status": status,
    });
    apps.patch(
        name,
        &PatchParams::apply("argocd-pull-test").force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

/// What cluster1 reports for the guestbook once synced: Synced, Healthy,
/// its Service and Deployment with the health of each (`deployment`: the
/// Deployment's).
pub fn guestbook_status(deployment: &str) -> serde_json::Value {
    json!({
        "sync": { "status": "Synced", "revision": "4b825dc642cb6eb9a060e54bf8d69288fbee4904" },
        "health": { "status": deployment },
        "resources": [
            { "version": "v1", "kind": "Service", "namespace": "guestbook", "name": "guestbook-ui",
              "status": "Synced", "health": { "status": "Healthy" } },
            { "group": "apps", "version": "v1", "kind": "Deployment", "namespace": "guestbook",
              "name": "guestbook-ui", "status": "Synced", "health": { "status": deployment } },
        ],
        "sourceType": "Directory",
    })
}

/// Argo CD's CLI (`$CACHE/bin/argocd-cli/argocd`).
pub fn cli() -> Result<PathBuf> {
    require(&paths::bin_dir().join("argocd-cli").join("argocd"))
}

/// Sets the local admin's password as Argo CD's own `argocd account
/// update-password` would store it: a bcrypt hash in `argocd-secret`'s
/// `admin.password`, with `admin.passwordMtime` (which invalidates older
/// sessions). The hash comes from the CLI's `argocd account bcrypt`.
async fn set_admin_password(cluster: &Cluster, password: &str) -> Result<()> {
    let hash = run(Command::new(cli()?).args(["account", "bcrypt", "--password", password]))?;
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    apply_in_namespace::<Secret>(
        &cluster.client().await?,
        &PatchParams::apply(&format!("{FIELD_MANAGER}-admin")).force(),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "argocd-secret", "namespace": NAMESPACE },
            "stringData": { "admin.password": hash, "admin.passwordMtime": now },
        }),
    )
    .await
}

/// Adds the local account `name` (login only) with `password`, and sets
/// Argo CD's RBAC (`argocd-rbac-cm`'s `policy.csv`) to `policy`, as a
/// platform team gives a tenant its rights; argocd-server picks both up
/// without a restart.
pub async fn add_local_account(
    cluster: &Cluster,
    name: &str,
    password: &str,
    policy: &str,
) -> Result<()> {
    let hash = run(Command::new(cli()?).args(["account", "bcrypt", "--password", password]))?;
    let client = cluster.client().await?;
    let pp = PatchParams::apply(&format!("{FIELD_MANAGER}-account-{name}")).force();
    apply_in_namespace::<ConfigMap>(
        &client,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "argocd-cm", "namespace": NAMESPACE },
            "data": { format!("accounts.{name}"): "login" },
        }),
    )
    .await?;
    apply_in_namespace::<Secret>(
        &client,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "argocd-secret", "namespace": NAMESPACE },
            "stringData": { format!("accounts.{name}.password"): hash },
        }),
    )
    .await?;
    apply_in_namespace::<ConfigMap>(
        &client,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "argocd-rbac-cm", "namespace": NAMESPACE,
                          "labels": { "app.kubernetes.io/part-of": "argocd" } },
            "data": { "policy.csv": policy },
        }),
    )
    .await
}

/// Server-side applies `object` (a `K`, named in its metadata) in Argo
/// CD's namespace with `pp`.
async fn apply_in_namespace<K>(
    client: &kube::Client,
    pp: &PatchParams,
    object: serde_json::Value,
) -> Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    let name = object.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), NAMESPACE)
        .patch(&name, pp, &Patch::Apply(&object))
        .await?;
    Ok(())
}

/// The API resource of `appprojects.argoproj.io`.
pub fn appproject_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    )
}

/// The API resource of `applicationsets.argoproj.io`.
pub fn applicationset_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "ApplicationSet"),
        "applicationsets",
    )
}

/// Sets `keys` in argocd-cm, with a field manager of their own.
async fn settings(cluster: &Cluster, keys: &[(String, String)]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let data: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let pp = PatchParams::apply("argocd-pull-test-settings").force();
    apply_in_namespace::<ConfigMap>(
        &cluster.client().await?,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "argocd-cm", "namespace": NAMESPACE },
            "data": data,
        }),
    )
    .await
}

/// What Argo CD's install manifests and API server would put in place:
/// its namespace, its settings and the `default` project.
async fn install(cluster: &Cluster) -> Result<()> {
    cluster.ensure_namespace(NAMESPACE).await?;
    let client = cluster.client().await?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let part_of = json!({ "app.kubernetes.io/part-of": "argocd" });
    apply_in_namespace::<ConfigMap>(
        &client,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "argocd-cm", "namespace": NAMESPACE, "labels": part_of },
        }),
    )
    .await?;
    apply_in_namespace::<Secret>(
        &client,
        &pp,
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": "argocd-secret", "namespace": NAMESPACE, "labels": part_of },
            "stringData": { "server.secretkey": format!("{:032x}", rand_u128()) },
        }),
    )
    .await?;
    default_project(cluster).await
}

/// Namespace [`NAMESPACE`] and the `default` AppProject in it, as Argo CD's
/// API server creates it, but opened to Applications in every namespace
/// (`sourceNamespaces: ["*"]`): tests about other things put Applications
/// in namespaces of their own. Every hub cluster gets it at its start (the
/// hub-controller enforces AppProjects); tests about projects narrow it.
pub async fn default_project(cluster: &Cluster) -> Result<()> {
    cluster.ensure_namespace(NAMESPACE).await?;
    let client = cluster.client().await?;
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let ar = appproject_resource();
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": { "name": DEFAULT_PROJECT, "namespace": NAMESPACE },
        "spec": {
            "sourceRepos": ["*"],
            "sourceNamespaces": ["*"],
            "destinations": [{ "server": "*", "namespace": "*" }],
            "clusterResourceWhitelist": [{ "group": "*", "kind": "*" }],
        },
    }))
    .expect("a valid AppProject");
    Api::<DynamicObject>::namespaced_with(client, NAMESPACE, &ar)
        .patch(DEFAULT_PROJECT, &pp, &Patch::Apply(&project))
        .await?;
    Ok(())
}

/// Not cryptographic: the test API server's data is thrown away.
fn rand_u128() -> u128 {
    use std::hash::{BuildHasher, RandomState};
    let s = RandomState::new();
    (u128::from(s.hash_one(1u8)) << 64) | u128::from(s.hash_one(2u8))
}

/// A Git server on 127.0.0.1 (`git daemon`, anonymous `git://`), serving
/// the bare repositories made with [`GitServer::create_repo`].
pub struct GitServer {
    procs: Processes,
    repos: PathBuf,
    port: u16,
}

impl GitServer {
    /// Starts `git daemon` on a free loopback port, in a fresh folder under
    /// [`paths::run_dir`].
    pub async fn start() -> Result<Self> {
        Self::start_on(None).await
    }

    /// Starts `git daemon` on 127.0.0.1:`port` (a free one with `None`);
    /// fails if that port is taken.
    pub async fn start_on(port: Option<u16>) -> Result<Self> {
        let base = paths::run_dir();
        std::fs::create_dir_all(&base)?;
        let dir = tempfile::Builder::new()
            .prefix("git-")
            .tempdir_in(&base)?
            .keep();
        let procs = Processes::new(dir.clone())?;
        let repos = dir.join("repos");
        std::fs::create_dir_all(&repos)?;
        // `git daemon` would run git-daemon as its child, which outlives a
        // kill of `git`: start the daemon itself.
        let daemon = PathBuf::from(run(git().arg("--exec-path"))?).join("git-daemon");
        let port = procs
            .start_on("git-daemon", 1, port, |ports| {
                let mut cmd = git_command(&daemon);
                cmd.arg("--listen=127.0.0.1")
                    .arg(format!("--port={}", ports[0]))
                    .arg("--reuseaddr")
                    .arg("--export-all")
                    .arg("--informative-errors")
                    .arg("--verbose")
                    .arg(format!("--base-path={}", repos.display()))
                    .arg(&repos);
                cmd
            })
            .await?[0];
        Ok(Self { procs, repos, port })
    }

    /// Creates an empty repository `name` (branch `main`), served at
    /// `git://127.0.0.1:<port>/<name>.git`.
    pub fn create_repo(&self, name: &str) -> Result<Repo> {
        let git_dir = self.repos.join(format!("{name}.git"));
        let work = self.procs.dir.join("work").join(name);
        std::fs::create_dir_all(&work)?;
        run(git()
            .args(["init", "--quiet", "--bare", "--initial-branch=main"])
            .arg(&git_dir))?;
        Ok(Repo {
            url: format!("git://127.0.0.1:{}/{name}.git", self.port),
            git_dir,
            work,
        })
    }

    /// The last lines `git daemon` logged (one per request with `--verbose`).
    pub fn log_tail(&self, lines: usize) -> String {
        self.procs.log_tail("git-daemon", lines)
    }
}

/// A repository of a [`GitServer`], committed to directly (no clone, no push).
pub struct Repo {
    url: String,
    git_dir: PathBuf,
    work: PathBuf,
}

impl Repo {
    /// The URL Argo CD's `spec.source.repoURL` takes.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Writes `files` (path relative to the repository, content), commits
    /// the whole tree on `main` and returns the new commit's SHA. Files
    /// written by earlier commits stay unless overwritten; [`Repo::remove`]
    /// takes them out.
    pub fn commit(&self, message: &str, files: &[(&str, &str)]) -> Result<String> {
        for (path, content) in files {
            let path = self.work.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, content)?;
        }
        self.commit_tree(message)
    }

    /// Removes `paths` from the tree and commits; returns the new SHA.
    pub fn remove(&self, message: &str, paths: &[&str]) -> Result<String> {
        for path in paths {
            std::fs::remove_file(self.work.join(path))?;
        }
        self.commit_tree(message)
    }

    /// The SHA `main` points at.
    pub fn head(&self) -> Result<String> {
        run(self.git().args(["rev-parse", "refs/heads/main"]))
    }

    fn commit_tree(&self, message: &str) -> Result<String> {
        run(self.git().args(["add", "--all"]))?;
        run(self
            .git()
            .args(["commit", "--quiet", "--allow-empty", "-m", message]))?;
        self.head()
    }

    fn git(&self) -> Command {
        let mut cmd = git();
        cmd.arg(format!("--git-dir={}", self.git_dir.display()))
            .arg(format!("--work-tree={}", self.work.display()))
            .args(["-c", "user.name=argocd-pull tests"])
            .args(["-c", "user.email=tests@argocd-pull.invalid"]);
        cmd
    }
}

/// `git`, unaffected by the user's or the machine's Git configuration.
fn git() -> Command {
    git_command(Path::new("git"))
}

fn git_command(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0");
    cmd
}

/// Runs a short command; its trimmed stdout, or an error with its output.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output()?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    Err(Error::Command {
        command: format!("{cmd:?}"),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

/// `argocd <component>`: the multi-call binary picks the component from its
/// first argument.
/// `--application-namespaces`, where there are any.
fn application_namespaces(cmd: &mut Command, namespaces: &[String]) {
    if !namespaces.is_empty() {
        cmd.arg(format!("--application-namespaces={}", namespaces.join(",")));
    }
}

/// Starts a repo-server of `argocd` in `procs`, with Redis `redis`;
/// returns its gRPC address (plain text).
async fn start_repo_server(
    procs: &Processes,
    argocd: &Path,
    redis: SocketAddr,
) -> Result<SocketAddr> {
    let dir = procs.dir.clone();
    let tmp = dir.join("repo-server-tmp");
    std::fs::create_dir_all(&tmp)?;
    let ports = procs
        .start("repo-server", 2, |ports| {
            let mut cmd = component(argocd, "argocd-repo-server");
            cmd.arg("--address=127.0.0.1")
                .arg(format!("--port={}", ports[0]))
                .arg("--metrics-address=127.0.0.1")
                .arg(format!("--metrics-port={}", ports[1]))
                .arg(format!("--redis={redis}"))
                .arg("--disable-tls")
                // Its default (a path in the image) is refused with
                // --disable-tls.
                .arg("--client-ca-path=")
                // Clones go to $TMPDIR/_argocd-repo.
                .env("TMPDIR", &tmp)
                .env("ARGOCD_ASK_PASS_SOCK", dir.join("askpass.sock"))
                .env("ARGOCD_GPG_ENABLED", "false")
                // git runs with GIT_ASKPASS=argocd: our binary answers
                // as the askpass helper too.
                .env("PATH", path_with(&paths::bin_dir()));
            cmd
        })
        .await?;
    Ok(SocketAddr::from(([127, 0, 0, 1], ports[0])))
}

fn component(argocd: &Path, name: &str) -> Command {
    let mut cmd = Command::new(argocd);
    cmd.arg(name).arg("--logformat=text").arg("--loglevel=info");
    cmd
}

fn path_with(dir: &Path) -> std::ffi::OsString {
    let mut dirs = vec![dir.to_path_buf()];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    std::env::join_paths(dirs).expect("PATH entries hold no separator")
}

fn require(tool: &Path) -> Result<PathBuf> {
    if tool.is_file() {
        Ok(tool.to_path_buf())
    } else {
        Err(Error::MissingTool(tool.to_path_buf()))
    }
}

/// The processes of one Argo CD (or Git server) and their folder: killed
/// and removed on drop, or by the group's reaper when the test process dies.
struct Processes {
    dir: PathBuf,
    group: Mutex<Group>,
}

impl Processes {
    fn new(dir: PathBuf) -> Result<Self> {
        std::fs::create_dir_all(&dir)?;
        let keep = std::env::var_os("ARGOCD_PULL_KEEP_DATA").is_some();
        let group = Group::new(dir.clone(), keep)?;
        Ok(Self {
            dir,
            group: Mutex::new(group),
        })
    }

    fn group(&self) -> MutexGuard<'_, Group> {
        // Every change to the group is a single push or retain.
        self.group.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts Redis on a free loopback port, in this folder; returns the port.
    async fn start_redis(&self, redis_bin: &Path) -> Result<u16> {
        let dir = self.dir.clone();
        let ports = self
            .start("redis", 1, |ports| {
                let mut cmd = Command::new(redis_bin);
                cmd.args(["--bind", "127.0.0.1", "--port", &ports[0].to_string()])
                    // A cache: nothing to persist.
                    .args(["--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(&dir);
                cmd
            })
            .await?;
        Ok(ports[0])
    }

    /// Starts `name` with `ports` free loopback ports (`command` builds its
    /// command line from them) and waits until it accepts connections on
    /// the first. A port taken in the meantime is retried with new ones.
    async fn start(
        &self,
        name: &'static str,
        ports: usize,
        command: impl Fn(&[u16]) -> Command,
    ) -> Result<Vec<u16>> {
        self.start_on(name, ports, None, command).await
    }

    /// [`Processes::start`], with the first port fixed to `first` if given
    /// (then a port clash is an error, not retried).
    async fn start_on(
        &self,
        name: &'static str,
        ports: usize,
        first: Option<u16>,
        command: impl Fn(&[u16]) -> Command,
    ) -> Result<Vec<u16>> {
        if let Some(port) = first {
            // Something else listening there would pass for our process.
            std::net::TcpListener::bind(("127.0.0.1", port)).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("{name} needs 127.0.0.1:{port}, which is taken: {e}"),
                )
            })?;
        }
        let mut last = None;
        let attempts = if first.is_some() { 1 } else { PORT_ATTEMPTS };
        for _ in 0..attempts {
            let mut picked = (0..ports)
                .map(|_| free_addr().map(|a| a.port()))
                .collect::<std::io::Result<Vec<u16>>>()?;
            if let Some(port) = first {
                picked[0] = port;
            }
            self.group().spawn(name, command(&picked))?;
            match self.wait_listening(name, picked[0]).await {
                Ok(()) => return Ok(picked),
                Err(e @ Error::PortClash(_)) => {
                    self.group().stop(name);
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    async fn wait_listening(&self, name: &'static str, port: u16) -> Result<()> {
        crate::process::wait_listening(
            name,
            SocketAddr::from(([127, 0, 0, 1], port)),
            START_TIMEOUT,
            || self.exited(name),
            || self.log_tail(name, 30),
        )
        .await
    }

    fn exited(&self, name: &str) -> Option<Error> {
        self.group().exited(Some(name))
    }

    fn log_tail(&self, name: &str, lines: usize) -> String {
        self.group().log_tail(name, lines)
    }
}

/// The lines of a streamed answer of argocd-server ([`Server::stream`]).
pub struct Lines {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    conn: tokio::task::JoinHandle<std::result::Result<(), hyper::Error>>,
}

impl Lines {
    /// The next whole line; `None` when the answer ended.
    pub async fn next(&mut self) -> Result<Option<String>> {
        use http_body_util::BodyExt;
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return Ok(Some(String::from_utf8_lossy(&line[..at]).into_owned()));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.buffer.extend_from_slice(data);
                    }
                }
                Some(Err(e)) => {
                    return Err(Error::Command {
                        command: "a streamed answer of argocd-server".into(),
                        output: e.to_string(),
                    });
                }
                None if self.buffer.is_empty() => return Ok(None),
                None => {
                    let line = std::mem::take(&mut self.buffer);
                    return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
                }
            }
        }
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        self.conn.abort();
    }
}
