//! Several hub-controller replicas as the Deployment runs them (leader
//! election on, every one serving gRPC on an address of its own); their
//! gRPC Service is [`testenv::balancer::Balancer`].

use std::net::SocketAddr;
use std::time::Duration;

use testenv::net;

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

    /// The clusters whose agents are connected to it (its `/status`).
    pub async fn agents(&self) -> Vec<String> {
        let Ok((200, body)) = net::http_get(self.process.admin, "/status").await else {
            return Vec::new();
        };
        serde_json::from_str::<Report>(&body)
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
        let grpc = net::free_addr().unwrap();
        let mut args = vec!["--leader-election-namespace", "argocd-pull"];
        args.extend_from_slice(extra);
        let process = self.spawn_hub(grpc, &args, &[("POD_NAME", name)]).await;
        Replica {
            name: name.into(),
            process,
            grpc,
        }
    }
}
