//! Several hub-controller replicas as the Deployment runs them (leader
//! election on, every one serving gRPC on an address of its own); their
//! gRPC Service is [`testenv::balancer::Balancer`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use testenv::{net, wait};

use super::{Env, HubProcess, TIMEOUT};

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
        let report: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        report["agents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["cluster"].as_str().map(String::from))
            .collect()
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
        let (admin, grpc) = (net::free_addr().unwrap(), net::free_addr().unwrap());
        let d = self.dir.path().to_path_buf();
        self.hub_starts += 1;
        let log: PathBuf = d.join(format!("hub-{}.log", self.hub_starts));
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_hub-controller"))
            .arg("--kubeconfig")
            .arg(self.hub.kubeconfig())
            .args(["--admin-addr", &admin.to_string()])
            .args(["--leader-election-namespace", "argocd-pull"])
            .args(["--grpc-addr", &grpc.to_string()])
            .arg("--grpc-tls-cert")
            .arg(d.join("hub.crt"))
            .arg("--grpc-tls-key")
            .arg(d.join("hub.key"))
            .arg("--grpc-client-ca")
            .arg(d.join("ca.crt"))
            .args(["--grpc-heartbeat", "2s", "--grpc-digest-interval", "5s"])
            .args(extra)
            .env("POD_NAME", name)
            .env("ARGOCD_PULL_LOG", "info,kube_client=off")
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let replica = Replica {
            name: name.into(),
            process: HubProcess { child, admin, log },
            grpc,
        };
        wait::until(&format!("replica {name} to be Ready"), TIMEOUT, || async {
            if replica.ready().await {
                Ok(())
            } else {
                Err(format!("{:?}", net::http_get(admin, "/readyz").await))
            }
        })
        .await;
        replica
    }
}
