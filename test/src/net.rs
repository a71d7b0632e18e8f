//! Small network helpers for tests that start argocd-pull binaries.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
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
