//! The live endpoint's connections: TLS handshakes several at once, each
//! bounded in time ([`HANDSHAKE_TIMEOUT`]), then HTTP/1.1 on at most
//! `--live-max-connections` connections at once (one beyond is closed at
//! once, with a log line), each closed when its client sends no request
//! head within `--live-header-timeout` or holds it idle, no request under
//! way, for `--live-idle-timeout`. The live port is reachable by any pod
//! the network lets in, before any token is checked: so one client (one
//! peer address) holds at most `--live-max-connections-per-client` of the
//! connections and [`clients::HANDSHAKES_PER_CLIENT`] of the handshakes,
//! each for a bounded time, and the others keep theirs.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tower::ServiceExt;

use super::clients::{self, Clients, Full, Slot};
use super::files::Reloaded;

/// How many connections, and for how long each may wait.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub max_connections: usize,
    /// Of those, and of handshakes under way, one client's at most.
    pub max_connections_per_client: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Handshakes under way at once; a connection beyond is closed at once.
const MAX_HANDSHAKES: usize = 64;
/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP connections, each through its TLS handshake, several at once: a
/// client that opens a connection and says nothing holds one handshake
/// for [`HANDSHAKE_TIMEOUT`], not the endpoint.
pub struct Listener {
    ready: tokio::sync::mpsc::Receiver<Accepted>,
    accepting: tokio::task::JoinHandle<()>,
}

/// A connection through its handshake, its peer, and its client's place.
type Accepted = (TlsStream<TcpStream>, SocketAddr, Slot);

impl Listener {
    pub fn new(
        tcp: TcpListener,
        tls: Reloaded<Arc<ServerConfig>>,
        bounds: Bounds,
    ) -> std::io::Result<Self> {
        let clients = Clients::new(bounds.max_connections_per_client);
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
                let (place, handshaking) = match clients.admit(peer.ip()) {
                    Ok(slots) => slots,
                    Err(full) => {
                        let (held, flag) = match full {
                            Full::Connections => (
                                bounds.max_connections_per_client,
                                "--live-max-connections-per-client",
                            ),
                            Full::Handshakes => {
                                (clients::HANDSHAKES_PER_CLIENT, "handshakes under way")
                            }
                        };
                        tracing::warn!(%peer, held, flag, "a client of the live endpoint holds its share: closed a new connection of it");
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
                            drop((slot, handshaking));
                            let _ = done.send((tls, peer, place)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "a live endpoint handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "a live endpoint handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, accepting })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Listener {
    /// The next connection through its handshake.
    async fn accept(&mut self) -> Accepted {
        match self.ready.recv().await {
            Some(c) => c,
            // The accepting task ended (it does not, but for its abort):
            // nothing more comes.
            None => std::future::pending().await,
        }
    }
}

/// Serves `router` on the connections of `listener` within `bounds` until
/// `shutdown`; then lets the requests under way finish.
pub async fn serve(
    mut listener: Listener,
    router: Router,
    bounds: Bounds,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(bounds.max_connections));
    let (stop, stopping) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (tls, peer, place) = tokio::select! {
            c = listener.accept() => c,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::warn!(%peer, max = bounds.max_connections, "the live endpoint has --live-max-connections open: closed a new one");
            continue;
        };
        let router = router.clone();
        tokio::spawn(connection(
            tls,
            peer,
            router,
            bounds,
            stopping.clone(),
            (slot, place),
        ));
    }
    let _ = stop.send(true);
    let _ = slots.acquire_many(bounds.max_connections as u32).await;
}

/// One connection: its requests until the client closes it, it idles past
/// the bounds, or the endpoint stops.
async fn connection(
    tls: TlsStream<TcpStream>,
    peer: SocketAddr,
    router: Router,
    bounds: Bounds,
    mut stopping: watch::Receiver<bool>,
    _places: (OwnedSemaphorePermit, Slot),
) {
    let activity = Arc::new(Activity::new());
    let seen = activity.clone();
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let busy = InFlight::start(seen.clone());
            let router = router.clone();
            async move {
                let response = router.oneshot(request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _busy: busy })))
            }
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_timeout)
        .serve_connection(TokioIo::new(tls), service)
        // A web terminal's exec takes the connection over.
        .with_upgrades();
    tokio::pin!(conn);
    let mut tick = tokio::time::interval(
        bounds
            .idle_timeout
            .min(bounds.header_timeout)
            .min(Duration::from_secs(1)),
    );
    let mut closing = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "a live endpoint connection ended");
                }
                return;
            }
            _ = stopping.changed(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = tick.tick(), if !closing => {
                // Before its first request a connection has the header
                // timeout (hyper's own starts only with a request's first
                // byte); after, the idle timeout.
                let (limit, flag) = if activity.served.load(Ordering::SeqCst) {
                    (bounds.idle_timeout, "--live-idle-timeout")
                } else {
                    (bounds.header_timeout, "--live-header-timeout")
                };
                if activity.idle_for() >= limit {
                    tracing::debug!(%peer, flag, "closed a live endpoint connection with no request under way");
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Whether a connection has a request under way, and since when it has
/// had none.
struct Activity {
    in_flight: AtomicUsize,
    since: Mutex<Instant>,
    /// Whether a request has come.
    served: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
            served: AtomicBool::new(false),
        }
    }

    /// How long the connection has had no request under way (zero while
    /// one is).
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        self.since.lock().expect("not poisoned").elapsed()
    }
}

/// A request under way, until its answer's body is sent or dropped.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        activity.served.store(true, Ordering::SeqCst);
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.since.lock().expect("not poisoned") = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An answer's body that holds its request under way while it is sent.
struct Tracked {
    body: Body,
    _busy: InFlight,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
