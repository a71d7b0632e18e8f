//! Spawned tasks tied to the scope that spawned them.

/// A spawned task that is aborted when this is dropped: a future dropped
/// half-way (a shutdown, or its caller giving up) must not leave its
/// helper tasks running on.
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::AbortOnDrop;

    #[tokio::test]
    async fn dropping_the_guard_stops_the_task() {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
        let guard = AbortOnDrop(tokio::spawn(async move {
            // Holds the sender until aborted.
            let _tx = tx;
            std::future::pending::<()>().await;
        }));
        drop(guard);
        // The task's end drops the sender: the channel closes.
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv()).await;
        assert_eq!(closed, Ok(None), "the task outlived its guard");
    }
}
