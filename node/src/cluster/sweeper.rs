//! The expiry sweeper: while this node leads, a bounded Sweep every interval.

use std::sync::atomic::Ordering;

use idemraft_store::{Op, Outcome};

use super::node::Node;

/// While this node leads, proposes a bounded Sweep every interval (which also keeps the log's
/// clock close to real time), and sweeps again at once while a sweep comes back full.
pub(super) async fn run(node: Node) {
    let interval = node.inner.config.sweep_interval;
    let limit = node.inner.config.sweep_limit;
    loop {
        tokio::time::sleep(interval).await;
        if node.inner.stopping.load(Ordering::Acquire) {
            return;
        }
        if node.leader().0 != Some(node.inner.config.id) {
            continue;
        }
        // At most 10 full sweeps back to back, so a backlog never crowds out client writes.
        for _ in 0..10 {
            let swept = tokio::time::timeout(interval * 5, node.inner.proposer.submit(Op::Sweep { limit })).await;
            if let Ok(Ok(Outcome::Swept { deleted })) = &swept {
                node.inner.observer.swept(*deleted);
            }
            match swept {
                Ok(Ok(Outcome::Swept { deleted })) if deleted >= limit => continue,
                Ok(Ok(Outcome::Swept { deleted })) => {
                    if deleted > 0 {
                        tracing::debug!(deleted, "swept expired records");
                    }
                    break;
                }
                Ok(Ok(other)) => {
                    tracing::warn!(outcome = ?other, "unexpected sweep outcome");
                    break;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "sweep not proposed");
                    break;
                }
                Err(_) => break,
            }
        }
    }
}
