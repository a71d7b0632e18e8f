//! [`Node::join`]: a kubelet, kube-scheduler, the API server reachable
//! inside the node's namespace, and the sandbox image, so that the node's
//! containerd runs a cluster's pods.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::Node;
use crate::{Error, Result, paths};

impl Node {
    /// Makes this node a real node of `cluster`: its API server reachable
    /// inside the namespace (relays, and `kubernetes.default`'s ClusterIP
    /// 10.0.0.1:443 sent there for pods), the sandbox image imported, a
    /// kubelet (cgroup v1, cgroupfs, its own cgroup root) and a
    /// kube-scheduler for the cluster. `testenv` is the harness's own
    /// binary (it runs the relays). Returns once the Node is Ready.
    pub async fn join(&mut self, cluster: &crate::Cluster, testenv: &Path) -> Result<()> {
        let d = self.dir.clone();
        let api = cluster.server().trim_start_matches("https://").to_string();
        let sock = d.join("apiserver.sock");
        let to_api = format!("unix:{}", sock.display());
        self.relay(
            testenv,
            "relay-outside",
            false,
            &to_api,
            &format!("tcp:{api}"),
            &[],
        )?;
        self.relay(
            testenv,
            "relay-inside",
            true,
            "tcp:0.0.0.0:6443",
            &to_api,
            &[],
        )?;
        // Pods reach the API server as kubernetes.default's ClusterIP.
        self.net.iptables(&[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-d",
            "10.0.0.1/32",
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            &format!("{}:6443", self.net.ip()),
        ])?;

        // The kubelet's kubeconfig: the cluster's admin one, through the relay.
        let admin = std::fs::read_to_string(cluster.kubeconfig())?;
        let kubeconfig = d.join("kubelet.kubeconfig");
        std::fs::write(
            &kubeconfig,
            admin.replace(cluster.server(), "https://127.0.0.1:6443"),
        )?;
        let host_kubeconfig = d.join("host.kubeconfig");
        std::fs::write(&host_kubeconfig, &admin)?;

        // The sandbox image, and the pod that writes a line a second
        // (what the hub's Argo CD shows as a pod's logs).
        let images = d.join("images");
        for name in ["pause", "ticker"] {
            let image = crate::images::build_one(&paths::bin_dir().join("node"), name, &images)?;
            self.import(&image)?;
        }

        let root = cgroup_root(self.net.name())?;
        std::fs::write(d.join("cgroup-root"), &root)?;

        std::fs::write(d.join("resolv.conf"), "")?;
        let config = d.join("kubelet.yaml");
        std::fs::write(&config, kubelet_config(&d, &root, self.net.ip()))?;
        std::fs::create_dir_all(d.join("manifests"))?;
        let mut kubelet = self.containerd.inside(&paths::bin_dir().join("kubelet"));
        kubelet
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}/kubelet", d.display()))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={}", self.net.ip()))
            .arg("--v=2");
        self.processes.spawn("kubelet", &mut kubelet)?;
        let mut scheduler = Command::new(paths::bin_dir().join("kube-scheduler"));
        scheduler
            .arg(format!("--kubeconfig={}", host_kubeconfig.display()))
            .args(["--leader-elect=false", "--secure-port=0", "--v=1"]);
        self.processes.spawn("kube-scheduler", &mut scheduler)?;

        // The API server's way to this kubelet (`kubectl logs`, `exec`, the
        // pods' logs argocd-pull's agents read): its egress proxy, a
        // unix socket outside, dialled from inside this node's namespace,
        // for this node's kubelet only.
        let kubelet = format!("{}:10250", self.net.ip());
        self.relay(
            testenv,
            "relay-kubelet",
            true,
            &format!("unix:{}", cluster.egress_socket().display()),
            &format!("tcp:{kubelet}"),
            &[format!("{}:10250", self.name), kubelet.clone()],
        )?;
        wait_ready(cluster, &self.name, &d.join("kubelet.log")).await
    }
}

/// A cgroup root of its own for the node in namespace `netns`, made in
/// every v1 hierarchy (cpuset needs its CPUs and memory nodes copied from
/// the parent before use); returns its name.
fn cgroup_root(netns: &str) -> Result<String> {
    let root = format!("argocd-pull-{}", netns.trim_start_matches("argocd-pull-"));
    for entry in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name == "unified" || !entry.path().join("cgroup.procs").exists() {
            continue;
        }
        let dir = entry.path().join(&root);
        std::fs::create_dir_all(&dir)?;
        if name == "cpuset" {
            for f in ["cpuset.cpus", "cpuset.mems"] {
                std::fs::write(dir.join(f), std::fs::read(entry.path().join(f))?)?;
            }
        }
    }
    Ok(root)
}

/// The kubelet's configuration: cgroup v1 with cgroupfs under `root`, the
/// node's containerd, its files in the node's folder `d`, serving on `ip`.
fn kubelet_config(d: &Path, root: &str, ip: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{root}
containerRuntimeEndpoint: unix://{d}/containerd.sock
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
failSwapOn: false
staticPodPath: {d}/manifests
podLogsDir: {d}/pod-logs
resolvConf: {d}/resolv.conf
clusterDomain: cluster.local
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
oomScoreAdj: 0
# Mounted ConfigMaps and Secrets (a new hub CA, a rotated certificate)
# reach the pods within seconds rather than the minute of the default.
syncFrequency: 10s
"#,
        d = d.display(),
    )
}

/// Returns once Node `node` of `cluster` is Ready (two minutes at the most).
async fn wait_ready(cluster: &crate::Cluster, node: &str, kubelet_log: &Path) -> Result<()> {
    let client = cluster.client().await?;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(n) = nodes.get(node).await {
            let ready = n
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            if ready {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(Error::NotReady(
                format!("node {node} (kubelet log: {})", kubelet_log.display()),
                Duration::from_secs(120),
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
