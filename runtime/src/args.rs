//! Flag groups every binary flattens into its own clap arguments. Each flag
//! also reads an environment variable, so a Deployment can set either.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

#[derive(Args, Clone, Debug)]
pub struct LogArgs {
    /// Log filter, in `tracing` EnvFilter syntax (e.g. `info,argocd_pull=debug`).
    #[arg(long = "log-level", env = "ARGOCD_PULL_LOG", default_value = "info")]
    pub level: String,
    /// Log format: `plain` for people, `json` for log pipelines.
    #[arg(long = "log-format", env = "ARGOCD_PULL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub format: LogFormat,
    /// Export OpenTelemetry traces to this OTLP/gRPC endpoint (for example
    /// `http://otel-collector.observability:4317`): a trace per delivery
    /// and per status report, across the hub and the agents. Off when
    /// unset, empty or `none`.
    #[arg(long = "otlp-endpoint", env = "ARGOCD_PULL_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct ClientArgs {
    /// Kubeconfig of the cluster to manage; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the current context).
    #[arg(long, env = "ARGOCD_PULL_CONTEXT")]
    pub context: Option<String>,
    /// Requests per second to the API server, on average (watches aside);
    /// 0 for no limit. A bound on a runaway loop, not the pace: the
    /// adaptive cap on writes in flight and the server's own priority and
    /// fairness set that.
    #[arg(
        long = "api-qps",
        env = "ARGOCD_PULL_API_QPS",
        default_value_t = 1000.0
    )]
    pub qps: f64,
    /// Requests that may go at once above `--api-qps` after a quiet spell.
    #[arg(
        long = "api-burst",
        env = "ARGOCD_PULL_API_BURST",
        default_value_t = 2000
    )]
    pub burst: u32,
    /// Writes (create, update, patch, delete) waiting for the API server at
    /// once, at most; 0 for no cap. Reads pass only the `--api-qps` bucket. The cap adapts between this and
    /// `--api-min-in-flight`: it grows while the server answers writes about
    /// as fast as the server's recent average and shrinks when their latency
    /// jumps above it (a queue is forming).
    #[arg(
        long = "api-max-in-flight",
        env = "ARGOCD_PULL_API_MAX_IN_FLIGHT",
        default_value_t = 32
    )]
    pub max_in_flight: usize,
    /// What the cap on requests in flight may shrink to while the API
    /// server is busy; set it to `--api-max-in-flight` for a fixed cap.
    #[arg(
        long = "api-min-in-flight",
        env = "ARGOCD_PULL_API_MIN_IN_FLIGHT",
        default_value_t = 2
    )]
    pub min_in_flight: usize,
}

impl ClientArgs {
    /// The client-side limits the flags set.
    pub fn limits(&self) -> crate::client::Limits {
        crate::client::Limits {
            qps: self.qps,
            burst: self.burst,
            max_in_flight: self.max_in_flight,
            min_in_flight: self.min_in_flight,
        }
    }

    /// Builds a client from the flags, or from the in-cluster service
    /// account, counting its requests in `metrics` (see [`crate::client`]).
    pub async fn client(&self, metrics: crate::client::ApiMetrics) -> anyhow::Result<kube::Client> {
        crate::client::build(
            self.config().await?,
            &crate::client::ApiLayer::new(metrics, self.limits()),
        )
    }

    /// The hosts the API server [`ClientArgs::client`] talks to is known
    /// by: its URL's host, and inside a pod the `kubernetes` Service's
    /// address too.
    pub async fn server_hosts(&self) -> Vec<String> {
        let mut hosts: Vec<String> = self
            .config()
            .await
            .ok()
            .and_then(|c| c.cluster_url.host().map(str::to_string))
            .into_iter()
            .collect();
        if let Ok(h) = std::env::var("KUBERNETES_SERVICE_HOST")
            && !h.is_empty()
        {
            hosts.push(h);
        }
        hosts
            .into_iter()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
            .collect()
    }

    async fn config(&self) -> anyhow::Result<kube::Config> {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| {
                    anyhow::anyhow!("cannot read kubeconfig {}: {e}", path.display())
                })?;
                kube::Config::from_custom_kubeconfig(kc, &options).await?
            }
            None => kube::Config::infer().await?,
        };
        let env_proxy = ["HTTPS_PROXY", "https_proxy"]
            .into_iter()
            .find_map(|v| std::env::var(v).ok().filter(|p| !p.is_empty()));
        Ok(without_env_proxy(config, env_proxy.as_deref()))
    }
}

/// `config` without the proxy kube took from `HTTPS_PROXY` (`env_proxy`)
/// for a kubeconfig that names none: that variable is the egress proxy
/// to the hub (OCM's `proxyConfig` sets it on the agent's container), not
/// a way to this cluster's own API server, which the client (built
/// without kube's proxy support) would refuse to start with. A kubeconfig's
/// own `proxy-url` stays, and is refused as before.
fn without_env_proxy(mut config: kube::Config, env_proxy: Option<&str>) -> kube::Config {
    let from_env = match (&config.proxy_url, env_proxy) {
        (Some(url), Some(env)) => env.parse::<http::Uri>().is_ok_and(|e| &e == url),
        _ => false,
    };
    if from_env {
        config.proxy_url = None;
    }
    config
}

#[cfg(test)]
mod proxy_tests {
    use super::without_env_proxy;

    #[test]
    fn the_egress_proxy_of_the_environment_is_not_the_way_to_the_api_server() {
        let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://egress:3128".parse().unwrap());
        let kept = without_env_proxy(config.clone(), None);
        assert!(kept.proxy_url.is_some(), "a kubeconfig's own proxy-url");
        let kept = without_env_proxy(config.clone(), Some("http://other:3128"));
        assert!(kept.proxy_url.is_some(), "a kubeconfig's own proxy-url");
        let dropped = without_env_proxy(config, Some("http://egress:3128"));
        assert_eq!(dropped.proxy_url, None);
    }
}

#[derive(Args, Clone, Debug)]
pub struct AdminArgs {
    /// Address of the admin server: /healthz, /readyz and /metrics.
    #[arg(
        long = "admin-addr",
        env = "ARGOCD_PULL_ADMIN_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub addr: SocketAddr,
}

#[derive(Args, Clone, Debug)]
pub struct LeaderElectionArgs {
    /// Run only while holding the leader Lease, so that replicas can stand
    /// by; `--leader-elect=false` for a single replica outside Kubernetes.
    #[arg(long = "leader-elect", env = "ARGOCD_PULL_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Namespace of the leader Lease (the Deployment sets it to its own).
    #[arg(
        long = "leader-election-namespace",
        env = "POD_NAMESPACE",
        default_value = "argocd-pull"
    )]
    pub namespace: String,
    /// Name of the leader Lease.
    #[arg(long = "leader-election-id", env = "ARGOCD_PULL_LEADER_ELECTION_ID")]
    pub id: Option<String>,
}

impl LeaderElectionArgs {
    /// The lease configuration, named `default_id` unless `--leader-election-id` is set.
    pub fn config(&self, default_id: &str) -> crate::lease::LeaseConfig {
        crate::lease::LeaseConfig::new(
            &self.namespace,
            self.id.as_deref().unwrap_or(default_id),
            &crate::lease::identity(),
        )
    }
}

/// Durations like `30s`, `5m` or `1h` (a bare number is seconds), for
/// flags; zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 30s, 5m or 1h"))?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?} is not a duration such as 30s, 5m or 1h")),
    };
    if secs == 0 {
        return Err("the duration must be positive".into());
    }
    Ok(Duration::from_secs(secs))
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn durations_in_seconds_minutes_and_hours() {
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        for bad in ["0s", "", "1d", "m", "-1s", "1.5m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
