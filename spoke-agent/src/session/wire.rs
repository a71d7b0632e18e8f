//! Which wire the agent dials the hub on, the decisions without the
//! sockets: gRPC (TLS on TCP) or WebSocket (the same TLS inside a
//! WebSocket, for HTTP/1.1-only proxies), the WebSocket URL, and with
//! `--transport auto` when to change wires. `session::websocket` does the
//! dialling.

use std::error::Error;
use std::path::PathBuf;

use argocd_pull_runtime::websocket::PATH;

use super::proxy::{ProxyConfig, ProxyError};

/// `--transport`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// gRPC first; the WebSocket once HTTP/2 is refused on the way.
    #[default]
    Auto,
    Grpc,
    Websocket,
}

/// The wire a dial uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    Grpc,
    WebSocket,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::Grpc => "grpc",
            Wire::WebSocket => "websocket",
        }
    }

    fn other(self) -> Wire {
        match self {
            Wire::Grpc => Wire::WebSocket,
            Wire::WebSocket => Wire::Grpc,
        }
    }

    /// The wire of the first dial.
    pub fn first(transport: Transport) -> Wire {
        match transport {
            Transport::Websocket => Wire::WebSocket,
            Transport::Auto | Transport::Grpc => Wire::Grpc,
        }
    }
}

/// `--transport`, `--websocket-url` and `--websocket-ca-file`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireConfig {
    pub transport: Transport,
    /// As given; unset, derived from the hub's address.
    pub url: Option<String>,
    /// The CA of whatever terminates a `wss://` URL's TLS; unset, the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
}

/// How the agent reaches the hub: through which proxy, on which wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Route {
    pub proxy: ProxyConfig,
    pub wire: WireConfig,
}

/// Where the WebSocket wire is dialled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WsUrl {
    /// `wss://`: TLS to whatever terminates it, then the WebSocket.
    pub secure: bool,
    pub host: String,
    pub port: u16,
    /// The URL as the handshake asks for it.
    pub text: String,
}

/// The WebSocket URL: `flag` when given (`ws://` or `wss://`, the path as
/// given or [`PATH`] when it has none), else `ws://<host:port of
/// hub_address>` and [`PATH`].
pub fn websocket_url(hub_address: &str, flag: Option<&str>) -> Result<WsUrl, String> {
    let given = flag.map(str::trim).filter(|f| !f.is_empty());
    let text = match given {
        Some(f) => f.to_string(),
        None => {
            let uri: http::Uri = hub_address
                .parse()
                .map_err(|e| format!("hub address {hub_address}: {e}"))?;
            let authority = uri
                .authority()
                .ok_or_else(|| format!("hub address {hub_address} names no host"))?;
            let port = authority.port_u16().unwrap_or(443);
            format!("ws://{}:{port}{PATH}", authority.host())
        }
    };
    let uri: http::Uri = text
        .parse()
        .map_err(|e| format!("--websocket-url {text}: {e}"))?;
    let secure = match uri.scheme_str() {
        Some("ws") => false,
        Some("wss") => true,
        _ => {
            return Err(format!(
                "--websocket-url {text}: only ws:// and wss:// are supported"
            ));
        }
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("--websocket-url {text} names no host"))?;
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let path = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("/") | Some("") => PATH,
        Some(p) => p,
    };
    let scheme = if secure { "wss" } else { "ws" };
    Ok(WsUrl {
        secure,
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string(),
        port,
        text: format!("{scheme}://{}:{port}{path}", uri.host().unwrap_or(host)),
    })
}

/// How a dial failed, as far as the choice of wire goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Nothing answered (refused, unreachable, timed out), or the egress
    /// proxy refused `CONNECT`: another wire would not help.
    Unreachable,
    /// Something answered but did not speak this wire: HTTP/1.1 where TLS
    /// or HTTP/2 was expected, or a refused WebSocket upgrade.
    Protocol,
    /// The hub answered on this wire and refused (a TLS alert, a
    /// certificate, a gRPC status): the wire works.
    Refused,
}

/// The wire of the next dial after one on `current` that failed with
/// `failure` (`None`: it worked). Only `auto` changes wires, and only when
/// the one in use is not spoken on the way.
pub fn next_wire(transport: Transport, current: Wire, failure: Option<Failure>) -> Wire {
    match (transport, failure) {
        (Transport::Grpc, _) => Wire::Grpc,
        (Transport::Websocket, _) => Wire::WebSocket,
        (Transport::Auto, Some(Failure::Protocol)) => current.other(),
        (Transport::Auto, _) => current,
    }
}

/// What the error chain of a failed connect says about the wire.
pub fn classify(e: &(dyn Error + 'static)) -> Failure {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(ProxyError::Unreachable { .. } | ProxyError::Refused { .. }) =
            err.downcast_ref::<ProxyError>()
        {
            return Failure::Unreachable;
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | HostUnreachable
                    | NetworkUnreachable
                    | TimedOut
                    | AddrNotAvailable
            ) {
                return Failure::Unreachable;
            }
            if let Some(inner) = io.get_ref() {
                let f = classify(inner);
                if f != Failure::Protocol {
                    return f;
                }
            }
        }
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return match tls {
                rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                    Failure::Protocol
                }
                _ => Failure::Refused,
            };
        }
        next = err.source();
    }
    Failure::Protocol
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_derived_from_the_hub_address_or_taken_as_given() {
        let u = websocket_url("https://hub.example.com:8443", None).unwrap();
        assert_eq!(u.text, "ws://hub.example.com:8443/argocd-pull/v1/ws");
        assert!(!u.secure);
        assert_eq!((u.host.as_str(), u.port), ("hub.example.com", 8443));
        let u = websocket_url("https://hub", Some("wss://ingress.example.com")).unwrap();
        assert_eq!(u.text, "wss://ingress.example.com:443/argocd-pull/v1/ws");
        assert!(u.secure);
        let u = websocket_url("https://hub", Some("ws://10.0.0.1:80/hub/ws")).unwrap();
        assert_eq!(u.text, "ws://10.0.0.1:80/hub/ws");
        let u = websocket_url("https://[::1]:9443", None).unwrap();
        assert_eq!(u.text, "ws://[::1]:9443/argocd-pull/v1/ws");
        assert_eq!(u.host, "::1");
        let e = websocket_url("https://hub", Some("https://hub:443/ws")).unwrap_err();
        assert!(e.contains("only ws:// and wss://"), "{e}");
    }

    #[test]
    fn only_auto_changes_wires_and_only_when_the_wire_is_not_spoken() {
        use Failure::*;
        use Transport::*;
        assert_eq!(Wire::first(Auto), Wire::Grpc);
        assert_eq!(Wire::first(Websocket), Wire::WebSocket);
        assert_eq!(next_wire(Auto, Wire::Grpc, Some(Protocol)), Wire::WebSocket);
        assert_eq!(next_wire(Auto, Wire::WebSocket, Some(Protocol)), Wire::Grpc);
        assert_eq!(next_wire(Auto, Wire::Grpc, Some(Unreachable)), Wire::Grpc);
        assert_eq!(
            next_wire(Auto, Wire::WebSocket, Some(Refused)),
            Wire::WebSocket
        );
        assert_eq!(next_wire(Auto, Wire::WebSocket, None), Wire::WebSocket);
        assert_eq!(next_wire(Grpc, Wire::Grpc, Some(Protocol)), Wire::Grpc);
        assert_eq!(
            next_wire(Websocket, Wire::WebSocket, Some(Protocol)),
            Wire::WebSocket
        );
    }

    #[test]
    fn a_refused_connection_is_unreachable_an_alert_refused_and_plain_http_protocol() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(classify(&refused), Failure::Unreachable);
        let alert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
        );
        assert_eq!(classify(&alert), Failure::Refused);
        let http = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
        );
        assert_eq!(classify(&http), Failure::Protocol);
        let closed = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(classify(&closed), Failure::Protocol);
    }
}
