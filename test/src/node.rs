//! The container runtime of a real node: containerd (built from its Go
//! module by `make tools`) with runc, running inside a network namespace
//! that the harness creates and a mount namespace of its own, so that
//! nothing the node or its containers open is on the machine's own network
//! and nothing they mount is seen outside. Images come only from the
//! project's own OCI archives (`ctr images import`): no registry.
//!
//! Everything a node starts goes when it is dropped, and also when the test
//! process dies however it dies: a reaper (its own process group, watching
//! a pipe) then kills every process whose command line names the node's
//! folder, unmounts what is left under it, deletes the network namespace
//! and removes the folder.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::images::Image;
use crate::{Error, Result, paths};

mod join;
mod route;

pub use route::{Memory, route_service};

const REAPER: &str = r#"
while read -r line; do :; done
dir=$1 netns=$2
# Processes of this node only: their command lines name its folder.
for p in /proc/[0-9]*; do
  [ "${p#/proc/}" = "$$" ] && continue
  if tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "$dir"; then kill -KILL "${p#/proc/}" 2>/dev/null; fi
done
sleep 0.2
grep -F " $dir" /proc/mounts | cut -d' ' -f2 | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
ip netns delete "$netns" 2>/dev/null
# Containers' processes (pause, the pods') name no folder: they are found
# by the node's cgroups, killed, and the cgroups removed once empty.
if [ -f "$dir/cgroup-root" ]; then
  root=$(cat "$dir/cgroup-root")
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    left=""
    for h in /sys/fs/cgroup/*/"$root"; do
      [ -d "$h" ] || continue
      left=1
      find "$h" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -KILL 2>/dev/null
      find "$h" -depth -type d -exec rmdir {} \; 2>/dev/null
    done
    [ -z "$left" ] && break
    sleep 0.25
  done
fi
rm -rf "$dir"
"#;

/// A containerd in its own network namespace.
pub struct Node {
    pub name: String,
    /// The node's address inside its namespace.
    pub node_ip: String,
    netns: String,
    dir: PathBuf,
    containerd: Child,
    others: Vec<Child>,
    reaper: Child,
    reaper_stdin: Option<ChildStdin>,
}

impl Node {
    /// Creates network namespace `argocd-pull-<name>-<pid>-<n>` (loopback
    /// only) and starts containerd inside it, with its state in a short
    /// folder of its own (unix socket paths are limited to 108 bytes).
    pub async fn start(name: &str) -> Result<Self> {
        let containerd = node_bin("containerd")?;
        let runc = paths::bin_dir().join("runc");
        if !runc.exists() {
            return Err(Error::MissingTool(runc));
        }
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{}-{}-{}",
            name,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        // 10.213.0.0/16 is the harness's: each node takes 10.213.<k>.0/24
        // for its pods and 10.213.255.<k> as its own address. Nothing on
        // this machine's own interfaces is in that range (checked below).
        static K: AtomicUsize = AtomicUsize::new(1);
        let k = (K.fetch_add(1, Ordering::Relaxed) + std::process::id() as usize) % 250 + 1;
        let netns = format!("argocd-pull-{id}");
        let dir = PathBuf::from(format!("/tmp/apn-{id}"));
        std::fs::create_dir_all(&dir)?;

        let mut reaper = Command::new("sh")
            .arg("-c")
            .arg(REAPER)
            .arg("argocd-pull-node-reaper")
            .arg(&dir)
            .arg(&netns)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let reaper_stdin = reaper.stdin.take();

        let host_addrs = run_ok(Command::new("ip").args(["-4", "addr", "show"]))?;
        if String::from_utf8_lossy(&host_addrs.stdout).contains("inet 10.213.") {
            return Err(Error::Command {
                command: "ip -4 addr show".into(),
                output: "10.213.0.0/16, the harness's node range, is on this machine already"
                    .into(),
            });
        }
        run_ok(Command::new("ip").args(["netns", "add", &netns]))?;
        run_ok(Command::new("ip").args(["-n", &netns, "link", "set", "lo", "up"]))?;
        let node_ip = format!("10.213.255.{k}");
        run_ok(Command::new("ip").args([
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{node_ip}/32"),
            "dev",
            "lo",
        ]))?;

        std::fs::create_dir_all(dir.join("cni"))?;
        std::fs::write(dir.join("cni/10-argocd-pull.conflist"), cni_config(&dir, k))?;
        let config = dir.join("config.toml");
        std::fs::write(&config, containerd_config(&dir, &runc))?;
        // The kubelet sets a few kernel settings (vm.overcommit_memory,
        // kernel.panic, kernel.panic_on_oops, ...) for the whole machine.
        // In the node's mount namespace it writes to copies instead.
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
            .arg(format!("--net=/run/netns/{netns}"))
            .args(["--", "unshare", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", &format!("{binds}exec \"$0\" --config \"$1\"")])
            .arg(&containerd)
            .arg(&config)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut node = Self {
            name: name.to_string(),
            node_ip,
            netns,
            dir,
            containerd: child,
            others: Vec::new(),
            reaper,
            reaper_stdin,
        };
        node.wait_ready().await?;
        Ok(node)
    }

    /// The network namespace (`ip netns`) the node runs in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The containerd socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.containerd.try_wait()? {
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
                    format!("containerd of node {}", self.name),
                    Duration::from_secs(30),
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Runs `ctr` against this node's containerd, in the kubelet's
    /// namespace (`k8s.io`), inside the node's network namespace.
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
}

impl Node {
    /// The memory cgroup (v1) of a container of this node, from the pod's
    /// UID and the container's ID as its status gives them
    /// (`containerd://<id>`), and its QoS class (`burstable`, `besteffort`;
    /// `guaranteed` pods sit at the top).
    pub fn memory_cgroup(&self, qos: &str, pod_uid: &str, container_id: &str) -> PathBuf {
        let root = std::fs::read_to_string(self.dir.join("cgroup-root")).unwrap_or_default();
        let mut dir = PathBuf::from("/sys/fs/cgroup/memory")
            .join(root.trim())
            .join("kubepods");
        if qos != "guaranteed" {
            dir.push(qos);
        }
        dir.join(format!("pod{pod_uid}"))
            .join(container_id.trim_start_matches("containerd://"))
    }

    /// A command run inside the node: its network and mount namespaces.
    fn in_node(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.containerd.id()))
            .args(["--net", "--mount", "--"])
            .arg(program);
        cmd
    }

    /// Starts a process of the node with its log in the node's folder.
    /// Its command line names the folder, so the reaper finds it.
    fn spawn_logged(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.others.push(child);
        Ok(())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for c in &mut self.others {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        // The reaper does the rest (shims, mounts, the namespace, the folder).
        self.reaper_stdin.take();
        let _ = self.reaper.wait();
    }
}

/// A node component `make tools` built into `.cache/bin/node/`.
pub fn node_bin(name: &str) -> Result<PathBuf> {
    let path = paths::bin_dir().join("node").join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::MissingTool(path))
    }
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

/// `iptables`, `iptables-restore`, ...: the harness's own (Debian's,
/// unpacked by `test/tools/build.sh` into the cache), not the machine's.
fn iptables_bin(command: &str) -> String {
    paths::bin_dir().join(command).display().to_string()
}

fn run_ok(cmd: &mut Command) -> Result<Output> {
    let output = cmd.stdin(Stdio::null()).output()?;
    if output.status.success() {
        Ok(output)
    } else {
        Err(Error::Command {
            command: format!("{cmd:?}"),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}
