//! The gRPC transport's hub side: a tonic server over rustls with mutual
//! TLS, one stream per agent, the cluster taken from the verified client
//! certificate only.
//!
//! - [`identity`]: certificate subject -> cluster (pure);
//! - [`assign`]: hub Application -> what the agent gets (pure, from the
//!   core's one routing decision), with [`render`]: the copy it carries and
//!   the read-only mirror of an autonomous cluster's Application (pure);
//! - [`cluster`]: what the hub holds per cluster across connections;
//! - [`hub`]: watches -> index -> desired sets, and the writers;
//! - [`session`]: one stream;
//! - [`tls`]: certificates, refused handshakes logged with the cluster;
//! - [`revoke`]: validity on every stream, the deny list, revoked clusters;
//! - [`issued`]: a certificate speaks for a cluster only if it was issued
//!   on that cluster's own request (its CSR's requester);
//! - [`claims`]: with several replicas, which one writes for a cluster (the
//!   one its agent is connected to; the leader for the rest);
//! - [`holders`]: the record of what each agent holds, so that a key held
//!   over gRPC is not taken by an older claimant.

pub mod assign;
pub mod claims;
pub mod cluster;
pub mod commands;
mod config;
pub mod holders;
pub mod hub;
pub mod identity;
pub mod issued;
pub mod live;
pub mod metrics;
pub mod render;
pub mod revoke;
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
use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status, Streaming};

use crate::route::authz::Authorization;
pub use config::{GrpcConfig, Limits};
pub use hub::Hub;
use identity::{IdentityError, IdentityMap, Pattern, Peer, cert_info, fingerprint};
use metrics::UNVERIFIED;
use revoke::{DenyList, Refusal, RefusalCode};

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
    #[arg(long = "grpc-heartbeat", env = "ARGOCD_PULL_GRPC_HEARTBEAT", default_value = "10s", value_parser = argocd_pull_runtime::parse_duration)]
    pub grpc_heartbeat: Duration,
    /// The shortest heartbeat interval an agent may ask for (its
    /// `--heartbeat`, for a network that cuts quiet connections sooner
    /// than three of the hub's intervals); an agent never gets a longer
    /// one than `--grpc-heartbeat`.
    #[arg(long = "grpc-heartbeat-min", env = "ARGOCD_PULL_GRPC_HEARTBEAT_MIN", default_value = "2s", value_parser = argocd_pull_runtime::parse_duration)]
    pub grpc_heartbeat_min: Duration,
    /// How often both sides compare digests and repair differences (also
    /// after every connect).
    #[arg(long = "grpc-digest-interval", env = "ARGOCD_PULL_GRPC_DIGEST_INTERVAL", default_value = "5m", value_parser = argocd_pull_runtime::parse_duration)]
    pub grpc_digest_interval: Duration,
    /// With several replicas: a cluster's claim that no live replica has
    /// held for this long (its agent never came back: the cluster was
    /// deleted, or moved to ManifestWork) is deleted by the leader.
    #[arg(long = "grpc-abandoned-claim-after", env = "ARGOCD_PULL_GRPC_ABANDONED_CLAIM_AFTER", default_value = "80s", value_parser = argocd_pull_runtime::parse_duration)]
    pub abandoned_claim_after: Duration,
    /// Writers to the hub API server (status, mirrors), in parallel across
    /// Applications.
    #[arg(
        long = "grpc-workers",
        env = "ARGOCD_PULL_GRPC_WORKERS",
        default_value_t = 32
    )]
    pub grpc_workers: usize,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// ConfigMap (in --grpc-denied-certificates-namespace) listing client
    /// certificates the hub refuses: each key the SHA-256 of one (DER, hex),
    /// its value a note. Watched; empty turns the deny list off.
    #[arg(
        long = "grpc-denied-certificates",
        env = "ARGOCD_PULL_GRPC_DENIED_CERTIFICATES",
        default_value = revoke::DENY_LIST
    )]
    pub grpc_denied_certificates: String,
    /// Namespace of the deny list: the hub-controller's own.
    #[arg(
        long = "grpc-denied-certificates-namespace",
        env = "POD_NAMESPACE",
        default_value = argocd_pull_addon::HUB_NAMESPACE
    )]
    pub grpc_denied_certificates_namespace: String,
    /// Which client certificates may speak for a cluster: `csr` (only one
    /// the hub saw OCM issue on a CSR filed by that cluster's own OCM
    /// identity; certificates issued before the hub first recorded any are
    /// accepted until they expire), `off` (any the client CA signed: for
    /// certificates issued outside OCM), `auto` (`csr` with
    /// --grpc-manage-certificates, `off` without). See docs/security.md.
    #[arg(
        long = "grpc-certificate-binding",
        env = "ARGOCD_PULL_GRPC_CERTIFICATE_BINDING",
        value_enum,
        default_value_t = issued::Binding::Auto
    )]
    pub grpc_certificate_binding: issued::Binding,
}

/// What one client may cost the hub (docs/security.md, "Limits").
#[derive(Args, Clone, Debug)]
pub struct LimitArgs {
    /// TLS handshakes under way at once; a connection beyond them is closed
    /// at once (counted in argocd_pull_hub_grpc_handshakes_dropped_total).
    #[arg(
        long = "grpc-max-handshakes",
        env = "ARGOCD_PULL_GRPC_MAX_HANDSHAKES",
        default_value_t = 128,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_handshakes: u32,
    /// New TLS handshakes started per second (a burst of as many is let
    /// through at once); a connection beyond the rate is closed before any
    /// cryptography (counted in argocd_pull_hub_grpc_handshakes_dropped_total).
    /// A flood of handshakes then costs the hub at most this many a second;
    /// agents reconnecting together after a hub restart take
    /// agents / rate seconds more.
    #[arg(
        long = "grpc-max-handshake-rate",
        env = "ARGOCD_PULL_GRPC_MAX_HANDSHAKE_RATE",
        default_value_t = 500,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_handshake_rate: u32,
    /// Client connections open at once, handshaking or past it (an agent
    /// holds one); a connection beyond them is closed at once (counted in
    /// argocd_pull_hub_grpc_connections_dropped_total). Keep it above the
    /// number of clusters with the addon.
    #[arg(
        long = "grpc-max-connections",
        env = "ARGOCD_PULL_GRPC_MAX_CONNECTIONS",
        default_value_t = 4096,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_connections: u32,
    /// How long a client has to finish its TLS handshake.
    #[arg(long = "grpc-handshake-timeout", env = "ARGOCD_PULL_GRPC_HANDSHAKE_TIMEOUT", default_value = "10s", value_parser = argocd_pull_runtime::parse_duration)]
    pub handshake_timeout: Duration,
    /// HTTP/2 streams one connection may have open (an agent uses one).
    #[arg(
        long = "grpc-max-streams-per-connection",
        env = "ARGOCD_PULL_GRPC_MAX_STREAMS_PER_CONNECTION",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_streams_per_connection: u32,
    /// A connection older than this is asked to go away (HTTP/2 GOAWAY); the
    /// agent dials again, and the new connection is checked from scratch.
    #[arg(long = "grpc-max-connection-age", env = "ARGOCD_PULL_GRPC_MAX_CONNECTION_AGE", default_value = "1h", value_parser = argocd_pull_runtime::parse_duration)]
    pub max_connection_age: Duration,
    /// How long the streams of a connection past its age may go on before
    /// the connection is closed.
    #[arg(long = "grpc-max-connection-age-grace", env = "ARGOCD_PULL_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "30s", value_parser = argocd_pull_runtime::parse_duration)]
    pub max_connection_age_grace: Duration,
    /// Largest header list (bytes) a request may carry.
    #[arg(
        long = "grpc-max-header-list-bytes",
        env = "ARGOCD_PULL_GRPC_MAX_HEADER_LIST_BYTES",
        default_value_t = 8192,
        value_parser = clap::value_parser!(u32).range(1024..)
    )]
    pub max_header_list_bytes: u32,
    /// Acknowledgements waiting for one agent; while that many wait, the hub
    /// reads nothing more from it (and ends the stream when it reads
    /// nothing for three heartbeats).
    #[arg(
        long = "grpc-control-queue",
        env = "ARGOCD_PULL_GRPC_CONTROL_QUEUE",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub control_queue: u32,
    /// Applications an autonomous agent may have mirrored on the hub; a
    /// report of one more is refused (logged, counted as
    /// refused{reason="over-limit"}, the agent told).
    #[arg(
        long = "grpc-max-mirrors-per-cluster",
        env = "ARGOCD_PULL_GRPC_MAX_MIRRORS_PER_CLUSTER",
        default_value_t = 1000,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub max_mirrors_per_cluster: u32,
    /// Bytes of reports (Application and status JSON) the hub holds in
    /// memory for one autonomous cluster; a report that would go over is
    /// refused like one mirror too many.
    #[arg(
        long = "grpc-max-mirror-bytes-per-cluster",
        env = "ARGOCD_PULL_GRPC_MAX_MIRROR_BYTES_PER_CLUSTER",
        default_value_t = 32 << 20,
        value_parser = clap::value_parser!(u64).range(1024..)
    )]
    pub max_mirror_bytes_per_cluster: u64,
}

impl LimitArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            handshakes: tls::HandshakeLimits {
                max_in_flight: self.max_handshakes as usize,
                max_rate: self.max_handshake_rate,
                timeout: self.handshake_timeout,
                max_connections: self.max_connections as usize,
            },
            max_streams_per_connection: self.max_streams_per_connection,
            max_connection_age: self.max_connection_age,
            max_connection_age_grace: self.max_connection_age_grace,
            max_header_list_bytes: self.max_header_list_bytes,
            control_queue: self.control_queue as usize,
            mirrors: cluster::held::MirrorLimits {
                max_objects: self.max_mirrors_per_cluster as usize,
                max_bytes: self.max_mirror_bytes_per_cluster as usize,
            },
        }
    }
}

impl GrpcArgs {
    /// The configuration, when gRPC is enabled (certificates not kept by
    /// the hub: see [`GrpcArgs::config_managed`]).
    pub fn config(&self, authorization: Authorization) -> Option<GrpcConfig> {
        self.config_managed(authorization, false)
    }

    /// The configuration, when gRPC is enabled; `manage_certificates`:
    /// the hub keeps OCM's signing CA (`--grpc-manage-certificates`).
    pub fn config_managed(
        &self,
        authorization: Authorization,
        manage_certificates: bool,
    ) -> Option<GrpcConfig> {
        let identities = if self.grpc_identities.is_empty() {
            IdentityMap::default()
        } else {
            IdentityMap(self.grpc_identities.clone())
        };
        let binding = match self.grpc_certificate_binding {
            issued::Binding::Auto if manage_certificates => true,
            issued::Binding::Auto => false,
            issued::Binding::Csr => true,
            issued::Binding::Off => false,
        };
        Some(GrpcConfig {
            addr: self.grpc_addr?,
            tls: tls::TlsFiles {
                cert: self.grpc_tls_cert.clone(),
                key: self.grpc_tls_key.clone(),
                client_ca: self.grpc_client_ca.clone(),
            },
            issued: issued::Issued::new(
                binding,
                &self.grpc_denied_certificates_namespace,
                identities.clone(),
            ),
            identities,
            heartbeat: self.grpc_heartbeat,
            heartbeat_min: self.grpc_heartbeat_min,
            digest_interval: self.grpc_digest_interval,
            workers: self.grpc_workers,
            authorization,
            limits: self.limits.limits(),
            deny_list: DenyList::new(
                &self.grpc_denied_certificates_namespace,
                &self.grpc_denied_certificates,
            ),
            wires: tls::WireMetrics::default(),
        })
    }
}

struct Service {
    hub: Arc<Hub>,
    shutdown: watch::Receiver<bool>,
}

type ConnectStream =
    Pin<Box<dyn futures::Stream<Item = Result<HubMessage, Status>> + Send + 'static>>;

/// A refusal as the agent reads it: the server's edge is where a decision
/// becomes a gRPC status.
impl From<Refusal> for Status {
    fn from(r: Refusal) -> Self {
        let code = match r.code {
            RefusalCode::Unauthenticated => tonic::Code::Unauthenticated,
            RefusalCode::PermissionDenied => tonic::Code::PermissionDenied,
            RefusalCode::Unavailable => tonic::Code::Unavailable,
        };
        Status::new(code, r.message)
    }
}

#[tonic::async_trait]
impl Transport for Service {
    type ConnectStream = ConnectStream;

    async fn connect(
        &self,
        request: Request<Streaming<AgentMessage>>,
    ) -> Result<Response<ConnectStream>, Status> {
        let remote = request
            .remote_addr()
            .map(argocd_pull_runtime::net::canonical);
        let peer = match self.identify(&request) {
            Ok(peer) => peer,
            Err(e) => {
                let reason = match e {
                    IdentityError::NoMatch { .. } => "unknown-identity",
                    _ => "certificate-invalid",
                };
                tracing::warn!(?remote, error = %e, "refused an agent: its certificate names no cluster");
                self.hub.metrics.refuse(UNVERIFIED, reason);
                return Err(Status::permission_denied(e.to_string()));
            }
        };
        // Issued on the cluster's own request? Counted without the name:
        // nothing vouches for it (anyone with a klusterlet's credentials
        // can have any name signed).
        if let Err(d) = self.bound(&peer).await {
            let r = d.refusal;
            tracing::warn!(cluster = %peer.cluster, certificate = %peer.fingerprint, requester = %d.requester, csr = %d.csr, reason = r.reason, message = %r.message, "refused an agent: its certificate was not issued on the cluster's own request");
            self.hub.metrics.refuse(UNVERIFIED, r.reason);
            return Err(r.into());
        }
        // Every stream, not only the first of its connection: the
        // certificate may have expired, been denied, or its cluster
        // revoked since the handshake.
        if let Err(r) = self.hub.admit(&peer) {
            tracing::warn!(cluster = %peer.cluster, certificate = %peer.fingerprint, reason = r.reason, message = %r.message, "refused an agent's stream");
            self.hub.metrics.refuse(&peer.cluster, r.reason);
            return Err(r.into());
        }
        let (tx, rx) = tokio::sync::mpsc::channel(128);
        let hub = self.hub.clone();
        let inbound = request.into_inner();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            session::run(hub, peer, inbound, tx, shutdown).await;
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx).map(|m| *m),
        )))
    }
}

impl Service {
    /// [`issued::Issued::check`], once the record was read (briefly
    /// waited for at start-up, so that a fleet reconnecting to a restarted
    /// hub is not refused for it).
    async fn bound(&self, peer: &Peer) -> Result<(), issued::record::Denied> {
        let issued = &self.hub.config.issued;
        let _ = tokio::time::timeout(ISSUED_LOAD_WAIT, issued.wait_loaded()).await;
        issued.check(peer).map(|_| ())
    }

    fn identify<T>(&self, request: &Request<T>) -> Result<Peer, IdentityError> {
        let certs = request.peer_certs().ok_or(IdentityError::NoCertificate)?;
        let leaf = certs.first().ok_or(IdentityError::NoCertificate)?;
        let info = cert_info(leaf)?;
        let cluster = self.hub.config.identities.cluster(&info.subject)?;
        Ok(Peer {
            cluster,
            not_before: info.not_before,
            not_after: info.not_after,
            fingerprint: fingerprint(leaf),
        })
    }
}

/// How long a new stream waits for the record of issued certificates at
/// start-up before it is refused as retriable.
const ISSUED_LOAD_WAIT: Duration = Duration::from_secs(10);

/// Starts the gRPC transport (the writers and the server; its index is fed
/// by the hub's watches, see [`crate::watch::watches`]) and
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
    let listener = argocd_pull_runtime::net::listen(config.addr, ACCEPT_QUEUE)
        .map_err(|e| anyhow::anyhow!("cannot listen on gRPC address {}: {e}", config.addr))?;
    tracing::info!(addr = %listener.local_addr()?, "gRPC transport listening");

    let (stop, stopped) = watch::channel(false);
    let deny_list = tokio::spawn(hub::run_deny_list(hub.clone(), wait_for(stopped.clone())));
    let issued = tokio::spawn(issued::run(
        config.issued.clone(),
        hub.client.clone(),
        wait_for(stopped.clone()),
    ));
    let workers = tokio::spawn(hub.clone().run_workers(config.workers));
    let service = TransportServer::new(Service {
        hub: hub.clone(),
        shutdown: stopped.clone(),
    })
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let limits = &config.limits;
    let incoming = tls::incoming(
        listener,
        acceptor,
        limits.handshakes,
        hub.metrics.clone(),
        config.wires.clone(),
    );
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(config.heartbeat))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(limits.max_streams_per_connection)
        .max_connection_age(limits.max_connection_age)
        .max_connection_age_grace(limits.max_connection_age_grace)
        .http2_max_header_list_size(limits.max_header_list_bytes)
        .tcp_nodelay(true)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, wait_for(stopped.clone()));
    let server = tokio::spawn(server);
    Ok(tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
        hub.close_queue();
        // Streams end on their own once told; do not wait for slow peers.
        let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        let _ = deny_list.await;
        let _ = issued.await;
        let _ = workers.await;
        tracing::info!("gRPC transport stopped");
    }))
}

/// Connections that may wait to be accepted (the kernel caps it at
/// `net.core.somaxconn`, 4096 on current kernels): the handshake rate
/// leaves the rest of a reconnecting fleet there (see [`tls::incoming`]),
/// eight seconds of it at the default rate.
const ACCEPT_QUEUE: u32 = 4096;

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
        let l = &config.limits;
        assert_eq!(l.handshakes.max_in_flight, 128);
        assert_eq!(l.handshakes.timeout, std::time::Duration::from_secs(10));
        assert_eq!(l.max_streams_per_connection, 8);
        assert_eq!(l.max_connection_age, std::time::Duration::from_secs(3600));
        assert_eq!(
            l.max_connection_age_grace,
            std::time::Duration::from_secs(30)
        );
        assert_eq!(l.max_header_list_bytes, 8192);
        assert_eq!(l.control_queue, 256);
        assert_eq!(
            config.deny_list.source(),
            "argocd-pull/argocd-pull-denied-certificates"
        );
        assert!(
            crate::Args::try_parse_from(["hub-controller", "--grpc-control-queue", "0"]).is_err()
        );
        assert!(
            crate::Args::parse_from(["hub-controller"])
                .grpc
                .config(Default::default())
                .is_none()
        );
    }
}
