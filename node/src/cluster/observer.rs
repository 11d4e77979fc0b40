//! What the cluster layer reports while it works, as a trait it calls: the metrics that
//! render these figures live in `crate::ops`, above this layer, so the cluster never imports
//! them (the same seam the store offers with `LogObserver`). A node started without metrics
//! (a test, a simulation) passes [`Unobserved`].

use idemraft_store::LogObserver;

/// Receives the cluster layer's events. Every method must be cheap and must not block: they
/// are called on the write path.
pub trait ClusterObserver: LogObserver + Send + Sync + 'static {
    /// The proposer proposed one log entry carrying `commands` client commands.
    fn batch_proposed(&self, commands: usize);
    /// A sweep deleted `deleted` expired records.
    fn swept(&self, deleted: u32);
    /// A settled claim was answered on the fast path, confirmed by `via` ("lease" or
    /// "read_index").
    fn replay_confirmed(&self, via: &'static str);
    /// An AppendEntries to a peer timed out (a heartbeat included); when it carried entries,
    /// that peer's byte budget halved.
    fn append_timed_out(&self);
    /// An AppendEntries over a peer's byte budget was sent back to openraft to carry fewer
    /// entries.
    fn append_cut(&self);
    /// The leader compressed a command whose encoding was `raw` bytes into `stored` bytes.
    fn command_compressed(&self, raw: usize, stored: usize);
}

/// An observer that records nothing.
pub struct Unobserved;

impl LogObserver for Unobserved {}

impl ClusterObserver for Unobserved {
    fn batch_proposed(&self, _commands: usize) {}
    fn swept(&self, _deleted: u32) {}
    fn replay_confirmed(&self, _via: &'static str) {}
    fn append_timed_out(&self) {}
    fn append_cut(&self) {}
    fn command_compressed(&self, _raw: usize, _stored: usize) {}
}
