//! argocd-agent, the peer of our gRPC transport, run as its own binaries
//! (built by test/tools/build-argocd-agent.sh): its principal on the hub API
//! server and one agent in managed mode on the managed API server, with
//! mTLS (the benchmark's CA signs the principal's serving certificate and
//! the agent's client certificate; the principal takes the agent's name
//! from the certificate's CN). Everything listens on 127.0.0.1.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{Context, Result};
use testenv::{Cluster, net, paths};

use crate::hub::Pki;

/// The principal's own namespace on the hub (its Argo CD's namespace).
pub const PRINCIPAL_NS: &str = "argocd";
/// Where the managed agent puts the Applications on the managed cluster;
/// not `argocd`, so that it never meets our agent's copies.
pub const AGENT_SPOKE_NS: &str = "argocd-agent";

/// The principal and one agent. In managed mode the hub Applications of an
/// agent live in the hub namespace named after it.
pub struct ArgocdAgent {
    pub agent_name: String,
    principal: Principal,
    _agent: tokio::process::Child,
    _redis: Option<tokio::process::Child>,
}

/// argocd-agent's principal on the hub API server: mTLS, the agent's name
/// taken from its certificate's CN, every namespace allowed.
pub struct Principal {
    bin: PathBuf,
    grpc: SocketAddr,
    hub_kubeconfig: PathBuf,
    tls: (PathBuf, PathBuf, PathBuf),
    /// Its resource proxy on: it then serves on [`RESOURCE_PROXY`] with
    /// the hub certificate, asking for client certificates of the CA.
    resource_proxy: bool,
    log: PathBuf,
    child: Option<tokio::process::Child>,
    pub started: Instant,
}

/// The level every process of both sides logs at in the comparisons: the
/// default of argocd-agent's `--log-level` and of our binaries.
pub const LOG_LEVEL: &str = "info";

/// The binary `make bench-grpc` builds (`$CACHE/bin/argocd-agent`).
pub fn default_bin() -> PathBuf {
    paths::bin_dir().join("argocd-agent")
}

fn port(addr: SocketAddr) -> String {
    addr.port().to_string()
}

/// A free port on 127.0.0.1 below 32768: argocd-agent refuses metrics and
/// health ports from 32768 up (`invalid port`), where the kernel hands out
/// ephemeral ones.
pub fn low_port() -> Result<SocketAddr> {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos() as u64);
    for i in 0..2000u64 {
        let port = 20000 + ((seed + i * 7919) % 12000) as u16;
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return Ok(l.local_addr()?);
        }
    }
    anyhow::bail!("no free port below 32768 on 127.0.0.1")
}

pub fn log_file(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Cuts the log at `path` to its last `keep` bytes, after a line saying
/// so: the principal logs every event of every agent at `info`, 1.5 to 5 GB
/// a run of 1,000 agents x 10 Applications, and the logs of two such runs
/// helped fill this machine's disk.
/// The tail is what a failed run is read for.
pub fn trim_log(path: &Path, keep: u64) -> Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file.metadata()?.len();
    if len <= keep {
        return Ok(());
    }
    file.seek(SeekFrom::Start(len - keep))?;
    let mut tail = Vec::with_capacity(keep as usize);
    file.read_to_end(&mut tail)?;
    let cut = std::fs::File::create(path)?;
    let mut out = std::io::BufWriter::new(cut);
    writeln!(
        out,
        "[bench-grpc: the first {} bytes of this log were cut after the run; the last {keep} follow]",
        len - keep
    )?;
    out.write_all(&tail)?;
    out.flush()?;
    Ok(())
}

/// A redis server on 127.0.0.1, for the agents' cluster caches (they keep
/// a client of Argo CD's redis); `None` when `redis-server` is not built.
/// Killed with `owner`'s API server if this benchmark is.
pub fn start_redis(owner: &Cluster) -> Result<(Option<tokio::process::Child>, SocketAddr)> {
    let redis_bin = paths::bin_dir().join("redis-server");
    let redis_addr = net::free_addr()?;
    if !redis_bin.is_file() {
        return Ok((None, redis_addr));
    }
    let child = tokio::process::Command::new(&redis_bin)
        .args(["--bind", "127.0.0.1", "--port", &port(redis_addr)])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("starting redis-server")?;
    if let Some(pid) = child.id() {
        owner.adopt(pid);
    }
    Ok((Some(child), redis_addr))
}

/// The benchmark's log folder, made if missing.
pub fn logs_dir() -> Result<PathBuf> {
    let logs = paths::run_dir().join("bench-logs");
    std::fs::create_dir_all(&logs)?;
    Ok(logs)
}

/// Where the principal's resource proxy listens in v0.9.0, whatever its
/// flags say (`principal/server.go`, `defaultResourceProxyListenerAddr`:
/// every address of the host; only 127.0.0.1 is ever sent to).
pub const RESOURCE_PROXY: &str = "127.0.0.1:9090";

impl ArgocdAgent {
    /// Starts the principal and the agent `agent_name`, their resource
    /// proxy off; returns at once.
    pub async fn start(
        bin: &Path,
        hub: &Cluster,
        spoke: &Cluster,
        pki: &Pki,
        agent_name: &str,
    ) -> Result<Self> {
        Self::start_with(bin, hub, spoke, pki, agent_name, false).await
    }

    /// [`ArgocdAgent::start`], with the resource proxy of the principal
    /// and the agent on when `resource_proxy`.
    pub async fn start_with(
        bin: &Path,
        hub: &Cluster,
        spoke: &Cluster,
        pki: &Pki,
        agent_name: &str,
        resource_proxy: bool,
    ) -> Result<Self> {
        let logs = logs_dir()?;
        hub.ensure_namespace(PRINCIPAL_NS).await?;
        hub.ensure_namespace(agent_name).await?;
        spoke.ensure_namespace(AGENT_SPOKE_NS).await?;
        let grpc = low_port()?;
        let (redis, redis_addr) = start_redis(hub)?;
        let agent_tls = pki.agent_files(&format!("argocd-agent-{agent_name}"), agent_name)?;
        let mut principal = Principal::new(bin, hub, pki, grpc, "argocd-agent-principal.log")?;
        principal.resource_proxy = resource_proxy;
        principal.restart(hub)?;
        let agent = tokio::process::Command::new(bin)
            .arg("agent")
            .arg("--kubeconfig")
            .arg(spoke.kubeconfig())
            .args(["--agent-mode", "managed", "--creds", "mtls:any"])
            .args(["--namespace", AGENT_SPOKE_NS])
            .args([
                "--server-address",
                "127.0.0.1",
                "--server-port",
                &port(grpc),
            ])
            .arg("--root-ca-path")
            .arg(&agent_tls.ca)
            .arg("--tls-client-cert")
            .arg(&agent_tls.cert)
            .arg("--tls-client-key")
            .arg(&agent_tls.key)
            .args(["--redis-addr", &redis_addr.to_string()])
            .args(["--metrics-port", &port(low_port()?)])
            .args(["--healthz-port", &port(low_port()?)])
            .arg(format!("--enable-resource-proxy={resource_proxy}"))
            .args(["--log-level", LOG_LEVEL])
            // It logs to stdout.
            .stdout(log_file(&logs.join("argocd-agent-agent.log"))?)
            .stderr(log_file(&logs.join("argocd-agent-agent.log"))?)
            .kill_on_drop(true)
            .spawn()
            .context("starting argocd-agent's agent")?;
        if let Some(pid) = agent.id() {
            // Killed with the spoke's API server if this benchmark is.
            spoke.adopt(pid);
        }
        Ok(Self {
            agent_name: agent_name.to_string(),
            principal,
            _agent: agent,
            _redis: redis,
        })
    }

    /// Starts the principal on `hub` again; returns at once.
    pub fn start_principal(&mut self, hub: &Cluster) -> Result<()> {
        self.principal.restart(hub)
    }

    /// When the principal was last started.
    pub fn principal_started(&self) -> Instant {
        self.principal.started
    }

    /// Ends the principal the way a crash or an OOM kill would (SIGKILL).
    pub async fn kill_principal(&mut self) -> Result<()> {
        self.principal.kill().await
    }
}

impl Principal {
    /// Where it logs.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Starts the principal on `hub`, serving gRPC on `grpc` with the hub
    /// certificate of `pki`, logging at [`LOG_LEVEL`] to `log` in the
    /// benchmark's log folder; returns at once.
    pub fn start(
        bin: &Path,
        hub: &Cluster,
        pki: &Pki,
        grpc: SocketAddr,
        log: &str,
    ) -> Result<Self> {
        let mut this = Self::new(bin, hub, pki, grpc, log)?;
        this.restart(hub)?;
        Ok(this)
    }

    /// [`Principal::start`] without starting it.
    fn new(bin: &Path, hub: &Cluster, pki: &Pki, grpc: SocketAddr, log: &str) -> Result<Self> {
        let (crt, key) = pki.hub_files();
        Ok(Self {
            bin: bin.to_path_buf(),
            grpc,
            hub_kubeconfig: hub.kubeconfig().to_path_buf(),
            tls: (crt, key, pki.ca_file()),
            resource_proxy: false,
            log: logs_dir()?.join(log),
            child: None,
            started: Instant::now(),
        })
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    /// Starts it (again) on `hub`, whose reaper kills it should this
    /// benchmark die first; returns at once.
    pub fn restart(&mut self, hub: &Cluster) -> Result<()> {
        let (crt, key, ca) = &self.tls;
        let resource_proxy: Vec<std::ffi::OsString> = if self.resource_proxy {
            vec![
                "--enable-resource-proxy=true".into(),
                "--resource-proxy-cert-path".into(),
                crt.into(),
                "--resource-proxy-key-path".into(),
                key.into(),
                "--resource-proxy-ca-path".into(),
                ca.into(),
            ]
        } else {
            vec!["--enable-resource-proxy=false".into()]
        };
        let child = tokio::process::Command::new(&self.bin)
            .arg("principal")
            .args(resource_proxy)
            .arg("--kubeconfig")
            .arg(&self.hub_kubeconfig)
            .args(["--namespace", PRINCIPAL_NS, "--allowed-namespaces", "*"])
            .args([
                "--listen-host",
                "127.0.0.1",
                "--listen-port",
                &port(self.grpc),
            ])
            .arg("--tls-cert")
            .arg(crt)
            .arg("--tls-key")
            .arg(key)
            .arg("--root-ca-path")
            .arg(ca)
            .args([
                "--require-client-certs",
                "--auth",
                "mtls:subject:CN=([^,]+)",
            ])
            .arg("--insecure-jwt-generate")
            .arg("--disable-redis-proxy")
            .args(["--metrics-port", &port(low_port()?)])
            .args(["--healthz-port", &port(low_port()?)])
            .args(["--log-level", LOG_LEVEL])
            .stdout(log_file(&self.log)?)
            .stderr(log_file(&self.log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting argocd-agent's principal")?;
        if let Some(pid) = child.id() {
            hub.adopt(pid);
        }
        self.child = Some(child);
        self.started = Instant::now();
        Ok(())
    }

    /// Ends it the way a crash or an OOM kill would (SIGKILL).
    pub async fn kill(&mut self) -> Result<()> {
        if let Some(mut p) = self.child.take() {
            p.start_kill()?;
            p.wait().await?;
        }
        Ok(())
    }
}

/// What argocd-agent runs with other than its defaults, besides the flags
/// that connect the agent and the principal (printed with the settings):
/// the resource and Redis proxies serve the hub's UI, which neither side
/// is measured on (ours has none yet), and the principal needs a JWT key
/// to start.
pub const NOT_DEFAULT: &str = "--enable-resource-proxy=false (agent and principal), --disable-redis-proxy and \
     --insecure-jwt-generate (principal)";

/// What argocd-agent runs with other than its defaults in `live-compare`,
/// besides the flags that connect the agent and the principal: its
/// resource proxy on, with the benchmark's certificates.
pub const NOT_DEFAULT_PROXY: &str = "--resource-proxy-cert-path/-key-path/-ca-path (the benchmark's CA), \
     --disable-redis-proxy and --insecure-jwt-generate (principal)";

#[cfg(test)]
mod tests {
    use super::trim_log;

    #[test]
    fn trim_log_keeps_the_tail_and_says_what_it_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("principal.log");
        std::fs::write(&path, "line 1\nline 2\nline 3\n").unwrap();
        trim_log(&path, 7).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "[bench-grpc: the first 14 bytes of this log were cut after the run; the last 7 follow]\nline 3\n"
        );
        // A log already short enough stays as it is.
        std::fs::write(&path, "short\n").unwrap();
        trim_log(&path, 7).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short\n");
    }
}
