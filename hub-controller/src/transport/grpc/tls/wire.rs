//! The two wires of the gRPC port: TLS straight on TCP, or TLS inside a
//! WebSocket (for agents behind HTTP/1.1-only proxies). The first byte
//! tells them apart: a TLS connection starts with a handshake record
//! (`0x16`), a WebSocket with an HTTP request. Either way the same TLS
//! acceptor, client certificate check and gRPC service follow, and the
//! session sees the TCP peer's address.

use std::pin::Pin;
use std::task::{Context, Poll};

use argocd_pull_runtime::websocket::ByteStream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::websocket;

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WireLabel {
    wire: &'static str,
}

/// Connections by wire: those whose TLS handshake completed, and the HTTP
/// requests to the port that got no upgrade.
#[derive(Clone, Debug, Default)]
pub struct WireMetrics {
    connections: Family<WireLabel, Counter>,
    refused: Counter,
}

impl WireMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let r = registry.sub_registry_with_prefix("grpc");
        r.register(
            "wire_connections",
            "Connections whose TLS handshake completed, by wire (grpc: TLS on TCP; websocket: TLS inside a WebSocket)",
            metrics.connections.clone(),
        );
        r.register(
            "http_refused",
            "HTTP requests to the gRPC port answered 400 or 404 (not a WebSocket upgrade to its path)",
            metrics.refused.clone(),
        );
        metrics
    }

    fn connected(&self, wire: &'static str) {
        self.connections.get_or_create(&WireLabel { wire }).inc();
    }
}

/// What the TLS of a connection runs on.
pub enum Wire {
    Tcp(TcpStream),
    WebSocket(Box<ByteStream<TcpStream>>, TcpConnectInfo),
}

impl Wire {
    fn name(&self) -> &'static str {
        match self {
            Wire::Tcp(_) => "grpc",
            Wire::WebSocket(..) => "websocket",
        }
    }
}

/// The TLS handshake on whichever wire `tcp` starts: `None` when it was an
/// HTTP request that got no upgrade (answered, logged and counted) or the
/// peer closed before its first byte.
pub async fn handshake(
    tcp: TcpStream,
    tls: TlsAcceptor,
    metrics: &WireMetrics,
) -> std::io::Result<Option<TlsStream<Wire>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    let wire = if first[0] == TLS_HANDSHAKE {
        Wire::Tcp(tcp)
    } else {
        let info = tcp.connect_info();
        let peer = info.remote_addr;
        match websocket::accept(tcp).await? {
            Ok(ws) => Wire::WebSocket(Box::new(ws), info),
            Err(refusal) => {
                metrics.refused.inc();
                tracing::debug!(
                    ?peer,
                    status = refusal.status,
                    reason = refusal.reason,
                    "answered an HTTP request to the gRPC port without an upgrade"
                );
                return Ok(None);
            }
        }
    };
    let name = wire.name();
    let stream = tls.accept(wire).await?;
    metrics.connected(name);
    Ok(Some(stream))
}

impl Connected for Wire {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        match self {
            Wire::Tcp(tcp) => tcp.connect_info(),
            Wire::WebSocket(_, info) => info.clone(),
        }
    }
}

impl AsyncRead for Wire {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Wire::WebSocket(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Wire {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Wire::WebSocket(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_flush(cx),
            Wire::WebSocket(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Wire::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Wire::WebSocket(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
