//! When this node may start an election: only after a pre-vote round in which a majority of
//! the voters say that they, too, have stopped hearing from a leader.
//!
//! openraft 0.9 has no pre-vote. A node that misses a few heartbeats (it just restarted, it
//! was partitioned, it is starved of CPU, or a long AppendEntries held its heartbeats back)
//! raises its term and campaigns; the others refuse it under their leader lease, but the
//! leader's next AppendEntries meets the higher term and the leader steps down. One slow
//! follower can so depose a healthy leader again and again. Here openraft's own election timer
//! is off (`enable_elect: false`) and this module decides instead:
//!
//! - Every AppendEntries or InstallSnapshot from the current leader (or a newer one) counts
//!   as contact, from the moment it arrives.
//! - After `election_timeout_max + random(election_timeout_min..election_timeout_max)` without
//!   contact (the same delay openraft's own timer uses for a follower of a known leader), the
//!   node asks every voter "would you vote for me at the next term?". A voter says yes only
//!   when it is not the leader itself, has heard from no leader for `election_timeout_max`
//!   (the lease under which openraft would refuse the real vote anyway), is not at a newer
//!   term, and does not hold a longer log than the candidate's (Raft's up-to-date rule).
//! - With yes from a majority of every voter configuration (joint ones included; its own
//!   counts), it triggers openraft's election; otherwise it waits another random timeout.
//! - Split votes are what stretches a failover past one timeout: two nodes whose delays end
//!   within a message's round trip both pass the pre-vote and split the real vote. So a node
//!   that grants a pre-vote holds back its own for a random `election_timeout_min / 2 ..
//!   election_timeout_max`, giving that candidate time to win; the timer sleeps until the
//!   exact instant its delay ends rather than to the next heartbeat tick (ticks would round
//!   every node's delay to the same few instants); and a node whose election failed tries
//!   again after a random `election_timeout_min / 2 .. election_timeout_max`, not a whole
//!   lease later, since nobody leads.
//!
//! A node that notices it was itself paused or starved (its tick came a whole
//! `election_timeout_min` late) counts its waking as contact, since messages of a live leader
//! may be waiting unread. A single voter elects at once, as openraft would. A peer that does not know the PreVote
//! RPC (a release from before it) answers UNIMPLEMENTED and counts as yes, so a rolling
//! upgrade behaves as before until every node has it.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_proto::v1::RaftMessage;
use idemraft_store::TypeConfig;
use openraft::{Raft, ServerState};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cluster::storage::LogView;
use crate::cluster::transport::{PeerCall, Transport};
use crate::wire::{self, PreVote, PreVoteReply};

/// Contact with a leader, as this node last saw it.
pub struct Election {
    last_contact: Mutex<Instant>,
    /// Until when this node does not start a pre-vote of its own: set when it grants one, so
    /// that the candidate it said yes to can finish its election before a rival starts.
    hold_until: Mutex<Option<Instant>>,
    /// `(election_timeout_min, election_timeout_max)`.
    timeouts: (Duration, Duration),
    /// The state of the jitter's generator (splitmix64): seeded by the caller, so a test that
    /// runs nodes in one process replays the same elections from the same seed.
    rng: Mutex<u64>,
}

impl Election {
    /// Counts the node's start as contact: a leader gets a full timeout to reach a node that
    /// just started before it may campaign.
    pub fn new(timeouts: (Duration, Duration), seed: u64) -> Arc<Election> {
        Arc::new(Election {
            last_contact: Mutex::new(Instant::now()),
            hold_until: Mutex::new(None),
            timeouts,
            rng: Mutex::new(seed),
        })
    }

    /// A random duration in `[min, max)`.
    fn jitter(&self, min: Duration, max: Duration) -> Duration {
        let span = max.saturating_sub(min).as_millis().max(1) as u64;
        let mut state = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        min + Duration::from_millis(splitmix64(&mut state) % span)
    }

    /// A message from a live leader arrived.
    pub fn heard_from_leader(&self) {
        *self.last_contact.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn silence(&self) -> Duration {
        self.last_contact.lock().unwrap_or_else(|e| e.into_inner()).elapsed()
    }

    /// The lease under which no vote is given: openraft's own leader lease.
    fn lease(&self) -> Duration {
        self.timeouts.1
    }

    /// Whether this node would vote for `req`'s candidate now, and why not.
    pub async fn answer(&self, raft: &Raft<TypeConfig>, log: &dyn LogView, req: &PreVote) -> PreVoteReply {
        let m = raft.metrics().borrow().clone();
        let refuse = |why: String| PreVoteReply { granted: false, why };
        if m.state == ServerState::Leader {
            return refuse(format!("node {} leads term {}", m.id, m.current_term));
        }
        let silence = self.silence();
        if silence < self.lease() {
            return refuse(format!("node {} heard from a leader {} ms ago", m.id, silence.as_millis()));
        }
        if req.term < m.current_term {
            return refuse(format!("node {} is at term {}, past {}", m.id, m.current_term, req.term));
        }
        let mine = log.last_log_id();
        if req.last_log < mine {
            return refuse(format!("node {} holds a longer log ({mine:?} > {:?})", m.id, req.last_log));
        }
        // Two nodes whose timers fire close together would otherwise both pass the pre-vote
        // and split the real vote, costing a whole further timeout. The hold is random, so
        // the nodes that said yes do not all come back at once if this candidate fails.
        let (min, max) = self.timeouts;
        let hold = Instant::now() + self.jitter(min / 2, max);
        let mut until = self.hold_until.lock().unwrap_or_else(|e| e.into_inner());
        *until = Some(until.map_or(hold, |t| t.max(hold)));
        PreVoteReply { granted: true, why: String::new() }
    }

    /// How long this node still holds back its own pre-vote after granting one.
    fn held(&self) -> Duration {
        let until = *self.hold_until.lock().unwrap_or_else(|e| e.into_inner());
        until.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now()))
    }
}

/// The next value of a splitmix64 generator.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed nobody else has: the hasher's random keys, for a node that is not replayed.
pub fn random_seed() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// Whether `yes` holds a majority of every configuration in `joint`.
pub fn has_quorum(joint: &[BTreeSet<u64>], yes: &BTreeSet<u64>) -> bool {
    !joint.is_empty() && joint.iter().all(|voters| voters.intersection(yes).count() * 2 > voters.len())
}

/// Watches for a lost leader until `stopping` is set; see the module doc.
pub async fn run(
    id: u64,
    raft: Raft<TypeConfig>,
    log: Arc<dyn LogView>,
    election: Arc<Election>,
    transport: Arc<dyn Transport>,
    tick: Duration,
    stopping: Arc<AtomicBool>,
) {
    let (min, max) = election.timeouts;
    // The silence after which this node starts a pre-vote; drawn afresh after each round.
    let mut wait = election.lease() + election.jitter(min, max);
    // No round starts before this: a whole `wait` after a round that found no majority (a
    // leader may be alive), a short random time after one that started an election that
    // then failed (a split vote: nobody leads, so waiting out a lease again only adds delay).
    let mut next_round: Option<Instant> = None;
    let mut last_attempt: Option<Instant> = None;
    let mut nap = tick;
    loop {
        let slept = Instant::now();
        tokio::time::sleep(nap).await;
        if stopping.load(Ordering::Acquire) {
            return;
        }
        let overslept = slept.elapsed() > nap + min;
        nap = tick;
        if overslept {
            // This node was paused (SIGSTOP, a frozen VM) or starved: its silence says nothing
            // about the leader, whose messages are only now being read. Give it a timeout.
            election.heard_from_leader();
            continue;
        }
        let m = raft.metrics().borrow().clone();
        if m.running_state.is_err() {
            return;
        }
        if m.state == ServerState::Leader {
            // Once it steps down, a former leader gives the new one a full timeout too.
            election.heard_from_leader();
            continue;
        }
        let membership = m.membership_config.membership();
        let joint = membership.get_joint_config().clone();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        if !voters.contains(&id) {
            continue;
        }
        if voters.len() == 1 {
            // The only voter elects itself when it knows no leader, and also when the leader
            // it knows has gone quiet: a leader that removed itself from the voters (with the
            // others) steps down and sends nothing more, yet stays this node's current leader.
            let since_attempt = last_attempt.map_or(Duration::MAX, |t| t.elapsed());
            let leaderless = m.current_leader.is_none() || election.silence() >= wait;
            if leaderless && since_attempt >= min {
                last_attempt = Some(Instant::now());
                let _ = raft.trigger().elect().await;
            }
            continue;
        }
        // Sleep exactly until the next moment a round may start rather than to the next tick:
        // ticks would round every node's random delay to the same few instants.
        let silence = election.silence();
        let not_yet = [
            wait.saturating_sub(silence),
            next_round.map_or(Duration::ZERO, |t| t.saturating_duration_since(Instant::now())),
            election.held(),
        ]
        .into_iter()
        .max()
        .unwrap_or(Duration::ZERO);
        if !not_yet.is_zero() {
            nap = tick.min(not_yet);
            continue;
        }
        let req = PreVote { candidate: id, term: m.current_term + 1, last_log: log.last_log_id() };
        let mut yes = BTreeSet::from([id]);
        let mut calls = JoinSet::new();
        for peer in voters.iter().copied().filter(|p| *p != id) {
            let Some(node) = membership.get_node(&peer) else { continue };
            let (transport, addr, req) = (transport.clone(), node.addr.clone(), req.clone());
            calls.spawn(async move { (peer, ask(&*transport, peer, &addr, &req, min / 2).await) });
        }
        let mut refusals = Vec::new();
        while let Some(done) = calls.join_next().await {
            match done {
                Ok((peer, Ok(reply))) if reply.granted => {
                    yes.insert(peer);
                }
                Ok((peer, Ok(reply))) => refusals.push(format!("{peer}: {}", reply.why)),
                Ok((peer, Err(e))) => refusals.push(format!("{peer}: {e}")),
                Err(_) => {}
            }
        }
        wait = election.lease() + election.jitter(min, max);
        if election.silence() < election.lease() {
            // A leader reached this node during the round: it is alive after all.
            continue;
        }
        if has_quorum(&joint, &yes) {
            next_round = Some(Instant::now() + election.jitter(min / 2, max));
            tracing::info!(
                term = req.term,
                silence_ms = election.silence().as_millis() as u64,
                granted = ?yes,
                "no leader heard from and a majority agrees; starting an election"
            );
            let _ = raft.trigger().elect().await;
        } else {
            next_round = Some(Instant::now() + wait);
            tracing::info!(
                term = req.term,
                silence_ms = election.silence().as_millis() as u64,
                refusals = %refusals.join("; "),
                "no leader heard from, but the pre-vote found no majority; not starting an election"
            );
        }
    }
}

async fn ask(
    transport: &dyn Transport,
    peer: u64,
    addr: &str,
    req: &PreVote,
    ttl: Duration,
) -> Result<PreVoteReply, String> {
    let msg = RaftMessage { target: peer, payload: wire::encode(req)? };
    match tokio::time::timeout(ttl, transport.call(peer, addr, PeerCall::PreVote, msg, ttl)).await {
        Err(_) => Err(format!("no answer within {} ms", ttl.as_millis())),
        Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
            Ok(PreVoteReply { granted: true, why: "an older release without pre-vote".into() })
        }
        Ok(Err(status)) => Err(status.message().to_string()),
        Ok(Ok(reply)) => wire::decode("pre-vote reply", &reply.payload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_needs_a_majority_of_every_configuration() {
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        assert!(has_quorum(&[set(&[1, 2, 3])], &set(&[1, 2])));
        assert!(!has_quorum(&[set(&[1, 2, 3])], &set(&[1])));
        assert!(!has_quorum(&[set(&[1, 2, 3, 4])], &set(&[1, 2])), "half is not a majority");
        assert!(has_quorum(&[set(&[1])], &set(&[1])));
        let joint = [set(&[1, 2, 3]), set(&[3, 4, 5])];
        assert!(!has_quorum(&joint, &set(&[1, 2, 3])), "the new configuration has only 3");
        assert!(has_quorum(&joint, &set(&[1, 3, 4])));
        assert!(!has_quorum(&[], &set(&[1])));
    }

    #[test]
    fn jitter_stays_in_its_range_and_follows_its_seed() {
        let (min, max) = (Duration::from_millis(400), Duration::from_millis(800));
        let e = Election::new((min, max), 7);
        let draws: Vec<Duration> = (0..100).map(|_| e.jitter(min, max)).collect();
        assert!(draws.iter().all(|j| *j >= min && *j < max), "{draws:?}");
        assert!(draws.iter().any(|j| *j != draws[0]), "not constant");
        let again = Election::new((min, max), 7);
        assert_eq!(draws, (0..100).map(|_| again.jitter(min, max)).collect::<Vec<_>>(), "same seed, same draws");
        assert_eq!(e.jitter(min, min), min);
    }
}
