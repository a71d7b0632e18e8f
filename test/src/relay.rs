//! `testenv relay`: TCP or unix-socket connections piped to another
//! address. A network namespace cannot reach the machine's loopback, but
//! both sides see the same files, so a node's way out (to its API server)
//! and its way in (a hub Service another node's pods dial) are a relay from
//! TCP inside a namespace to a unix socket, and another from that socket
//! to where the connection should go.

use std::path::PathBuf;

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
/// forever; with `connect` (the `host:port`s it serves), each connection
/// first asks with an HTTP `CONNECT` for one of those, as a Kubernetes API
/// server does through its egress selector ([`connect_target`]). A network namespace cannot reach the machine's loopback, but
/// both sides see the same files: the node's API server address is a relay
/// from TCP inside the namespace to a unix socket, and a second relay
/// outside takes that socket to the API server's loopback port.
pub async fn relay(listen: Endpoint, to: Endpoint, connect: Vec<String>) -> std::io::Result<()> {
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
        let allowed = connect.clone();
        tokio::spawn(async move {
            if !allowed.is_empty() && !http_connect(&mut inbound, &allowed).await {
                return;
            }
            if let Ok(mut outbound) = self::connect(&to).await {
                if !allowed.is_empty() {
                    let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
                    if tokio::io::AsyncWriteExt::write_all(&mut inbound, ok)
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

/// Reads an HTTP `CONNECT` request from `inbound`: true when it asks for
/// one of `allowed`; otherwise answers 403 and returns false.
async fn http_connect(inbound: &mut Box<dyn Stream>, allowed: &[String]) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte: nothing after the request's blank line may be taken.
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || inbound.read_exact(&mut byte).await.is_err() {
            return false;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    match connect_target(&head) {
        Some(target) if allowed.iter().any(|a| a == target) => true,
        target => {
            let body = format!(
                "only {} are reached here, not {}\n",
                allowed.join(", "),
                target.unwrap_or("that request")
            );
            let answer = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = inbound.write_all(answer.as_bytes()).await;
            false
        }
    }
}

/// The `host:port` an HTTP `CONNECT` request's head asks for.
pub fn connect_target(head: &str) -> Option<&str> {
    let mut words = head.lines().next()?.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("CONNECT"), Some(target), Some(v)) if v.starts_with("HTTP/") => Some(target),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::connect_target;

    #[test]
    fn a_connect_request_names_its_target_and_nothing_else_does() {
        assert_eq!(
            connect_target(
                "CONNECT cluster1-node:10250 HTTP/1.1\r\nHost: cluster1-node:10250\r\n\r\n"
            ),
            Some("cluster1-node:10250")
        );
        assert_eq!(connect_target("GET / HTTP/1.1\r\n\r\n"), None);
        assert_eq!(connect_target("CONNECT\r\n\r\n"), None);
        assert_eq!(connect_target(""), None);
    }
}
