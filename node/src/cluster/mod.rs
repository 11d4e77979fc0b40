//! The replicated core of a node: the Raft instance over the stores, the proposer that groups
//! client commands into log entries, elections after a pre-vote, the peer network, fast reads
//! of settled claims, the expiry sweeper, snapshots by log size, the data directory's
//! identity, and restore at start. It knows nothing of the client-facing API or of how its figures are shown: it
//! reports through [`observer::ClusterObserver`].

mod compaction;
pub mod election;
pub mod fast_read;
pub mod identity;
pub mod link;
pub mod network;
pub mod node;
pub mod observer;
pub mod proposer;
pub mod restore;
mod routing;
pub mod snapshot_stream;
pub mod storage;
mod sweeper;
pub mod tasks;
pub mod transport;
