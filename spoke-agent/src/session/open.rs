//! Opening a stream to the hub: dial on the wire in use (gRPC, or the
//! WebSocket wire's connector), through the egress proxy when one applies,
//! then this release's Hello and the hub's Welcome, checked.

use std::time::Duration;

use argocd_pull_proto::limits::MAX_MESSAGE_BYTES;
use argocd_pull_proto::v1::transport_client::TransportClient;
use argocd_pull_proto::v1::{
    AgentMessage, AgentMode, Hello, HubMessage, Welcome, agent_message, hub_message,
};
use argocd_pull_proto::version;
use tokio::sync::mpsc;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use super::proxy::ProxyConfig;
use super::wire::{Failure, Route, Wire, classify, websocket_url};
use super::{tunnel, websocket};

/// How long the agent waits for its connection (TCP, TLS, HTTP/2). A hub
/// takes its TLS handshakes at a rate (`--grpc-max-handshake-rate`, 500 a
/// second): when a whole fleet dials at once, a connection waits up to
/// about 8 s in the hub's accept queue before its turn.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the agent waits for the hub's Welcome. A hub welcomes agents
/// only once it has read all of its Applications, which takes a hub with
/// 100,000 of them 20 to 40 s after a start (docs/benchmarks.md): an agent
/// that gave up sooner would go back to the end of the queue of TLS
/// handshakes, and the fleet would spend the hub's start handshaking
/// again and again. The connection's HTTP/2 keepalive still ends a wait on
/// a hub that is gone.
const WELCOME_TIMEOUT: Duration = Duration::from_secs(120);
/// A stream to the hub after a successful handshake.
pub struct Opened {
    /// What the agent sends; the stream ends when it is dropped.
    pub tx: mpsc::Sender<AgentMessage>,
    pub inbound: tonic::Streaming<HubMessage>,
    pub welcome: Welcome,
    pub negotiated: version::Negotiated,
}

/// Dials the hub at `address` with `tls` and does the handshake (this
/// release's Hello, the hub's Welcome, checked). Also used by the fleet
/// load generator of `make bench-grpc`, so that its simulated agents open
/// their streams exactly as an agent does.
pub async fn open(address: &str, tls: ClientTlsConfig, mode: AgentMode) -> Result<Opened, String> {
    open_with(
        address,
        tls,
        version::hello(mode, env!("CARGO_PKG_VERSION")),
    )
    .await
}

/// [`open`] with `hello` (this release's, with the optional capabilities
/// the agent's configuration adds).
pub async fn open_with(
    address: &str,
    tls: ClientTlsConfig,
    hello: Hello,
) -> Result<Opened, String> {
    open_through(address, tls, hello, &ProxyConfig::default()).await
}

/// [`open_with`] through the proxy `proxy` names for the hub, if any: a
/// `CONNECT` tunnel with TLS inside it.
pub async fn open_through(
    address: &str,
    tls: ClientTlsConfig,
    hello: Hello,
    proxy: &ProxyConfig,
) -> Result<Opened, String> {
    let route = Route {
        proxy: proxy.clone(),
        wire: Default::default(),
    };
    open_on(address, tls, hello, &route, Wire::Grpc)
        .await
        .map_err(|e| e.reason)
}

/// Why opening a stream failed: what the agent logs, and what it says
/// about the wire.
#[derive(Debug)]
pub struct OpenError {
    pub reason: String,
    /// `None`: past the dial (the stream or the handshake failed), which
    /// says nothing against the wire.
    pub failure: Option<Failure>,
}

impl From<String> for OpenError {
    fn from(reason: String) -> Self {
        Self {
            reason,
            failure: None,
        }
    }
}

/// [`open_with`] on `wire`, along `route`.
pub async fn open_on(
    address: &str,
    tls: ClientTlsConfig,
    hello: Hello,
    route: &Route,
    wire: Wire,
) -> Result<Opened, OpenError> {
    let endpoint = Endpoint::from_shared(address.to_string())
        .and_then(|e| e.tls_config(tls))
        .map_err(|e| format!("hub address {address}: {e}"))?
        .connect_timeout(Duration::from_secs(10))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    // `connect_timeout` bounds the TCP connect only (through a proxy: the
    // connect and the `CONNECT`); a hub that paces its TLS handshakes
    // leaves the connection in its accept queue meanwhile.
    let channel = match tokio::time::timeout(CONNECT_TIMEOUT, dial(&endpoint, route, wire)).await {
        Err(_) => {
            return Err(OpenError {
                reason: format!(
                    "no TLS handshake with the hub within {}s",
                    CONNECT_TIMEOUT.as_secs()
                ),
                failure: Some(Failure::Unreachable),
            });
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(channel)) => channel,
    };
    let mut client = TransportClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let (tx, rx) = mpsc::channel::<AgentMessage>(128);
    let _ = tx
        .send(AgentMessage {
            kind: Some(agent_message::Kind::Hello(hello.clone())),
        })
        .await;
    let mut inbound = client
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|status| OpenError {
            reason: status_text(&status),
            // A status the hub sent has no source; one from below (the
            // connection, HTTP/2) says what the wire did.
            failure: std::error::Error::source(&status).map(classify),
        })?
        .into_inner();
    let welcome = welcome(&mut inbound).await?;
    let negotiated =
        version::accept_welcome(&hello, &welcome).map_err(|e| OpenError::from(e.to_string()))?;
    Ok(Opened {
        tx,
        inbound,
        welcome,
        negotiated,
    })
}

/// The hub's first message on `inbound`, which must be its Welcome.
async fn welcome(inbound: &mut tonic::Streaming<HubMessage>) -> Result<Welcome, OpenError> {
    match tokio::time::timeout(WELCOME_TIMEOUT, inbound.message()).await {
        Err(_) => Err(format!(
            "no Welcome from the hub within {}s",
            WELCOME_TIMEOUT.as_secs()
        )
        .into()),
        Ok(Err(status)) => Err(status_text(&status).into()),
        Ok(Ok(None)) => Err(String::from("the hub closed the stream during the handshake").into()),
        Ok(Ok(Some(HubMessage {
            kind: Some(hub_message::Kind::Welcome(w)),
        }))) => Ok(w),
        Ok(Ok(Some(_))) => Err(String::from(
            "the hub's first message is not a Welcome: it does not follow the protocol",
        )
        .into()),
    }
}

/// The channel to the hub on `wire`: gRPC dials the hub's address (or
/// tunnels to it), the WebSocket wire its URL (or tunnels to that).
async fn dial(endpoint: &Endpoint, route: &Route, wire: Wire) -> Result<Channel, OpenError> {
    let uri = endpoint.uri();
    let connected = match wire {
        Wire::Grpc => {
            let host = uri.host().unwrap_or_default();
            let port = uri.port_u16().unwrap_or(443);
            match route.proxy.route(host, port).map_err(|e| e.to_string())? {
                Some(proxy_url) => {
                    let tunnel = tunnel::Tunnel {
                        proxy: proxy_url,
                        credentials_file: route.proxy.credentials_file.clone(),
                    };
                    endpoint.connect_with_connector(tunnel).await
                }
                None => endpoint.connect().await,
            }
        }
        Wire::WebSocket => {
            let url = websocket_url(&uri.to_string(), route.wire.url.as_deref())?;
            let tunnel = route
                .proxy
                .route(&url.host, url.port)
                .map_err(|e| e.to_string())?
                .map(|proxy_url| tunnel::Tunnel {
                    proxy: proxy_url,
                    credentials_file: route.proxy.credentials_file.clone(),
                });
            let connector = websocket::Connector {
                url,
                tunnel,
                ca_file: route.wire.ca_file.clone(),
            };
            endpoint.connect_with_connector(connector).await
        }
    };
    connected.map_err(|e| OpenError {
        reason: error_chain(&e),
        failure: Some(classify(&e)),
    })
}

/// A status as an operator reads it.
pub(super) fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Connection errors hide the useful part (a TLS alert) in their sources.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        // Some layers repeat their source's words in their own.
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
