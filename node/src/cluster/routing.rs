//! Routing of every call: executed here when this node leads, otherwise forwarded to the
//! leader over the peer port (a caller may talk to any node); writes go through the proposer,
//! reads through a linearizable check, settled claims through the fast path, membership
//! changes through openraft.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use idemraft_proto::v1::RaftMessage;
use idemraft_store::planted::{self, Bug};
use idemraft_store::{Op, Outcome, RecordState};
use openraft::error::{CheckIsLeaderError, ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use tokio::time::Instant;

use crate::cluster::transport::PeerCall;
use crate::error::NodeError;
use crate::wire::{self, Forwarded, Reply, Request};

use super::node::{internal, member_list, Node, REPLY_MARGIN};

impl Node {
    /// Executes a call wherever the leader is, within `deadline`.
    pub async fn call(&self, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        if self.inner.stopping.load(Ordering::Acquire) {
            return Err(NodeError::ShuttingDown);
        }
        if planted::active(Bug::StaleLocalReads)
            && matches!(req, Request::Get(_) | Request::List(_) | Request::Wait { .. })
        {
            return self.local(req, deadline).await;
        }
        // Bounded: one look for a leader, one retry after leadership moved under the call.
        for _ in 0..3 {
            let (leader, peer_addr) = self.leader();
            match leader {
                Some(l) if l == self.inner.config.id => match self.local(req.clone(), deadline).await {
                    Err(NodeError::NoLeader { .. }) if Instant::now() + REPLY_MARGIN < deadline => continue,
                    other => return other,
                },
                Some(l) => {
                    let Some(addr) = peer_addr else {
                        return Err(self.no_leader(format!("leader {l} is not in this node's membership")));
                    };
                    return self.forward(l, &addr, req, deadline).await;
                }
                None => {
                    let wait = deadline.saturating_duration_since(Instant::now()).saturating_sub(REPLY_MARGIN);
                    let wait = wait.min(self.inner.config.election_timeout.1 * 3);
                    let found = self
                        .inner
                        .raft
                        .wait(Some(wait))
                        .metrics(|m| m.current_leader.is_some(), "a leader to be known")
                        .await;
                    if found.is_err() {
                        return Err(self.no_leader("no leader is elected (is a majority of nodes up?)".into()));
                    }
                }
            }
        }
        Err(self.no_leader("leadership kept moving while the call was routed".into()))
    }

    fn no_leader(&self, why: String) -> NodeError {
        let (leader_id, _) = self.leader();
        NodeError::NoLeader { why, leader_id, leader_addr: self.cached_leader_addr(leader_id) }
    }

    async fn forward(&self, leader: u64, addr: &str, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        let payload = wire::encode(&req).map_err(NodeError::Internal)?;
        let ttl = deadline.saturating_duration_since(Instant::now()).saturating_sub(REPLY_MARGIN);
        if ttl.is_zero() {
            return Err(NodeError::Deadline("before the call could be forwarded to the leader".into()));
        }
        let msg = RaftMessage { target: leader, payload };
        let call = self.inner.transport.call(leader, addr, PeerCall::Forward, msg, ttl);
        // A leader that stopped answering (paused, cut off) holds the call until its deadline,
        // while the rest of the cluster elects another. Once this node's view of the leader
        // moves on, the caller is better off retrying now, where the new leader is, than
        // waiting out its attempt: an answer the old leader may still send could only be one
        // it committed, which the retry meets as its own earlier effect (the caller is told
        // the outcome is unknown, as after a timeout).
        let answered = tokio::select! {
            r = tokio::time::timeout(ttl, call) => r,
            next = self.leadership_leaves(leader) => {
                return Err(NodeError::NoLeader {
                    why: format!("leader {leader} at {addr} stopped leading while the call was forwarded to it"),
                    leader_id: next,
                    leader_addr: self.cached_leader_addr(next),
                });
            }
        };
        let reply = match answered {
            Err(_) => return Err(NodeError::Deadline(format!("while forwarded to leader {leader}"))),
            Ok(Err(status)) if status.code() == tonic::Code::DeadlineExceeded => {
                return Err(NodeError::Deadline(format!("while forwarded to leader {leader}")))
            }
            Ok(Err(status)) => {
                // Never point the caller back at the leader that just failed to answer (a
                // paused or cut-off leader would hold its next attempt too): name the node
                // that leads now if leadership has moved meanwhile, else none, so the
                // caller tries another node.
                let now = self.leader().0.filter(|l| *l != leader);
                return Err(NodeError::NoLeader {
                    why: format!("leader {leader} at {addr} did not take the call: {}", status.message()),
                    leader_id: Some(leader),
                    leader_addr: now.and_then(|l| self.cached_leader_addr(Some(l))),
                });
            }
            Ok(Ok(r)) => r,
        };
        let forwarded: Forwarded = wire::decode("forwarded reply", &reply.payload).map_err(NodeError::Internal)?;
        if let Ok(mut cache) = self.inner.leader_client_addr.lock() {
            *cache = Some((leader, forwarded.leader_client_addr.clone()));
        }
        match forwarded.result {
            Err(NodeError::NoLeader { why, leader_id, .. }) => {
                Err(NodeError::NoLeader { why, leader_id, leader_addr: self.cached_leader_addr(leader_id) })
            }
            other => other,
        }
    }

    /// Resolves once this node no longer takes `leader` to lead, with the leader it knows
    /// then, if any. Watches the server metrics, which change with votes and leaders only.
    async fn leadership_leaves(&self, leader: u64) -> Option<u64> {
        let mut rx = self.inner.raft.server_metrics();
        loop {
            let now = rx.borrow_and_update().current_leader;
            if now != Some(leader) {
                return now;
            }
            if rx.changed().await.is_err() {
                // Raft stopped: the call's own deadline ends the forward.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Serves a call that a follower forwarded: here only, never forwarded again (so a call
    /// cannot loop between two nodes that disagree about the leader).
    pub async fn serve_forwarded(&self, req: Request, deadline: Instant) -> Forwarded {
        let result = if self.leader().0 == Some(self.inner.config.id) {
            self.local(req, deadline).await
        } else {
            Err(self.no_leader("the node a call was forwarded to is no longer the leader".into()))
        };
        Forwarded { result, leader_client_addr: self.inner.config.advertise_client_addr.clone() }
    }

    async fn local(&self, req: Request, deadline: Instant) -> Result<Reply, NodeError> {
        let until = deadline.checked_sub(REPLY_MARGIN).unwrap_or(deadline);
        // A leader cut off from its majority says so at once instead of holding the call
        // until its deadline: the caller can try elsewhere (a new leader may exist already).
        if let Some(e) = self.lost_quorum() {
            return Err(e);
        }
        match req {
            Request::Write(op) => {
                if let Some(o) = self.fast_answer(&op, until).await {
                    return Ok(Reply::Outcome(o));
                }
                match tokio::time::timeout_at(until, self.inner.proposer.submit(op)).await {
                    Err(_) => Err(self.write_deadline()),
                    Ok(Err(e)) => Err(e),
                    Ok(Ok(Outcome::Invalid(e))) => Err(NodeError::Invalid(e)),
                    Ok(Ok(o)) => Ok(Reply::Outcome(o)),
                }
            }
            Request::Get(id) => {
                self.linearize(until).await?;
                Ok(Reply::Record(self.inner.sm.get(&id).await.map_err(internal)?))
            }
            Request::List(q) => {
                self.linearize(until).await?;
                Ok(Reply::Page(self.inner.sm.list(&q).await.map_err(internal)?))
            }
            Request::Wait { id, timeout_ms } => {
                let end = until.min(Instant::now() + Duration::from_millis(timeout_ms));
                self.linearize(until).await?;
                // After the read index, local reads only see newer states: a record seen
                // settled here has settled in the committed log.
                // The applied index is what can settle the record; the data metrics change
                // with it (the full metrics change after every turn of the Raft core).
                let mut changes = self.inner.raft.data_metrics();
                loop {
                    let record = self.inner.sm.get(&id).await.map_err(internal)?;
                    let pending = record.as_ref().is_some_and(|r| r.record.state == RecordState::InProgress);
                    if !pending || Instant::now() >= end {
                        return Ok(Reply::Waited { record, timed_out: pending });
                    }
                    let tick = (Instant::now() + Duration::from_millis(50)).min(end);
                    tokio::select! {
                        _ = changes.changed() => {}
                        _ = tokio::time::sleep_until(tick) => {}
                    }
                }
            }
            Request::Quota(tenant) => {
                self.linearize(until).await?;
                Ok(Reply::Quota(self.inner.sm.quota_report(tenant.as_deref()).await))
            }
            Request::Members => Ok(self.members()),
            Request::AddLearner { id, peer_addr, wait } => {
                let r =
                    tokio::time::timeout_at(until, self.inner.raft.add_learner(id, BasicNode::new(peer_addr), wait))
                        .await
                        .map_err(|_| NodeError::Deadline("while adding the learner".into()))?;
                r.map_err(|e| self.membership_error(e))?;
                Ok(self.members())
            }
            Request::Promote(ids) => {
                let change = ChangeMembers::AddVoterIds(ids.into_iter().collect());
                self.change_membership(change, until).await
            }
            Request::Remove(ids) => {
                let (voters, learners) = {
                    let m = self.inner.raft.metrics();
                    let m = m.borrow();
                    let voter_ids: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
                    let (v, l): (BTreeSet<u64>, BTreeSet<u64>) = ids.into_iter().partition(|i| voter_ids.contains(i));
                    (v, l)
                };
                if voters.contains(&self.inner.config.id) {
                    tracing::info!("removing the leader itself; a new leader will be elected");
                }
                let mut reply = self.members();
                if !voters.is_empty() {
                    reply = self.change_membership(ChangeMembers::RemoveVoters(voters), until).await?;
                }
                if !learners.is_empty() {
                    reply = self.change_membership(ChangeMembers::RemoveNodes(learners), until).await?;
                }
                Ok(reply)
            }
        }
    }

    /// A settled claim's answer by read index, when the fast path is on and may answer.
    async fn fast_answer(&self, op: &Op, until: Instant) -> Option<Outcome> {
        self.inner.fast_read.as_ref()?.answer(op, until).await
    }

    async fn change_membership(
        &self,
        change: ChangeMembers<u64, BasicNode>,
        until: Instant,
    ) -> Result<Reply, NodeError> {
        let r = tokio::time::timeout_at(until, self.inner.raft.change_membership(change, false))
            .await
            .map_err(|_| NodeError::Deadline("while changing the membership".into()))?;
        r.map_err(|e| self.membership_error(e))?;
        Ok(self.members())
    }

    fn membership_error(&self, e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> NodeError {
        match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => NodeError::NoLeader {
                why: "leadership moved during the membership change".into(),
                leader_id: f.leader_id,
                leader_addr: self.cached_leader_addr(f.leader_id),
            },
            RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => NodeError::Precondition(c.to_string()),
            RaftError::Fatal(f) => NodeError::Internal(f.to_string()),
        }
    }

    fn members(&self) -> Reply {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        let (list, index) = member_list(&m);
        Reply::Members(list, index)
    }

    /// A write whose deadline passed: without a recent quorum it is the cluster that is
    /// unavailable; with one, the write was merely slow.
    fn write_deadline(&self) -> NodeError {
        let m = self.inner.raft.metrics();
        let quorum_ms = m.borrow().millis_since_quorum_ack;
        let bound = self.inner.config.election_timeout.1.as_millis() as u64;
        match quorum_ms {
            Some(ms) if ms <= bound => NodeError::Deadline("while the write was being committed".into()),
            Some(ms) => NodeError::NoQuorum(format!("the leader has not heard from a majority for {ms} ms")),
            None => NodeError::NoQuorum("the leader has not heard from a majority in this term".into()),
        }
    }

    fn lost_quorum(&self) -> Option<NodeError> {
        let m = self.inner.raft.metrics();
        let quorum_ms = m.borrow().millis_since_quorum_ack?;
        let bound = 2 * self.inner.config.election_timeout.1.as_millis() as u64;
        (quorum_ms > bound)
            .then(|| NodeError::NoQuorum(format!("this leader has not heard from a majority for {quorum_ms} ms")))
    }

    async fn linearize(&self, until: Instant) -> Result<(), NodeError> {
        if planted::active(Bug::StaleLocalReads) {
            return Ok(());
        }
        match tokio::time::timeout_at(until, self.inner.raft.ensure_linearizable()).await {
            Err(_) => Err(NodeError::NoQuorum("a majority did not confirm this leader before the deadline".into())),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => Err(NodeError::NoLeader {
                why: "this node is no longer the leader".into(),
                leader_id: f.leader_id,
                leader_addr: self.cached_leader_addr(f.leader_id),
            }),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)))) => {
                Err(NodeError::NoQuorum(q.to_string()))
            }
            Ok(Err(RaftError::Fatal(f))) => Err(NodeError::Internal(f.to_string())),
        }
    }
}
