//! Waiting for a condition in a test, with a deadline and a useful failure.

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;

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

/// `Ok` when `got` is `want`, else what was got: the check of an [`until`]
/// that waits for a value.
pub fn equal<T: PartialEq<U> + std::fmt::Debug, U>(got: T, want: U) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{got:?}"))
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

/// The first Event that `events` lists for the object that `fields`
/// selects (a field selector: `involvedObject.name=…`) and that `matches`;
/// else the reasons and messages of the Events there are.
pub async fn find_event(
    events: &kube::Api<Event>,
    fields: &str,
    matches: impl Fn(&Event) -> bool,
) -> Result<Event, String> {
    let list = events
        .list(&kube::api::ListParams::default().fields(fields))
        .await
        .map_err(|e| e.to_string())?;
    let seen: Vec<_> = list
        .items
        .iter()
        .map(|e| (e.type_.clone(), e.reason.clone(), e.message.clone()))
        .collect();
    list.items
        .into_iter()
        .find(|e| matches(e))
        .ok_or_else(|| format!("{} events: {seen:?}", seen.len()))
}

/// Whether `event` is a Warning with `reason`.
pub fn is_warning(event: &Event, reason: &str) -> bool {
    event.type_.as_deref() == Some("Warning") && event.reason.as_deref() == Some(reason)
}

/// Waits until the object that `fields` selects has a Warning Event with
/// `reason`, and returns it.
pub async fn warning(
    events: &kube::Api<Event>,
    fields: &str,
    reason: &str,
    timeout: Duration,
) -> Event {
    until(
        &format!("a Warning Event {reason} on {fields}"),
        timeout,
        || find_event(events, fields, |e| is_warning(e, reason)),
    )
    .await
}
