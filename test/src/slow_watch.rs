//! A client layer for tests that play a loaded API server: watch events of
//! one resource arrive a fixed delay late (each event exactly that late, in
//! order, with no loss of throughput), and every request is logged. The API
//! server, the objects and every other request stay real.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use kube::client::Body;
use tower::{BoxError, Layer, Service};

/// The requests a client sent: method and path.
#[derive(Clone, Default)]
pub struct RequestLog(Arc<Mutex<Vec<(Method, String)>>>);

impl RequestLog {
    /// How many requests of `method` went to a path containing `part`.
    pub fn count(&self, method: &Method, part: &str) -> usize {
        self.0
            .lock()
            .expect("never poisoned")
            .iter()
            .filter(|(m, p)| m == method && p.contains(part))
            .count()
    }

    /// The paths of the requests of `method`.
    pub fn paths(&self, method: &Method) -> Vec<String> {
        self.0
            .lock()
            .expect("never poisoned")
            .iter()
            .filter(|(m, _)| m == method)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

/// Delays the watch events of resources whose path contains `resource`
/// (e.g. `/applications`) by `delay`, and logs every request in `log`.
#[derive(Clone)]
pub struct SlowWatch {
    pub resource: &'static str,
    pub delay: Duration,
    pub log: RequestLog,
}

impl SlowWatch {
    /// A client for `config` whose watches of `resource` come `delay` late.
    pub fn client(&self, config: kube::Config) -> crate::Result<kube::Client> {
        Ok(kube::client::ClientBuilder::try_from(config)?
            .with_layer(self)
            .build())
    }
}

impl<S> Layer<S> for SlowWatch {
    type Service = SlowWatchService<S>;

    fn layer(&self, inner: S) -> SlowWatchService<S> {
        SlowWatchService {
            inner,
            layer: self.clone(),
        }
    }
}

pub struct SlowWatchService<S> {
    inner: S,
    layer: SlowWatch,
}

type Delayed = UnsyncBoxBody<Bytes, BoxError>;

impl<S, B> Service<Request<Body>> for SlowWatchService<S>
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<Delayed>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Delayed>, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let path = request.uri().path().to_string();
        let watch = request.method() == Method::GET
            && path.contains(self.layer.resource)
            && request
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true"));
        self.layer
            .log
            .0
            .lock()
            .expect("never poisoned")
            .push((request.method().clone(), path));
        let delay = watch.then_some(self.layer.delay);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await.map_err(Into::into)?;
            Ok(response.map(|body| match delay {
                None => body.map_err(Into::into).boxed_unsync(),
                Some(delay) => late(body, delay),
            }))
        })
    }
}

/// `body` with every frame handed on `delay` after it arrived.
fn late<B>(body: B, delay: Duration) -> Delayed
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        while let Some(frame) = body.frame().await {
            let due = tokio::time::Instant::now() + delay;
            if tx.send((due, frame.map_err(Into::into))).is_err() {
                return;
            }
        }
    });
    let frames =
        tokio_stream::wrappers::UnboundedReceiverStream::new(rx).then(|(due, frame)| async move {
            tokio::time::sleep_until(due).await;
            frame
        });
    StreamBody::new(frames).boxed_unsync()
}
