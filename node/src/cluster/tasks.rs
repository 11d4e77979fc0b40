//! The background tasks a node owns (the proposer, the fast-read confirmer, the election
//! watch, the sweeper, log compaction), spawned through one [`Tasks`] so that stopping the
//! node stops them all and waits until they are gone. Several nodes in one process (the
//! routing tests, the simulator) then start and stop without leaving tasks of a stopped node
//! running against the next one's stores.

use std::future::Future;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A node's task set. Cloning shares it.
#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Tasks {
    /// An empty set.
    pub fn new() -> Tasks {
        Tasks::default()
    }

    /// Runs `task` until it ends or the set is stopped, whichever comes first.
    pub fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = self.cancel.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                // Stopping wins over a task that is ready in the same poll: the order is
                // fixed, so a simulated run replays the same way.
                biased;
                _ = cancel.cancelled() => {}
                _ = task => {}
            }
        });
    }

    /// Stops every task and waits until each has ended; nothing can be spawned afterwards
    /// (a late spawn is cancelled at once).
    pub async fn stop(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }

    /// Tasks still running.
    pub fn running(&self) -> usize {
        self.tracker.len()
    }
}
