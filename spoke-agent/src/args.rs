//! Groups of the agent's command line.

use std::path::PathBuf;

use crate::session;

/// The way to the hub: an egress proxy and the wire the agent speaks on it.
#[derive(clap::Args, Clone, Debug)]
pub struct RouteArgs {
    /// An HTTP proxy to reach the hub through with `CONNECT`
    /// (`http://[user:password@]host:port`): TLS to the hub runs inside
    /// the tunnel. Unset, `HTTPS_PROXY` (or `https_proxy`; `HTTP_PROXY`
    /// for an `http://` hub) is read, as OCM's AddOnDeploymentConfig
    /// `proxyConfig` sets it; either way `NO_PROXY` (or `no_proxy`) naming
    /// the hub dials it directly.
    #[arg(long, env = "ARGOCD_PULL_PROXY")]
    pub proxy: Option<String>,
    /// A file holding `user:password` for the proxy's Basic
    /// authentication (a Secret's key), read at every dial; a missing file
    /// sends none (or the URL's own).
    #[arg(long, env = "ARGOCD_PULL_PROXY_CREDENTIALS_FILE")]
    pub proxy_credentials_file: Option<PathBuf>,
    /// The wire to the hub: `grpc` (TLS and HTTP/2 over TCP), `websocket`
    /// (the same TLS inside a WebSocket, through HTTP/1.1-only proxies),
    /// or `auto`: gRPC, and the WebSocket once HTTP/2 is refused on the
    /// way (back to gRPC when the WebSocket is).
    #[arg(
        long,
        env = "ARGOCD_PULL_TRANSPORT",
        default_value = "auto",
        value_parser = parse_transport
    )]
    pub transport: session::wire::Transport,
    /// The WebSocket wire's URL (`ws://` or `wss://host[:port][/path]`);
    /// unset or `hub`, `ws://<the hub address's host:port>/argocd-pull/v1/ws`.
    /// With `wss://` the agent does TLS to whatever terminates it (an
    /// ingress), then the hub's mutual TLS inside the WebSocket.
    #[arg(long, env = "ARGOCD_PULL_WEBSOCKET_URL")]
    pub websocket_url: Option<String>,
    /// The CA of a `wss://` URL's TLS; unset, the system's roots.
    #[arg(long, env = "ARGOCD_PULL_WEBSOCKET_CA_FILE")]
    pub websocket_ca_file: Option<PathBuf>,
}

impl RouteArgs {
    /// The route to `hub_address`, with the proxy variables of `env`.
    pub(crate) fn resolve(
        &self,
        hub_address: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> session::wire::Route {
        session::wire::Route {
            proxy: session::proxy::ProxyConfig::resolve(
                self.proxy.as_deref(),
                self.proxy_credentials_file.clone(),
                !hub_address.starts_with("http://"),
                env,
            ),
            wire: session::wire::WireConfig {
                transport: self.transport,
                url: self
                    .websocket_url
                    .clone()
                    .filter(|u| !u.trim().is_empty() && u.trim() != "hub"),
                ca_file: self.websocket_ca_file.clone(),
            },
        }
    }
}

/// `--transport`: `auto`, `grpc` or `websocket`; empty (an addon variable
/// set to nothing) is `auto`.
fn parse_transport(s: &str) -> Result<session::wire::Transport, String> {
    use session::wire::Transport;
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "auto" => Ok(Transport::Auto),
        "grpc" => Ok(Transport::Grpc),
        "websocket" => Ok(Transport::Websocket),
        _ => Err(format!("{s:?} is none of auto, grpc, websocket")),
    }
}

/// What the agent serves of the hub's live endpoint: its live views, and
/// with them its web terminals.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveArgs {
    /// Serve the hub's live views (capability `live-views`, docs/ui.md): a
    /// resource's live manifest, its events and its pods' logs, read with
    /// this agent's own identity, only for the objects of Applications it
    /// applied for the hub and what they own. Needs `get` on those kinds,
    /// `get` on `pods/log` and `list` on `events`.
    /// `--live-views` alone is `true`; the addon's variable gives `true`,
    /// `false`, or nothing (a cluster configuration without it), which is
    /// `false`.
    #[arg(
        long = "live-views",
        env = "ARGOCD_PULL_LIVE_VIEWS",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        default_value = "false",
        value_parser = crate::parse_switch
    )]
    pub views: bool,
    /// With `--live-views`: open the hub's web terminals (capability
    /// `terminal`, docs/ui.md): an exec, with this agent's own identity,
    /// into a pod of an Application it applied for the hub. Needs `create`
    /// on `pods/exec`, which the addon grants only with the variable
    /// `TERMINAL=true`. `--terminal` alone is `true`.
    #[arg(
        long,
        env = "ARGOCD_PULL_TERMINAL",
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        default_value = "false",
        value_parser = crate::parse_switch
    )]
    pub terminal: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::wire::Transport;

    #[test]
    fn a_transport_is_auto_grpc_or_websocket_and_empty_is_auto() {
        assert_eq!(parse_transport(""), Ok(Transport::Auto));
        assert_eq!(parse_transport("auto"), Ok(Transport::Auto));
        assert_eq!(parse_transport("gRPC"), Ok(Transport::Grpc));
        assert_eq!(parse_transport("websocket"), Ok(Transport::Websocket));
        assert!(parse_transport("http").is_err());
    }
}
