//! Snapshots by log size. openraft 0.9's snapshot policy counts entries only, and with large
//! responses 10,000 entries can be gigabytes of log on every node. This task asks openraft for
//! a snapshot once the log above the current one holds more than a quarter of the state, or
//! `--snapshot-log-bytes` if that is less (never less than [`snapshot_log_floor`]); openraft
//! then purges the log behind it (keeping its last 1,000 entries) as after any snapshot.
//! Every node compacts its own log, leader or not.
//!
//! Why a share of the state: between snapshots a node's disk carries the log and the old
//! snapshot's links to bodies since released, both growing with the time between snapshots.
//! Against a state that turns over quickly (short TTLs) 10,000 entries made disk swing by
//! more than the state itself. A snapshot costs about what its records file holds (bodies of
//! 512 B and more are linked, not copied), so it is asked for no sooner than the log has
//! grown by that much: snapshots never write more than the log does.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::node::Node;
use crate::config::snapshot_log_floor;

/// How often the log's size is looked at: summing a few thousand entry lengths.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What a record costs in a snapshot's records file, as an estimate: its stub or record is
/// 170–210 B, plus its body when that is under 512 B.
const RECORD_BYTES: u64 = 256;

/// The log bytes above the snapshot that ask for the next one, for a state of `records`
/// records and `blob_bytes` of bodies kept apart: a quarter of the state, at least what a
/// snapshot writes, clamped to [`snapshot_log_floor`] ..= `cap` (`--snapshot-log-bytes`).
fn limit_for(records: u64, blob_bytes: u64, floor: u64, cap: u64) -> u64 {
    let records_file = records.saturating_mul(RECORD_BYTES);
    let state = records_file.saturating_add(blob_bytes);
    (state / 4).max(records_file).clamp(floor, cap.max(floor))
}

pub(super) async fn run(node: Node) {
    let cap = node.inner.config.snapshot_log_bytes;
    let floor = snapshot_log_floor(node.inner.config.entry_max_bytes);
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
        let limit = limit_for(node.inner.sm.record_count() as u64, node.inner.sm.blob_bytes(), floor, cap);
        if bytes < limit {
            continue;
        }
        tracing::info!(
            log_bytes = bytes,
            limit,
            snapshot,
            applied,
            "log above a quarter of the state or --snapshot-log-bytes; taking a snapshot"
        );
        match node.inner.raft.trigger().snapshot().await {
            Ok(()) => asked_at = Some(snapshot),
            Err(e) => tracing::warn!(error = %e, "could not start a snapshot"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_log_bound_is_a_quarter_of_the_state_within_the_floor_and_the_cap() {
        let (floor, cap) = (16 * MIB, 512 * MIB);
        // A small state: the floor.
        assert_eq!(limit_for(6_000, 40 * MIB, floor, cap), floor);
        // Bodies kept apart: a quarter of them and the records file.
        assert_eq!(limit_for(40_000, 1024 * MIB, floor, cap), (40_000 * RECORD_BYTES + 1024 * MIB) / 4);
        // Small bodies inline: the records file is the state, and a snapshot rewrites it all,
        // so the log grows by as much first.
        assert_eq!(limit_for(400_000, 0, floor, cap), 400_000 * RECORD_BYTES);
        // A large state: the cap.
        assert_eq!(limit_for(1_000_000, 100 * 1024 * MIB, floor, cap), cap);
        // A cap below the floor cannot happen (the config refuses it) but would not panic.
        assert_eq!(limit_for(1_000_000, 100 * 1024 * MIB, floor, MIB), floor);
    }
}
