//! Several hub-controller replicas as the Deployment runs them (leader
//! election on, every one serving gRPC on an address of its own); their
//! gRPC Service is [`testenv::balancer::Balancer`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::balancer::Balancer;
use testenv::{net, wait};

use argocd_pull_hub_controller::report::Report;

use super::{Env, HubProcess};

/// One replica: its process, gRPC address and pod name.
pub struct Replica {
    pub name: String,
    pub process: HubProcess,
    pub grpc: SocketAddr,
}

impl Replica {
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let body = self.process.metrics().await;
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    pub async fn leads(&self) -> bool {
        self.metric("argocd_pull_hub_leader").await == Some(1.0)
    }

    pub async fn ready(&self) -> bool {
        matches!(
            net::http_get(self.process.admin, "/readyz").await,
            Ok((200, _))
        )
    }

    /// Its `/status` page, if it answers.
    pub async fn report(&self) -> Option<Report> {
        let Ok((200, body)) = net::http_get(self.process.admin, "/status").await else {
            return None;
        };
        serde_json::from_str(&body).ok()
    }

    /// The clusters whose agents are connected to it (its `/status`).
    pub async fn agents(&self) -> Vec<String> {
        self.report()
            .await
            .map(|r| r.agents.into_iter().map(|a| a.cluster).collect())
            .unwrap_or_default()
    }

    /// SIGKILL: no goodbye to anyone.
    pub async fn kill(mut self) {
        self.process.child.start_kill().unwrap();
        let _ = self.process.child.wait().await;
    }

    /// SIGTERM, as the kubelet stops a pod; the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        net::terminate(&mut self.process.child, Duration::from_secs(30)).await
    }
}

impl Env {
    /// Starts replica `name` (its `POD_NAME`) with leader election, serving
    /// gRPC with the test's certificates; waits until it is Ready.
    pub async fn start_replica(&mut self, name: &str, extra: &[&str]) -> Replica {
        let binary = Path::new(env!("CARGO_BIN_EXE_hub-controller"));
        self.start_replica_from(binary, name, extra).await
    }

    /// [`Env::start_replica`] with another build of the hub-controller.
    pub async fn start_replica_from(
        &mut self,
        binary: &Path,
        name: &str,
        extra: &[&str],
    ) -> Replica {
        let grpc = net::free_addr().unwrap();
        let mut args = vec!["--leader-election-namespace", "argocd-pull"];
        args.extend_from_slice(extra);
        let process = self
            .spawn_hub_from(binary, grpc, &args, &[("POD_NAME", name)])
            .await;
        Replica {
            name: name.into(),
            process,
            grpc,
        }
    }
}

/// Hub and managed clusters for several replicas: the hub-controller's
/// namespace, the hub's Argo CD namespace (where the leader keeps the
/// cluster Secrets), and the stand-in for the replicas' gRPC Service.
pub async fn replicas_env(clusters: &[&str]) -> (Env, Balancer) {
    let env = Env::new(clusters).await;
    env.hub.ensure_namespace("argocd-pull").await.unwrap();
    env.hub.ensure_namespace("argocd").await.unwrap();
    (env, Balancer::start().await.unwrap())
}

/// Creates `per_cluster` Applications for each of `clusters` clusters on
/// the hub; what [`Env::converged`] expects of them.
pub async fn create_apps(
    env: &Env,
    clusters: usize,
    per_cluster: usize,
) -> BTreeMap<String, usize> {
    let hub = env.hub_apps();
    let mut expected = BTreeMap::new();
    let mut creates = Vec::new();
    for c in 0..clusters {
        for n in 0..per_cluster {
            let app = env.app(&app_name(c, n), c, json!({}));
            expected.insert(app_name(c, n), c);
            let hub = hub.clone();
            creates.push(async move { hub.create(&PostParams::default(), &app).await.unwrap() });
        }
    }
    futures::future::join_all(creates).await;
    expected
}

/// The name of Application `n` on cluster `cluster` (its index).
pub fn app_name(cluster: usize, n: usize) -> String {
    format!("app-{cluster}-{n:03}")
}

/// The cluster index in an [`app_name`].
pub fn cluster_of(name: &str) -> usize {
    name[4..5].parse().unwrap()
}

/// A change to every `step`-th of `per_cluster` Applications on each of
/// `clusters` clusters: a new target revision.
pub async fn churn(env: &Env, clusters: usize, per_cluster: usize, round: usize, step: usize) {
    let hub = env.hub_apps();
    let mut patches = Vec::new();
    for c in 0..clusters {
        for n in (round % step..per_cluster).step_by(step) {
            let (hub, name) = (hub.clone(), app_name(c, n));
            patches.push(async move {
                hub.patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "spec": { "source": { "targetRevision": format!("round-{round}") } } })),
                )
                .await
                .unwrap();
            });
        }
    }
    futures::future::join_all(patches).await;
}

/// A sync with revision `rev` set on the hub copy of `name`.
pub async fn request_sync(env: &Env, name: &str, rev: &str) {
    env.hub_apps()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "operation": { "sync": { "revision": rev }, "initiatedBy": { "username": "alice" } } })),
        )
        .await
        .unwrap();
}

/// Waits until every Application in `expected` is exact on hub and spoke;
/// how long that took.
pub async fn converged(env: &Env, expected: &BTreeMap<String, usize>, what: &str) -> Duration {
    let start = Instant::now();
    wait::until(what, Duration::from_secs(120), || env.converged(expected)).await;
    start.elapsed()
}

/// The replica each connected cluster is on.
pub async fn placement(replicas: &[Replica]) -> BTreeMap<String, String> {
    let mut on = BTreeMap::new();
    for r in replicas {
        for c in r.agents().await {
            on.insert(c, r.name.clone());
        }
    }
    on
}

/// The index of the replica that leads, if one does.
pub async fn leader(replicas: &[Replica]) -> Option<usize> {
    for (i, r) in replicas.iter().enumerate() {
        if r.leads().await {
            return Some(i);
        }
    }
    None
}

/// Where each agent is, once all `clusters` are connected to a replica.
pub async fn all_connected(
    replicas: &[Replica],
    clusters: usize,
) -> Result<BTreeMap<String, String>, String> {
    let on = placement(replicas).await;
    if on.len() == clusters {
        Ok(on)
    } else {
        Err(format!("connected: {on:?}"))
    }
}

/// The Service in front of the replicas sends new connections to these.
pub fn point_service(service: &Balancer, replicas: &[Replica]) {
    service.set(&replicas.iter().map(|r| r.grpc).collect::<Vec<_>>());
}
