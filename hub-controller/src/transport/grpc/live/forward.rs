//! A live read that reaches a replica the cluster's agent is not connected
//! to goes on to the replica it is (the holder of the cluster's claim,
//! whose presence Lease says where its live endpoint listens:
//! `--live-peer-addr`). The read is sent as it came, with the caller's
//! token (every replica serves the same tokens), over TLS checked against
//! the live CA for the host of `--live-url` (the serving certificate every
//! replica shares); the answer streams back as the holder gives it. A
//! forwarded read carries [`FORWARDED_BY`] and is never forwarded again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::Reloaded;

/// Header of a forwarded read: the identity of the replica that forwarded
/// it.
pub const FORWARDED_BY: &str = "x-argocd-pull-forwarded-by";

/// How long connecting to a peer, with its handshake, may take.
const CONNECT: Duration = Duration::from_secs(5);

/// How this replica reaches the others' live endpoints.
pub struct Peers {
    /// This replica, named in [`FORWARDED_BY`].
    identity: HeaderValue,
    /// The name the serving certificate is checked for.
    server_name: ServerName<'static>,
    /// Trusts the live CA, read again when its file changes.
    tls: Reloaded<Arc<ClientConfig>>,
}

fn load_client_tls(files: &[std::path::PathBuf]) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&files[0])
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[0].display()))?
    {
        let cert = cert.map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[0].display()))?;
        roots.add(cert)?;
    }
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The host of `url` (`https://host:port/...`), as a TLS server name.
fn server_name(url: &str) -> anyhow::Result<ServerName<'static>> {
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("--live-url {url} is not a URL: {e}"))?;
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("--live-url {url} has no host"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| anyhow::anyhow!("--live-url {url}: {host} is not a server name: {e}"))
}

/// Why a forwarded read got no answer from the peer.
#[derive(Debug, thiserror::Error)]
pub enum Failed {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

impl Peers {
    /// Peers reached as `identity`, checking their certificate against the
    /// CA in `ca_file` for the host of `live_url`.
    pub fn new(
        identity: &str,
        live_url: &str,
        ca_file: std::path::PathBuf,
    ) -> anyhow::Result<Self> {
        let tls = Reloaded::new(vec![ca_file], load_client_tls);
        // The CA is often not there yet at a first install: the chart
        // mounts the Secret this hub-controller is about to create
        // (`--grpc-manage-certificates`), and the kubelet fills the volume
        // a minute later. Each forward reads it until it is there.
        if let Err(e) = tls.get() {
            tracing::warn!(error = %e, "the live CA cannot be read yet; reads for clusters whose agents are on other replicas get 502 until it can");
        }
        Ok(Self {
            identity: HeaderValue::from_str(identity)
                .map_err(|e| anyhow::anyhow!("identity {identity:?}: {e}"))?,
            server_name: server_name(live_url)?,
            tls,
        })
    }

    /// Sends the read of `path_and_query` (the whole path of the endpoint,
    /// `/clusters/<cluster>/...`) to the peer at `address`, with the
    /// caller's `headers`' token; its answer, streamed, once its head
    /// arrives within `timeout`.
    pub async fn forward(
        &self,
        address: &str,
        path_and_query: &str,
        headers: &HeaderMap,
        timeout: Duration,
    ) -> Result<Response, Failed> {
        let config = self.tls.get().map_err(|e| Failed::Connect(e.to_string()))?;
        let connect = async {
            let tcp = TcpStream::connect(address)
                .await
                .map_err(|e| Failed::Connect(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            TlsConnector::from(config.as_ref().clone())
                .connect(self.server_name.clone(), tcp)
                .await
                .map_err(|e| Failed::Connect(e.to_string()))
        };
        let tls = tokio::time::timeout(CONNECT, connect)
            .await
            .map_err(|_| Failed::Connect(format!("no connection within {CONNECT:?}")))??;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        // Ends with the answer, or when its reader drops it (the peer then
        // tells the agent to stop).
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "a forwarded live read's connection ended");
            }
        });
        let mut request = Request::get(path_and_query)
            .header(header::HOST, address)
            .header(FORWARDED_BY, self.identity.clone())
            .body(Body::empty())
            .expect("a valid request");
        for name in [header::AUTHORIZATION, header::ACCEPT] {
            if let Some(v) = headers.get(&name) {
                request.headers_mut().insert(name, v.clone());
            }
        }
        let answer = tokio::time::timeout(timeout, sender.send_request(request))
            .await
            .map_err(|_| Failed::Timeout(timeout))??;
        let (head, body) = answer.into_parts();
        let mut response = Response::new(Body::new(body));
        *response.status_mut() = head.status;
        if let Some(v) = head.headers.get(header::CONTENT_TYPE) {
            response
                .headers_mut()
                .insert(header::CONTENT_TYPE, v.clone());
        }
        Ok(response)
    }
}

/// The status a failed forward is answered with.
pub fn status(failed: &Failed) -> StatusCode {
    match failed {
        Failed::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peers_certificate_is_checked_for_the_host_of_the_live_url() {
        assert_eq!(
            server_name("https://argocd-pull-live.argocd-pull.svc:8444")
                .unwrap()
                .to_str(),
            "argocd-pull-live.argocd-pull.svc"
        );
        assert_eq!(
            server_name("https://127.0.0.1:8444/").unwrap().to_str(),
            "127.0.0.1"
        );
        assert_eq!(server_name("https://[::1]:8444").unwrap().to_str(), "::1");
        assert!(server_name("not a url").is_err());
    }
}
