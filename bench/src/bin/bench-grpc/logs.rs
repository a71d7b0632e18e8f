//! A pod's log followed through the hub (capability `live-views`,
//! docs/ui.md): log lines per second as the hub's argocd-server streams
//! them (`argocd app logs --follow`, the UI's LOGS tab: argocd-server ->
//! the hub-controller's live endpoint -> the agent's stream -> the
//! cluster's API server -> the kubelet), next to the same lines followed
//! straight from the cluster's API server.
//!
//! One run: the stage of the trees benchmark ([`crate::trees::Stage`]), a
//! node joined to the managed cluster, and the Application's Deployment of
//! one pod (the harness's `argocd-pull-ticker`) that writes `--lines`
//! lines at once, then one a second. Each read follows the log from its
//! last `--lines` lines and stops at the last of them; the reads go in
//! turns, the direct one first every other time.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

use crate::report::{self, Row, print_runs};
use crate::trees::Stage;

#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// Lines the pod writes at once, and each read follows.
    #[arg(long, default_value_t = 20_000)]
    lines: usize,
    /// Reads of each kind per run.
    #[arg(long, default_value_t = 5)]
    reads: usize,
    /// The harness's `testenv` binary (it joins the node); by default the
    /// one next to this binary.
    #[arg(long)]
    testenv: Option<std::path::PathBuf>,
}

const NS: &str = "bench";
const APP: &str = "trees";
pub const LINE: &str = "bench log line";
/// How long one read may take.
const WITHIN: Duration = Duration::from_secs(120);

/// One run's figures: lines per second of each read, and the reads
/// through the hub that ended before their last line.
struct Figures {
    hub: Vec<f64>,
    direct: Vec<f64>,
    cut: usize,
}

/// The middle value of `v` (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

pub async fn run(args: LogsArgs, repeat: usize, hub_bin: &Path) -> Result<()> {
    let testenv = testenv_bin(args.testenv.as_deref())?;
    let runs = report::each_round("logs", repeat, async |_| {
        one_run(&args, hub_bin, &testenv).await
    })
    .await;
    let hub = report::per_run(&runs, |f| median(f.hub.clone()));
    let direct = report::per_run(&runs, |f| median(f.direct.clone()));
    let ratio = report::per_run(&runs, |f| {
        Some(median(f.direct.clone())? / median(f.hub.clone())?)
    });
    let rows = vec![
        Row::new(
            "log lines followed through the hub (argocd-server, live endpoint, agent), lines/s",
            hub,
            report::rate,
        ),
        Row::new(
            "... the same lines followed straight from the cluster's API server, lines/s",
            direct,
            report::rate,
        ),
        Row::new("direct / through the hub (x)", ratio, |v| format!("{v:.2}")),
        Row::new(
            "reads through the hub cut off before their last line",
            report::per_run(&runs, |f| Some(f.cut as f64)),
            report::count,
        ),
    ];
    print_runs(
        &format!(
            "A pod's log followed through the hub: {} lines, {} reads of each per run, {repeat} run(s)",
            args.lines, args.reads
        ),
        &rows,
    );
    if report::print_failures("", &runs) {
        bail!("a run failed");
    }
    Ok(())
}

async fn one_run(args: &LogsArgs, hub_bin: &Path, testenv: &Path) -> Result<Figures> {
    // One pod writing `--lines` lines at once.
    let lines = args.lines.to_string();
    let yaml = testenv::stack::ticker_deployment("chatty", &[LINE, &lines]);
    let stage = Stage::start(
        "logs",
        hub_bin,
        &[("chatty.yaml", yaml.as_str())],
        Some(testenv),
    )
    .await?;
    let figures = measure(args, &stage).await;
    stage.stop().await;
    figures
}

async fn measure(args: &LogsArgs, stage: &Stage) -> Result<Figures> {
    let (server, token) = (&stage.server, &stage.token);
    eprintln!("bench-grpc logs: waiting for the pod in the hub's tree and its lines");
    let deadline = Instant::now() + Duration::from_secs(300);
    let pod = loop {
        let nodes = server.tree_nodes(token, NS, APP).await.unwrap_or_default();
        if let Some(name) = nodes
            .iter()
            .find(|n| n["kind"] == "Pod")
            .and_then(|n| n["name"].as_str())
        {
            break name.to_string();
        }
        if Instant::now() > deadline {
            bail!("no Pod in the hub's tree: {nodes:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pods: Api<Pod> = Api::namespaced(stage.spoke_client.clone(), APP);
    let last = last_line(args.lines);
    wrote(&pods, &pod, args.lines, deadline).await?;
    eprintln!(
        "bench-grpc logs: {} reads of {} lines each way",
        args.reads, args.lines
    );
    let mut figures = Figures {
        hub: Vec::new(),
        direct: Vec::new(),
        cut: 0,
    };
    for i in 0..args.reads {
        for through_hub in [i % 2 == 0, i % 2 == 1] {
            // Every line so far (the burst, then one a second), so that
            // the read starts at the burst's first line.
            let tail = newest_line(&pods, &pod).await?;
            let start = Instant::now();
            if through_hub {
                let path = format!(
                    "/api/v1/applications/{APP}/logs?appNamespace={NS}&namespace={APP}&podName={pod}&container=ticker&follow=true&tailLines={tail}"
                );
                let (code, mut lines) = server.stream(&path, token).await?;
                if code != 200 {
                    bail!("argocd-server answered {code} for the pod's log");
                }
                let got = tokio::time::timeout(WITHIN, async {
                    let mut n = 0;
                    while let Some(line) = lines.next().await? {
                        if line.contains(LINE) {
                            n += 1;
                            if line.contains(&format!("\"{last}\"")) {
                                return anyhow::Ok((n, true));
                            }
                        }
                    }
                    anyhow::Ok((n, false))
                })
                .await
                .context("a read through the hub took too long")??;
                match got {
                    (n, true) => figures.hub.push(n as f64 / start.elapsed().as_secs_f64()),
                    (n, false) => {
                        eprintln!("bench-grpc logs: a read through the hub ended after {n} lines");
                        figures.cut += 1;
                    }
                }
            } else {
                let n = follow(&pods, &pod, tail, &last, false).await?;
                figures
                    .direct
                    .push(n as f64 / start.elapsed().as_secs_f64());
            }
        }
    }
    Ok(figures)
}

/// The harness's `testenv` binary (it joins a node): `given`, or the one
/// next to this binary.
pub fn testenv_bin(given: Option<&Path>) -> Result<std::path::PathBuf> {
    let testenv = match given {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .context("the binary's folder")?
            .join("testenv"),
    };
    if !testenv.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p argocd-pull-test --bin testenv`",
            testenv.display()
        );
    }
    Ok(testenv)
}

/// The last line of a burst of `lines` (the ticker numbers its lines).
pub fn last_line(lines: usize) -> String {
    format!("{LINE} {lines}")
}

/// Waits until `pod` has written its burst of `lines` lines.
pub async fn wrote(pods: &Api<Pod>, pod: &str, lines: usize, deadline: Instant) -> Result<()> {
    let last = last_line(lines);
    loop {
        let tail = LogParams {
            tail_lines: Some(lines as i64 + 100),
            ..Default::default()
        };
        if let Ok(text) = pods.logs(pod, &tail).await
            && text.lines().any(|l| l == last)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("pod {pod} never wrote its {lines} lines");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The number of `pod`'s newest line: following that many lines from the
/// end starts at the burst's first line.
pub async fn newest_line(pods: &Api<Pod>, pod: &str) -> Result<usize> {
    let text = pods
        .logs(
            pod,
            &LogParams {
                tail_lines: Some(1),
                ..Default::default()
            },
        )
        .await?;
    text.trim()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .context("the pod's last line")
}

/// Follows `pod`'s log through `pods` (whichever API server its client
/// reaches) from its last `tail` lines until the line `last`, each line
/// with its timestamp when `timestamps` (as argocd-server asks); the
/// ticker's lines read.
pub async fn follow(
    pods: &Api<Pod>,
    pod: &str,
    tail: usize,
    last: &str,
    timestamps: bool,
) -> Result<usize> {
    let params = LogParams {
        follow: true,
        tail_lines: Some(tail as i64),
        container: Some("ticker".into()),
        timestamps,
        ..Default::default()
    };
    let mut lines = pods.log_stream(pod, &params).await?.lines();
    tokio::time::timeout(WITHIN, async {
        let mut n = 0;
        while let Some(line) = lines.next().await {
            let line = line?;
            let line = match timestamps {
                true => line.split_once(' ').map_or("", |(_, text)| text),
                false => line.as_str(),
            };
            if line.starts_with(LINE) {
                n += 1;
                if line == last {
                    return anyhow::Ok(n);
                }
            }
        }
        bail!("the read ended before its last line")
    })
    .await
    .context("a read took too long")?
}
