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
    bin: PathBuf,
    pub agent_name: String,
    grpc: SocketAddr,
    hub_kubeconfig: PathBuf,
    tls: (PathBuf, PathBuf, PathBuf),
    logs: PathBuf,
    principal: Option<tokio::process::Child>,
    _agent: tokio::process::Child,
    _redis: Option<tokio::process::Child>,
    pub principal_started: Instant,
}

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
fn low_port() -> Result<SocketAddr> {
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

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(name))
        .with_context(|| format!("opening {}/{name}", dir.display()))
}

impl ArgocdAgent {
    /// Starts the principal and the agent `agent_name`; returns at once.
    pub async fn start(
        bin: &Path,
        hub: &Cluster,
        spoke: &Cluster,
        pki: &Pki,
        agent_name: &str,
    ) -> Result<Self> {
        let logs = paths::run_dir().join("bench-logs");
        std::fs::create_dir_all(&logs)?;
        hub.ensure_namespace(PRINCIPAL_NS).await?;
        hub.ensure_namespace(agent_name).await?;
        spoke.ensure_namespace(AGENT_SPOKE_NS).await?;
        let (crt, key) = pki.hub_files();
        let grpc = low_port()?;

        // The agent keeps a cache client for Argo CD's redis; give it one.
        let redis_bin = paths::bin_dir().join("redis-server");
        let redis_addr = net::free_addr()?;
        let redis = if redis_bin.is_file() {
            Some(
                tokio::process::Command::new(&redis_bin)
                    .args(["--bind", "127.0.0.1", "--port", &port(redis_addr)])
                    .args(["--save", "", "--appendonly", "no"])
                    .stdout(Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting redis-server")?,
            )
        } else {
            None
        };

        let agent_tls = pki.agent_files(&format!("argocd-agent-{agent_name}"), agent_name)?;
        let mut this = Self {
            bin: bin.to_path_buf(),
            agent_name: agent_name.to_string(),
            grpc,
            hub_kubeconfig: hub.kubeconfig().to_path_buf(),
            tls: (crt, key, pki.ca_file()),
            logs: logs.clone(),
            principal: None,
            _agent: tokio::process::Command::new("true").spawn()?,
            _redis: redis,
            principal_started: Instant::now(),
        };
        this.start_principal()?;
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
            .arg("--enable-resource-proxy=false")
            .args(["--log-level", "info"])
            // It logs to stdout.
            .stdout(log_file(&logs, "argocd-agent-agent.log")?)
            .stderr(log_file(&logs, "argocd-agent-agent.log")?)
            .kill_on_drop(true)
            .spawn()
            .context("starting argocd-agent's agent")?;
        this._agent = agent;
        Ok(this)
    }

    /// Starts the principal (again); returns at once.
    pub fn start_principal(&mut self) -> Result<()> {
        let (crt, key, ca) = &self.tls;
        let child = tokio::process::Command::new(&self.bin)
            .arg("principal")
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
            .arg("--enable-resource-proxy=false")
            .arg("--disable-redis-proxy")
            .args(["--metrics-port", &port(low_port()?)])
            .args(["--healthz-port", &port(low_port()?)])
            .args(["--log-level", "info"])
            .stdout(log_file(&self.logs, "argocd-agent-principal.log")?)
            .stderr(log_file(&self.logs, "argocd-agent-principal.log")?)
            .kill_on_drop(true)
            .spawn()
            .context("starting argocd-agent's principal")?;
        self.principal = Some(child);
        self.principal_started = Instant::now();
        Ok(())
    }

    /// Ends the principal the way a crash or an OOM kill would (SIGKILL).
    pub async fn kill_principal(&mut self) -> Result<()> {
        if let Some(mut p) = self.principal.take() {
            p.start_kill()?;
            p.wait().await?;
        }
        Ok(())
    }
}
