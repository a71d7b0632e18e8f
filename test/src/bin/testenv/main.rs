//! `testenv`: real local clusters from the shell, for `make clusters`,
//! `make demo` and debugging.
//!
//! `testenv up` starts a hub and managed clusters, runs Open Cluster
//! Management on them (the managed clusters join the hub for real, unless
//! `--ocm=false`), writes a kubeconfig per cluster under `--dir`, prints how
//! to reach them, and keeps them running until it gets SIGINT or SIGTERM
//! (then everything is stopped and the folder emptied). `testenv down` stops
//! a running `testenv up`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use testenv::ocm::{Hub, JoinOptions};
use testenv::{Cluster, ClusterConfig, CrdSet};

mod demo;

#[derive(Parser)]
#[command(
    version,
    about = "Start real local Kubernetes clusters (etcd + kube-apiserver + kube-controller-manager)"
)]
struct Args {
    /// Folder for the clusters' data and kubeconfigs.
    #[arg(
        long,
        env = "ARGOCD_PULL_CLUSTERS_DIR",
        default_value = ".cache/clusters",
        global = true
    )]
    dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a hub and managed clusters and keep them running until interrupted.
    Up {
        /// Name of the hub cluster (gets the OCM hub and Argo CD CRDs).
        #[arg(long, default_value = "hub")]
        hub: String,
        /// Names of the managed clusters (get the klusterlet and Argo CD
        /// CRDs); `--managed=` for none.
        #[arg(
            long = "managed",
            value_delimiter = ',',
            default_value = "cluster1,cluster2"
        )]
        managed: Vec<String>,
        /// Run OCM: its hub components on the hub, and each managed cluster
        /// joined with its registration and work agents.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        ocm: bool,
        /// Start the work agents with feature gate `RawFeedbackJsonString`.
        #[arg(long)]
        raw_feedback: bool,
    },
    /// `make demo`: the whole pull model (OCM, Argo CD, argocd-pull from
    /// deploy/hub, the addon on every cluster), `example/` applied, a
    /// status table until it converges; then runs until interrupted.
    Demo {
        /// Port of the Git server on 127.0.0.1 (example/ points there).
        #[arg(long, default_value_t = 9418)]
        git_port: u16,
        /// Give up when the example has not converged by then.
        #[arg(long, default_value = "600s", value_parser = humantime_secs)]
        timeout: Duration,
    },
    /// Print the status table of a running `testenv demo` in --dir.
    Status {
        /// Namespace of the Applications on the hub.
        #[arg(long, default_value = "argocd")]
        namespace: String,
    },
    /// Pipe connections from one endpoint to another (`tcp:ADDR:PORT` or
    /// `unix:PATH`): how a node inside its network namespace reaches its
    /// API server on the machine's loopback (testenv::node).
    Relay {
        #[arg(long)]
        listen: testenv::relay::Endpoint,
        #[arg(long)]
        to: testenv::relay::Endpoint,
        /// Serve HTTP `CONNECT` requests for these `host:port`s only
        /// (comma-separated), as an API server's egress proxy.
        #[arg(long, value_delimiter = ',')]
        http_connect: Vec<String>,
    },
    /// Stop the clusters of a running `testenv up` in --dir.
    Down {
        /// How long to wait for it to stop.
        #[arg(long, default_value = "30s", value_parser = humantime_secs)]
        timeout: Duration,
    },
}

fn humantime_secs(s: &str) -> Result<Duration, String> {
    s.trim_end_matches('s')
        .parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|_| format!("{s:?} is not a number of seconds such as 30s"))
}

#[tokio::main]
async fn main() -> Result<()> {
    testenv::init_tracing();
    let args = Args::parse();
    let dir = std::path::absolute(&args.dir)?;
    match args.command {
        Cmd::Up {
            hub,
            managed,
            ocm,
            raw_feedback,
        } => {
            up(
                dir,
                hub,
                managed,
                ocm.then_some(JoinOptions { raw_feedback }),
            )
            .await
        }
        Cmd::Down { timeout } => down(dir, timeout).await,
        Cmd::Demo { git_port, timeout } => demo::run(dir, git_port, timeout).await,
        Cmd::Status { namespace } => demo::status(dir, &namespace).await,
        Cmd::Relay {
            listen,
            to,
            http_connect,
        } => Ok(testenv::relay::relay(listen, to, http_connect).await?),
    }
}

async fn up(
    dir: PathBuf,
    hub: String,
    managed: Vec<String>,
    ocm: Option<JoinOptions>,
) -> Result<()> {
    // `--managed=` gives one empty name: no managed cluster. Every name
    // becomes a folder under `dir`, so an empty or dotted one would land on
    // `dir` itself or outside it (and be emptied with it).
    let managed: Vec<String> = managed.into_iter().filter(|n| !n.is_empty()).collect();
    for name in std::iter::once(&hub).chain(&managed) {
        if let Err(why) = argocd_pull_apis::names::dns_label(name) {
            bail!("cluster name {name:?}: {why}");
        }
    }
    let pid_file = claim(&dir)?;

    // One after another: on two cores starting API servers in parallel is
    // not faster, and the first failure names its cluster.
    let config = |name: &str, crds| {
        let mut config = ClusterConfig::new(name, crds);
        config.dir = Some(dir.join(name));
        config
    };
    let (hub, hub_cluster) = if ocm.is_some() {
        let hub = Hub::start_with(config(&hub, CrdSet::Hub))
            .await
            .with_context(|| format!("starting hub {hub} with OCM"))?;
        (Some(hub), None)
    } else {
        let cluster = Cluster::start(config(&hub, CrdSet::Hub))
            .await
            .with_context(|| format!("starting cluster {hub}"))?;
        (None, Some(cluster))
    };
    let mut clusters = Vec::new();
    for name in managed {
        let cluster = Cluster::start(config(&name, CrdSet::Managed))
            .await
            .with_context(|| format!("starting cluster {name}"))?;
        if let (Some(hub), Some(options)) = (&hub, ocm) {
            hub.join(&cluster, options)
                .await
                .with_context(|| format!("joining {name} to the hub"))?;
        }
        clusters.push(cluster);
    }

    let mut summary = String::new();
    let hub_ref = hub.as_ref().map(Hub::cluster).or(hub_cluster.as_ref());
    for c in hub_ref.into_iter().chain(&clusters) {
        summary.push_str(&format!(
            "{:<10} {}  kube-apiserver {}\n           kubectl --kubeconfig {} get ns\n",
            c.name(),
            c.server(),
            c.version(),
            c.kubeconfig().display()
        ));
    }
    if let Some(options) = ocm {
        summary.push_str(&format!(
            "OCM: {} joined to {} (work agents with RawFeedbackJsonString={})\n",
            clusters
                .iter()
                .map(Cluster::name)
                .collect::<Vec<_>>()
                .join(", "),
            hub_ref.map(Cluster::name).unwrap_or_default(),
            options.raw_feedback
        ));
    }
    std::fs::write(dir.join("ready"), &summary)?;
    println!("{summary}");
    println!(
        "Stop with Ctrl-C or `testenv down --dir {}`.",
        dir.display()
    );

    shutdown_signal().await;
    eprintln!("stopping clusters");
    drop(clusters);
    drop(hub);
    drop(hub_cluster);
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(dir.join("ready"));
    Ok(())
}

/// Makes `dir` this process's (its pid file), unless another one runs there.
fn claim(dir: &std::path::Path) -> Result<PathBuf> {
    let pid_file = dir.join("testenv.pid");
    if let Ok(pid) = std::fs::read_to_string(&pid_file)
        && is_alive(pid.trim())
    {
        bail!(
            "clusters are already running in {} (pid {}); run `testenv down` first",
            dir.display(),
            pid.trim()
        );
    }
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(dir.join("ready"));
    std::fs::write(&pid_file, std::process::id().to_string())?;
    Ok(pid_file)
}

async fn down(dir: PathBuf, timeout: Duration) -> Result<()> {
    let pid_file = dir.join("testenv.pid");
    let Ok(pid) = std::fs::read_to_string(&pid_file) else {
        println!("no clusters running in {}", dir.display());
        return Ok(());
    };
    let pid = pid.trim().to_string();
    if !is_alive(&pid) {
        let _ = std::fs::remove_file(&pid_file);
        println!("no clusters running in {}", dir.display());
        return Ok(());
    }
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()?;
    let deadline = std::time::Instant::now() + timeout;
    while is_alive(&pid) {
        if std::time::Instant::now() > deadline {
            bail!("testenv (pid {pid}) did not stop within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("clusters in {} stopped", dir.display());
    Ok(())
}

fn is_alive(pid: &str) -> bool {
    !pid.is_empty() && std::path::Path::new("/proc").join(pid).exists()
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
