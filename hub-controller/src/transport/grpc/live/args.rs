//! The live endpoint's flags, and what they make of it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use argocd_pull_core::render::cluster_secret::LiveEndpoint;

use super::conn;
use super::files::tokens;
use crate::transport::grpc::cluster::live::ShareLimits;

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
    #[command(flatten)]
    pub bounds: LiveBounds,
}

/// What one reader, and one client, may take of the live endpoint
/// (docs/configuration.md, docs/ui.md). A reader is one namespace of a
/// cluster: argocd-server's request names no Application and no user.
#[derive(clap::Args, Clone, Debug)]
pub struct LiveBounds {
    /// Reads other than followed logs (a live manifest, events, a log
    /// without follow) under way at once in one namespace of a cluster;
    /// one more is answered 429.
    #[arg(
        long = "live-reads-per-namespace",
        env = "ARGOCD_PULL_LIVE_READS_PER_NAMESPACE",
        default_value_t = 8
    )]
    pub live_reads_per_namespace: usize,
    /// Followed logs under way at once in one namespace of a cluster
    /// (counted apart from the other reads); one more is answered 429.
    #[arg(
        long = "live-follows-per-namespace",
        env = "ARGOCD_PULL_LIVE_FOLLOWS_PER_NAMESPACE",
        default_value_t = 4
    )]
    pub live_follows_per_namespace: usize,
    /// How long a followed log is streamed before the endpoint ends it
    /// (Argo CD's UI and CLI follow again when asked); the agent ends one
    /// after 30 minutes whatever this says.
    #[arg(long = "live-follow-timeout", env = "ARGOCD_PULL_LIVE_FOLLOW_TIMEOUT", default_value = "10m", value_parser = argocd_pull_runtime::parse_duration)]
    pub live_follow_timeout: Duration,
    /// Connections open at once on the live port (after their TLS
    /// handshake); one more is closed at once.
    #[arg(
        long = "live-max-connections",
        env = "ARGOCD_PULL_LIVE_MAX_CONNECTIONS",
        default_value_t = 256
    )]
    pub live_max_connections: usize,
    /// Of those, the connections one client (one peer address) may hold at
    /// once, handshakes included; one more of it is closed at once. The
    /// hub's argocd-server replicas and the other hub-controller replicas
    /// are the clients meant to be here (`networkPolicy.enabled` in the
    /// chart lets in no other).
    #[arg(
        long = "live-max-connections-per-client",
        env = "ARGOCD_PULL_LIVE_MAX_CONNECTIONS_PER_CLIENT",
        default_value_t = 64
    )]
    pub live_max_connections_per_client: usize,
    /// How long a client has to send a request's head; a connection that
    /// sends none in time is closed.
    #[arg(long = "live-header-timeout", env = "ARGOCD_PULL_LIVE_HEADER_TIMEOUT", default_value = "10s", value_parser = argocd_pull_runtime::parse_duration)]
    pub live_header_timeout: Duration,
    /// How long a connection may stay open with no request under way.
    #[arg(long = "live-idle-timeout", env = "ARGOCD_PULL_LIVE_IDLE_TIMEOUT", default_value = "60s", value_parser = argocd_pull_runtime::parse_duration)]
    pub live_idle_timeout: Duration,
    /// Web terminals (capability `terminal`) open at once on one cluster;
    /// one more is answered 429.
    #[arg(
        long = "terminal-sessions-per-cluster",
        env = "ARGOCD_PULL_TERMINAL_SESSIONS_PER_CLUSTER",
        default_value_t = 4
    )]
    pub terminal_sessions_per_cluster: usize,
    /// A web terminal with no input or output for this long is closed.
    #[arg(long = "terminal-idle-timeout", env = "ARGOCD_PULL_TERMINAL_IDLE_TIMEOUT", default_value = "15m", value_parser = argocd_pull_runtime::parse_duration)]
    pub terminal_idle_timeout: Duration,
    /// A web terminal is closed after this long, whatever it does.
    #[arg(long = "terminal-max-duration", env = "ARGOCD_PULL_TERMINAL_MAX_DURATION", default_value = "2h", value_parser = argocd_pull_runtime::parse_duration)]
    pub terminal_max_duration: Duration,
}

impl Default for LiveBounds {
    fn default() -> Self {
        <Self as clap::FromArgMatches>::from_arg_matches(
            &<Self as clap::Args>::augment_args(clap::Command::new("live"))
                .get_matches_from(["live"]),
        )
        .expect("the defaults parse")
    }
}

impl LiveBounds {
    pub(super) fn shares(&self) -> ShareLimits {
        ShareLimits {
            reads: self.live_reads_per_namespace,
            follows: self.live_follows_per_namespace,
        }
    }

    pub(super) fn terminal(&self, client: kube::Client) -> super::terminal::Bounds {
        super::terminal::Bounds::new(
            client,
            self.terminal_sessions_per_cluster,
            self.terminal_idle_timeout,
            self.terminal_max_duration,
        )
    }

    pub(super) fn connections(&self) -> conn::Bounds {
        conn::Bounds {
            max_connections: self.live_max_connections,
            max_connections_per_client: self.live_max_connections_per_client,
            header_timeout: self.live_header_timeout,
            idle_timeout: self.live_idle_timeout,
        }
    }
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
