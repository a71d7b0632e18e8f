//! Graceful shutdown: the first SIGTERM or SIGINT asks every task to stop.

use tokio::sync::watch;

/// A handle that tasks clone and await; it resolves once shutdown begins.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// Resolves when shutdown has begun (immediately if it already has).
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|down| *down).await;
    }

    pub fn is_down(&self) -> bool {
        *self.0.borrow()
    }

    /// Runs `work`, which stops by itself once shutdown begins, to its end,
    /// but no longer than `grace` after shutdown began; false when it was
    /// cut off. kube-runtime's graceful shutdown, for one, waits for its
    /// cache's first list: a SIGTERM that comes before it must not hang the
    /// process.
    pub async fn bounded(
        self,
        work: impl std::future::Future<Output = ()>,
        grace: std::time::Duration,
    ) -> bool {
        tokio::select! {
            _ = work => true,
            _ = async { self.wait().await; tokio::time::sleep(grace).await } => false,
        }
    }
}

/// The trigger side, for tests and for binaries that stop on their own.
pub struct Trigger(watch::Sender<bool>);

impl Trigger {
    pub fn fire(&self) {
        let _ = self.0.send(true);
    }
}

pub fn channel() -> (Trigger, Shutdown) {
    let (tx, rx) = watch::channel(false);
    (Trigger(tx), Shutdown(rx))
}

/// A shutdown handle fired by the process's first SIGTERM or SIGINT.
pub fn on_signals() -> anyhow::Result<Shutdown> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (trigger, shutdown) = channel();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        trigger.fire();
    });
    Ok(shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_resolves_after_fire_and_when_already_down() {
        let (trigger, shutdown) = channel();
        assert!(!shutdown.is_down());
        let waiter = tokio::spawn(shutdown.clone().wait());
        trigger.fire();
        waiter.await.unwrap();
        assert!(shutdown.is_down());
        // A handle cloned after the fact does not wait at all.
        tokio::time::timeout(std::time::Duration::from_secs(5), shutdown.wait())
            .await
            .expect("already down");
    }

    #[tokio::test]
    async fn bounded_work_ends_on_its_own_or_is_cut_off_after_the_grace() {
        let grace = std::time::Duration::from_millis(50);
        let (trigger, shutdown) = channel();
        assert!(shutdown.clone().bounded(async {}, grace).await);
        // Work that ignores shutdown is not waited for past the grace.
        let stuck = tokio::spawn(shutdown.bounded(std::future::pending(), grace));
        trigger.fire();
        assert!(!stuck.await.unwrap());
    }
}
