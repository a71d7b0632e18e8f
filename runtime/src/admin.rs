//! The admin port every binary serves: `/healthz` (the process is alive),
//! `/readyz` (every readiness check passes) and `/metrics` (Prometheus text),
//! plus whatever routes the binary adds ([`Admin::with_routes`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::shutdown::Shutdown;

/// Named readiness checks; `/readyz` is ready when every one registered so
/// far is true (and at least one is registered).
#[derive(Clone, Default)]
pub struct Readiness(Arc<Mutex<BTreeMap<&'static str, bool>>>);

impl Readiness {
    pub fn set(&self, check: &'static str, ready: bool) {
        self.0
            .lock()
            .expect("never poisoned: no code panics holding it")
            .insert(check, ready);
    }

    /// Whether all checks pass, and the names of those that do not.
    pub fn report(&self) -> (bool, Vec<&'static str>) {
        let checks = self.0.lock().expect("never poisoned");
        let failing: Vec<_> = checks
            .iter()
            .filter(|(_, ok)| !**ok)
            .map(|(n, _)| *n)
            .collect();
        (!checks.is_empty() && failing.is_empty(), failing)
    }
}

#[derive(Clone)]
pub struct Admin {
    pub readiness: Readiness,
    registry: Arc<Registry>,
    /// Length of the last `/metrics` text: the next one starts at about
    /// that size. Grown by doubling, the text of a hub with 10,000 agents
    /// (per-cluster series) took twice its size or more at each scrape.
    last_metrics_len: Arc<AtomicUsize>,
    routes: Router,
}

impl Admin {
    pub fn new(readiness: Readiness, registry: Registry) -> Self {
        Self {
            readiness,
            registry: Arc::new(registry),
            last_metrics_len: Arc::default(),
            routes: Router::new(),
        }
    }

    /// Serves `routes` too (their paths must not be the ones above).
    pub fn with_routes(mut self, routes: Router) -> Self {
        self.routes = self.routes.merge(routes);
        self
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/livez", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self.clone())
            .merge(self.routes)
    }

    /// Serves until `shutdown` fires. Binding errors are returned at once so
    /// that a taken port fails start-up with a clear message.
    pub async fn serve(self, addr: SocketAddr, shutdown: Shutdown) -> anyhow::Result<()> {
        let listener = crate::net::listen(addr, 1024)
            .map_err(|e| anyhow::anyhow!("cannot listen on admin address {addr}: {e}"))?;
        tracing::info!(addr = %listener.local_addr()?, "admin server listening");
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown.wait())
            .await?;
        Ok(())
    }
}

async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    match admin.readiness.report() {
        (true, _) => (StatusCode::OK, "ok".to_string()),
        (false, failing) if failing.is_empty() => {
            (StatusCode::SERVICE_UNAVAILABLE, "starting".to_string())
        }
        (false, failing) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {}", failing.join(", ")),
        ),
    }
}

async fn metrics(State(admin): State<Admin>) -> impl IntoResponse {
    let last = admin.last_metrics_len.load(Ordering::Relaxed);
    let mut body = String::with_capacity(last + last / 16);
    match prometheus_client::encoding::text::encode(&mut body, &admin.registry) {
        Ok(()) => {
            admin.last_metrics_len.store(body.len(), Ordering::Relaxed);
            (
                StatusCode::OK,
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                body,
            )
                .into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    async fn get_text(addr: SocketAddr, path: &str) -> (u16, String) {
        testenv::net::http_get(addr, path).await.unwrap()
    }

    #[tokio::test]
    async fn serves_health_readiness_and_metrics_then_stops() {
        let mut registry = Registry::with_prefix("argocd_pull");
        let counter = Counter::<u64>::default();
        registry.register("test_events", "Events seen by the test", counter.clone());
        counter.inc_by(3);
        let readiness = Readiness::default();
        let admin = Admin::new(readiness.clone(), registry);
        let (trigger, shutdown) = crate::shutdown::channel();
        let addr = testenv::net::free_addr().unwrap();
        let server = tokio::spawn(admin.serve(addr, shutdown));
        // Wait for the listener.
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }

        assert_eq!(get_text(addr, "/healthz").await, (200, "ok".into()));
        assert_eq!(get_text(addr, "/readyz").await, (503, "starting".into()));
        readiness.set("kube", false);
        readiness.set("cache", true);
        assert_eq!(
            get_text(addr, "/readyz").await,
            (503, "not ready: kube".into())
        );
        readiness.set("kube", true);
        assert_eq!(get_text(addr, "/readyz").await, (200, "ok".into()));
        let (code, body) = get_text(addr, "/metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("argocd_pull_test_events_total 3"), "{body}");

        trigger.fire();
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .expect("server stops on shutdown")
            .unwrap()
            .unwrap();
    }
}
