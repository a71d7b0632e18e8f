//! Waiting for a condition in a test, with a deadline and a useful failure.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` until it returns `Some`, or panics after `timeout` with
/// `what` and the last value seen by `check`'s `Err` side.
pub async fn until<T, E, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Debug,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {last:?}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Waits until `api` has an object called `name`, and returns it.
pub async fn exists<K>(api: &kube::Api<K>, name: &str, timeout: Duration) -> K
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(&format!("{name} to exist"), timeout, || async {
        match api.get_opt(name).await {
            Ok(Some(obj)) => Ok(obj),
            Ok(None) => Err("not found".to_string()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// Waits until `api` has no object called `name` (deleted, finalizers
/// released); the failure shows the object's deletion timestamp and
/// finalizers.
pub async fn gone<K>(api: &kube::Api<K>, name: &str, timeout: Duration)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    until(&format!("{name} to be gone"), timeout, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(obj)) => Err(format!(
                "still there: deletionTimestamp {:?}, finalizers {:?}",
                obj.meta().deletion_timestamp,
                obj.meta().finalizers
            )),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}
