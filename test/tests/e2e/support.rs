//! Helpers of the end-to-end test: polling for a positive signal, and
//! reading Applications.

use std::future::Future;
use std::time::{Duration, Instant};

use argocd_pull_apis::argocd::application_resource;
use kube::api::{Api, DynamicObject};
use serde_json::Value;
use testenv::paths;
use testenv::stack::Stack;

pub const TIMEOUT: Duration = Duration::from_secs(150);
pub const NS: &str = "argocd";

pub fn example(path: &str) -> std::path::PathBuf {
    paths::workspace_dir().join("example").join(path)
}

/// Polls `check` until it returns `Ok`; on timeout fails with the last
/// error and the end of argocd-pull's logs.
pub async fn eventually<T, F, Fut>(stack: &Stack, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match check().await {
            Ok(v) => return v,
            Err(last) if Instant::now() > deadline => panic!(
                "timed out after {TIMEOUT:?} waiting for {what}; last seen: {last}\n{}",
                stack.log_tails(40)
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

pub fn apps(client: &kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, &application_resource())
}

pub async fn get(api: &Api<DynamicObject>, name: &str) -> Result<Value, String> {
    api.get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .map(|o| serde_json::to_value(o).expect("an object serializes"))
        .ok_or_else(|| format!("no Application {name}"))
}

pub use testenv::names;

pub fn at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// The hub copy of `name` is Synced and Healthy at `revision` (any, if empty).
pub async fn converged(stack: &Stack, hub: &Api<DynamicObject>, name: &str, revision: &str) {
    eventually(
        stack,
        &format!("{name} Synced/Healthy at {revision:?} on the hub"),
        || async {
            let a = get(hub, name).await?;
            let ok = at(&a, "/status/sync/status") == "Synced"
                && at(&a, "/status/health/status") == "Healthy"
                && (revision.is_empty() || at(&a, "/status/sync/revision") == revision);
            if ok {
                Ok(())
            } else {
                Err(a["status"].to_string())
            }
        },
    )
    .await
}
