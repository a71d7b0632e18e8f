//! Ways into and out of a node's network namespace, and what its
//! containers use: relays (TCP inside, a unix socket in the node's folder
//! that every namespace of the machine sees), addresses on the node's
//! loopback, a Service address sent to the pods behind it (what kube-proxy
//! does for a ClusterIP), and a container's memory as its cgroup counts it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::api::core::v1::Pod;

use super::netns::iptables_in;
use super::{Node, run_ok};
use crate::{Error, Result};

/// The nat chain (jumped to from OUTPUT and PREROUTING) that sends each
/// Service address [`route_service`] keeps to a chain of its own.
const CHAIN: &str = "ARGOCD-PULL-SERVICES";

/// A container's memory as its memory cgroup (v1) counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Memory {
    /// `memory.max_usage_in_bytes`: the most it ever used.
    pub peak: u64,
    /// `memory.limit_in_bytes`: the Deployment's limit, as the kernel has it.
    pub limit: u64,
}

impl Node {
    /// Starts `testenv relay --listen <listen> --to <to>` (see
    /// [`crate::relay`]), inside the node's namespaces if `inside`, else on
    /// the machine, each connection first asking with an HTTP `CONNECT`
    /// for one of `connect` (`host:port`s) unless it is empty; its log is
    /// `<name>.log` in the node's folder.
    pub fn relay(
        &mut self,
        testenv: &Path,
        name: &str,
        inside: bool,
        listen: &str,
        to: &str,
        connect: &[String],
    ) -> Result<()> {
        let mut cmd = if inside {
            self.containerd.inside(testenv)
        } else {
            Command::new(testenv)
        };
        cmd.args(["relay", "--listen", listen, "--to", to]);
        if !connect.is_empty() {
            cmd.arg(format!("--http-connect={}", connect.join(",")));
        }
        self.processes.spawn(name, &mut cmd)
    }

    /// Makes `address` (an address of the harness's range) a way into
    /// this node: connections to it from inside the node go to the pods
    /// [`route_service`] names for it, and the unix socket returned leads
    /// there from anywhere on the machine (give it to [`Node::reach`]).
    pub fn expose(&mut self, testenv: &Path, address: SocketAddr) -> Result<PathBuf> {
        self.net.add_address(address.ip())?;
        for hook in ["OUTPUT", "PREROUTING"] {
            let net = &self.net;
            if net
                .iptables(&["-t", "nat", "-C", hook, "-j", CHAIN])
                .is_err()
            {
                let _ = net.iptables(&["-t", "nat", "-N", CHAIN]);
                net.iptables(&["-t", "nat", "-A", hook, "-j", CHAIN])?;
            }
        }
        let socket = self
            .dir
            .join(format!("in-{}-{}.sock", address.ip(), address.port()));
        self.relay(
            testenv,
            &format!("relay-in-{}", address.port()),
            true,
            &format!("unix:{}", socket.display()),
            &format!("tcp:{address}"),
            &[],
        )?;
        Ok(socket)
    }

    /// Makes `address` inside this node lead to `socket` (another node's
    /// [`Node::expose`]): this node's pods dial it as if it were a load
    /// balancer's address of the other cluster. The relay's command line
    /// names the other node's folder, so that node's reaper also ends it
    /// if the test process dies (this node's drop ends it otherwise).
    pub fn reach(&mut self, testenv: &Path, address: SocketAddr, socket: &Path) -> Result<()> {
        self.net.add_address(address.ip())?;
        self.relay(
            testenv,
            &format!("relay-out-{}", address.port()),
            true,
            &format!("tcp:{address}"),
            &format!("unix:{}", socket.display()),
            &[],
        )
    }

    /// The memory of container `container` of `pod` (a pod of this node,
    /// running), from its memory cgroup.
    pub fn memory(&self, pod: &Pod, container: &str) -> Result<Memory> {
        let status = pod.status.clone().unwrap_or_default();
        let id = status
            .container_statuses
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.name == container)
            .and_then(|c| c.container_id)
            .ok_or_else(|| Error::Command {
                command: format!("the memory of container {container}"),
                output: "no container ID in the pod's status".into(),
            })?;
        let dir = self.memory_cgroup(
            &status.qos_class.unwrap_or_default().to_lowercase(),
            pod.metadata.uid.as_deref().unwrap_or_default(),
            &id,
        );
        let read = |file: &str| -> Result<u64> {
            let path = dir.join(file);
            let text = std::fs::read_to_string(&path)?;
            text.trim().parse().map_err(|e| Error::Command {
                command: format!("reading {}", path.display()),
                output: format!("{text:?}: {e}"),
            })
        };
        Ok(Memory {
            peak: read("memory.max_usage_in_bytes")?,
            limit: read("memory.limit_in_bytes")?,
        })
    }
}

/// Sends connections to `address` inside network namespace `netns` (a
/// node's, after [`Node::expose`]) to one of `endpoints`, each as likely
/// as the others, as kube-proxy does for a Service: with none, nothing
/// answers there. Replaces what was there before in one step.
pub fn route_service(netns: &str, address: SocketAddr, endpoints: &[SocketAddr]) -> Result<()> {
    // Each address has a chain of its own, jumped to from CHAIN, so that
    // addresses are routed independently of each other.
    let std::net::IpAddr::V4(ip) = address.ip() else {
        return Err(Error::Command {
            command: format!("route_service {address}"),
            output: "only IPv4 addresses are routed".into(),
        });
    };
    let chain = format!("APS-{:08x}-{:04x}", u32::from(ip), address.port());
    let iptables = |args: &[&str]| {
        run_ok(
            iptables_in(netns, "iptables")
                .args(["-t", "nat"])
                .args(args),
        )
    };
    let (dst, port) = (format!("{ip}/32"), address.port().to_string());
    let jump = [
        CHAIN, "-d", &dst, "-p", "tcp", "--dport", &port, "-j", &chain,
    ];
    if iptables(&[&["-C"], &jump[..]].concat()).is_err() {
        let _ = iptables(&["-N", &chain]);
        iptables(&[&["-A"], &jump[..]].concat())?;
    }
    let mut rules = format!("*nat\n:{chain} - [0:0]\n");
    for (i, to) in endpoints.iter().enumerate() {
        let left = endpoints.len() - i;
        let pick = if left > 1 {
            format!(
                "-m statistic --mode random --probability {:.5} ",
                1.0 / left as f64
            )
        } else {
            String::new()
        };
        rules.push_str(&format!(
            "-A {chain} -p tcp {pick}-j DNAT --to-destination {to}\n"
        ));
    }
    rules.push_str("COMMIT\n");
    let mut child = iptables_in(netns, "iptables-restore")
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(rules.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command: format!("iptables-restore in {netns}:\n{rules}"),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}
