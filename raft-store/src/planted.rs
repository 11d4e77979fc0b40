//! Deliberately planted bugs, off unless a node is started with `--unsafe-planted-bugs`.
//!
//! The fault harness (`idemraft-jepsen`) must prove that its checkers would notice if Idemraft
//! broke a promise. The only convincing proof is to break the promise for real, in the real
//! binary, and watch the checker catch it; etcd's robustness suite keeps the same discipline.
//! Each bug below is a one-line deviation at the exact place the correct rule lives.
//!
//! The switch is process-wide and set once at start-up because the state machine is a pure
//! function with no configuration handle of its own; threading a test-only knob through every
//! store and snapshot path would add more risk than it removes. Nothing in the project sets it
//! except the node's option parser, which refuses unknown names and logs every planted bug
//! loudly.

use std::sync::atomic::{AtomicU32, Ordering};

/// One planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bug {
    /// Complete, Fail, ExtendLease and Checkpoint accept any token (no fencing).
    SkipTokenCheck,
    /// The state machine judges leases and expiry by the applying node's wall clock instead of
    /// the time stamped in the log, so replicas decide differently.
    LocalClock,
    /// A live lease never blocks a takeover.
    IgnoreLeases,
    /// Get, Wait and List answer from this node's local state without a read-index round and
    /// without forwarding to the leader.
    StaleLocalReads,
    /// Leases are judged 400 ms short: a takeover can come while the owner's lease still runs.
    EarlyLeaseExpiry,
    /// A claim retried by the owner of an in-progress record is granted a new token and
    /// attempt instead of getting its own grant back, fencing out the very worker that asked.
    RetryNewToken,
    /// The log store answers an append as durable without fsyncing it.
    AckBeforeFsync,
    /// A rename or create is never made durable by fsyncing its directory.
    SkipDirFsync,
    /// A built snapshot file is put in place (and the log purged behind it)
    /// without fsyncing its content.
    UnsyncedSnapshot,
    /// A claim on a completed record past its expiry replays the stored response instead of
    /// treating the key as new (only until the sweeper deletes the record).
    ReplayExpired,
}

impl Bug {
    /// Every bug, in a fixed order.
    pub const ALL: [Bug; 10] = [
        Bug::SkipTokenCheck,
        Bug::LocalClock,
        Bug::IgnoreLeases,
        Bug::StaleLocalReads,
        Bug::EarlyLeaseExpiry,
        Bug::RetryNewToken,
        Bug::AckBeforeFsync,
        Bug::SkipDirFsync,
        Bug::UnsyncedSnapshot,
        Bug::ReplayExpired,
    ];

    /// The name the option takes.
    pub fn name(self) -> &'static str {
        match self {
            Bug::SkipTokenCheck => "skip-token-check",
            Bug::LocalClock => "local-clock",
            Bug::IgnoreLeases => "ignore-leases",
            Bug::StaleLocalReads => "stale-local-reads",
            Bug::EarlyLeaseExpiry => "early-lease-expiry",
            Bug::RetryNewToken => "retry-new-token",
            Bug::AckBeforeFsync => "ack-before-fsync",
            Bug::SkipDirFsync => "skip-dir-fsync",
            Bug::UnsyncedSnapshot => "unsynced-snapshot",
            Bug::ReplayExpired => "replay-expired",
        }
    }

    /// The bug of that name.
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

static ACTIVE: AtomicU32 = AtomicU32::new(0);

/// Switches the given bugs on for the rest of the process.
pub fn plant(bugs: &[Bug]) {
    let bits = bugs.iter().fold(0, |acc, b| acc | b.bit());
    ACTIVE.fetch_or(bits, Ordering::SeqCst);
}

/// Whether `bug` is switched on.
#[inline]
pub fn active(bug: Bug) -> bool {
    ACTIVE.load(Ordering::Relaxed) & bug.bit() != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for b in Bug::ALL {
            assert_eq!(Bug::from_name(b.name()), Some(b));
        }
        assert_eq!(Bug::from_name("no-such-bug"), None);
    }
}
