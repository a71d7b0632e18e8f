//! [`Isolated`]: a network namespace of the harness with loopback alone,
//! whose only ways out are the addresses a test opens with
//! [`Isolated::reach`]. A program run in it (a spoke-agent) reaches those
//! and nothing else, as a cluster's node whose only way out is its egress
//! proxy. It is removed, with every process started for it, by the node
//! reaper when dropped or when the test process dies.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{NODE_DIRS, Netns, Reaper};
use crate::{Error, Result};

pub struct Isolated {
    net: Netns,
    dir: PathBuf,
    children: Vec<Child>,
    /// Held for its drop, last: it waits until the rest is gone.
    _reaper: Reaper,
}

impl Isolated {
    /// Creates namespace `argocd-pull-<name>-<pid>-<n>`, loopback only.
    pub fn create(name: &str) -> Result<Self> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let id = format!(
            "{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let netns = format!("argocd-pull-{id}");
        let dir = PathBuf::from(format!("{NODE_DIRS}/api-{id}"));
        std::fs::create_dir_all(&dir)?;
        let reaper = Reaper::start(&dir, &netns)?;
        let net = Netns::create(netns, Netns::free_slot())?;
        Ok(Self {
            net,
            dir,
            children: Vec::new(),
            _reaper: reaper,
        })
    }

    /// Its folder (whatever names it on a command line is reaped with it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes `to`, an address on this machine's loopback, reachable at the
    /// same address inside: a relay listens there and pipes each
    /// connection through a unix socket in the folder to a second relay
    /// outside, which dials `to`. Returns once the inside one listens.
    pub async fn reach(&mut self, testenv: &Path, to: SocketAddr) -> Result<()> {
        let socket = self.dir.join(format!("reach-{}.sock", to.port()));
        let unix = format!("unix:{}", socket.display());
        let outside = self.spawn(Command::new(testenv).args([
            "relay",
            "--listen",
            &unix,
            "--to",
            &format!("tcp:{to}"),
        ]))?;
        let inside = self.spawn(self.command(testenv).args([
            "relay",
            "--listen",
            &format!("tcp:{to}"),
            "--to",
            &unix,
        ]))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        // The inside relay's own view of its namespace's sockets.
        let listening = format!(":{:04X} 00000000:0000 0A", to.port());
        loop {
            let table =
                std::fs::read_to_string(format!("/proc/{inside}/net/tcp")).unwrap_or_default();
            if socket.exists() && table.contains(&listening) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Command {
                    command: format!("testenv relay (outside {outside}, inside {inside})"),
                    output: format!("not listening on {to} inside {} in 20s", self.net.name()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `program` to be run inside the namespace.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.net.name()]).arg(program);
        cmd
    }

    fn spawn(&mut self, cmd: &mut Command) -> Result<u32> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pid = child.id();
        self.children.push(child);
        Ok(pid)
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
