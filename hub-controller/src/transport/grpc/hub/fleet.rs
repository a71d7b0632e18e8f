//! The fleet-level figures of one replica's gRPC transport, summed over
//! its clusters every [`FLEET_EVERY`] and set on the gauges of
//! [`super::super::metrics`]: a pass costs one short lock per cluster, a
//! scrape reads the figures alone, and the series do not grow with the
//! fleet.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::super::metrics::FleetFigures;
use super::Hub;

/// How often the fleet figures are summed: ages (lag, time without an
/// agent) move with the clock, so they are taken at a pace well under a
/// scrape interval rather than on each change.
pub const FLEET_EVERY: Duration = Duration::from_secs(1);

impl Hub {
    /// Sets the fleet gauges every `FLEET_EVERY` (a second), for as long as
    /// it runs.
    pub async fn publish_fleet(self: Arc<Self>) {
        let mut tick = tokio::time::interval(FLEET_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.metrics.set_fleet(self.fleet());
        }
    }

    /// The figures as they stand.
    pub(crate) fn fleet(&self) -> FleetFigures {
        let now = unix(SystemTime::now());
        let mut f = FleetFigures {
            queue_depth: self.writing.queue.len() as i64,
            ..FleetFigures::default()
        };
        for cs in self.clusters() {
            let s = cs.sample();
            // Every replica keeps an outbox for every cluster with
            // Applications; what waits in it is this replica's to count
            // only while its agent is connected here or, with no agent
            // here, while this replica writes for the cluster (it holds
            // the claim, or it leads and nobody does). Summed over the
            // replicas, each object is then counted once.
            let counted_here = s.agent_not_after.is_some() || self.acts_for(&cs.name);
            if counted_here {
                f.pending += s.pending as i64;
                f.control_queue += s.control as i64;
                f.lag_longest = f.lag_longest.max(s.lag);
            }
            if let Some(not_after) = s.agent_not_after {
                f.connected += 1;
                f.agent_not_after = Some(f.agent_not_after.map_or(not_after, |t| t.min(not_after)));
                continue;
            }
            let last_seen = s.last_seen;
            // A cluster whose agent is elsewhere is that replica's to count.
            if (s.wanted || last_seen.is_some()) && counted_here {
                f.disconnected += 1;
                let since = last_seen.unwrap_or(unix(s.created));
                f.disconnected_longest = f.disconnected_longest.max(now - since);
            }
        }
        f
    }
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::{Duration, Instant, SystemTime};

    use argocd_pull_proto::v1::{AgentMode, ObjectKey};
    use argocd_pull_runtime::Readiness;
    use argocd_pull_runtime::admin::Admin;
    use argocd_pull_runtime::client::{ApiMetrics, RequestLabels};
    use clap::Parser;
    use prometheus_client::registry::Registry;

    use super::super::super::claims::{Claims, ClaimsConfig};
    use super::super::super::cluster::{Agent, Item};
    use super::super::super::metrics::GrpcMetrics;
    use super::super::HubParts;
    use super::*;
    use crate::watch::watches::{Scope, Watches};

    const CLUSTERS: usize = 10_000;

    /// A transport nobody connects to, its metrics in `registry`, its
    /// serving certificate `cert`.
    fn hub(registry: &mut Registry, per_cluster: bool, cert: &Path) -> Arc<Hub> {
        hub_with(registry, per_cluster, cert, None)
    }

    /// [`hub`] with `claims` (several replicas).
    fn hub_with(
        registry: &mut Registry,
        per_cluster: bool,
        cert: &Path,
        claims: Option<Arc<Claims>>,
    ) -> Arc<Hub> {
        let args = crate::Args::parse_from([
            "hub-controller".to_string(),
            "--grpc-addr=127.0.0.1:0".to_string(),
            format!("--grpc-tls-cert={}", cert.display()),
        ]);
        let config = args.grpc.config(Default::default()).unwrap();
        let metrics = GrpcMetrics::register(registry, per_cluster);
        let client = nowhere();
        let watches = Watches::new(Scope {
            grpc: true,
            ..Scope::default()
        });
        Hub::new(HubParts {
            claims,
            ..HubParts::new(config, client, metrics, watches.caches())
        })
    }

    /// A client of an API server that is not there (nothing here calls
    /// it).
    fn nowhere() -> kube::Client {
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
    }

    /// A self-signed serving certificate at `path`.
    fn write_serving_cert(path: &Path) {
        let cert = rcgen::generate_simple_self_signed(vec!["hub".into()]).unwrap();
        std::fs::write(path, cert.cert.pem()).unwrap();
    }

    fn now() -> f64 {
        unix(SystemTime::now())
    }

    /// What a session does to the metrics of its cluster over a while:
    /// connected, messages of eight kinds both ways, a resync, a
    /// delivery, and for one cluster in a hundred a refusal.
    fn connect(hub: &Hub, i: usize) {
        let name = format!("cluster-{i:05}");
        let cs = hub.cluster(&name);
        let agent = Agent {
            certificate_not_after: 1_900_000_000 + i as i64,
            ..Agent::default()
        };
        cs.attach_as(i as u64, AgentMode::Managed, agent).unwrap();
        cs.seen(now());
        let m = &hub.metrics;
        let l = m.cluster(&name);
        m.agents.connected.get_or_create(&l).set(1);
        m.agents.last_seen.get_or_create(&l).set(now());
        m.agents.lag.get_or_create(&l).set(0.25);
        m.agents.pending.get_or_create(&l).set(2);
        m.agents.control_queue.get_or_create(&l).set(0);
        m.resync(&name);
        for k in ["upsert", "delete", "object_ack", "digest"] {
            m.message(&name, "out", k);
        }
        for k in ["status", "object_ack", "heartbeat", "digest"] {
            m.message(&name, "in", k);
        }
        m.writes.delivery.observe(0.05 + (i % 100) as f64 / 100.0);
        if i.is_multiple_of(100) {
            m.refuse(&name, "stalled");
        }
    }

    /// The whole `/metrics` of a hub-controller with `CLUSTERS` agents
    /// connected: its size, and the time an HTTP scrape of it takes (best
    /// and median of 7).
    async fn scrape_at_scale(per_cluster: bool) -> (usize, Duration, Duration, String) {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        write_serving_cert(&cert);
        let mut registry = Registry::with_prefix("argocd_pull_hub");
        let hub_metrics = crate::metrics::Metrics::register(&mut registry);
        let hub = hub(&mut registry, per_cluster, &cert);
        let api = ApiMetrics::register(&mut registry);
        for verb in [
            "get", "list", "watch", "create", "patch", "update", "delete",
        ] {
            for resource in [
                "applications",
                "manifestworks",
                "leases",
                "secrets",
                "events",
            ] {
                api.requests
                    .get_or_create(&RequestLabels {
                        verb: verb.into(),
                        resource: resource.into(),
                        code: "200".into(),
                    })
                    .inc();
            }
        }
        hub_metrics.reconcile_seconds.observe(0.01);
        for i in 0..CLUSTERS {
            connect(&hub, i);
        }
        hub.metrics.set_fleet(hub.fleet());
        let mut encode = Duration::MAX;
        for _ in 0..5 {
            let mut text = String::new();
            let started = Instant::now();
            prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
            encode = encode.min(started.elapsed());
        }
        println!("encode alone: best of 5 {encode:?} (per_cluster={per_cluster})");
        let addr = testenv::net::free_addr().unwrap();
        let (stop, shutdown) = argocd_pull_runtime::shutdown::channel();
        let server = tokio::spawn(Admin::new(Readiness::default(), registry).serve(addr, shutdown));
        let mut times = Vec::new();
        let mut body = String::new();
        for _ in 0..7 {
            let started = Instant::now();
            let (code, b) = loop {
                match testenv::net::http_get(addr, "/metrics").await {
                    Ok(r) => break r,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            times.push(started.elapsed());
            assert_eq!(code, 200);
            body = b;
        }
        stop.fire();
        server.await.unwrap().unwrap();
        times.sort();
        (body.len(), times[0], times[times.len() / 2], body)
    }

    /// The figure of docs/operations.md (Metrics): a hub-controller with
    /// 10,000 agents, scraped by default and with --metrics-per-cluster.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_at_10000_clusters_stay_small_by_default() {
        let (size, best, median, body) = scrape_at_scale(false).await;
        let series = body.lines().filter(|l| !l.starts_with('#')).count();
        println!(
            "default: /metrics {size} bytes, {series} series, scrape best {best:?}, median {median:?} ({CLUSTERS} clusters)"
        );
        assert!(
            body.contains(&format!("argocd_pull_hub_grpc_agents_connected {CLUSTERS}")),
            "{body}"
        );
        assert!(
            body.contains(&format!(
                "argocd_pull_hub_grpc_messages_total{{direction=\"in\",kind=\"status\"}} {CLUSTERS}"
            )),
            "{body}"
        );
        assert!(
            !body.contains("cluster=\""),
            "a per-cluster series by default"
        );
        assert!(size < 200 * 1024, "{size} bytes");

        let (size, best, median, body) = scrape_at_scale(true).await;
        let series = body.lines().filter(|l| !l.starts_with('#')).count();
        println!(
            "--metrics-per-cluster: /metrics {size} bytes, {series} series, scrape best {best:?}, median {median:?} ({CLUSTERS} clusters)"
        );
        assert!(body.contains("argocd_pull_hub_grpc_agent_connected{cluster=\"cluster-09999\"} 1"));
    }

    #[tokio::test]
    async fn the_fleet_figures_count_this_replicas_clusters() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let mut registry = Registry::default();
        let hub = hub(&mut registry, false, &cert);
        // No serving certificate yet, no cluster.
        assert_eq!(hub.fleet(), FleetFigures::default());

        connect(&hub, 1);
        connect(&hub, 2);
        // cluster 3's agent was here and left 100 s ago.
        connect(&hub, 3);
        let gone = hub.cluster("cluster-00003");
        gone.detach(3);
        gone.seen(now() - 100.0);
        // A cluster this replica only heard of (no Applications, no agent).
        hub.cluster("bystander");
        let f = hub.fleet();
        assert_eq!(f.connected, 2);
        assert_eq!(f.disconnected, 1);
        assert!(
            (100.0..110.0).contains(&f.disconnected_longest),
            "{}",
            f.disconnected_longest
        );
        assert_eq!(f.agent_not_after, Some(1_900_000_001));
        // The gauges, as scraped: the figures as last set.
        hub.metrics.set_fleet(f);
        hub.metrics.serving_certificate(Some(2_000_000_000));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("grpc_agents_connected 2\n"), "{text}");
        assert!(text.contains("grpc_agents_disconnected 1\n"), "{text}");
        assert!(
            text.contains("grpc_agent_certificate_expiry_earliest_timestamp_seconds 1900000001"),
            "{text}"
        );
        assert!(
            text.contains("grpc_serving_certificate_expiry_timestamp_seconds 2000000000"),
            "{text}"
        );
    }

    /// One object waiting in the outbox of `cluster`.
    fn queue_one(hub: &Hub, cluster: &str) {
        let key = ObjectKey {
            namespace: "argocd".into(),
            name: format!("app-of-{cluster}"),
        };
        hub.cluster(cluster).resend(
            &key,
            Item::Delete {
                hub_uid: "uid".into(),
            },
        );
    }

    /// Every replica keeps every cluster's outbox; summed over the
    /// replicas, an object waiting for a cluster must count once, at the
    /// replica that serves its agent or writes for it (the 3,000-agent
    /// run on three replicas showed 60,000 pending objects at rest when
    /// each replica counted every cluster).
    #[tokio::test]
    async fn pending_objects_count_where_the_cluster_is_served_or_written_for() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let mut registry = Registry::default();
        // Several replicas: this one holds no claim and does not lead yet.
        let claims = Claims::new(nowhere(), ClaimsConfig::new("argocd-pull", "replica-a"));
        let hub = hub_with(&mut registry, false, &cert, Some(claims.clone()));

        connect(&hub, 1);
        queue_one(&hub, "cluster-00001");
        // Another replica serves this cluster's agent (or will).
        queue_one(&hub, "elsewhere");
        let f = hub.fleet();
        assert_eq!(f.pending, 1, "only the cluster served here: {f:?}");

        // Leading with nobody holding its claim, this replica writes for
        // it: its object is this replica's to count.
        claims.set_leader(true);
        let f = hub.fleet();
        assert_eq!(f.pending, 2, "{f:?}");
    }
}
