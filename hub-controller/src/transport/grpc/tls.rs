//! The hub's TLS: mutual TLS is required, the client certificate must chain
//! to the configured CA, and every refused handshake is logged with the
//! cluster the certificate names, so an operator sees which agent has a
//! wrong or expired certificate. The serving certificate, its key and the
//! client CA are read again when they change on disk.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::identity::{IdentityMap, cert_info};
use super::metrics::GrpcMetrics;

/// Where the hub's TLS material is.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the files are looked at for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(10);

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
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
    Ok((Arc::new(config), fingerprint))
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
                let cluster = self.identities.cluster(&subject).unwrap_or_default();
                let reason = match e {
                    rustls::Error::InvalidCertificate(rustls::CertificateError::Expired)
                    | rustls::Error::InvalidCertificate(
                        rustls::CertificateError::ExpiredContext { .. },
                    ) => "certificate-expired",
                    _ => "certificate-invalid",
                };
                self.metrics.refuse(&cluster, reason);
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
    current: Mutex<(TlsAcceptor, Vec<u8>, Instant)>,
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
            current: Mutex::new((TlsAcceptor::from(config), fingerprint, Instant::now())),
        })
    }

    fn acceptor(&self) -> TlsAcceptor {
        let mut current = self.current.lock().expect("never poisoned");
        if current.2.elapsed() >= RELOAD_CHECK {
            current.2 = Instant::now();
            match server_config(&self.files, &self.identities, &self.metrics) {
                Ok((config, fingerprint)) if fingerprint != current.1 => {
                    tracing::info!(cert = %self.files.cert.display(), "TLS files changed on disk; using them for new connections");
                    current.0 = TlsAcceptor::from(config);
                    current.1 = fingerprint;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(error = %e, "TLS files changed but cannot be used; keeping the previous ones")
                }
            }
        }
        current.0.clone()
    }
}

/// Accepts TCP connections and completes their TLS handshakes in parallel,
/// yielding only the streams that finished one; failures are logged (by
/// the verifier when the certificate is the problem).
pub fn incoming(
    listener: TcpListener,
    acceptor: Arc<Acceptor>,
) -> impl futures::Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = match listener.accept().await {
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
            // Latency matters more than a few bytes saved.
            let _ = tcp.set_nodelay(true);
            let tls = acceptor.acceptor();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
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

fn log_handshake_failure(peer: SocketAddr, e: &std::io::Error) {
    tracing::debug!(%peer, error = %e, "TLS handshake failed");
}
