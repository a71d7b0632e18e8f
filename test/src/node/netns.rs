//! [`Netns`]: the node's network namespace, its addresses in the
//! harness's range, and iptables inside it.

use std::net::IpAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::run_ok;
use crate::{Error, Result, paths};

/// A network namespace (`ip netns`) of the harness, loopback only, with
/// an address of its own on it. The node's reaper deletes it.
pub struct Netns {
    name: String,
    /// The node's address: `10.213.255.<slot>`.
    ip: String,
    /// The node's slot in 10.213.0.0/16: its pods take `10.213.<slot>.0/24`.
    slot: usize,
}

impl Netns {
    /// A free slot in the harness's range, before the namespace exists:
    /// 10.213.0.0/16 is the harness's, each node takes 10.213.<k>.0/24 for
    /// its pods and 10.213.255.<k> as its own address.
    pub(super) fn free_slot() -> usize {
        static K: AtomicUsize = AtomicUsize::new(1);
        (K.fetch_add(1, Ordering::Relaxed) + std::process::id() as usize) % 250 + 1
    }

    /// Creates namespace `name` with loopback up and 10.213.255.<slot> on
    /// it, once nothing on this machine's own interfaces is in the
    /// harness's range.
    pub(super) fn create(name: String, slot: usize) -> Result<Self> {
        let host_addrs = run_ok(Command::new("ip").args(["-4", "addr", "show"]))?;
        if String::from_utf8_lossy(&host_addrs.stdout).contains("inet 10.213.") {
            return Err(Error::Command {
                command: "ip -4 addr show".into(),
                output: "10.213.0.0/16, the harness's node range, is on this machine already"
                    .into(),
            });
        }
        run_ok(Command::new("ip").args(["netns", "add", &name]))?;
        run_ok(Command::new("ip").args(["-n", &name, "link", "set", "lo", "up"]))?;
        let netns = Self {
            name,
            ip: format!("10.213.255.{slot}"),
            slot,
        };
        netns.add(&netns.ip)?;
        Ok(netns)
    }

    /// Its name (`ip netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's own address.
    pub fn ip(&self) -> &str {
        &self.ip
    }

    /// The node's slot in the harness's range (its pods' /24).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Gives the loopback one more address (`/32`): pods reach it through
    /// their bridge's gateway, like the node's own.
    pub fn add_address(&self, ip: IpAddr) -> Result<()> {
        self.add(&ip.to_string())
    }

    fn add(&self, ip: &str) -> Result<()> {
        let cidr = format!("{ip}/32");
        run_ok(Command::new("ip").args(["-n", &self.name, "addr", "add", &cidr, "dev", "lo"]))?;
        Ok(())
    }

    /// Runs iptables inside the namespace.
    pub fn iptables(&self, args: &[&str]) -> Result<()> {
        run_ok(iptables_in(&self.name, "iptables").args(args))?;
        Ok(())
    }
}

/// `command` (`iptables`, `iptables-restore`: the harness's own) run
/// inside network namespace `netns`.
pub(super) fn iptables_in(netns: &str, command: &str) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns, &iptables_bin(command)]);
    cmd
}

/// `iptables`, `iptables-restore`, ...: the harness's own (Debian's,
/// unpacked by `test/tools/build.sh` into the cache), not the machine's.
fn iptables_bin(command: &str) -> String {
    paths::bin_dir().join(command).display().to_string()
}
