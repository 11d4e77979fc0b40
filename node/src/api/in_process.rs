//! An in-process peer network, for running several whole nodes in one process (the routing
//! tests, the deterministic simulator): each node's [`Link`] delivers a message by calling the
//! target's peer service directly, as the peer port would, or loses it, delays it or loses its
//! answer, as the network's [`Fate`] function decides for that message. Nothing here is used
//! by a server.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1::raft_server::Raft as _;
use idemraft_proto::v1::RaftMessage;

use crate::api::peer::PeerApi;
use crate::cluster::node::Node;
use crate::cluster::transport::{PeerCall, Transport};

/// What becomes of one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Delivered, after this delay (zero: at once).
    Deliver(Duration),
    /// Never arrives: the sender sees an unreachable peer.
    Lost,
    /// Arrives and is acted on, but its answer is lost.
    AnswerLost,
}

/// Decides each message's fate from its sender, its target and its kind.
pub type FateFn = Box<dyn FnMut(u64, u64, PeerCall) -> Fate + Send>;

/// The nodes on the network and the links that are cut.
pub struct Network {
    nodes: Mutex<BTreeMap<u64, Arc<PeerApi>>>,
    cut: Mutex<BTreeSet<(u64, u64)>>,
    fate: Mutex<FateFn>,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            nodes: Mutex::default(),
            cut: Mutex::default(),
            fate: Mutex::new(Box::new(|_, _, _| Fate::Deliver(Duration::ZERO))),
        }
    }
}

impl Network {
    /// An empty network that delivers every message at once.
    pub fn new() -> Arc<Network> {
        Arc::new(Network::default())
    }

    /// The transport of node `id` on this network.
    pub fn link(self: &Arc<Self>, id: u64) -> Arc<Link> {
        Arc::new(Link { from: id, net: self.clone() })
    }

    /// Puts `node` on the network (again, after a restart).
    pub fn attach(&self, id: u64, node: Node) {
        lock(&self.nodes).insert(id, Arc::new(PeerApi::new(node)));
    }

    /// Takes node `id` off the network: messages to it are lost, as to a stopped process.
    pub fn detach(&self, id: u64) {
        lock(&self.nodes).remove(&id);
    }

    /// Cuts the link from `from` to `to` (one way).
    pub fn cut(&self, from: u64, to: u64) {
        lock(&self.cut).insert((from, to));
    }

    /// Cuts every link between `node` and `others`, both ways.
    pub fn isolate(&self, node: u64, others: &[u64]) {
        for o in others {
            self.cut(node, *o);
            self.cut(*o, node);
        }
    }

    /// Restores every link.
    pub fn heal(&self) {
        lock(&self.cut).clear();
    }

    /// Decides the fate of every message from now on.
    pub fn set_fate(&self, fate: FateFn) {
        *lock(&self.fate) = fate;
    }

    fn reaches(&self, from: u64, to: u64) -> bool {
        !lock(&self.cut).contains(&(from, to))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One node's end of the network.
pub struct Link {
    from: u64,
    net: Arc<Network>,
}

#[tonic::async_trait]
impl Transport for Link {
    async fn call(
        &self,
        target: u64,
        _addr: &str,
        kind: PeerCall,
        msg: RaftMessage,
        ttl: Duration,
    ) -> Result<RaftMessage, tonic::Status> {
        let unreachable = |from: u64, to: u64| tonic::Status::unavailable(format!("node {to} unreachable from {from}"));
        let fate = (lock(&self.net.fate))(self.from, target, kind);
        if !self.net.reaches(self.from, target) || fate == Fate::Lost {
            return Err(unreachable(self.from, target));
        }
        if let Fate::Deliver(delay) = fate {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        let peer = lock(&self.net.nodes).get(&target).cloned().ok_or_else(|| unreachable(self.from, target))?;
        let mut req = tonic::Request::new(msg);
        req.set_timeout(ttl);
        let reply = match kind {
            PeerCall::AppendEntries => peer.append_entries(req).await,
            PeerCall::Vote => peer.vote(req).await,
            PeerCall::InstallSnapshot => peer.install_snapshot(req).await,
            PeerCall::Forward => peer.forward(req).await,
            PeerCall::PreVote => peer.pre_vote(req).await,
        }?;
        if !self.net.reaches(target, self.from) || fate == Fate::AnswerLost {
            return Err(unreachable(target, self.from));
        }
        Ok(reply.into_inner())
    }

    // Every node of an in-process network runs this build.
    fn decodes_compressed(&self, _target: u64, _addr: &str) -> bool {
        true
    }
}
