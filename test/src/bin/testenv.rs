//! `testenv`: real local clusters from the shell, for `make clusters`,
//! `make demo` and debugging.
//!
//! `testenv up` starts a hub and managed clusters, writes a kubeconfig per
//! cluster under `--dir`, prints how to reach them, and keeps them running
//! until it gets SIGINT or SIGTERM (then everything is stopped and the
//! folder emptied). `testenv down` stops a running `testenv up`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use testenv::{Cluster, ClusterConfig, CrdSet};

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
        /// Names of the managed clusters (get the klusterlet and Argo CD CRDs).
        #[arg(
            long = "managed",
            value_delimiter = ',',
            default_value = "cluster1,cluster2"
        )]
        managed: Vec<String>,
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
        Cmd::Up { hub, managed } => up(dir, hub, managed).await,
        Cmd::Down { timeout } => down(dir, timeout).await,
    }
}

async fn up(dir: PathBuf, hub: String, managed: Vec<String>) -> Result<()> {
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
    std::fs::create_dir_all(&dir)?;
    let _ = std::fs::remove_file(dir.join("ready"));
    std::fs::write(&pid_file, std::process::id().to_string())?;

    let mut specs = vec![(hub, CrdSet::Hub)];
    specs.extend(managed.into_iter().map(|m| (m, CrdSet::Managed)));
    // One after another: on two cores starting API servers in parallel is
    // not faster, and the first failure names its cluster.
    let mut clusters = Vec::new();
    for (name, crds) in specs {
        let mut config = ClusterConfig::new(name.clone(), crds);
        config.dir = Some(dir.join(&name));
        let cluster = Cluster::start(config)
            .await
            .with_context(|| format!("starting cluster {name}"))?;
        clusters.push(cluster);
    }

    let mut summary = String::new();
    for c in &clusters {
        summary.push_str(&format!(
            "{:<10} {}  kube-apiserver {}\n           kubectl --kubeconfig {} get ns\n",
            c.name(),
            c.server(),
            c.version(),
            c.kubeconfig().display()
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
    let _ = std::fs::remove_file(&pid_file);
    let _ = std::fs::remove_file(dir.join("ready"));
    Ok(())
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
