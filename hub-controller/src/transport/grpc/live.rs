//! Capability `live-views`, the hub's live endpoint: an HTTPS server in
//! the shape of the Kubernetes API, one path prefix per cluster
//! (`/clusters/<cluster>/...`), that the hub's argocd-server reaches through
//! the cluster Secrets argocd-pull writes (`server:
//! <--live-url>/clusters/<cluster>`, with a bearer token and the CA). Each
//! read goes to the cluster's agent over its stream (`LiveRequest`) and its
//! answer comes back in chunks (`LiveResponse`); the agent checks that the
//! object belongs to an Application it applied.
//!
//! Only a caller with one of the tokens of `--live-token-file` is served
//! (401 otherwise); only reads of single objects, one object's events, one
//! pod's log and discovery ([`argocd_pull_core::live::parse`], 403 or 405
//! otherwise, before anything reaches a cluster). A read of a cluster whose
//! agent is connected to another replica goes there (`live/forward.rs`). A
//! cluster with no agent connected to any replica, or one that does not
//! serve live views, is answered 501 with what to do; every answer that is
//! not the cluster's is a Kubernetes `Status`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use argocd_pull_core::live::{self, Refusal};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::Hub;
use super::cluster::live::{CREDIT_BATCH, MAX_LIVE_READS, Unavailable};

mod discovery;
mod forward;

/// Flags of the live endpoint (docs/configuration.md, docs/ui.md).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct LiveArgs {
    /// Serve the hub's argocd-server its live views of clusters connected
    /// over gRPC (a resource's live manifest, its events, its pods' logs)
    /// on this address, over HTTPS with the gRPC serving certificate.
    /// Needs `--live-url` and `--live-token-file`.
    #[arg(long = "live-addr", env = "ARGOCD_PULL_LIVE_ADDR")]
    pub live_addr: Option<SocketAddr>,
    /// The URL argocd-server reaches the live endpoint at (such as
    /// `https://argocd-pull-live.argocd-pull.svc:8444`): every cluster
    /// Secret's `server` becomes `<url>/clusters/<cluster>`.
    #[arg(long = "live-url", env = "ARGOCD_PULL_LIVE_URL")]
    pub live_url: Option<String>,
    /// A file of tokens, one per line: a caller presenting any of them is
    /// served; the first is written into the cluster Secrets. To rotate,
    /// put the new one first and remove the old one once the Secrets carry
    /// the new one.
    #[arg(long = "live-token-file", env = "ARGOCD_PULL_LIVE_TOKEN_FILE")]
    pub live_token_file: Option<PathBuf>,
    /// The CA (PEM) of the serving certificate, written into the cluster
    /// Secrets for argocd-server to trust; unset, the gRPC server's client
    /// CA file is not it, so it must be given.
    #[arg(long = "live-ca-file", env = "ARGOCD_PULL_LIVE_CA_FILE")]
    pub live_ca_file: Option<PathBuf>,
    /// How long a read may wait for the first chunk of the cluster's
    /// answer.
    #[arg(long = "live-timeout", env = "ARGOCD_PULL_LIVE_TIMEOUT", default_value = "30s", value_parser = argocd_pull_runtime::parse_duration)]
    pub live_timeout: Duration,
    /// With several replicas: where the other replicas reach this one's
    /// live endpoint: the pod's IP (v4 or v6; the port of `--live-addr` is
    /// added), or `host:port`, or `[v6]:port`. A read that reaches a
    /// replica the cluster's agent is not connected to is forwarded to the
    /// one it is; unset, such a read is answered 501.
    #[arg(long = "live-peer-addr", env = "ARGOCD_PULL_LIVE_PEER_ADDR")]
    pub live_peer_addr: Option<String>,
}

impl LiveArgs {
    /// Where the other replicas connect to reach this one's endpoint, as
    /// `host:port` with an IPv6 host in brackets (what a peer dials and
    /// sends as `Host`); `None` when the endpoint is off or the flag unset.
    /// A bare IP takes the port of `--live-addr`: `$(POD_IP):8444` is
    /// ambiguous when the pod's IP is IPv6 (`fd00::5:8444` is itself an
    /// address), so the chart gives the IP alone.
    pub fn peer_address(&self) -> anyhow::Result<Option<String>> {
        let (Some(given), Some(listen)) = (&self.live_peer_addr, self.live_addr) else {
            return Ok(None);
        };
        if let Ok(ip) = given.parse::<std::net::IpAddr>() {
            return Ok(Some(SocketAddr::new(ip, listen.port()).to_string()));
        }
        if let Ok(address) = given.parse::<SocketAddr>() {
            return Ok(Some(address.to_string()));
        }
        match given.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty()
                    && !host.contains([':', '[', ']'])
                    && port.parse::<u16>().is_ok() =>
            {
                Ok(Some(given.clone()))
            }
            _ => Err(anyhow::anyhow!(
                "--live-peer-addr {given:?}: give the pod's IP (the port of --live-addr is added), host:port, or [IPv6]:port"
            )),
        }
    }

    /// Whether the endpoint is on, or what is missing.
    pub fn enabled(&self) -> anyhow::Result<bool> {
        match (
            &self.live_addr,
            &self.live_url,
            &self.live_token_file,
            &self.live_ca_file,
        ) {
            (None, None, None, None) => Ok(false),
            (Some(_), Some(_), Some(_), Some(_)) => Ok(true),
            _ => Err(anyhow::anyhow!(
                "the live endpoint needs all of --live-addr, --live-url, --live-token-file and --live-ca-file"
            )),
        }
    }
}

pub use argocd_pull_core::render::cluster_secret::LiveEndpoint;

impl LiveArgs {
    /// The token and CA as they are now in their files.
    pub fn endpoint(&self) -> anyhow::Result<Option<LiveEndpoint>> {
        if !self.enabled()? {
            return Ok(None);
        }
        let file = self.live_token_file.as_ref().expect("enabled");
        let token = tokens(file)?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("{} holds no token", file.display()))?;
        let ca = self.live_ca_file.as_ref().expect("enabled");
        let ca_pem = std::fs::read_to_string(ca)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", ca.display()))?;
        Ok(Some(LiveEndpoint {
            url: self
                .live_url
                .clone()
                .expect("enabled")
                .trim_end_matches('/')
                .to_string(),
            token,
            ca_pem,
        }))
    }
}

/// The tokens of `file`, one per line, blank lines skipped.
fn tokens(file: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// What the endpoint serves with.
#[derive(Clone)]
struct Endpoint {
    hub: Arc<Hub>,
    tokens: Arc<Reloaded<Vec<String>>>,
    timeout: Duration,
    /// The clusters' discovery answers, kept for [`discovery::TTL`].
    discovery: Arc<discovery::Cache>,
    /// The other replicas, with several.
    peers: Option<Arc<forward::Peers>>,
}

/// The modification times of a [`Reloaded`]'s files.
type Stamps = Vec<Option<SystemTime>>;

/// A value read from files, read again when one of them changes.
struct Reloaded<T> {
    files: Vec<PathBuf>,
    load: fn(&[PathBuf]) -> anyhow::Result<T>,
    last: Mutex<Option<(Stamps, Arc<T>)>>,
}

impl<T> Reloaded<T> {
    fn new(files: Vec<PathBuf>, load: fn(&[PathBuf]) -> anyhow::Result<T>) -> Self {
        Self {
            files,
            load,
            last: Mutex::new(None),
        }
    }

    /// The value, read again if a file's modification time changed; the
    /// last good one while the files cannot be read.
    fn get(&self) -> anyhow::Result<Arc<T>> {
        let stamps: Stamps = self
            .files
            .iter()
            .map(|f| std::fs::metadata(f).and_then(|m| m.modified()).ok())
            .collect();
        let mut last = self.last.lock().expect("not poisoned");
        if let Some((seen, value)) = &*last
            && *seen == stamps
        {
            return Ok(value.clone());
        }
        match (self.load)(&self.files) {
            Ok(value) => {
                let value = Arc::new(value);
                *last = Some((stamps, value.clone()));
                Ok(value)
            }
            Err(e) => match &*last {
                Some((_, value)) => {
                    tracing::warn!(error = %e, "keeping the live endpoint's last good files");
                    Ok(value.clone())
                }
                None => Err(e),
            },
        }
    }
}

fn load_tokens(files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    tokens(&files[0])
}

fn load_tls(files: &[PathBuf]) -> anyhow::Result<Arc<ServerConfig>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files[0])
        .and_then(|i| i.collect())
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[0].display()))?;
    let key = PrivateKeyDer::from_pem_file(&files[1])
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", files[1].display()))?;
    let mut config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Serves the live endpoint on `addr` until `shutdown`, with the serving
/// certificate and key of `cert` and `key`.
pub async fn serve(
    hub: Arc<Hub>,
    args: &LiveArgs,
    cert: PathBuf,
    key: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let addr = args.live_addr.expect("enabled");
    let tls = Reloaded::new(vec![cert, key], load_tls);
    tls.get()?;
    let tokens = Arc::new(Reloaded::new(
        vec![args.live_token_file.clone().expect("enabled")],
        load_tokens,
    ));
    tokens.get()?;
    let tcp = argocd_pull_runtime::net::listen(addr, 1024)
        .map_err(|e| anyhow::anyhow!("cannot listen on the live address {addr}: {e}"))?;
    tracing::info!(addr = %tcp.local_addr()?, "live endpoint listening");
    let peers = match hub.claims() {
        Some(claims) => Some(Arc::new(forward::Peers::new(
            claims.identity(),
            args.live_url.as_deref().expect("enabled"),
            args.live_ca_file.clone().expect("enabled"),
        )?)),
        None => None,
    };
    let endpoint = Endpoint {
        hub,
        tokens,
        timeout: args.live_timeout,
        discovery: Arc::default(),
        peers,
    };
    let router = Router::new()
        .route("/clusters/{cluster}/{*rest}", any(handle))
        .fallback(|| async {
            refusal(&Refusal::new(
                404,
                "the live endpoint serves /clusters/<cluster>/<a path of the Kubernetes API>",
            ))
        })
        .with_state(endpoint);
    let listener = Listener::new(tcp, tls)?;
    Ok(tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(error = %e, "the live endpoint stopped");
        }
    }))
}

/// Handshakes under way at once; a connection beyond is closed at once.
const MAX_HANDSHAKES: usize = 64;
/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP connections, each through its TLS handshake, several at once: a
/// client that opens a connection and says nothing holds one handshake
/// for [`HANDSHAKE_TIMEOUT`], not the endpoint.
struct Listener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Listener {
    fn new(tcp: TcpListener, tls: Reloaded<Arc<ServerConfig>>) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (done, ready) = tokio::sync::mpsc::channel(MAX_HANDSHAKES);
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
        let accepting = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match argocd_pull_runtime::net::accept(&tcp).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "the live endpoint cannot accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "{MAX_HANDSHAKES} live endpoint handshakes under way: closed a connection");
                    continue;
                };
                let config = match tls.get() {
                    Ok(c) => c.as_ref().clone(),
                    Err(e) => {
                        tracing::error!(error = %e, "the live endpoint has no serving certificate");
                        continue;
                    }
                };
                let done = done.clone();
                tokio::spawn(async move {
                    let handshake = TlsAcceptor::from(config).accept(tcp);
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(tls)) => {
                            drop(slot);
                            let _ = done.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "a live endpoint handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "a live endpoint handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for Listener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (it does not, but for its abort):
            // nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// A refusal as the Kubernetes API would answer it.
fn refusal(r: &Refusal) -> Response {
    let code = StatusCode::from_u16(r.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        r.status_json(),
    )
        .into_response()
}

async fn handle(
    State(endpoint): State<Endpoint>,
    axum::extract::Path((cluster, rest)): axum::extract::Path<(String, String)>,
    request: Request,
) -> Response {
    let (by, response) = read(&endpoint, &cluster, &rest, request).await;
    endpoint.hub.metrics.live_read(by);
    response
}

/// The answer to one read, and who gave it (the `answer` label of
/// `argocd_pull_hub_grpc_live_reads_total`): `cluster` (its agent, whatever
/// it said), `cache` (discovery kept here), `forwarded` (the replica the
/// agent is connected to, whatever it said), `refused` (by the endpoint,
/// before any cluster: a token, a path, no agent, too many reads) or
/// `failed` (the agent or its replica went or did not answer in time).
async fn read(
    endpoint: &Endpoint,
    cluster: &str,
    rest: &str,
    request: Request,
) -> (&'static str, Response) {
    let refused = |r: &Refusal| ("refused", refusal(r));
    let (head, _) = request.into_parts();
    let (uri, headers, method) = (head.uri, head.headers, head.method);
    if let Err(r) = authorized(endpoint, &headers) {
        return refused(&r);
    }
    let mut path = format!("/{rest}");
    if let Some(q) = uri.query() {
        path.push('?');
        path.push_str(q);
    }
    let read = match live::parse(method.as_str(), &path) {
        Ok(read) => read,
        Err(r) => {
            tracing::info!(%cluster, %method, %path, reason = %r.message, "refused a live read");
            return refused(&r);
        }
    };
    let Some(cs) = endpoint.hub.find_cluster(cluster) else {
        return elsewhere(endpoint, cluster, &uri, &headers).await;
    };
    let discovery = matches!(read, live::Read::Discovery(_));
    if discovery
        && let Some(kept) = endpoint
            .discovery
            .get(cluster, &path, std::time::Instant::now())
    {
        let body = Body::from(kept.body);
        return ("cache", answer(StatusCode::OK, &kept.content_type, body));
    }
    let (id, mut chunks, credits) = match cs.live_read(&path) {
        Ok(read) => read,
        Err(Unavailable::NoAgent) => return elsewhere(endpoint, cluster, &uri, &headers).await,
        Err(why) => return refused(&unavailable(cluster, why)),
    };
    let first = match tokio::time::timeout(endpoint.timeout, chunks.recv()).await {
        Ok(Some(chunk)) => chunk,
        Ok(None) => {
            return (
                "failed",
                refusal(&Refusal::new(
                    503,
                    format!("the agent of cluster {cluster} disconnected before it answered"),
                )),
            );
        }
        Err(_) => {
            cs.live_cancel(id);
            return (
                "failed",
                refusal(&Refusal::new(
                    504,
                    format!(
                        "the agent of cluster {cluster} did not answer within {:?}",
                        endpoint.timeout
                    ),
                )),
            );
        }
    };
    let code = StatusCode::from_u16(first.http_status as u16).unwrap_or(StatusCode::BAD_GATEWAY);
    let content_type = first.content_type.clone();
    let body = if first.last {
        if discovery && code == StatusCode::OK {
            let kept = discovery::Answer {
                content_type: content_type.clone(),
                body: first.body.clone(),
            };
            let now = std::time::Instant::now();
            endpoint.discovery.put(cluster, &path, kept, now);
        }
        Body::from(first.body)
    } else {
        // Dropped when the reader goes away: the agent is told to stop.
        let mut guard = Cancel {
            cs,
            id,
            done: false,
            credits,
            taken: 0,
        };
        guard.took_one();
        let head = futures::stream::once(async move { Ok::<_, std::io::Error>(first.body) });
        let rest = futures::stream::unfold((chunks, guard), |(mut chunks, mut guard)| async move {
            if guard.done {
                return None;
            }
            let chunk = chunks.recv().await?;
            guard.done = chunk.last;
            guard.took_one();
            Some((Ok(chunk.body), (chunks, guard)))
        });
        Body::from_stream(futures::StreamExt::chain(head, rest))
    };
    ("cluster", answer(code, &content_type, body))
}

/// A read of `cluster`, whose agent is not connected here: forwarded to
/// the replica it is connected to, if another replica holds its claim and
/// the read was not forwarded already.
async fn elsewhere(
    endpoint: &Endpoint,
    cluster: &str,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
) -> (&'static str, Response) {
    let refused = |r: &Refusal| ("refused", refusal(r));
    if let Some(by) = headers.get(forward::FORWARDED_BY) {
        // The replica that sent it believed the agent was here: it just
        // moved (or is moving) between replicas.
        let by = String::from_utf8_lossy(by.as_bytes());
        tracing::info!(%cluster, forwarded_by = %by, "a forwarded live read found no agent here");
        return refused(&Refusal::new(
            503,
            format!(
                "the agent of cluster {cluster} is moving between hub-controller replicas; try again"
            ),
        ));
    }
    let peer = endpoint
        .peers
        .as_ref()
        .zip(endpoint.hub.claims().and_then(|c| c.live_peer(cluster)));
    let Some((peers, (holder, address))) = peer else {
        return refused(&unavailable(cluster, Unavailable::NoAgent));
    };
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    match peers
        .forward(&address, path, headers, endpoint.timeout)
        .await
    {
        Ok(response) => ("forwarded", response),
        Err(e) => {
            tracing::warn!(%cluster, replica = %holder, %address, error = %e, "cannot forward a live read to the replica the agent is connected to");
            let code = forward::status(&e).as_u16();
            (
                "failed",
                refusal(&Refusal::new(
                    code,
                    format!(
                        "the agent of cluster {cluster} is connected to hub-controller replica {holder}, which did not answer at {address}: {e}"
                    ),
                )),
            )
        }
    }
}

/// A response of `code` with `body` of `content_type` (JSON when that is
/// not a valid header value).
fn answer(code: StatusCode, content_type: &str, body: Body) -> Response {
    let content_type =
        HeaderValue::from_str(content_type).unwrap_or(HeaderValue::from_static("application/json"));
    let mut response = Response::new(body);
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, content_type);
    response
}

/// Tells the agent to stop when the reader goes away before the answer's
/// last chunk; with `live-credits`, grants back what the reader took.
struct Cancel {
    cs: Arc<super::cluster::ClusterState>,
    id: u64,
    done: bool,
    credits: bool,
    /// Chunks taken and not granted back yet.
    taken: usize,
}

impl Cancel {
    /// The reader took a chunk off the channel: room for one more.
    fn took_one(&mut self) {
        if !self.credits || self.done {
            return;
        }
        self.taken += 1;
        if self.taken >= CREDIT_BATCH {
            self.cs.live_credit(self.id, self.taken);
            self.taken = 0;
        }
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if !self.done {
            self.cs.live_cancel(self.id);
        }
    }
}

/// Whether the request carries one of the tokens (compared in constant
/// time).
fn authorized(endpoint: &Endpoint, headers: &axum::http::HeaderMap) -> Result<(), Refusal> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    let tokens = endpoint.tokens.get().map_err(|e| {
        tracing::error!(error = %e, "the live endpoint cannot read its tokens");
        Refusal::new(503, "the live endpoint cannot read its tokens")
    })?;
    let mut ok = false;
    for t in tokens.iter() {
        ok |= constant_time_eq(t.as_bytes(), presented.as_bytes());
    }
    if ok && !presented.is_empty() {
        Ok(())
    } else {
        Err(Refusal::new(
            401,
            "the live endpoint serves only the hub's Argo CD, with the token argocd-pull writes into its cluster Secrets",
        ))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a cluster's live views cannot be served, in words for the UI.
fn unavailable(cluster: &str, why: Unavailable) -> Refusal {
    match why {
        Unavailable::NoAgent => Refusal::new(
            501,
            format!(
                "live views of cluster {cluster} need the gRPC transport: no argocd-pull agent of {cluster} is connected to the hub-controller (a cluster served in ManifestWorks shows its tree and status only; with several replicas, each needs --live-peer-addr)"
            ),
        ),
        Unavailable::NotOffered(version) => Refusal::new(
            501,
            format!(
                "cluster {cluster} runs argocd-pull-agent {version}, which does not serve live views: upgrade it and start it with --live-views"
            ),
        ),
        Unavailable::Busy => Refusal::new(
            429,
            format!("{MAX_LIVE_READS} live reads of cluster {cluster} are under way; try again"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn the_endpoint_is_all_or_nothing() {
        assert!(!LiveArgs::default().enabled().unwrap());
        let half = LiveArgs {
            live_addr: Some("127.0.0.1:1".parse().unwrap()),
            ..Default::default()
        };
        assert!(half.enabled().is_err());
        // Its flags among every other of the hub-controller.
        <crate::Args as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn a_peer_address_is_one_a_peer_can_dial_for_ipv4_and_ipv6_pods() {
        let with = |given: &str| {
            LiveArgs {
                live_addr: Some("0.0.0.0:8444".parse().unwrap()),
                live_peer_addr: Some(given.into()),
                ..Default::default()
            }
            .peer_address()
        };
        // The pod's IP alone (what the chart gives): the live port added,
        // an IPv6 address in brackets.
        assert_eq!(with("10.1.2.3").unwrap().as_deref(), Some("10.1.2.3:8444"));
        assert_eq!(with("fd00::5").unwrap().as_deref(), Some("[fd00::5]:8444"));
        assert_eq!(
            with("fd00::5:8444").unwrap().as_deref(),
            Some("[fd00::5:8444]:8444")
        );
        // An address with its port, as given.
        assert_eq!(
            with("10.1.2.3:9000").unwrap().as_deref(),
            Some("10.1.2.3:9000")
        );
        assert_eq!(
            with("[fd00::5]:9000").unwrap().as_deref(),
            Some("[fd00::5]:9000")
        );
        assert_eq!(
            with("hub-1.argocd-pull-peers:8444").unwrap().as_deref(),
            Some("hub-1.argocd-pull-peers:8444")
        );
        // Nothing a peer could dial: a clear error at start.
        for bad in ["hub-1", "hub-1:port", ":8444", "[fd00::5", "fd00::5]:1"] {
            let e = with(bad).expect_err(bad).to_string();
            assert!(e.contains("--live-peer-addr"), "{e}");
        }
        // Off, or not given: nothing on the Lease.
        assert_eq!(LiveArgs::default().peer_address().unwrap(), None);
    }
}
