//! Real Kubernetes clusters for tests, benchmarks and the demo.
//!
//! Each [`Cluster`] is its own etcd + kube-apiserver (+ kube-controller-manager)
//! on free loopback ports, built from the upstream Go modules pinned in
//! `test/tools/`. Start one per test with [`Cluster::start`], or share one
//! among the tests of a binary with [`shared`] and give each test its own
//! namespace with [`Cluster::namespace`]. Every process and data folder goes
//! away when the cluster is dropped or, for shared clusters, when the test
//! process exits, however it exits. [`ocm`] runs real Open Cluster
//! Management on such clusters: a hub and managed clusters joined to it;
//! [`argocd`] runs real Argo CD on them, with a Git server to deploy from.

#![forbid(unsafe_code)]

pub mod argocd;
pub mod balancer;
pub mod browser;
mod cluster;
mod crds;
mod daemon;
pub mod freeze;
pub mod images;
pub mod kubelet;
pub mod net;
pub mod nginx;
pub mod node;
pub mod ocm;
pub mod paths;
pub mod pki;
mod process;
pub mod procfs;
pub mod relay;
pub mod slow_watch;
pub mod stack;
pub mod stats;
pub mod tinyproxy;
pub mod wait;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

pub use cluster::{Cluster, ClusterConfig, client_for};
pub use crds::CrdSet;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} is missing: run `make tools` (test/tools/build.sh) first")]
    MissingTool(PathBuf),
    #[error("{0} is missing: build it with `cargo build --workspace --bins`")]
    MissingBinary(PathBuf),
    #[error("{name} exited during start-up; its log ends with:\n{log}")]
    Exited { name: &'static str, log: String },
    #[error("{0} could not bind its port")]
    PortClash(&'static str),
    #[error("cluster {0} was not ready within {1:?}")]
    NotReady(String, Duration),
    #[error("CRD {0} was not established in time")]
    CrdNotEstablished(String),
    #[error("managed cluster {cluster} did not join the hub: {why}")]
    NotJoined { cluster: String, why: String },
    #[error("{command} failed:\n{output}")]
    Command { command: String, output: String },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    #[error(transparent)]
    Http(#[from] http::Error),
    #[error(transparent)]
    Yaml(#[from] serde_yaml::Error),
    #[error(transparent)]
    Cert(#[from] rcgen::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a test binary shares, by name: each started once, on first use,
/// and kept (leaked) until the test process exits.
pub(crate) type Shared<T> =
    LazyLock<Mutex<HashMap<String, Arc<tokio::sync::OnceCell<&'static T>>>>>;

/// `name`'s entry of `shared`, made by `start` if it has none yet.
pub(crate) async fn shared_entry<T, F, Fut>(
    shared: &Shared<T>,
    name: &str,
    start: F,
) -> Result<&'static T>
where
    T: Sync + 'static,
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let slot = shared
        .lock()
        .expect("no test panics while holding this lock")
        .entry(name.to_string())
        .or_default()
        .clone();
    slot.get_or_try_init(|| async { Ok(&*Box::leak(Box::new(start().await?))) })
        .await
        .copied()
}

static SHARED: Shared<Cluster> = LazyLock::new(Default::default);

/// The names of every object `api` lists, in its order.
pub async fn names<K>(api: &kube::Api<K>) -> std::result::Result<Vec<String>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .map(kube::ResourceExt::name_any)
        .collect())
}

/// A cluster shared by every test of this test binary that asks for the same
/// `name`, started on first use. Its processes and data are removed when the
/// test process exits. Tests that share it must keep to their own namespaces.
pub async fn shared(name: &str, crds: CrdSet) -> Result<&'static Cluster> {
    shared_entry(&SHARED, name, || {
        Cluster::start(ClusterConfig::new(name, crds))
    })
    .await
}

/// For tools of the harness (benchmarks): logs to standard error, filtered
/// by `RUST_LOG` or else `default_filter`.
pub fn init_tracing_stderr(default_filter: &str) {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Logs to the test output (captured per test by the test runner), once.
pub fn init_tracing() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
            )
            .with_test_writer()
            .try_init();
    });
}
