//! The connector of the WebSocket wire: TCP to the URL's host (through the
//! egress proxy's `CONNECT` tunnel when one applies), TLS to whatever
//! terminates a `wss://` URL (the system's roots or `--websocket-ca-file`,
//! no client certificate), the WebSocket handshake, and the WebSocket as a
//! byte stream handed to tonic, which does the same mutual TLS with the
//! hub inside it as on the gRPC wire. What to dial is [`super::wire`]'s.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use argocd_pull_runtime::websocket::{self, ByteStream};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::transport::Uri;

use super::proxy::ProxyError;
use super::tunnel::Tunnel;
use super::wire::WsUrl;

/// What the WebSocket runs on: TCP, or TLS on TCP for `wss://`.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Why a dial on the WebSocket wire failed, as an operator reads it.
#[derive(Debug, thiserror::Error)]
pub enum WsError {
    /// Not transparent: the choice of wire reads the `ProxyError` in the
    /// error's sources.
    #[error("{0}")]
    Proxy(#[from] ProxyError),
    #[error("cannot reach {address} for the WebSocket wire: {source}")]
    Tcp {
        address: String,
        source: std::io::Error,
    },
    #[error("--websocket-ca-file {file}: {why}")]
    Ca { file: String, why: String },
    #[error("TLS to {address} (wss://): {source}")]
    OuterTls {
        address: String,
        source: std::io::Error,
    },
    #[error("WebSocket handshake with {url}: {source}")]
    Handshake {
        url: String,
        source: websocket::Error,
    },
}

/// A tower `Service<Uri>` for `Endpoint::connect_with_connector`: the
/// hub's URI is ignored (tonic still names it in its TLS), the URL is
/// dialled.
#[derive(Clone)]
pub struct Connector {
    pub url: WsUrl,
    /// The egress proxy's tunnel to the URL's host, when one applies.
    pub tunnel: Option<Tunnel>,
    /// `--websocket-ca-file`.
    pub ca_file: Option<std::path::PathBuf>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<ByteStream<Box<dyn Io>>>;
    type Error = WsError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, WsError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), WsError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.dial().await.map(TokioIo::new) })
    }
}

impl Connector {
    async fn dial(&self) -> Result<ByteStream<Box<dyn Io>>, WsError> {
        let url = &self.url;
        let address = super::proxy::connect_target(&url.host, url.port);
        let tcp = match &self.tunnel {
            Some(tunnel) => {
                let uri: Uri = format!("https://{address}")
                    .parse()
                    .map_err(|e| WsError::Tcp {
                        address: address.clone(),
                        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                    })?;
                tunnel.dial(&uri).await?
            }
            None => TcpStream::connect((url.host.as_str(), url.port))
                .await
                .map_err(|source| WsError::Tcp {
                    address: address.clone(),
                    source,
                })?,
        };
        // Heartbeats and acknowledgements are small: send them at once.
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = if url.secure {
            let tls = outer_tls(self.ca_file.as_deref())?;
            let name = ServerName::try_from(url.host.clone()).map_err(|e| WsError::OuterTls {
                address: address.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
            })?;
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|source| WsError::OuterTls { address, source })?;
            Box::new(stream)
        } else {
            Box::new(tcp)
        };
        let (ws, _) = tokio_tungstenite::client_async_with_config(
            url.text.as_str(),
            io,
            Some(websocket::config()),
        )
        .await
        .map_err(|source| WsError::Handshake {
            url: url.text.clone(),
            source,
        })?;
        Ok(ByteStream::new(ws))
    }
}

/// The TLS of a `wss://` URL: the roots of `ca_file`, else the system's;
/// no client certificate (the hub's mutual TLS runs inside).
fn outer_tls(ca_file: Option<&std::path::Path>) -> Result<tokio_rustls::TlsConnector, WsError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(file) => {
            let error = |why: String| WsError::Ca {
                file: file.display().to_string(),
                why,
            };
            let pem = std::fs::read(file).map_err(|e| error(e.to_string()))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| error(e.to_string()))?;
                roots.add(cert).map_err(|e| error(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(error("holds no certificate".into()));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| WsError::Ca {
            file: String::new(),
            why: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    /// Answers one WebSocket upgrade on `stream` and echoes five bytes;
    /// the request line it was asked with.
    async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> String {
        let head = argocd_pull_runtime::net::read_head(&mut stream, 8192)
            .await
            .unwrap();
        let head = String::from_utf8(head).unwrap();
        let key = head
            .lines()
            .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
            .expect("a key");
        let answer = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
            websocket::derive_accept_key(key.as_bytes())
        );
        stream.write_all(answer.as_bytes()).await.unwrap();
        let mut ws = ByteStream::server(stream).await;
        let mut buf = [0u8; 5];
        ws.read_exact(&mut buf).await.unwrap();
        ws.write_all(&buf).await.unwrap();
        ws.flush().await.unwrap();
        head.lines().next().unwrap_or_default().to_string()
    }

    /// A WebSocket server on loopback that echoes, with TLS when `tls`
    /// is given; its port and the request line it was asked with.
    async fn echo_server(
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> (u16, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            match tls {
                Some(tls) => echo(tls.accept(tcp).await.unwrap()).await,
                None => echo(tcp).await,
            }
        });
        (port, task)
    }

    /// Sends five bytes through `connector` and reads them back.
    async fn round_trip(connector: Connector) {
        let io = connector
            .oneshot(Uri::from_static("https://hub:443"))
            .await
            .unwrap();
        let mut stream = io.into_inner();
        stream.write_all(b"hello").await.unwrap();
        stream.flush().await.unwrap();
        let mut back = [0u8; 5];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello");
    }

    #[tokio::test]
    async fn a_wss_url_is_dialled_with_tls_to_its_host_trusting_the_ca_file() {
        let ca = testenv::pki::Ca::new("ingress-ca").unwrap();
        let serving = ca
            .serving(&["localhost"], &[std::net::Ipv4Addr::LOCALHOST.into()])
            .unwrap();
        let chain = CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (port, server) = echo_server(Some(acceptor.clone())).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &ca.pem.cert_pem).unwrap();
        let url = super::super::wire::websocket_url(
            "https://hub:8443",
            Some(&format!("wss://localhost:{port}/hub")),
        )
        .unwrap();
        round_trip(Connector {
            url: url.clone(),
            tunnel: None,
            ca_file: Some(ca_file),
        })
        .await;
        assert_eq!(server.await.unwrap(), "GET /hub HTTP/1.1");

        // The system's roots do not know that CA: refused, and said so.
        let (port, _server) = echo_server(Some(acceptor)).await;
        let url = super::super::wire::websocket_url(
            "https://hub:8443",
            Some(&format!("wss://localhost:{port}/hub")),
        )
        .unwrap();
        let e = dial_error(url, "TLS with the system's roots to a server of another CA").await;
        assert!(
            e.starts_with(&format!("TLS to localhost:{port} (wss://): ")),
            "{e}"
        );
    }

    #[tokio::test]
    async fn the_connector_upgrades_to_the_path_and_carries_bytes_both_ways() {
        let (port, server) = echo_server(None).await;
        let url =
            super::super::wire::websocket_url(&format!("https://127.0.0.1:{port}"), None).unwrap();
        round_trip(Connector {
            url,
            tunnel: None,
            ca_file: None,
        })
        .await;
        assert_eq!(
            server.await.unwrap(),
            format!("GET {} HTTP/1.1", websocket::PATH)
        );
    }

    #[test]
    fn a_proxy_refusing_connect_to_the_websocket_url_is_no_reason_to_change_wires() {
        use super::super::wire::{Failure, classify};
        let e = WsError::from(ProxyError::Refused {
            proxy: "proxy:3128".into(),
            target: "hub:443".into(),
            answer: "403 Forbidden".into(),
        });
        assert_eq!(classify(&e), Failure::Unreachable);
        assert_eq!(
            e.to_string(),
            "the proxy proxy:3128 refused CONNECT to hub:443: 403 Forbidden"
        );
    }

    #[tokio::test]
    async fn a_refused_upgrade_names_the_url() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let _ = argocd_pull_runtime::net::read_head(&mut s, 8192).await;
            let _ = s
                .write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                .await;
        });
        let url = super::super::wire::websocket_url(
            "https://hub",
            Some(&format!("ws://127.0.0.1:{port}/x")),
        )
        .unwrap();
        let e = dial_error(url, "a 404 is no upgrade").await;
        assert!(
            e.starts_with(&format!(
                "WebSocket handshake with ws://127.0.0.1:{port}/x: "
            )),
            "{e}"
        );
        assert!(e.contains("404"), "{e}");
    }

    /// The error of a dial to `url`, straight (no tunnel, the system's
    /// roots); `what` says why it must fail.
    async fn dial_error(url: WsUrl, what: &str) -> String {
        let connector = Connector {
            url,
            tunnel: None,
            ca_file: None,
        };
        match connector.oneshot(Uri::from_static("https://hub:443")).await {
            Ok(_) => panic!("dialled: {what}"),
            Err(e) => e.to_string(),
        }
    }
}
