//! A controller under test (ours or upstream's), run as a child process and
//! seen only from outside: readiness, metrics, /proc figures, its log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use testenv::net;
use tokio::io::AsyncReadExt;

use crate::Impl;
use crate::stats::{RequestMetric, metric_sum, requests_by_method};

/// A controller under test, started through a small `sh` guard that kills it
/// when the benchmark goes away, however it goes away (the guard holds a pipe
/// from us and kills the controller when it reads end-of-file).
pub struct Controller {
    pub which: Impl,
    guard: tokio::process::Child,
    pid: u32,
    metrics: SocketAddr,
    pub log: PathBuf,
}

const GUARD: &str = r#"
exec 3<&0
"$@" </dev/null &
pid=$!
echo "$pid"
( read -r _ <&3; kill -TERM "$pid" 2>/dev/null ) &
wait "$pid"
"#;

/// Reconcile counters read from a controller's metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Counts {
    pub total: Option<f64>,
    pub errors: Option<f64>,
}

impl Controller {
    pub async fn start(which: Impl, bin: &Path, kubeconfig: &Path, log: &Path) -> Result<Self> {
        let metrics = net::free_addr()?;
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(GUARD).arg("bench-guard").arg(bin);
        let ready = match which {
            Impl::Ours => {
                cmd.arg("--kubeconfig")
                    .arg(kubeconfig)
                    .arg("--admin-addr")
                    .arg(metrics.to_string());
                // One replica, like upstream's run; versions before leader
                // election have no such flag.
                if has_flag(bin, "--leader-elect").await {
                    cmd.arg("--leader-elect=false");
                }
                metrics
            }
            Impl::Upstream => {
                let probe = net::free_addr()?;
                cmd.env("KUBECONFIG", kubeconfig)
                    .arg("--mode=basic")
                    .arg(format!("--metrics-bind-address={metrics}"))
                    .arg(format!("--health-probe-bind-address={probe}"))
                    .arg("--leader-elect=false")
                    .arg("--argocd-namespace=argocd")
                    .arg("--zap-log-level=info");
                probe
            }
        };
        let out = std::fs::File::create(log)?;
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(out)
            .kill_on_drop(true);
        let mut guard = cmd.spawn().context("starting the controller")?;
        let mut stdout = guard.stdout.take().expect("piped");
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).await? == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let pid: u32 = String::from_utf8_lossy(&line)
            .trim()
            .parse()
            .context("the guard did not report the controller's PID")?;
        let mut controller = Controller {
            which,
            guard,
            pid,
            metrics,
            log: log.to_path_buf(),
        };
        // Ours is ready once its Application cache is synced; upstream's
        // probe only says the process is up, so give it the same settle time.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = controller.exited() {
                bail!(
                    "the {} controller exited at start ({status}); see {}",
                    which.label(),
                    log.display()
                );
            }
            if controller.ready(ready).await {
                break;
            }
            if Instant::now() > deadline {
                bail!("the {} controller was not ready in 120 s", which.label());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(controller)
    }

    /// Ours: `/readyz` on the admin port, which passes once its Application
    /// cache is synced. Upstream: its health probe, or, should that serve no
    /// checks, its metrics showing the Application controller.
    async fn ready(&self, probe: SocketAddr) -> bool {
        if let Ok((200, body)) = net::http_get(probe, "/readyz").await
            && body.trim() == "ok"
        {
            return true;
        }
        self.which == Impl::Upstream
            && matches!(
                net::http_get(self.metrics, "/metrics").await,
                Ok((200, body)) if body.contains("controller_runtime_reconcile_total{controller=\"application\"")
            )
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.guard.try_wait().ok().flatten()
    }

    /// Reconciles of the Application delivery and status paths. Ours counts
    /// them in one counter; upstream's controller-runtime counts per
    /// controller: `application` (delivery) plus `manifestwork` (status),
    /// without `managedcluster` (the cluster Secrets, which ours counts
    /// elsewhere).
    pub async fn reconciles(&self) -> Result<Counts> {
        let (code, body) = net::http_get(self.metrics, "/metrics").await?;
        if code != 200 {
            bail!("metrics answered {code}");
        }
        Ok(match self.which {
            Impl::Ours => Counts {
                total: metric_sum(
                    &body,
                    "argocd_pull_hub_application_reconciles_total",
                    |_| true,
                ),
                errors: metric_sum(
                    &body,
                    "argocd_pull_hub_application_reconcile_errors_total",
                    |_| true,
                ),
            },
            Impl::Upstream => {
                let not_clusters = |labels: &str| !labels.contains("controller=\"managedcluster\"");
                Counts {
                    total: metric_sum(&body, "controller_runtime_reconcile_total", not_clusters),
                    errors: metric_sum(
                        &body,
                        "controller_runtime_reconcile_errors_total",
                        not_clusters,
                    ),
                }
            }
        })
    }

    /// The controller's API requests so far, by HTTP method (`None`: it
    /// exports no request counter).
    pub async fn requests(&self) -> Result<Option<std::collections::BTreeMap<String, f64>>> {
        let (code, body) = net::http_get(self.metrics, "/metrics").await?;
        if code != 200 {
            bail!("metrics answered {code}");
        }
        Ok(requests_by_method(
            &body,
            match self.which {
                Impl::Ours => RequestMetric::Ours,
                Impl::Upstream => RequestMetric::ClientGo,
            },
        ))
    }

    /// A memory figure of the controller from /proc (`VmHWM:` is the peak
    /// resident set, `VmRSS:` the current one), in KiB.
    pub fn rss_kib(&self, field: &str) -> Option<u64> {
        testenv::procfs::memory_kib(self.pid, field)
    }

    /// User plus system CPU time the controller used so far.
    pub fn cpu_time(&self) -> Option<Duration> {
        testenv::procfs::cpu_time(self.pid)
    }

    /// SIGTERM, then SIGKILL after 20 s.
    pub async fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(20), self.guard.wait())
            .await
            .is_err()
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
            let _ = self.guard.wait().await;
        }
    }
}

/// Whether `bin --help` mentions `flag`.
async fn has_flag(bin: &Path, flag: &str) -> bool {
    tokio::process::Command::new(bin)
        .arg("--help")
        .output()
        .await
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
}

/// Lines of a controller's log at error level (ours: plain `tracing` format;
/// upstream: zap's console format).
pub fn count_error_lines(log: &Path) -> std::io::Result<usize> {
    let text = std::fs::read_to_string(log)?;
    Ok(text
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains("\tERROR\t"))
        .count())
}
