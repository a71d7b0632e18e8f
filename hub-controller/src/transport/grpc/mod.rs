//! The gRPC transport's hub side: a tonic server over rustls with mutual
//! TLS, one stream per agent, the cluster taken from the verified client
//! certificate only.
//!
//! - [`identity`]: certificate subject -> cluster (pure);
//! - [`plan`]: hub Application -> what the agent gets, commands, status,
//!   mirrors (pure);
//! - [`cluster`]: what the hub holds per cluster across connections;
//! - [`hub`]: watches -> index -> desired sets, and the writers;
//! - [`session`]: one stream;
//! - [`tls`]: certificates, refused handshakes logged with the cluster.

pub mod cluster;
pub mod commands;
pub mod hub;
pub mod identity;
pub mod metrics;
pub mod session;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::transport_server::{Transport, TransportServer};
use argocd_pull_proto::v1::{AgentMessage, HubMessage};
use clap::Args;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};

use crate::route::authz::Authorization;
pub use hub::Hub;
use identity::{IdentityError, IdentityMap, Pattern, cert_info};

/// Flags of the gRPC transport (documented in docs/grpc.md).
#[derive(Args, Clone, Debug)]
pub struct GrpcArgs {
    /// Serve the gRPC transport on this address (e.g. `0.0.0.0:8443`);
    /// without it every cluster uses ManifestWork.
    #[arg(long = "grpc-addr", env = "ARGOCD_PULL_GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// Serving certificate (PEM) of the gRPC server; reloaded when it changes.
    #[arg(
        long = "grpc-tls-cert",
        env = "ARGOCD_PULL_GRPC_TLS_CERT",
        default_value = "/etc/argocd-pull/grpc/tls.crt"
    )]
    pub grpc_tls_cert: PathBuf,
    /// Private key (PEM) of the serving certificate.
    #[arg(
        long = "grpc-tls-key",
        env = "ARGOCD_PULL_GRPC_TLS_KEY",
        default_value = "/etc/argocd-pull/grpc/tls.key"
    )]
    pub grpc_tls_key: PathBuf,
    /// CA bundle (PEM) that agents' client certificates must chain to (the
    /// addon's signer CA).
    #[arg(
        long = "grpc-client-ca",
        env = "ARGOCD_PULL_GRPC_CLIENT_CA",
        default_value = "/etc/argocd-pull/grpc/ca.crt"
    )]
    pub grpc_client_ca: PathBuf,
    /// Client certificate subject (common name) -> cluster: `{cluster}`
    /// marks the cluster name, `*` any text without `:`. Repeat or separate
    /// with commas; default: OCM addon certificates of the argocd-pull addon.
    #[arg(
        long = "grpc-identity",
        env = "ARGOCD_PULL_GRPC_IDENTITIES",
        value_delimiter = ','
    )]
    pub grpc_identities: Vec<Pattern>,
    /// Heartbeat interval; a stream silent for three is closed.
    #[arg(long = "grpc-heartbeat", env = "ARGOCD_PULL_GRPC_HEARTBEAT", default_value = "10s", value_parser = crate::parse_duration)]
    pub grpc_heartbeat: Duration,
    /// How often both sides compare digests and repair differences (also
    /// after every connect).
    #[arg(long = "grpc-digest-interval", env = "ARGOCD_PULL_GRPC_DIGEST_INTERVAL", default_value = "5m", value_parser = crate::parse_duration)]
    pub grpc_digest_interval: Duration,
    /// Writers to the hub API server (status, mirrors), in parallel across
    /// Applications.
    #[arg(
        long = "grpc-workers",
        env = "ARGOCD_PULL_GRPC_WORKERS",
        default_value_t = 32
    )]
    pub grpc_workers: usize,
}

impl GrpcArgs {
    /// The configuration, when gRPC is enabled.
    pub fn config(&self, authorization: Authorization) -> Option<GrpcConfig> {
        Some(GrpcConfig {
            addr: self.grpc_addr?,
            tls: tls::TlsFiles {
                cert: self.grpc_tls_cert.clone(),
                key: self.grpc_tls_key.clone(),
                client_ca: self.grpc_client_ca.clone(),
            },
            identities: if self.grpc_identities.is_empty() {
                IdentityMap::default()
            } else {
                IdentityMap(self.grpc_identities.clone())
            },
            heartbeat: self.grpc_heartbeat,
            digest_interval: self.grpc_digest_interval,
            workers: self.grpc_workers,
            authorization,
        })
    }
}

#[derive(Clone, Debug)]
pub struct GrpcConfig {
    pub addr: SocketAddr,
    pub tls: tls::TlsFiles,
    pub identities: IdentityMap,
    pub heartbeat: Duration,
    pub digest_interval: Duration,
    pub workers: usize,
    pub authorization: Authorization,
}

struct Service {
    hub: Arc<Hub>,
    shutdown: watch::Receiver<bool>,
}

type ConnectStream =
    Pin<Box<dyn futures::Stream<Item = Result<HubMessage, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Transport for Service {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let remote = request.remote_addr();
        let (cluster, not_after) = match self.identify(&request) {
            Ok(id) => id,
            Err(e) => {
                let reason = match e {
                    IdentityError::NoMatch { .. } => "unknown-identity",
                    _ => "certificate-invalid",
                };
                tracing::warn!(?remote, error = %e, "refused an agent: its certificate names no cluster");
                self.hub.metrics.refuse("", reason);
                return Err(Status::permission_denied(e.to_string()));
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(128);
        let hub = self.hub.clone();
        let inbound = request.into_inner();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            session::run(hub, cluster, not_after, inbound, tx, shutdown).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

impl Service {
    fn identify<T>(&self, request: &Request<T>) -> Result<(String, i64), IdentityError> {
        let certs = request.peer_certs().ok_or(IdentityError::NoCertificate)?;
        let leaf = certs.first().ok_or(IdentityError::NoCertificate)?;
        let info = cert_info(leaf)?;
        let cluster = self.hub.config.identities.cluster(&info.subject)?;
        Ok((cluster, info.not_after))
    }
}

/// Starts the gRPC transport (the writers and the server; its index is fed
/// by the hub's watches, see [`crate::hub::watches`]) and
/// returns the task serving it until `shutdown` resolves. Fails at once
/// when the address or the TLS files cannot be used.
pub async fn start(
    hub: Arc<Hub>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let config = hub.config.clone();
    let acceptor = Arc::new(tls::Acceptor::new(
        config.tls.clone(),
        config.identities.clone(),
        hub.metrics.clone(),
    )?);
    let listener = tokio::net::TcpListener::bind(config.addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on gRPC address {}: {e}", config.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "gRPC transport listening");

    let (stop, stopped) = watch::channel(false);
    let workers = tokio::spawn(hub.clone().run_workers(config.workers));
    let service = TransportServer::new(Service {
        hub: hub.clone(),
        shutdown: stopped.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let incoming = tls::incoming(listener, acceptor);
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(config.heartbeat))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .tcp_nodelay(true)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, wait_for(stopped.clone()));
    let server = tokio::spawn(server);
    Ok(tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
        hub.queue.close();
        // Streams end on their own once told; do not wait for slow peers.
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        let _ = workers.await;
        tracing::info!("gRPC transport stopped");
    }))
}

async fn wait_for(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    #[test]
    fn flags_parse_with_their_defaults() {
        crate::Args::command().debug_assert();
        let args = crate::Args::parse_from([
            "hub-controller",
            "--grpc-addr",
            "127.0.0.1:8443",
            "--grpc-identity",
            "spoke-{cluster},x:{cluster}:*",
        ]);
        let config = args.grpc.config(Default::default()).unwrap();
        assert_eq!(config.identities.0.len(), 2);
        assert_eq!(config.heartbeat, std::time::Duration::from_secs(10));
        assert!(
            crate::Args::parse_from(["hub-controller"])
                .grpc
                .config(Default::default())
                .is_none()
        );
    }
}
