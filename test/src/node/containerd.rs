//! [`Containerd`]: the node's container runtime, in the node's network
//! namespace and a mount namespace of its own, and `ctr` against it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Netns, node_bin, run_ok};
use crate::images::Image;
use crate::{Error, Result, paths};

/// containerd (with runc and the CNI bridge) running in a node's
/// namespaces, its state in the node's folder; killed when dropped.
pub struct Containerd {
    child: Child,
    dir: PathBuf,
    /// The network namespace's name, for `ctr`.
    netns: String,
}

/// containerd and runc as `make tools` built them.
pub(super) fn binaries() -> Result<(PathBuf, PathBuf)> {
    let containerd = node_bin("containerd")?;
    let runc = paths::bin_dir().join("runc");
    if !runc.exists() {
        return Err(Error::MissingTool(runc));
    }
    Ok((containerd, runc))
}

impl Containerd {
    /// Starts `containerd` with `runc`, its configuration and state in
    /// `dir`, inside `netns` and a mount namespace of its own; returns
    /// once it answers. `node` names it in errors.
    pub(super) async fn start(
        node: &str,
        (containerd, runc): (PathBuf, PathBuf),
        dir: &Path,
        netns: &Netns,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir.join("cni"))?;
        std::fs::write(
            dir.join("cni/10-argocd-pull.conflist"),
            cni_config(dir, netns.slot()),
        )?;
        let config = dir.join("config.toml");
        std::fs::write(&config, containerd_config(dir, &runc))?;
        let binds = kernel_tunable_binds(dir)?;
        let log = std::fs::File::create(dir.join("containerd.log"))?;
        // The shim and runc are found on PATH.
        let path = format!(
            "{}:{}:/usr/sbin:/usr/bin:/sbin:/bin",
            containerd.parent().unwrap().display(),
            paths::bin_dir().display()
        );
        // The node's own mount namespace too: what containerd mounts (image
        // snapshots, container roots) is never seen by the machine, and
        // goes when the node's last process does.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", netns.name()))
            .args(["--", "unshare", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", &format!("{binds}exec \"$0\" --config \"$1\"")])
            .arg(&containerd)
            .arg(&config)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut containerd = Self {
            child,
            dir: dir.to_path_buf(),
            netns: netns.name().to_string(),
        };
        containerd.wait_ready(node).await?;
        Ok(containerd)
    }

    async fn wait_ready(&mut self, node: &str) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::Command {
                    command: format!("containerd ({status})"),
                    output: self.log_tail(),
                });
            }
            if self.socket().exists() && self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::NotReady(
                    format!("containerd of node {node}"),
                    Duration::from_secs(30),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The containerd socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The last 40 lines of containerd's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Runs `ctr` against this containerd, in the kubelet's namespace
    /// (`k8s.io`), inside the node's network namespace.
    pub fn ctr(&self, args: &[&str]) -> Result<Output> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(node_bin("ctr")?)
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"])
            .args(args);
        run_ok(&mut cmd)
    }

    /// Imports an image archive with every tag it names.
    pub fn import(&self, image: &Image) -> Result<()> {
        self.ctr(&["images", "import", image.archive.to_str().unwrap()])?;
        Ok(())
    }

    /// Runs `reference` to completion as a container, read-only root and
    /// the image's own user, and returns what it printed. `args` is the
    /// whole command line (ctr does not keep the image's entrypoint).
    pub fn run(&self, reference: &str, args: &[&str]) -> Result<Output> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "run-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut all = vec!["run", "--rm", "--read-only", reference, &id];
        all.extend_from_slice(args);
        self.ctr(&all)
    }

    /// `program` run inside the node: containerd's network and mount
    /// namespaces.
    pub(super) fn inside(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.child.id()))
            .args(["--net", "--mount", "--"])
            .arg(program);
        cmd
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kubelet sets a few kernel settings (vm.overcommit_memory,
/// kernel.panic, kernel.panic_on_oops, ...) for the whole machine. In the
/// node's mount namespace it writes to copies in `dir` instead: the shell
/// that binds them there before containerd starts.
fn kernel_tunable_binds(dir: &Path) -> Result<String> {
    let mut binds = String::new();
    for (key, value) in KERNEL_TUNABLES {
        let copy = dir.join("sysctl").join(key);
        std::fs::create_dir_all(copy.parent().unwrap())?;
        let current = std::fs::read_to_string(Path::new("/proc/sys").join(key))
            .unwrap_or_else(|_| format!("{value}\n"));
        std::fs::write(&copy, current)?;
        binds.push_str(&format!(
            "mount --bind {} /proc/sys/{key} && ",
            copy.display()
        ));
    }
    Ok(binds)
}

fn containerd_config(dir: &Path, runc: &Path) -> String {
    let d = dir.display();
    format!(
        r#"version = 3
root = "{d}/root"
state = "{d}/state"

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.runtime.v2.task"]
  platforms = ["linux/amd64"]

# Lowering a process's oom_score_adj needs CAP_SYS_RESOURCE, which this
# machine does not give: runc then fails ("can't get final child's PID
# from pipe") for every sandbox (-998). Keep scores at containerd's own.
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  # Pod network namespaces in the node's folder, not the machine's /run/netns.
  netns_mounts_under_state_dir = true

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "docker.io/library/argocd-pull-pause:{version}"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni}"]
  conf_dir = "{d}/cni"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
"#,
        runc = runc.display(),
        version = env!("CARGO_PKG_VERSION"),
        cni = paths::bin_dir().join("node/cni").display(),
    )
}

/// What the kubelet writes under /proc/sys, and the value it wants.
const KERNEL_TUNABLES: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// A bridge inside the node's namespace, pods in 10.213.<k>.0/24.
fn cni_config(dir: &Path, k: usize) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "argocd-pull",
        "plugins": [{
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": format!("10.213.{k}.0/24"), "gateway": format!("10.213.{k}.1") }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": dir.join("cni-ipam").display().to_string(),
            },
        }],
    })
    .to_string()
}
