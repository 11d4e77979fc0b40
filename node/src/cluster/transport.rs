//! How a node reaches its peers' `Raft` service: every message it sends to another node
//! (openraft's RPCs, forwarded client calls, pre-votes) goes through one [`Transport`]. In a
//! server that is the peer link to the peer port (`link::Links`, with gRPC through
//! `network::Channels` where the link is not spoken); a test can put an in-process
//! transport in its place and run several whole nodes in one process, delivering, delaying
//! or dropping each message as it chooses.

use std::time::Duration;

use idemraft_proto::v1::raft_client::RaftClient;
use idemraft_proto::v1::RaftMessage;
use tonic::transport::Channel;

/// The peer service's unary methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerCall {
    /// openraft AppendEntries (also heartbeats).
    AppendEntries,
    /// openraft RequestVote.
    Vote,
    /// One chunk of openraft InstallSnapshot.
    InstallSnapshot,
    /// A client call passed on to the leader.
    Forward,
    /// A pre-vote before a campaign.
    PreVote,
}

/// Delivers peer messages.
#[tonic::async_trait]
pub trait Transport: Send + Sync + 'static {
    /// Sends `msg` to node `target` (advertised at `addr`) as a `kind` call and waits at most
    /// `ttl` for its answer. A failure is a gRPC status, as the peer port would give it:
    /// UNAVAILABLE for a node that cannot be reached, DEADLINE_EXCEEDED for no answer in time.
    async fn call(
        &self,
        target: u64,
        addr: &str,
        kind: PeerCall,
        msg: RaftMessage,
        ttl: Duration,
    ) -> Result<RaftMessage, tonic::Status>;

    /// A gRPC client on a connection of its own to `target`, for streamed snapshots; `None`
    /// when this transport has none, and snapshots then travel as InstallSnapshot chunks.
    fn bulk(&self, target: u64, addr: &str) -> Option<Result<RaftClient<Channel>, String>> {
        let _ = (target, addr);
        None
    }

    /// Whether node `target` (advertised at `addr`) is known to run a release that decodes
    /// compressed commands (decision 0030). A leader compresses only while this holds for
    /// every other member, so a node of an older release never meets an entry it cannot read.
    /// `false` when unknown.
    fn decodes_compressed(&self, target: u64, addr: &str) -> bool {
        let _ = (target, addr);
        false
    }

    /// Adds what identifies this node's cluster to a request sent on a [`Transport::bulk`]
    /// client (the transport does it itself for [`Transport::call`]).
    fn stamp(&self, metadata: &mut tonic::metadata::MetadataMap) {
        let _ = metadata;
    }
}

/// A message as an error type, for openraft's `AnyError` wrappers.
#[derive(Debug)]
pub struct StrError(pub String);

impl std::fmt::Display for StrError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StrError {}
