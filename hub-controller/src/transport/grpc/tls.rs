//! The hub's TLS: mutual TLS is required, the client certificate must chain
//! to the configured CA, and every refused handshake is logged with the
//! cluster the certificate names, so an operator sees which agent has a
//! wrong or expired certificate (the metric says `unverified`: a name
//! nobody vouched for never becomes a series). The serving certificate, its
//! key and the client CA are read again when they change on disk, and a
//! certificate is only ever used with its own key. At most
//! `--grpc-max-handshakes` handshakes run at once, at most
//! `--grpc-max-handshake-rate` start per second and at most
//! `--grpc-max-connections` connections are open; a connection beyond
//! any is closed at once and counted. The limits hold for both wires
//! ([`wire`]): TLS on TCP, and TLS inside a WebSocket.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_pull_runtime::client::limit::Bucket;
use prometheus_client::metrics::gauge::Gauge;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::identity::{self, IdentityMap, cert_info};
use super::metrics::{GrpcMetrics, UNVERIFIED};

mod held;
pub mod websocket;
pub mod wire;

pub use held::Held;
pub use wire::WireMetrics;

/// Where the hub's TLS material is.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// How often the files are looked at for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(10);
/// How soon to look again after reading a certificate with another key
/// (the other file of a renewal is about to land).
const MISMATCH_RETRY: Duration = Duration::from_secs(1);

/// Limits of the TLS layer (flags, see docs/security.md).
#[derive(Clone, Copy, Debug)]
pub struct HandshakeLimits {
    /// Handshakes under way at once; more connections are closed at once.
    pub max_in_flight: usize,
    /// Handshakes started per second (and in a burst).
    pub max_rate: u32,
    /// How long a client has to finish its handshake.
    pub timeout: Duration,
    /// Connections open at once (handshaking or past it); more are closed
    /// at once.
    pub max_connections: usize,
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}

/// Builds the server configuration from the files' contents.
fn server_config(
    files: &TlsFiles,
    identities: &IdentityMap,
    metrics: &GrpcMetrics,
) -> anyhow::Result<(Arc<ServerConfig>, Vec<u8>)> {
    let (cert, key, ca) = (
        read(&files.cert)?,
        read(&files.key)?,
        read(&files.client_ca)?,
    );
    let fingerprint = [cert.as_slice(), &key, &ca].concat();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<_, _>>()
        .map_err(|e| anyhow::anyhow!("{}: {e}", files.cert.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|e| anyhow::anyhow!("{}: {e}", files.key.display()))?;
    let not_after = chain.first().and_then(|c| identity::not_after(c));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // A renewal replaces two files: read between the two, the certificate
    // is new and the key old (or the reverse). Never serve such a pair.
    rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), &provider).map_err(
        |e| match e {
            rustls::Error::InconsistentKeys(_) => anyhow::Error::new(KeyMismatch {
                cert: files.cert.clone(),
                key: files.key.clone(),
            }),
            e => anyhow::anyhow!("serving certificate {}: {e}", files.cert.display()),
        },
    )?;
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca) {
        let c = c.map_err(|e| anyhow::anyhow!("{}: {e}", files.client_ca.display()))?;
        roots
            .add(c)
            .map_err(|e| anyhow::anyhow!("{}: {e}", files.client_ca.display()))?;
    }
    if roots.is_empty() {
        anyhow::bail!(
            "{} holds no CA certificate: agents could never connect",
            files.client_ca.display()
        );
    }
    let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| anyhow::anyhow!("client CA {}: {e}", files.client_ca.display()))?;
    let verifier = Arc::new(LoggingVerifier {
        inner,
        identities: identities.clone(),
        metrics: metrics.clone(),
    });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| anyhow::anyhow!("serving certificate {}: {e}", files.cert.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    // The gauge tells of the certificate served, so only of a usable pair.
    metrics.serving_certificate(not_after);
    Ok((Arc::new(config), fingerprint))
}

/// The serving certificate and the key on disk are not a pair.
#[derive(Debug, thiserror::Error)]
#[error(
    "the serving certificate {} does not belong to the key {} (read in the middle of a renewal, or a wrong file)",
    .cert.display(),
    .key.display()
)]
pub struct KeyMismatch {
    cert: PathBuf,
    key: PathBuf,
}

/// Verifies like WebPKI, and says who was refused and why.
struct LoggingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    identities: IdentityMap,
    metrics: GrpcMetrics,
}

impl std::fmt::Debug for LoggingVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoggingVerifier")
            .field("identities", &self.identities)
            .finish()
    }
}

impl ClientCertVerifier for LoggingVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner
            .verify_client_cert(end_entity, intermediates, now)
            .inspect_err(|e| {
                let info = cert_info(end_entity);
                let subject = info.as_ref().map(|i| i.subject.clone()).unwrap_or_default();
                // Only for the log: nothing vouches for this name.
                let cluster = self.identities.cluster(&subject).unwrap_or_default();
                let reason = match e {
                    rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
                    | rustls::Error::InvalidCertificate(
                        rustls::CertificateError::ExpiredContext { .. },
                    ) => "certificate-expired",
                    _ => "certificate-invalid",
                };
                self.metrics.refuse(UNVERIFIED, reason);
                tracing::warn!(%cluster, %subject, error = %e, "refused an agent's client certificate");
            })
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS acceptor that picks up new files.
pub struct Acceptor {
    files: TlsFiles,
    identities: IdentityMap,
    metrics: GrpcMetrics,
    /// The acceptor in use, what its files held, and when to look again.
    current: Mutex<(TlsAcceptor, Vec<u8>, Instant)>,
    reload_check: Duration,
}

impl Acceptor {
    /// Reads the files once; fails start-up when they are unusable.
    pub fn new(
        files: TlsFiles,
        identities: IdentityMap,
        metrics: GrpcMetrics,
    ) -> anyhow::Result<Self> {
        let (config, fingerprint) = server_config(&files, &identities, &metrics)?;
        Ok(Self {
            files,
            identities,
            metrics,
            current: Mutex::new((
                TlsAcceptor::from(config),
                fingerprint,
                Instant::now() + RELOAD_CHECK,
            )),
            reload_check: RELOAD_CHECK,
        })
    }

    /// The acceptor for a new connection, after reading the files again
    /// when they are due. Unusable files, or a certificate with another
    /// key, leave the previous pair in use.
    pub fn acceptor(&self) -> TlsAcceptor {
        let mut current = self.current.lock().expect("never poisoned");
        if Instant::now() >= current.2 {
            current.2 = Instant::now() + self.reload_check;
            match server_config(&self.files, &self.identities, &self.metrics) {
                Ok((config, fingerprint)) if fingerprint != current.1 => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS files changed on disk; using them for new connections");
                    current.0 = TlsAcceptor::from(config);
                    current.1 = fingerprint;
                }
                Ok(_) => {}
                Err(e) if e.is::<KeyMismatch>() => {
                    current.2 = Instant::now() + MISMATCH_RETRY.min(self.reload_check);
                    tracing::warn!(error = %e, "keeping the previous serving certificate and key until both files match");
                }
                Err(e) => {
                    tracing::error!(error = %e, "TLS files changed but cannot be used; keeping the previous ones")
                }
            }
        }
        current.0.clone()
    }

    /// The files are looked at again every `every` (tests).
    pub fn with_reload_check(mut self, every: Duration) -> Self {
        self.reload_check = every;
        self.current.get_mut().expect("never poisoned").2 = Instant::now();
        self
    }
}

/// Accepts TCP connections and completes their TLS handshakes (after the
/// WebSocket upgrade on that wire) in parallel,
/// at most `limits.max_in_flight` at once, yielding only the streams that
/// finished one; failures are logged (by the verifier when the certificate
/// is the problem). A connection beyond that limit is closed at once: it
/// costs one accept and no cryptography, and its client backs off and
/// dials again.
///
/// The rate (`limits.max_rate` a second) paces the accepts instead: beyond
/// it a connection waits in the kernel's accept queue, unanswered and at no
/// cost to the hub, until its turn. A fleet that lost its hub dials again
/// all at once; closing what is over the rate made each agent's backoff
/// grow at every refusal (up to its 30 s cap), and the last agents came
/// back long after the hub could take them.
pub fn incoming(
    listener: TcpListener,
    acceptor: Arc<Acceptor>,
    limits: HandshakeLimits,
    metrics: GrpcMetrics,
    wires: WireMetrics,
) -> impl futures::Stream<Item = Result<Held, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut gate = Gate::new(limits, metrics);
    tokio::spawn(async move {
        loop {
            gate.pace().await;
            let (tcp, peer) = match argocd_pull_runtime::net::accept(&listener).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if tx.is_closed() {
                return;
            }
            let Some(place) = gate.place(peer) else {
                drop(tcp);
                continue;
            };
            let Some(permit) = gate.permit(peer) else {
                drop(tcp);
                continue;
            };
            // Latency matters more than a few bytes saved.
            let _ = tcp.set_nodelay(true);
            let tls = acceptor.acceptor();
            let tx = tx.clone();
            let timeout = limits.timeout;
            let in_flight = gate.metrics.handshakes_in_flight.clone();
            in_flight.inc();
            let wires = wires.clone();
            tokio::spawn(async move {
                let accepted =
                    tokio::time::timeout(timeout, wire::handshake(tcp, tls, &wires)).await;
                in_flight.dec();
                drop(permit);
                match accepted {
                    Ok(Ok(None)) => {}
                    Ok(Ok(Some(stream))) => {
                        let _ = tx.send(Ok(Held::new(stream, place))).await;
                    }
                    Ok(Err(e)) => log_handshake_failure(peer, &e),
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out")
                    }
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// What [`incoming`] lets through: the rate handshakes start at, the
/// connection places and the handshakes under way, each limit logged at
/// most every 10 s while it bites.
struct Gate {
    limits: HandshakeLimits,
    metrics: GrpcMetrics,
    rate: Bucket,
    places: Arc<Semaphore>,
    permits: Arc<Semaphore>,
    last_rate: Option<Instant>,
    last_full: Option<Instant>,
    last_warning: Option<Instant>,
}

impl Gate {
    fn new(limits: HandshakeLimits, metrics: GrpcMetrics) -> Self {
        Self {
            rate: Bucket::new(
                f64::from(limits.max_rate.max(1)),
                limits.max_rate,
                tokio::time::Instant::now(),
            ),
            places: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            permits: Arc::new(Semaphore::new(limits.max_in_flight.max(1))),
            limits,
            metrics,
            last_rate: None,
            last_full: None,
            last_warning: None,
        }
    }

    /// Waits until the rate lets the next connection be accepted.
    async fn pace(&mut self) {
        let wait = self.rate.take(tokio::time::Instant::now());
        if wait.is_zero() {
            return;
        }
        self.metrics.handshakes_paced.inc();
        if due(&mut self.last_rate) {
            tracing::info!(
                max = self.limits.max_rate,
                "more TLS handshakes a second than allowed; new connections wait their turn (--grpc-max-handshake-rate)"
            );
        }
        tokio::time::sleep(wait).await;
    }

    /// A place for the connection from `peer`; None (counted, and logged)
    /// when `--grpc-max-connections` are open.
    fn place(&mut self, peer: SocketAddr) -> Option<Place> {
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            self.metrics.connections_dropped.inc();
            if due(&mut self.last_full) {
                tracing::warn!(%peer, max = self.limits.max_connections, "too many gRPC connections open; closing new ones until some close (--grpc-max-connections)");
            }
            return None;
        };
        Some(Place::new(place, self.metrics.connections_open.clone()))
    }

    /// A permit to handshake with `peer`; None (counted, and logged) when
    /// `--grpc-max-handshakes` are under way.
    fn permit(&mut self, peer: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            self.metrics.handshakes_dropped.inc();
            if due(&mut self.last_warning) {
                tracing::warn!(%peer, max = self.limits.max_in_flight, "too many TLS handshakes under way; closing new connections until some finish (--grpc-max-handshakes)");
            }
            return None;
        };
        Some(permit)
    }
}

/// Whether a warning last given at `last` may be given again (at most
/// every 10 s); if so, now is when it was last given.
fn due(last: &mut Option<Instant>) -> bool {
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
        *last = Some(Instant::now());
        return true;
    }
    false
}

/// One of the `--grpc-max-connections` places, taken until the connection
/// closes.
pub struct Place {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Place {
    fn new(permit: OwnedSemaphorePermit, open: Gauge) -> Self {
        open.inc();
        Self {
            _permit: permit,
            open,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.open.dec();
    }
}

fn log_handshake_failure(peer: SocketAddr, e: &std::io::Error) {
    tracing::debug!(%peer, error = %e, "TLS handshake failed");
}

#[cfg(test)]
mod tests;
