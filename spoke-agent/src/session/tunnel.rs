//! The connector that dials the hub through an HTTP proxy: TCP to the
//! proxy, `CONNECT` to the hub, and the open tunnel handed to tonic, which
//! does TLS (the hub's URI is `https`) inside it. What to send and how to
//! read the answer is [`super::proxy`]'s.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::transport::Uri;

use super::proxy::{self, Credentials, ProxyError, ProxyUrl};

/// A tower `Service<Uri>` for `Endpoint::connect_with_connector`.
#[derive(Clone, Debug)]
pub struct Tunnel {
    pub proxy: ProxyUrl,
    /// Read at each dial, so that a renewed Secret counts at the next one.
    pub credentials_file: Option<std::path::PathBuf>,
}

impl tower::Service<Uri> for Tunnel {
    type Response = TokioIo<TcpStream>;
    type Error = ProxyError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ProxyError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { this.dial(&uri).await.map(TokioIo::new) })
    }
}

impl Tunnel {
    /// A stream to `uri`'s host and port through the proxy, once it said
    /// yes to `CONNECT`.
    pub(super) async fn dial(&self, uri: &Uri) -> Result<TcpStream, ProxyError> {
        let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
            Some("http") => 80,
            _ => 443,
        });
        let target = proxy::connect_target(uri.host().unwrap_or_default(), port);
        let credentials = match &self.credentials_file {
            Some(file) => read_credentials(file)?.or_else(|| self.proxy.credentials.clone()),
            None => self.proxy.credentials.clone(),
        };
        let address = self.proxy.address();
        let mut stream = TcpStream::connect((self.proxy.host.as_str(), self.proxy.port))
            .await
            .map_err(|source| ProxyError::Unreachable {
                proxy: address.clone(),
                source,
            })?;
        // Heartbeats and acknowledgements are small: send them at once.
        let _ = stream.set_nodelay(true);
        let closed = |source| ProxyError::Closed {
            proxy: address.clone(),
            target: target.clone(),
            source,
        };
        let request = proxy::connect_request(&target, credentials.as_ref());
        stream.write_all(request.as_bytes()).await.map_err(closed)?;
        let head = argocd_pull_runtime::net::read_head(&mut stream, proxy::MAX_HEAD)
            .await
            .map_err(closed)?;
        proxy::connect_answer(&head, credentials.is_some()).map_err(|answer| {
            ProxyError::Refused {
                proxy: address.clone(),
                target: target.clone(),
                answer,
            }
        })?;
        Ok(stream)
    }
}

/// The credentials in `file`; none when it does not exist (the chart's
/// Secret is optional).
fn read_credentials(file: &Path) -> Result<Option<Credentials>, ProxyError> {
    let error = |why: String| ProxyError::Credentials {
        file: file.display().to_string(),
        why,
    };
    match std::fs::read_to_string(file) {
        Ok(text) => Credentials::from_file_text(&text).map(Some).map_err(error),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(error(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::TcpListener;
    use tower::ServiceExt;

    /// A proxy that reads one request head, answers `answer`, then echoes.
    async fn fake_proxy(answer: &'static [u8]) -> (ProxyUrl, tokio::task::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).await.unwrap();
                head.push(b[0]);
            }
            s.write_all(answer).await.unwrap();
            let mut rest = [0u8; 5];
            if s.read_exact(&mut rest).await.is_ok() {
                s.write_all(&rest).await.unwrap();
            }
            String::from_utf8(head).unwrap()
        });
        let url = ProxyUrl::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        (url, task)
    }

    #[tokio::test]
    async fn a_tunnel_asks_for_the_hub_and_then_carries_bytes_both_ways() {
        let (proxy, seen) = fake_proxy(b"HTTP/1.1 200 Connection established\r\n\r\n").await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(&file, "agent:s3cret\n").unwrap();
        let tunnel = Tunnel {
            proxy,
            credentials_file: Some(file),
        };
        let io = tunnel
            .oneshot(Uri::from_static("https://hub.example.com:8443"))
            .await
            .unwrap();
        let mut stream = io.into_inner();
        stream.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"hello");
        let head = seen.await.unwrap();
        assert!(
            head.starts_with("CONNECT hub.example.com:8443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(head.contains("Proxy-Authorization: Basic "), "{head}");
    }

    #[tokio::test]
    async fn a_refusal_names_the_proxy_and_what_to_fix() {
        let (proxy, _) = fake_proxy(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n").await;
        let address = proxy.address();
        let tunnel = Tunnel {
            proxy,
            // Absent: no credentials sent.
            credentials_file: Some("/nonexistent/credentials".into()),
        };
        let e = tunnel
            .oneshot(Uri::from_static("https://hub:443"))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "the proxy {address} refused CONNECT to hub:443: 407 Proxy Authentication Required: set --proxy-credentials-file (a Secret with `user:password`)"
            )
        );
    }

    #[tokio::test]
    async fn an_endless_head_is_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let line = vec![b'x'; 1024];
            while s.write_all(&line).await.is_ok() {}
        });
        let tunnel = Tunnel {
            proxy: ProxyUrl::parse(&format!("127.0.0.1:{port}")).unwrap(),
            credentials_file: None,
        };
        let e = tunnel
            .oneshot(Uri::from_static("https://hub:443"))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("longer than 8192 bytes"), "{e}");
    }
}
