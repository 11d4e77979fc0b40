//! The openraft network: openraft's messages as bincode inside `RaftMessage`, addressed to a
//! node id so a wrong address is caught on arrival, handed to a [`Transport`] (in a server the
//! peer link, `link`); and the gRPC side of the peer port: one lazily connected tonic channel
//! per peer address for peers without the link or with peer TLS, and a second one for
//! streamed snapshots (`snapshot_stream`).
//!
//! AppendEntries are cut to a byte budget per peer. openraft 0.9 sends heartbeats and entries
//! to a follower from one task, one RPC at a time, each within the heartbeat interval: an RPC
//! that carries too much both misses that deadline (and is retried whole, so a follower far
//! behind never catches up) and holds back the heartbeats behind it until the follower starts
//! an election. A request over the budget is answered with `PayloadTooLarge` and an entries
//! hint, so openraft sends fewer; the budget halves after a timed-out RPC and grows back after
//! each one that arrives in time, so a busy follower still gets messages it can take in time.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1::raft_client::RaftClient;
use idemraft_proto::v1::RaftMessage;
use idemraft_store::TypeConfig;
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, ReplicationClosed,
    StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, SnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, Snapshot, Vote};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;

use crate::cluster::identity::IdentityHandle;
use crate::cluster::observer::ClusterObserver;
use crate::cluster::snapshot_stream::Link;
pub use crate::cluster::transport::StrError;
use crate::cluster::transport::{PeerCall, Transport};
use crate::wire::{self, MAX_PEER_MESSAGE};

/// Channels to peers, by address. Cloning shares the cache.
#[derive(Clone, Default)]
pub struct Channels {
    inner: Arc<Mutex<HashMap<String, Channel>>>,
    /// `--peer-route`: addresses to dial instead of a member's advertised one. The membership
    /// (replicated in the log) holds one address per node for everyone; a route is this node's
    /// own way to reach it (through NAT, a sidecar, or a fault-injection proxy).
    routes: Arc<BTreeMap<u64, String>>,
    /// This node's cluster id, stamped on every outgoing request (see `identity`).
    identity: Option<IdentityHandle>,
    /// Mutual TLS towards peers (`--peer-tls-*`); `None`: plaintext.
    tls: Option<Arc<crate::security::tls::PeerTls>>,
}

impl Channels {
    /// A cache that dials `routes[id]` instead of a member's advertised address.
    pub fn with_routes(routes: BTreeMap<u64, String>) -> Channels {
        Channels { inner: Arc::default(), routes: Arc::new(routes), identity: None, tls: None }
    }

    /// The same cache, stamping `identity`'s cluster id on every request it sends.
    pub fn with_identity(mut self, identity: IdentityHandle) -> Channels {
        self.identity = Some(identity);
        self
    }

    /// The same cache, dialling with mutual TLS when `tls` is set.
    pub fn with_tls(self, tls: Option<crate::security::tls::PeerTls>) -> Channels {
        Channels { tls: tls.map(Arc::new), ..self }
    }

    /// Whether peers are dialled with mutual TLS.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Where node `id`, advertised at `addr`, is dialled: its `--peer-route`, or `addr`.
    pub fn dial_addr(&self, id: u64, addr: &str) -> String {
        self.routes.get(&id).cloned().unwrap_or_else(|| addr.to_string())
    }

    /// This node's cluster id, if it has one yet.
    pub fn cluster_id(&self) -> Option<String> {
        self.identity.as_ref().and_then(IdentityHandle::cluster_id)
    }

    /// A client for node `id`, advertised at `addr`, reusing the channel when there is one.
    /// Never connects eagerly: openraft asks for clients of nodes that may be down.
    pub fn client(&self, id: u64, addr: &str) -> Result<RaftClient<Channel>, String> {
        self.client_on(id, addr, Lane::Raft)
    }

    /// A client for node `id` on `lane`'s connection.
    pub fn client_on(&self, id: u64, addr: &str, lane: Lane) -> Result<RaftClient<Channel>, String> {
        let advertised = addr;
        let addr = self.dial_addr(id, addr);
        let key = match lane {
            Lane::Raft => addr.clone(),
            Lane::Bulk => format!("{addr} (bulk)"),
        };
        let mut map = self.inner.lock().map_err(|_| "peer channel cache poisoned".to_string())?;
        let channel = match map.get(&key) {
            Some(c) => c.clone(),
            None => {
                let endpoint = crate::security::tls::peer_endpoint(&addr, advertised, self.tls.as_deref())?
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5));
                let c = endpoint.connect_lazy();
                map.insert(key, c.clone());
                c
            }
        };
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE))
    }
}

#[tonic::async_trait]
impl Transport for Channels {
    async fn call(
        &self,
        target: u64,
        addr: &str,
        kind: PeerCall,
        msg: RaftMessage,
        ttl: Duration,
    ) -> Result<RaftMessage, tonic::Status> {
        let mut client = self.client(target, addr).map_err(tonic::Status::unavailable)?;
        let mut request = tonic::Request::new(msg);
        request.set_timeout(ttl);
        Transport::stamp(self, request.metadata_mut());
        let reply = match kind {
            PeerCall::AppendEntries => client.append_entries(request).await,
            PeerCall::Vote => client.vote(request).await,
            PeerCall::InstallSnapshot => client.install_snapshot(request).await,
            PeerCall::Forward => client.forward(request).await,
            PeerCall::PreVote => client.pre_vote(request).await,
        };
        reply.map(tonic::Response::into_inner)
    }

    fn bulk(&self, target: u64, addr: &str) -> Option<Result<RaftClient<Channel>, String>> {
        Some(self.client_on(target, addr, Lane::Bulk))
    }

    fn stamp(&self, metadata: &mut tonic::metadata::MetadataMap) {
        if let Some(id) = &self.identity {
            id.stamp(metadata);
        }
    }
}

/// Which connection to a peer a message takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Heartbeats, AppendEntries, votes and forwarded calls: small, and due in milliseconds.
    Raft,
    /// Streamed snapshots: gigabytes, which must not hold back the other lane on a shared
    /// TCP connection and HTTP/2 window.
    Bulk,
}

/// Builds one [`PeerNetwork`] per target for openraft.
#[derive(Clone)]
pub struct Network {
    /// This node's id (for timeout reports).
    pub id: u64,
    /// How messages reach the peers.
    pub transport: Arc<dyn Transport>,
    /// Most bytes one AppendEntries may carry (`--replication-max-bytes`).
    pub replication_max_bytes: usize,
    /// Bytes per second of one snapshot stream (`--snapshot-rate`); 0: unbounded.
    pub snapshot_rate: u64,
    /// Told of every AppendEntries that timed out or was cut to the byte budget.
    pub observer: Arc<dyn ClusterObserver>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerNetwork {
        PeerNetwork {
            id: self.id,
            target,
            addr: node.addr.clone(),
            transport: self.transport.clone(),
            budget: ReplicationBudget::new(self.replication_max_bytes),
            snapshot_rate: self.snapshot_rate,
            observer: self.observer.clone(),
        }
    }
}

/// The connection to one peer.
pub struct PeerNetwork {
    id: u64,
    target: u64,
    addr: String,
    transport: Arc<dyn Transport>,
    budget: ReplicationBudget,
    snapshot_rate: u64,
    observer: Arc<dyn ClusterObserver>,
}

/// Bytes the next AppendEntries to one peer may carry: the configured bound while RPCs arrive
/// in time, halved after each one that timed out (never below [`ReplicationBudget::FLOOR`], and
/// one entry always goes even when it alone is larger), doubled back after each success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationBudget {
    max: usize,
    current: usize,
}

impl ReplicationBudget {
    /// The smallest budget a run of timeouts shrinks to.
    pub const FLOOR: usize = 64 * 1024;

    /// A budget that starts at `max`.
    pub fn new(max: usize) -> ReplicationBudget {
        ReplicationBudget { max, current: max }
    }

    /// The bytes the next RPC may carry.
    pub fn bytes(&self) -> usize {
        self.current
    }

    /// An RPC of `sent` bytes did not come back in time.
    pub fn timed_out(&mut self, sent: usize) {
        self.current = (sent.min(self.current) / 2).max(Self::FLOOR.min(self.max));
    }

    /// An RPC carrying entries came back in time.
    pub fn arrived(&mut self) {
        self.current = self.current.saturating_mul(2).min(self.max);
    }
}

/// The room an AppendEntries needs besides its entries (vote, log ids, framing), rounded up.
const APPEND_HEADER_BYTES: usize = 256;

/// How many of the leading entries, of these encoded sizes, fit in `budget` bytes; at least
/// one, so an entry larger than the budget still travels (alone).
pub fn entries_within(sizes: impl IntoIterator<Item = usize>, budget: usize) -> usize {
    let room = budget.saturating_sub(APPEND_HEADER_BYTES);
    let mut used = 0usize;
    let mut n = 0usize;
    for size in sizes {
        used = used.saturating_add(size);
        if n > 0 && used > room {
            break;
        }
        n += 1;
    }
    n.max(1)
}

type RpcErr<E = openraft::error::Infallible> = RPCError<u64, BasicNode, RaftError<u64, E>>;

impl PeerNetwork {
    async fn call<Req, Resp, E>(&self, kind: RPCTypes, req: &Req, ttl: Duration) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let payload = wire::encode(req).map_err(|e| RPCError::Network(NetworkError::new(&StrError(e))))?;
        let kind_call = match kind {
            RPCTypes::AppendEntries => PeerCall::AppendEntries,
            RPCTypes::Vote => PeerCall::Vote,
            RPCTypes::InstallSnapshot => PeerCall::InstallSnapshot,
        };
        let call =
            self.transport.call(self.target, &self.addr, kind_call, RaftMessage { target: self.target, payload }, ttl);
        let reply = match tokio::time::timeout(ttl, call).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout { action: kind, id: self.id, target: self.target, timeout: ttl }))
            }
            Ok(Err(status)) => return Err(status_to_rpc_error(self, kind, ttl, &status)),
            Ok(Ok(r)) => r,
        };
        let decoded: Result<Resp, RaftError<u64, E>> = wire::decode("Raft RPC reply", &reply.payload)
            .map_err(|e| RPCError::Network(NetworkError::new(&StrError(e))))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn status_to_rpc_error<E: std::error::Error>(
    peer: &PeerNetwork,
    kind: RPCTypes,
    ttl: Duration,
    status: &tonic::Status,
) -> RpcErr<E> {
    let err = StrError(format!("peer {} at {}: {}", peer.target, peer.addr, status.message()));
    match status.code() {
        // A refused or reset connection: openraft backs off instead of retrying hot.
        tonic::Code::Unavailable | tonic::Code::Unknown => RPCError::Unreachable(Unreachable::new(&err)),
        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
            RPCError::Timeout(Timeout { action: kind, id: peer.id, target: peer.target, timeout: ttl })
        }
        _ => RPCError::Network(NetworkError::new(&err)),
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcErr> {
        // A heartbeat or a bare commit index has nothing to send in smaller pieces: it is
        // never cut and leaves the budget alone.
        let carries = !rpc.entries.is_empty();
        // A size the encoding cannot even state is over every budget.
        let size = if carries { wire::encoded_len(&rpc).unwrap_or(usize::MAX) } else { 0 };
        let budget = self.budget.bytes();
        if size > budget && rpc.entries.len() > 1 {
            let fit = entries_within(rpc.entries.iter().map(|e| wire::encoded_len(e).unwrap_or(usize::MAX)), budget);
            if fit < rpc.entries.len() {
                tracing::debug!(
                    target = self.target,
                    entries = rpc.entries.len(),
                    bytes = size,
                    budget,
                    fit,
                    "AppendEntries over the byte budget; asking openraft for fewer entries"
                );
                self.observer.append_cut();
                return Err(RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(fit as u64)));
            }
        }
        let reply = self.call(RPCTypes::AppendEntries, &rpc, option.soft_ttl()).await;
        match &reply {
            Err(RPCError::Timeout(_)) => {
                self.observer.append_timed_out();
                if carries {
                    self.budget.timed_out(size);
                    tracing::debug!(
                        target = self.target,
                        bytes = size,
                        budget = self.budget.bytes(),
                        "AppendEntries timed out; smaller ones next"
                    );
                }
            }
            Ok(_) if carries => self.budget.arrived(),
            _ => {}
        }
        reply
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> Result<VoteResponse<u64>, RpcErr> {
        self.call(RPCTypes::Vote, &rpc, option.soft_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcErr<InstallSnapshotError>> {
        self.call(RPCTypes::InstallSnapshot, &rpc, option.soft_ttl()).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote<u64>,
        snapshot: Snapshot<TypeConfig>,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<u64>, StreamingError<TypeConfig, Fatal<u64>>> {
        let link = Link {
            id: self.id,
            target: self.target,
            addr: self.addr.clone(),
            rate: self.snapshot_rate,
            transport: self.transport.clone(),
        };
        crate::cluster::snapshot_stream::send(self, link, vote, snapshot, cancel, option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_cut_at_the_budget_but_one_always_goes() {
        let kib = 1024;
        assert_eq!(entries_within([300 * kib; 10], 1024 * kib), 3);
        assert_eq!(entries_within([2048 * kib, 10], 1024 * kib), 1, "an oversize first entry travels alone");
        assert_eq!(entries_within([10; 5], 1024 * kib), 5);
        assert_eq!(entries_within(std::iter::empty(), 1024 * kib), 1);
        assert_eq!(entries_within([usize::MAX, usize::MAX], 1024 * kib), 1, "no overflow");
    }

    #[test]
    fn the_budget_halves_on_timeouts_and_grows_back() {
        let mut b = ReplicationBudget::new(4 << 20);
        b.timed_out(4 << 20);
        assert_eq!(b.bytes(), 2 << 20);
        b.timed_out(3 << 20);
        assert_eq!(b.bytes(), 1 << 20, "halves what was in force when the sent RPC was larger");
        for _ in 0..20 {
            b.timed_out(1);
        }
        assert_eq!(b.bytes(), ReplicationBudget::FLOOR);
        for _ in 0..20 {
            b.arrived();
        }
        assert_eq!(b.bytes(), 4 << 20, "never above the configured bound");
        let mut tiny = ReplicationBudget::new(1000);
        tiny.timed_out(1000);
        assert_eq!(tiny.bytes(), 1000, "the floor never lifts a budget above its bound");
    }
}
