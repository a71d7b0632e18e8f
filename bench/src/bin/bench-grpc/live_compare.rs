//! The live views next to argocd-agent's resource proxy, the same feature
//! of the peer (its principal and agent, v0.9.0, built by
//! test/tools/build-argocd-agent.sh), on the same reads of the same
//! cluster in the same run.
//!
//! One run: the stage of the trees benchmark ([`crate::trees::Stage`]: our
//! hub-controller with its live endpoint and our agent, Argo CD on the
//! managed cluster syncing a ConfigMap and a Deployment of one pod, a node
//! joined), and argocd-agent's principal on the hub API server and its
//! agent (managed mode) on the managed one, both with their resource proxy
//! on. Each path is read with the same Kubernetes client code:
//! - **ours**: the live endpoint at `/clusters/<cluster>` with its token
//!   -> our agent's stream -> the cluster's API server;
//! - **argocd-agent**: the principal's resource proxy with a client
//!   certificate whose CN names the agent -> its agent's event stream ->
//!   the cluster's API server;
//! - **direct**: the cluster's API server itself, the floor of both.
//!
//! Reads: the ConfigMap (GET of one object, as the LIVE MANIFEST tab asks
//! it), `--reads` on each path; then the pod's log followed from the first
//! of `--lines` lines to the last, `--log-reads` on each path, each line
//! with its timestamp as argocd-server asks (argocd-agent's agent asks the
//! cluster for timestamps whatever its reader asked, `agent/log.go`). The paths
//! take turns, in each of the six orders of three in turn, so that none always
//! finds the connections and caches the one before it warmed.
//!
//! Not comparable, and so not measured: argocd-server in front of either
//! (argocd-agent's needs its Redis proxy and cluster Secrets carrying
//! client certificates; ours is timed through argocd-server by `trees`
//! and `logs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use argocd_pull_bench::stats::{Percentiles, percentiles};
use argocd_pull_bench::table::{Better, Compared, side_by_side};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, PostParams};

use crate::argocd_agent::{AGENT_SPOKE_NS, ArgocdAgent, RESOURCE_PROXY};
use crate::hub::{self, Pki};
use crate::logs::{follow, last_line, median, newest_line, wrote};
use crate::report::{self, Row, print_runs};
use crate::trees::{APP, SETTINGS, Stage};

#[derive(clap::Args, Debug)]
pub struct LiveCompareArgs {
    /// Reads of the ConfigMap on each path per run.
    /// Reads of the ConfigMap on each path per run (rounded up to a
    /// multiple of six: see [`order`]).
    #[arg(long, default_value_t = 204)]
    reads: usize,
    /// Lines the pod writes at once, and each log read follows.
    #[arg(long, default_value_t = 20_000)]
    lines: usize,
    /// Log reads on each path per run (rounded up to a multiple of six).
    #[arg(long, default_value_t = 6)]
    log_reads: usize,
    /// argocd-agent's binary (default: what `make bench-grpc-build` builds).
    #[arg(long)]
    argocd_agent: Option<PathBuf>,
    /// The harness's `testenv` binary (it joins the node); by default the
    /// one next to this binary.
    #[arg(long)]
    testenv: Option<PathBuf>,
}

/// argocd-agent's name for the cluster: the CN of its certificates, and
/// its namespace on the hub.
const AGENT: &str = "proxied";
/// How long each path may take to answer its first read.
const FIRST: Duration = Duration::from_secs(180);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    Ours,
    Peer,
    Direct,
}

impl Route {
    const ALL: [Route; 3] = [Route::Ours, Route::Peer, Route::Direct];

    fn label(self) -> &'static str {
        match self {
            Route::Ours => "ours",
            Route::Peer => "argocd-agent",
            Route::Direct => "direct",
        }
    }
}

/// One run's figures, per path in [`Route::ALL`]'s order.
struct Figures {
    reads: [Percentiles; 3],
    /// Lines per second of each log read.
    logs: [Vec<f64>; 3],
}

pub async fn run(args: LiveCompareArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let peer_bin = args
        .argocd_agent
        .clone()
        .unwrap_or_else(crate::argocd_agent::default_bin);
    let testenv = crate::logs::testenv_bin(args.testenv.as_deref())?;
    if !peer_bin.is_file() {
        bail!(
            "{} is missing: build it with test/tools/build-argocd-agent.sh (make bench-grpc-build)",
            peer_bin.display()
        );
    }
    let runs = report::each_round("live-compare", repeat, async |_| {
        one_run(&args, hub_bin, &peer_bin, &testenv).await
    })
    .await;
    let of = |path: usize, pick: fn(&Percentiles) -> Duration| {
        report::per_run(&runs, move |f| Some(pick(&f.reads[path]).as_secs_f64()))
    };
    let lines = |path: usize| report::per_run(&runs, move |f| median(f.logs[path].clone()));
    let p50 = |p: &Percentiles| p.p50;
    let p99 = |p: &Percentiles| p.p99;
    let (ours, peer, direct) = (0, 1, 2);
    let compared = vec![
        Compared::new(
            "a ConfigMap read through the hub and the agent, p50",
            of(ours, p50),
            of(peer, p50),
            report::ms,
            Some(Better::Lower),
        ),
        Compared::new(
            "a ConfigMap read through the hub and the agent, p99",
            of(ours, p99),
            of(peer, p99),
            report::ms,
            Some(Better::Lower),
        ),
        Compared::new(
            "a pod's log followed through the hub and the agent, lines/s",
            lines(ours),
            lines(peer),
            report::rate,
            Some(Better::Higher),
        ),
    ];
    println!(
        "\nThe live views next to argocd-agent's resource proxy: {} reads of a ConfigMap and {} of a pod's {} log lines on each path per run, {repeat} run(s)\n",
        rounds(args.reads),
        rounds(args.log_reads),
        args.lines
    );
    println!(
        "ours: the hub-controller's live endpoint (token) and our agent; argocd-agent: its principal's resource proxy (client certificate, CN {AGENT}) and its agent in managed mode, v0.9.0, at their defaults but for {}. Every process of both sides logs at `{}` (ours: the hub-controller to {}, the agent in this process to stderr; argocd-agent's to files in the same folder). Same client code on each path; the paths in each of the six orders in turn.\n",
        crate::argocd_agent::NOT_DEFAULT_PROXY,
        crate::argocd_agent::LOG_LEVEL,
        crate::argocd_agent::logs_dir()
            .map(|d| d.join("live-compare-hub.log").display().to_string())
            .unwrap_or_default(),
    );
    print!("{}", side_by_side(Route::Peer.label(), &compared));
    print_runs(
        "The floor of both: the same reads straight from the cluster's API server",
        &[
            Row::new("a ConfigMap read, p50", of(direct, p50), report::ms),
            Row::new("a ConfigMap read, p99", of(direct, p99), report::ms),
            Row::new("a pod's log followed, lines/s", lines(direct), report::rate),
        ],
    );
    if report::print_failures("", &runs) {
        bail!("a run failed");
    }
    Ok(())
}

async fn one_run(
    args: &LiveCompareArgs,
    hub_bin: &Path,
    peer_bin: &Path,
    testenv: &Path,
) -> Result<Figures> {
    let chatty =
        testenv::stack::ticker_deployment("chatty", &[crate::logs::LINE, &args.lines.to_string()]);
    let stage = Stage::start(
        "live-compare",
        hub_bin,
        &[("cm.yaml", SETTINGS), ("chatty.yaml", chatty.as_str())],
        Some(testenv),
    )
    .await?;
    let figures = async {
        // The agent reads the tracking method from an argocd-cm in its
        // namespace (Argo CD's settings manager: labelled part-of argocd).
        stage.spoke.ensure_namespace(AGENT_SPOKE_NS).await?;
        let argocd_cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "argocd-cm",
                "labels": { "app.kubernetes.io/part-of": "argocd" }
            }
        }))?;
        Api::<ConfigMap>::namespaced(stage.spoke_client.clone(), AGENT_SPOKE_NS)
            .create(&PostParams::default(), &argocd_cm)
            .await?;
        let _peer =
            ArgocdAgent::start_with(peer_bin, &stage.hub, &stage.spoke, &stage.pki, AGENT, true)
                .await?;
        let clients = [
            hub::live_client(&stage.pki, &format!("{}/clusters/spoke1", stage.live_url))?,
            resource_proxy_client(&stage.pki)?,
            stage.spoke_client.clone(),
        ];
        measure(args, &clients).await
    }
    .await;
    stage.stop().await;
    figures
}

/// A Kubernetes client of argocd-agent's resource proxy as argocd-server's
/// cluster Secret would make it: a client certificate of the CA whose CN
/// names the agent, no retries.
fn resource_proxy_client(pki: &Pki) -> Result<kube::Client> {
    let files = pki.agent_files("argocd-agent-reader", AGENT)?;
    let mut config = pki.kube_config(&format!("https://{RESOURCE_PROXY}"))?;
    config.auth_info.client_certificate = Some(files.cert.display().to_string());
    config.auth_info.client_key = Some(files.key.display().to_string());
    Ok(kube::Client::try_from(config)?)
}

/// The order of the paths in round `i`: the six orders of three in turn,
/// so that over six rounds each path is first, second and last twice, and
/// each comes before each other one three times.
fn order(i: usize) -> [usize; 3] {
    const ORDERS: [[usize; 3]; 6] = [
        [0, 1, 2],
        [1, 0, 2],
        [1, 2, 0],
        [2, 1, 0],
        [2, 0, 1],
        [0, 2, 1],
    ];
    ORDERS[i % 6]
}

/// `n` rounds rounded up to whole cycles of [`order`].
fn rounds(n: usize) -> usize {
    n.div_ceil(6) * 6
}

async fn measure(args: &LiveCompareArgs, clients: &[kube::Client; 3]) -> Result<Figures> {
    let cms = clients
        .clone()
        .map(|c| Api::<ConfigMap>::namespaced(c, APP));
    let pods = clients.clone().map(|c| Api::<Pod>::namespaced(c, APP));
    let read = async |path: usize| -> Result<()> {
        let cm = cms[path].get("settings").await?;
        let value = cm.data.and_then(|d| d.get("value").cloned());
        if value.as_deref() != Some("v0") {
            bail!(
                "{} read the ConfigMap with value {value:?}",
                Route::ALL[path].label()
            );
        }
        Ok(())
    };
    eprintln!("bench-grpc live-compare: waiting for each path to read the ConfigMap");
    for path in 0..3 {
        let deadline = Instant::now() + FIRST;
        loop {
            match read(path).await {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context(format!(
                        "{} never read the ConfigMap",
                        Route::ALL[path].label()
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    let direct = &pods[2];
    let pod = loop {
        let list = direct.list(&Default::default()).await?;
        if let Some(name) = list.items.iter().find_map(|p| p.metadata.name.clone()) {
            break name;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    wrote(direct, &pod, args.lines, Instant::now() + FIRST).await?;

    eprintln!(
        "bench-grpc live-compare: {} reads of the ConfigMap on each path",
        rounds(args.reads)
    );
    let mut reads: [Vec<Duration>; 3] = Default::default();
    for i in 0..rounds(args.reads) {
        for path in order(i) {
            let start = Instant::now();
            read(path).await?;
            reads[path].push(start.elapsed());
        }
    }
    eprintln!(
        "bench-grpc live-compare: {} reads of {} log lines on each path",
        rounds(args.log_reads),
        args.lines
    );
    let last = last_line(args.lines);
    let mut logs: [Vec<f64>; 3] = Default::default();
    for i in 0..rounds(args.log_reads) {
        for path in order(i) {
            // From the burst's first line, whatever came after it.
            let tail = newest_line(direct, &pod).await?;
            let start = Instant::now();
            let n = follow(&pods[path], &pod, tail, &last, true)
                .await
                .with_context(|| format!("{} following the log", Route::ALL[path].label()))?;
            logs[path].push(n as f64 / start.elapsed().as_secs_f64());
        }
    }
    let [a, b, c] = reads;
    let p = |v: Vec<Duration>| percentiles(v).context("no reads");
    Ok(Figures {
        reads: [p(a)?, p(b)?, p(c)?],
        logs,
    })
}

#[cfg(test)]
mod tests {
    use super::{order, rounds};

    #[test]
    fn over_six_rounds_each_path_holds_each_place_and_precedes_each_other_equally() {
        for path in 0..3 {
            for place in 0..3 {
                let n = (0..6).filter(|&i| order(i)[place] == path).count();
                assert_eq!(n, 2, "path {path} in place {place}");
            }
            for other in (0..3).filter(|&o| o != path) {
                let before = (0..6)
                    .filter(|&i| {
                        let o = order(i);
                        o.iter().position(|&p| p == path) < o.iter().position(|&p| p == other)
                    })
                    .count();
                assert_eq!(before, 3, "path {path} before {other}");
            }
        }
        assert_eq!((rounds(1), rounds(6), rounds(200)), (6, 6, 204));
    }
}
