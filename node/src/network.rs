//! The openraft network over gRPC: one lazily connected tonic channel per peer address,
//! shared by Raft RPCs and forwarded client calls. openraft's messages travel as bincode
//! inside `RaftMessage`, addressed to a node id so a wrong address is caught on arrival.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1::raft_client::RaftClient;
use idemraft_proto::v1::RaftMessage;
use idemraft_store::TypeConfig;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable};
use openraft::network::{RPCOption, RPCTypes, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::Channel;

use crate::identity::IdentityHandle;
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
    tls: Option<Arc<crate::tls::PeerTls>>,
}

impl Channels {
    /// A cache that dials `routes[id]` instead of a member's advertised address.
    pub fn with_routes(routes: BTreeMap<u64, String>) -> Channels {
        Channels { inner: Arc::default(), routes: Arc::new(routes), identity: None, tls: None }
    }

    /// The same cache, stamping `identity`'s cluster id on every request made through
    /// [`Channels::stamp`].
    pub fn with_identity(mut self, identity: IdentityHandle) -> Channels {
        self.identity = Some(identity);
        self
    }

    /// Adds this node's cluster id to an outgoing peer request, once it has one.
    pub fn stamp<T>(&self, request: &mut tonic::Request<T>) {
        if let Some(id) = &self.identity {
            id.stamp(request.metadata_mut());
        }
    }

    /// The same cache, dialling with mutual TLS when `tls` is set.
    pub fn with_tls(self, tls: Option<crate::tls::PeerTls>) -> Channels {
        Channels { tls: tls.map(Arc::new), ..self }
    }

    /// A client for node `id`, advertised at `addr`, reusing the channel when there is one.
    /// Never connects eagerly: openraft asks for clients of nodes that may be down.
    pub fn client(&self, id: u64, addr: &str) -> Result<RaftClient<Channel>, String> {
        let advertised = addr;
        let addr = self.routes.get(&id).map(String::as_str).unwrap_or(addr);
        let mut map = self.inner.lock().map_err(|_| "peer channel cache poisoned".to_string())?;
        let channel = match map.get(addr) {
            Some(c) => c.clone(),
            None => {
                let endpoint = crate::tls::peer_endpoint(addr, advertised, self.tls.as_deref())?
                    .connect_timeout(Duration::from_millis(500))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5));
                let c = endpoint.connect_lazy();
                map.insert(addr.to_string(), c.clone());
                c
            }
        };
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE))
    }
}

/// Builds one [`PeerNetwork`] per target for openraft.
#[derive(Clone)]
pub struct Network {
    /// This node's id (for timeout reports).
    pub id: u64,
    /// Shared channels.
    pub channels: Channels,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerNetwork {
        PeerNetwork { id: self.id, target, addr: node.addr.clone(), channels: self.channels.clone() }
    }
}

/// The connection to one peer.
pub struct PeerNetwork {
    id: u64,
    target: u64,
    addr: String,
    channels: Channels,
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
        let mut client = self
            .channels
            .client(self.target, &self.addr)
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&StrError(e))))?;
        let mut request = tonic::Request::new(RaftMessage { target: self.target, payload });
        request.set_timeout(ttl);
        self.channels.stamp(&mut request);
        let call = async {
            match kind {
                RPCTypes::AppendEntries => client.append_entries(request).await,
                RPCTypes::Vote => client.vote(request).await,
                RPCTypes::InstallSnapshot => client.install_snapshot(request).await,
            }
        };
        let reply = match tokio::time::timeout(ttl, call).await {
            Err(_) => {
                return Err(RPCError::Timeout(Timeout { action: kind, id: self.id, target: self.target, timeout: ttl }))
            }
            Ok(Err(status)) => return Err(status_to_rpc_error(self, kind, ttl, &status)),
            Ok(Ok(r)) => r.into_inner(),
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
        self.call(RPCTypes::AppendEntries, &rpc, option.soft_ttl()).await
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
