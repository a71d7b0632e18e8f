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

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::images::Image;
use crate::{Error, Result, paths};

mod containerd;
mod isolated;
mod join;
mod netns;
mod reaper;
mod route;

pub use containerd::Containerd;
pub use isolated::Isolated;
pub use netns::Netns;
use reaper::Reaper;
pub use route::{Memory, route_service};

/// A node: containerd in a network namespace of its own ([`Netns`]), the
/// processes it runs for a cluster once joined ([`Node::join`]), and the
/// reaper that removes all of it.
///
/// Its parts are dropped in the order of its fields: the joined processes,
/// then containerd, then the reaper, which waits until the rest is gone.
pub struct Node {
    pub name: String,
    /// The relays, kubelet and kube-scheduler, killed first.
    processes: NodeProcesses,
    containerd: Containerd,
    net: Netns,
    dir: PathBuf,
    /// Held for its drop, last: it waits until the rest is gone.
    _reaper: Reaper,
}

impl Node {
    /// Creates network namespace `argocd-pull-<name>-<pid>-<n>` (loopback
    /// only) and starts containerd inside it, with its state in a short
    /// folder of its own (unix socket paths are limited to 108 bytes).
    pub async fn start(name: &str) -> Result<Self> {
        let binaries = containerd::binaries()?;
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{}-{}-{}",
            name,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let netns = format!("argocd-pull-{id}");
        let dir = PathBuf::from(format!("{NODE_DIRS}/apn-{id}"));
        reap_orphans(Path::new(NODE_DIRS));
        std::fs::create_dir_all(&dir)?;
        // First the reaper, so that whatever follows goes with it.
        let reaper = Reaper::start(&dir, &netns)?;
        let net = Netns::create(netns, Netns::free_slot())?;
        let containerd = Containerd::start(name, binaries, &dir, &net).await?;
        Ok(Self {
            name: name.to_string(),
            processes: NodeProcesses {
                dir: dir.clone(),
                children: Vec::new(),
            },
            containerd,
            net,
            dir,
            _reaper: reaper,
        })
    }

    /// The network namespace (`ip netns`) the node runs in.
    pub fn netns(&self) -> &str {
        self.net.name()
    }

    /// The node's network namespace: its address, more addresses, iptables.
    pub fn net(&self) -> &Netns {
        &self.net
    }

    /// The node's container runtime.
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    /// The containerd socket.
    pub fn socket(&self) -> PathBuf {
        self.containerd.socket()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// See [`Containerd::log_tail`].
    pub fn log_tail(&self) -> String {
        self.containerd.log_tail()
    }

    /// See [`Containerd::ctr`].
    pub fn ctr(&self, args: &[&str]) -> Result<Output> {
        self.containerd.ctr(args)
    }

    /// See [`Containerd::import`].
    pub fn import(&self, image: &Image) -> Result<()> {
        self.containerd.import(image)
    }

    /// See [`Containerd::run`].
    pub fn run(&self, reference: &str, args: &[&str]) -> Result<Output> {
        self.containerd.run(reference, args)
    }

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
}

/// The processes a node runs besides containerd, each with its log
/// `<name>.log` in the node's folder; killed when dropped.
struct NodeProcesses {
    dir: PathBuf,
    children: Vec<Child>,
}

impl NodeProcesses {
    /// Starts `cmd`. Its command line names the node's folder, so the
    /// reaper finds it.
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.children.push(child);
        Ok(())
    }
}

impl Drop for NodeProcesses {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
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

/// Where nodes keep their folders, `apn-<name>-<pid>-<n>`.
const NODE_DIRS: &str = "/tmp";

/// Reaps the nodes in `dirs` whose test process is gone and whose reaper
/// went with it (a stop that killed the whole process group leaves their
/// network namespace, folder and cgroups behind): each as its own reaper
/// would have. A node of a live process, or one whose owner cannot be
/// read from its name, is left alone.
fn reap_orphans(dirs: &Path) {
    let Ok(entries) = std::fs::read_dir(dirs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(id) = name.strip_prefix("apn-") else {
            continue;
        };
        // <name>-<pid>-<n>
        let Some(pid) = id.rsplit('-').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Ok(reaper) = Reaper::start(&e.path(), &format!("argocd-pull-{id}")) {
            // Dropped: it reaps now, and this waits for it.
            drop(reaper);
        }
    }
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

#[cfg(test)]
mod tests {
    use super::reap_orphans;
    use std::path::Path;
    use std::process::Command;

    fn netns_exists(name: &str) -> bool {
        Path::new("/run/netns").join(name).exists()
    }

    #[test]
    fn a_node_left_by_a_dead_process_is_reaped_and_a_live_ones_is_not() {
        let dirs = tempfile::tempdir().unwrap();
        // A process that has exited: its pid is dead.
        let dead = {
            let mut c = Command::new("true").spawn().unwrap();
            let pid = c.id();
            c.wait().unwrap();
            pid
        };
        let live = std::process::id();
        let orphan = format!("orphantest-{dead}-0");
        let mine = format!("orphantest-{live}-0");
        for id in [&orphan, &mine] {
            std::fs::create_dir_all(dirs.path().join(format!("apn-{id}")).join("state")).unwrap();
            let added = Command::new("ip")
                .args(["netns", "add", &format!("argocd-pull-{id}")])
                .status()
                .unwrap();
            assert!(added.success());
        }
        reap_orphans(dirs.path());
        let orphan_gone = !dirs.path().join(format!("apn-{orphan}")).exists()
            && !netns_exists(&format!("argocd-pull-{orphan}"));
        let mine_kept = dirs.path().join(format!("apn-{mine}")).exists()
            && netns_exists(&format!("argocd-pull-{mine}"));
        let _ = Command::new("ip")
            .args(["netns", "delete", &format!("argocd-pull-{mine}")])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "delete", &format!("argocd-pull-{orphan}")])
            .status();
        assert!(orphan_gone, "the dead process's node is reaped");
        assert!(mine_kept, "this process's node is left alone");
    }
}
