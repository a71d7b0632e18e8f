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
