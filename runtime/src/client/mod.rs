//! The Kubernetes client every binary builds: kube's own stack with one
//! layer of ours around it that counts each request by verb, resource and
//! response code (`<prefix>_api_requests_total`) and applies the
//! client-side [`limit`]s. A storm of requests then shows on a dashboard,
//! and one process cannot crowd the other clients of its API server.

pub mod adapt;
pub mod classify;
pub mod limit;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::Body;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service};

pub use limit::Limits;
use limit::{Limiter, retry_after};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    pub resource: String,
    /// The HTTP status code, or `error` when no response came.
    pub code: String,
}

/// Requests to the API server by verb, resource and code.
#[derive(Clone, Default)]
pub struct ApiMetrics {
    pub requests: Family<RequestLabels, Counter>,
    /// The adaptive cap on requests in flight, as it stands.
    pub in_flight_limit: Gauge,
}

impl ApiMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "api_requests",
            "Requests to the Kubernetes API server, by verb, resource and response code",
            m.requests.clone(),
        );
        registry.register(
            "api_in_flight_limit",
            "Writes to the API server that may be in flight now: the adaptive cap between --api-min-in-flight and --api-max-in-flight",
            m.in_flight_limit.clone(),
        );
        m
    }
}

/// The layer of ours around kube's stack.
#[derive(Clone)]
pub struct ApiLayer {
    metrics: ApiMetrics,
    limiter: Arc<Limiter>,
}

impl ApiLayer {
    pub fn new(metrics: ApiMetrics, limits: Limits) -> Self {
        Self {
            metrics: metrics.clone(),
            limiter: Arc::new(Limiter::new(limits, metrics.in_flight_limit.clone())),
        }
    }
}

/// Builds a client from `config` with the [`ApiLayer`].
pub fn build(config: kube::Config, layer: &ApiLayer) -> anyhow::Result<kube::Client> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(layer)
        .build())
}

type Inner<S> = Buffer<Request<Body>, <S as Service<Request<Body>>>::Future>;

impl<S> Layer<S> for ApiLayer
where
    S: Service<Request<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
{
    type Service = ApiService<S>;

    fn layer(&self, inner: S) -> ApiService<S> {
        ApiService {
            // A buffer makes kube's (not cloneable) stack shareable by the
            // requests waiting on the limits.
            inner: Buffer::new(inner, 1024),
            layer: self.clone(),
        }
    }
}

pub struct ApiService<S: Service<Request<Body>>> {
    inner: Inner<S>,
    layer: ApiLayer,
}

impl<S, B> Service<Request<Body>> for ApiService<S>
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Response = Response<B>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Readiness is awaited per request below, after the limits.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let mut inner = self.inner.clone();
        let layer = self.layer.clone();
        Box::pin(async move {
            let (verb, resource) = classify::classify(
                request.method(),
                request.uri().path(),
                request.uri().query(),
            );
            // Watches are long-running; Leases (leader election, the
            // replicas' presence and claims) must not queue behind this
            // process's own bulk writes: a renewal that waits for the cap
            // loses the lease, and the replica exits, under exactly the load
            // it should ride out. Both bypass the limits.
            let limited = verb != "watch" && resource != "leases";
            let mut request = request;
            let mut retried = false;
            loop {
                let write = matches!(verb, "create" | "update" | "patch" | "delete");
                let permit = if limited {
                    Some(layer.limiter.admit(write).await)
                } else {
                    None
                };
                // Kept to send again after a 429, when the body allows it.
                let again = (!retried).then(|| clone_request(&request)).flatten();
                let result = tower::ServiceExt::ready(&mut inner)
                    .await?
                    .call(request)
                    .await;
                // Writes are the samples of the server's latency: a LIST's
                // time grows with what it returns, not with the queue.
                if let (Some(p), Ok(_), true) = (&permit, &result, write) {
                    p.answered();
                }
                drop(permit);
                let code = match &result {
                    Ok(r) => r.status().as_u16().to_string(),
                    Err(_) => "error".to_string(),
                };
                layer
                    .metrics
                    .requests
                    .get_or_create(&RequestLabels {
                        verb: verb.into(),
                        resource: resource.clone(),
                        code,
                    })
                    .inc();
                if let Ok(response) = &result
                    && response.status() == http::StatusCode::TOO_MANY_REQUESTS
                    && let Some(after) =
                        retry_after(response.headers().get(http::header::RETRY_AFTER))
                {
                    tracing::debug!(verb, %resource, ?after, "the API server asked to slow down");
                    layer.limiter.pause(after);
                    if let Some(again) = again {
                        request = again;
                        retried = true;
                        continue;
                    }
                }
                return result;
            }
        })
    }
}

fn clone_request(r: &Request<Body>) -> Option<Request<Body>> {
    let body = r.body().try_clone()?;
    let mut out = Request::builder()
        .method(r.method().clone())
        .uri(r.uri().clone())
        .version(r.version())
        .body(body)
        .ok()?;
    *out.headers_mut() = r.headers().clone();
    out.extensions_mut().clone_from(r.extensions());
    Some(out)
}
