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
