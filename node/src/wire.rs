//! What a follower hands to the leader (a client call, already checked at the edge) and what
//! comes back, plus the one bounded bincode codec used for everything that crosses the peer
//! port. The bound matters because those bytes come from the network: a forged length prefix
//! must fail to decode, not allocate.

use bincode::Options;
use idemraft_store::{ListPage, ListQuery, Op, Outcome, QuotaReport, RecordKey, RecordView};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::NodeError;

/// Largest peer message, in bytes (also the gRPC message limit of the peer port). Nothing the
/// node sends comes near it: an AppendEntries is cut at `--replication-max-bytes` (at most a
/// quarter of this) and a snapshot chunk or stream frame is 1 MiB; the bound is what a forged length prefix
/// or a misbehaving peer runs into.
pub const MAX_PEER_MESSAGE: usize = 64 * 1024 * 1024;

/// A client call as the leader executes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Request {
    /// A command for the log; the leader stamps its clock on it.
    Write(Op),
    /// Linearizable read of one record.
    Get(RecordKey),
    /// Wait for a record to leave IN_PROGRESS.
    Wait {
        /// The record.
        id: RecordKey,
        /// Longest wait, ms.
        timeout_ms: u64,
    },
    /// Linearizable listing.
    List(ListQuery),
    /// Membership as the leader knows it.
    Members,
    /// Add a learner.
    AddLearner {
        /// Node id.
        id: u64,
        /// Peer address.
        peer_addr: String,
        /// Wait for it to catch up.
        wait: bool,
    },
    /// Make learners voters.
    Promote(Vec<u64>),
    /// Remove members.
    Remove(Vec<u64>),
    /// Quotas and per-tenant record counts, linearizably; one tenant, or all. Appended last,
    /// like every new variant, so older peers' variants keep their bincode indexes.
    Quota(Option<String>),
}

/// One member, as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberInfo {
    /// Node id.
    pub id: u64,
    /// Peer address.
    pub peer_addr: String,
    /// Voter or learner.
    pub voter: bool,
}

/// The leader's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Reply {
    /// A write's outcome.
    Outcome(Outcome),
    /// A Get.
    Record(Option<RecordView>),
    /// A Wait.
    Waited {
        /// The record at the end of the wait.
        record: Option<RecordView>,
        /// Still IN_PROGRESS at the timeout.
        timed_out: bool,
    },
    /// A List page from a leader of the previous release: no byte bound, and the page is
    /// taken as full when it holds `limit` records.
    Records(Vec<RecordView>),
    /// Members and the log index of the membership.
    Members(Vec<MemberInfo>, u64),
    /// A Quota read.
    Quota(QuotaReport),
    /// A List page with its continuation, bounded in bytes (see `LIST_PAGE_BYTES`), so it
    /// fits the peer port's and the client port's message limits. Takes the place of
    /// `Records`, which a leader of the previous release still sends; appended last, like
    /// every new variant, so older peers' variants keep their bincode indexes.
    Page(ListPage),
}

/// "Would you vote for me at `term`?", asked before a campaign (see `election`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PreVote {
    /// The asking node.
    pub candidate: u64,
    /// The term it would campaign for.
    pub term: u64,
    /// Its last log id, for Raft's up-to-date rule.
    pub last_log: Option<openraft::LogId<u64>>,
}

/// The answer to a [`PreVote`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PreVoteReply {
    /// Yes.
    pub granted: bool,
    /// Why not, for the candidate's log.
    pub why: String,
}

/// The first frame of a streamed snapshot (`Raft/StreamSnapshot`): who sends it, what it
/// is, and how many bytes follow, so a stream cut short is told from a complete one.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SnapshotHeader {
    /// The sending leader's vote, checked by the receiver before and after the transfer.
    pub vote: openraft::Vote<u64>,
    /// The snapshot's openraft metadata.
    pub meta: idemraft_store::raft::SnapshotMeta,
    /// The snapshot's length in bytes.
    pub len: u64,
}

/// The receiver's answer to a streamed snapshot: its vote once the snapshot is installed (or
/// at once, when it already knows a newer leader), or the fatal error that stopped it.
pub type SnapshotReply = Result<openraft::raft::SnapshotResponse<u64>, openraft::error::Fatal<u64>>;

/// A forwarded call's result, with the leader's client address so the follower can hand it
/// to callers (who then talk to the leader directly).
#[derive(Debug, Serialize, Deserialize)]
pub struct Forwarded {
    /// The result.
    pub result: Result<Reply, NodeError>,
    /// The answering leader's advertised client address.
    pub leader_client_addr: String,
}

fn options() -> impl Options {
    // The same layout as `bincode::serialize` (fixed-width integers), plus a size bound.
    bincode::DefaultOptions::new().with_fixint_encoding().allow_trailing_bytes().with_limit(MAX_PEER_MESSAGE as u64)
}

/// Encodes a peer message.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    options().serialize(value).map_err(|e| format!("cannot encode peer message: {e}"))
}

/// The exact size [`encode`] would produce, without encoding: bincode sizes byte strings
/// from their length, so this costs a walk over the fields, not over the bytes.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, String> {
    options().serialized_size(value).map(|n| n as usize).map_err(|e| format!("cannot size peer message: {e}"))
}

/// Decodes a peer message, naming what it was meant to be.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, String> {
    options().deserialize(bytes).map_err(|e| format!("malformed {what} ({} bytes): {e}", bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_forged_lengths_are_refused() {
        assert!(decode::<Request>("request", b"\xff\xff\xff\xff").is_err());
        // A Get whose key claims 2^62 bytes: must fail, not allocate.
        let mut forged = 1u32.to_le_bytes().to_vec();
        forged.extend_from_slice(&(1u64 << 62).to_le_bytes());
        assert!(decode::<Request>("request", &forged).is_err());
    }

    #[test]
    fn round_trip() {
        let r = Request::Promote(vec![4, 5]);
        let bytes = encode(&r).unwrap_or_default();
        assert!(matches!(decode::<Request>("request", &bytes), Ok(Request::Promote(v)) if v == vec![4, 5]));
    }
}
