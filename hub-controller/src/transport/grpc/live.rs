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
//! (401 otherwise); only a path the agent takes
//! ([`check_live_path`], 414 or 400 otherwise: a read the agent refused
//! would have ended the stream every delivery of the cluster shares), and
//! only reads of single objects, one object's events by its uid, one pod's
//! log and discovery ([`argocd_pull_core::live::parse`], 403 or 405
//! otherwise), before anything reaches a cluster. Reads are shared per
//! namespace of a cluster, followed logs apart, and a follow ends after
//! `--live-follow-timeout` (`live/stream.rs`); connections are bounded and
//! closed when idle (`live/conn.rs`). A read of a cluster whose
//! agent is connected to another replica goes there (`live/forward.rs`). A
//! cluster with no agent connected to any replica, or one that does not
//! serve live views, is answered 501 with what to do; every answer that is
//! not the cluster's is a Kubernetes `Status`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use argocd_pull_core::live::{self, Refusal};
use argocd_pull_proto::limits::check_live_path;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;

use super::cluster::live::{ShareLimits, Unavailable};
use super::hub::Hub;
use files::{Reloaded, load_tls, load_tokens};

mod args;
mod clients;
mod conn;
mod discovery;
mod files;
mod forward;
mod stream;
mod terminal;

pub use args::{LiveArgs, LiveBounds, LiveEndpoint};

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
    shares: ShareLimits,
    follow_timeout: Duration,
    /// Capability `terminal`: its sessions' bounds and audit.
    terminal: terminal::Bounds,
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
    let endpoint_client = hub.client.clone();
    let endpoint = Endpoint {
        hub,
        tokens,
        timeout: args.live_timeout,
        discovery: Arc::default(),
        peers,
        shares: args.bounds.shares(),
        follow_timeout: args.bounds.live_follow_timeout,
        terminal: args.bounds.terminal(endpoint_client),
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
    let bounds = args.bounds.connections();
    let listener = conn::Listener::new(tcp, tls, bounds)?;
    Ok(tokio::spawn(conn::serve(
        listener, router, bounds, shutdown,
    )))
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
    let path = format!("/{rest}");
    let (by, response) = if live::exec::exec_path(&path).is_some() {
        terminal::serve(&endpoint, &cluster, &path, request).await
    } else {
        read(&endpoint, &cluster, &rest, request).await
    };
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
    let (path, read) = match checked(cluster, method.as_str(), rest, uri.query()) {
        Ok(checked) => checked,
        Err(r) => return refused(&r),
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
    let share = read.share();
    let (id, mut chunks, credits) = match cs.live_read(&path, &share, &endpoint.shares) {
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
        let deadline = share
            .follow
            .then(|| tokio::time::Instant::now() + endpoint.follow_timeout);
        stream::body(cs, id, first, chunks, credits, deadline)
    };
    ("cluster", answer(code, &content_type, body))
}

/// The path (and query) of a read as the agent receives it, and what it
/// asks for; or why it is refused, logged. What the agent takes is
/// checked here: a read it would refuse never goes on the stream the
/// cluster's deliveries share.
fn checked(
    cluster: &str,
    method: &str,
    rest: &str,
    query: Option<&str>,
) -> Result<(String, live::Read), Refusal> {
    let mut path = format!("/{rest}");
    if let Some(q) = query {
        path.push('?');
        path.push_str(q);
    }
    if let Err(e) = check_live_path(&path) {
        let shown: String = path.chars().take(120).collect();
        tracing::warn!(%cluster, %method, length = path.len(), path = %shown, code = e.http_status(), reason = %e, "refused a live read");
        return Err(Refusal::new(e.http_status(), e.to_string()));
    }
    match live::parse(method, &path) {
        Ok(read) => Ok((path, read)),
        Err(r) => {
            tracing::info!(%cluster, %method, %path, reason = %r.message, "refused a live read");
            Err(r)
        }
    }
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
        Unavailable::Busy { share, limit } => {
            let flag = if share.follow {
                "--live-follows-per-namespace"
            } else {
                "--live-reads-per-namespace"
            };
            tracing::warn!(%cluster, %share, limit, flag, "refused a live read: its share of the cluster's live reads is taken");
            Refusal::new(
                429,
                format!(
                    "{limit} {share} of cluster {cluster} are under way, as many as one share takes (the hub-controller's {flag}): close one (a LOGS tab) or wait for one to end, or raise {flag}; other namespaces and other reads are not held back"
                ),
            )
        }
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
