//! Snapshots by log size. openraft 0.9's snapshot policy counts entries only, and with large
//! responses 10,000 entries can be gigabytes of log on every node. This task asks openraft for
//! a snapshot once the log holds more than `--snapshot-log-bytes` above the current one;
//! openraft then purges the log behind it (keeping its last 1,000 entries) as after any
//! snapshot. Every node compacts its own log, leader or not.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::node::Node;

/// How often the log's size is looked at: summing a few thousand entry lengths.
const CHECK_EVERY: Duration = Duration::from_secs(2);

pub(super) async fn run(node: Node) {
    let limit = node.inner.config.snapshot_log_bytes;
    // The snapshot index last asked for, so a build that runs is not asked for again.
    let mut asked_at = None;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        if node.inner.stopping.load(Ordering::Acquire) {
            return;
        }
        let (snapshot, applied) = {
            let m = node.inner.raft.metrics();
            let m = m.borrow();
            (m.snapshot.map_or(0, |l| l.index), m.last_applied.map_or(0, |l| l.index))
        };
        if applied <= snapshot || asked_at == Some(snapshot) {
            continue;
        }
        let bytes = node.inner.log.bytes_after(snapshot);
        if bytes < limit {
            continue;
        }
        tracing::info!(
            log_bytes = bytes,
            limit,
            snapshot,
            applied,
            "log above --snapshot-log-bytes; taking a snapshot"
        );
        match node.inner.raft.trigger().snapshot().await {
            Ok(()) => asked_at = Some(snapshot),
            Err(e) => tracing::warn!(error = %e, "could not start a snapshot"),
        }
    }
}
