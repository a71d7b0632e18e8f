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
rm -rf "$dir"
"#;

/// A containerd in its own network namespace.
pub struct Node {
    pub name: String,
    netns: String,
    dir: PathBuf,
    containerd: Child,
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

        run_ok(Command::new("ip").args(["netns", "add", &netns]))?;
        run_ok(Command::new("ip").args(["-n", &netns, "link", "set", "lo", "up"]))?;

        let config = dir.join("config.toml");
        std::fs::write(&config, containerd_config(&dir, &runc))?;
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
            .arg(&containerd)
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut node = Self {
            name: name.to_string(),
            netns,
            dir,
            containerd: child,
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
    /// the image's own user, and returns what it printed.
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

impl Drop for Node {
    fn drop(&mut self) {
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

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
"#,
        runc = runc.display()
    )
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

/// One end of a [`relay`]: a TCP address or a unix socket's path.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Endpoint {
    type Err = String;
    /// `tcp:127.0.0.1:6443` or `unix:/path/to/socket`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.split_once(':') {
            Some(("tcp", a)) => a
                .parse()
                .map(Endpoint::Tcp)
                .map_err(|e| format!("{s}: {e}")),
            Some(("unix", p)) => Ok(Endpoint::Unix(p.into())),
            _ => Err(format!("{s}: expected tcp:ADDR:PORT or unix:PATH")),
        }
    }
}

trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Stream for T {}

async fn connect(to: &Endpoint) -> std::io::Result<Box<dyn Stream>> {
    Ok(match to {
        Endpoint::Tcp(a) => Box::new(tokio::net::TcpStream::connect(a).await?),
        Endpoint::Unix(p) => Box::new(tokio::net::UnixStream::connect(p).await?),
    })
}

/// Accepts on `listen` and pipes each connection to a new one to `to`,
/// forever. A network namespace cannot reach the machine's loopback, but
/// both sides see the same files: the node's API server address is a relay
/// from TCP inside the namespace to a unix socket, and a second relay
/// outside takes that socket to the API server's loopback port.
pub async fn relay(listen: Endpoint, to: Endpoint) -> std::io::Result<()> {
    enum Listener {
        Tcp(tokio::net::TcpListener),
        Unix(tokio::net::UnixListener),
    }
    let listener = match &listen {
        Endpoint::Tcp(a) => Listener::Tcp(tokio::net::TcpListener::bind(a).await?),
        Endpoint::Unix(p) => {
            let _ = std::fs::remove_file(p);
            Listener::Unix(tokio::net::UnixListener::bind(p)?)
        }
    };
    loop {
        let mut inbound: Box<dyn Stream> = match &listener {
            Listener::Tcp(l) => Box::new(l.accept().await?.0),
            Listener::Unix(l) => Box::new(l.accept().await?.0),
        };
        let to = to.clone();
        tokio::spawn(async move {
            if let Ok(mut outbound) = connect(&to).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}
