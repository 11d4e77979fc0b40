//! Disk faults: switches that make fsync or write answer `EIO`, and a delay before every
//! fsync, with counters that show a harness the faults actually fired.
//!
//! They live outside the layer's lock: FUSE handlers read them with one atomic load, and a
//! delayed fsync waits on them without holding the layer, so the control socket and a power
//! loss stay responsive while fsyncs wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// The fault switches and counters of one mount, shared by its handle, its FUSE handlers and
/// its control socket.
#[derive(Debug, Default)]
pub struct Faults {
    fail_fsync: AtomicBool,
    fail_write: AtomicBool,
    /// Nanoseconds; 0 is off.
    fsync_delay_ns: AtomicU64,
    failed_fsyncs: AtomicU64,
    failed_writes: AtomicU64,
    delayed_fsyncs: AtomicU64,
    /// Set when the mount goes away: fsyncs still waiting give up rather than hold it up.
    closed: AtomicBool,
    /// Waiting fsyncs sleep on `changed` so that lowering the delay releases them early; the
    /// mutex guards nothing but makes a change and its wake-up atomic for a waiter.
    wake: Mutex<()>,
    changed: Condvar,
}

/// How often each fault fired since the mount.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// fsync/fdatasync calls (of files and directories, including the sync of an `O_SYNC`
    /// write) answered `EIO` because `fail fsync` was on.
    pub failed_fsyncs: u64,
    /// write calls answered `EIO` because `fail write` was on.
    pub failed_writes: u64,
    /// fsync/fdatasync calls that arrived while a delay was set and so waited.
    pub delayed_fsyncs: u64,
}

/// What is switched on, for reporting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ActiveFaults {
    /// fsync answers `EIO`.
    pub fail_fsync: bool,
    /// write answers `EIO`.
    pub fail_write: bool,
    /// Wait before every fsync; zero is off.
    pub fsync_delay: Duration,
}

impl Faults {
    /// No faults.
    pub fn new() -> Faults {
        Faults::default()
    }

    /// While on, fsync and fdatasync answer `EIO` and make nothing durable.
    pub fn set_fail_fsync(&self, on: bool) {
        self.fail_fsync.store(on, Ordering::SeqCst);
    }

    /// While on, write answers `EIO` and changes nothing.
    pub fn set_fail_write(&self, on: bool) {
        self.fail_write.store(on, Ordering::SeqCst);
    }

    /// Sets the wait before every fsync (zero turns it off). Fsyncs already waiting go ahead
    /// once the new delay has passed since they arrived, so lowering it releases them.
    pub fn set_fsync_delay(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.fsync_delay_ns.store(ns, Ordering::SeqCst);
        self.wake_waiters();
    }

    /// Turns every fault off; fsyncs still waiting go ahead at once.
    pub fn clear(&self) {
        self.set_fail_fsync(false);
        self.set_fail_write(false);
        self.set_fsync_delay(Duration::ZERO);
    }

    /// What is switched on now.
    pub fn active(&self) -> ActiveFaults {
        ActiveFaults { fail_fsync: self.fail_fsync(), fail_write: self.fail_write(), fsync_delay: self.fsync_delay() }
    }

    /// Counters since the mount.
    pub fn stats(&self) -> FaultStats {
        FaultStats {
            failed_fsyncs: self.failed_fsyncs.load(Ordering::SeqCst),
            failed_writes: self.failed_writes.load(Ordering::SeqCst),
            delayed_fsyncs: self.delayed_fsyncs.load(Ordering::SeqCst),
        }
    }

    pub(crate) fn fail_fsync(&self) -> bool {
        self.fail_fsync.load(Ordering::SeqCst)
    }

    pub(crate) fn fail_write(&self) -> bool {
        self.fail_write.load(Ordering::SeqCst)
    }

    pub(crate) fn fsync_delay(&self) -> Duration {
        Duration::from_nanos(self.fsync_delay_ns.load(Ordering::SeqCst))
    }

    pub(crate) fn count_failed_fsync(&self) {
        self.failed_fsyncs.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn count_failed_write(&self) {
        self.failed_writes.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn count_delayed_fsync(&self) {
        self.delayed_fsyncs.fetch_add(1, Ordering::SeqCst);
    }

    /// Blocks until the delay set now has passed since `arrived`. False when the mount is
    /// going away, in which case the fsync must not be carried out.
    pub(crate) fn wait_delay(&self, arrived: Instant) -> bool {
        let mut guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return false;
            }
            let delay = self.fsync_delay();
            let waited = arrived.elapsed();
            if waited >= delay {
                return true;
            }
            guard = match self.changed.wait_timeout(guard, delay - waited) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// The mount is going away: waiting fsyncs give up (unmounting flushes nothing), and
    /// later ones give up at once.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake_waiters();
    }

    fn wake_waiters(&self) {
        // Taking the lock orders this after any waiter's check, so none misses the change.
        let _guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        self.changed.notify_all();
    }
}
