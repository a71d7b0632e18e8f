//! Small network helpers for tests that start argocd-pull binaries.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback address with a port that was free a moment ago, for a
/// process the test is about to start.
///
/// The port comes from below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), never from the kernel's own pick:
/// between this call and the process binding it, the kernel may hand a
/// port of its range to any outgoing connection (the tests open thousands,
/// to API servers and etcd), and the process then fails to start ("address
/// in use"). Below that range only a listener can take it; this process
/// hands out each port once, and the start differs per process.
pub fn free_addr() -> std::io::Result<SocketAddr> {
    free_on(std::net::Ipv4Addr::LOCALHOST.into())
}

/// [`free_addr`] on the IPv6 loopback, `[::1]`.
pub fn free_addr_v6() -> std::io::Result<SocketAddr> {
    free_on(std::net::Ipv6Addr::LOCALHOST.into())
}

fn free_on(ip: std::net::IpAddr) -> std::io::Result<SocketAddr> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = ports_below_ephemeral();
    let span = high - low;
    let seed = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let offset = (seed + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(low + offset).expect("ports below 65536");
        if let Ok(listener) = TcpListener::bind((ip, port)) {
            return listener.local_addr();
        }
    }
    TcpListener::bind((ip, 0))?.local_addr()
}

/// The ports the tests hand out: from 20000 (above the ports Kubernetes
/// components listen on) up to the start of the
/// ephemeral range (32768 by default).
fn ports_below_ephemeral() -> (u32, u32) {
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    (20000, first_ephemeral.max(22000))
}

/// A plain HTTP/1.1 GET, returning the status code and body; enough for the
/// admin endpoints without pulling an HTTP client into the tests. Gives up
/// after 10 s (a relay can accept a connection and then never answer, when
/// the pod behind it is gone).
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    tokio::time::timeout(Duration::from_secs(10), get(addr, path))
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("GET {path} from {addr}: no answer within 10 s"),
            )
        })?
}

async fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let code = out
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {out:?}")))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Runs the argocd-pull binary `binary` (with its admin port on a free
/// address and `args`) against an API server that does not answer: a
/// kubeconfig for 127.0.0.1:1. Returns what it left once it exited.
pub async fn run_unreachable(binary: &str, args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n").expect("the kubeconfig written");
    tokio::process::Command::new(binary)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--admin-addr")
        .arg(free_addr().expect("a free port").to_string())
        .args(args)
        .output()
        .await
        .expect("the binary runs")
}

/// Sends SIGTERM to a child and waits for it to exit, returning its status.
pub async fn terminate(
    child: &mut tokio::process::Child,
    within: Duration,
) -> std::process::ExitStatus {
    let pid = child.id().expect("child still running").to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill runs");
    tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("process {pid} did not exit within {within:?} of SIGTERM"))
        .expect("wait on child")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_addresses_are_distinct_and_outside_the_ephemeral_range() {
        let (low, high) = ports_below_ephemeral();
        let ports: Vec<u16> = (0..50).map(|_| free_addr().unwrap().port()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for p in ports {
            assert!(
                (low..high).contains(&u32::from(p)),
                "{p} not in {low}..{high}"
            );
        }
    }
}
