//! The replay fast path: a Claim whose answer is already settled is answered on the leader
//! without a log append, once the leader knows it is still the only leader.
//!
//! A claim on a COMPLETED record answers REPLAY, and one whose fingerprint differs from the
//! record's answers MISMATCH, and no later command changes either answer while the record
//! lives (docs/decisions/0011-replay-fast-path-under-a-leader-lease.md). The only thing that ends a record's life is
//! expiry by the log's clock, so the fast path answers only when the record's expiry lies
//! beyond max(state clock, this leader's wall clock) + [`MARGIN_MS`]: any command this leader
//! could stamp now would still find it alive. Otherwise, and on any doubt (no quorum, not the
//! leader, a storage error), the claim takes the log path, which is always correct.
//!
//! Order on the leader: a local read first, so a claim on a fresh key (most claims) pays no
//! confirmation; then one confirmation shared by every claim that queued while the previous
//! one ran; then the expiry check again against the clock applied by then.
//!
//! A confirmation is either a read-index round (`ensure_linearizable`: a heartbeat that a
//! quorum acknowledges) or, within a lease that such a round earned, a look at the Raft
//! core's own state with no round trip. The lease: a round started at instant `s` that a
//! quorum acknowledged touched each acknowledging follower at or after `s`, and openraft's
//! followers refuse every vote request for `election_timeout_max` after such a touch, so no
//! other leader can be elected before `s + election_timeout_max`. The lease ends at
//! `s + election_timeout_min / 2`, less than half of that, which leaves room for clock-rate
//! drift between nodes; it is used only in its first half, so a busy leader renews it (one
//! round per quarter election timeout) before it runs out. Within the lease the core is asked
//! whether this node still leads the lease's term with an entry of that term committed (so
//! every earlier entry is committed too), and the claim waits for nothing only if the state
//! machine has applied up to that commit index. The core answers in order with vote
//! requests, so a leader that has just granted its vote to a candidate says so here.
//! docs/decisions/0011 has the full argument and the one double fault it leans on the margin for.

use std::sync::Arc;
use std::time::Duration;

use idemraft_store::machine::settled_claim_answer;
use idemraft_store::{Fingerprint, Op, Outcome, Record, TypeConfig};
use openraft::{Raft, ServerState};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::cluster::observer::ClusterObserver;
use crate::cluster::proposer::WallClock;
use crate::cluster::storage::StateView;
use crate::cluster::tasks::Tasks;

/// How far beyond max(state clock, wall clock) a record's expiry must lie for the fast path.
/// The clock moves by stamps this leader makes from its wall clock, so a few seconds is
/// already far more than the time between the check and the answer.
pub const MARGIN_MS: u64 = 10_000;

/// Queue bound of waiting confirmations; past it a claim takes the log path.
const QUEUE: usize = 16 * 1024;

/// The settled answer `rec` gives a claim with `fingerprint`, if the fast path may give it
/// at state clock `clock_ms` and leader wall clock `wall_ms`.
pub fn settled(rec: &Record, fingerprint: Option<&Fingerprint>, clock_ms: u64, wall_ms: u64) -> Option<Outcome> {
    let horizon = clock_ms.max(wall_ms).saturating_add(MARGIN_MS);
    if rec.expires_ms <= horizon {
        return None;
    }
    settled_claim_answer(rec, fingerprint)
}

/// The fast path of one node.
pub struct FastRead {
    sm: Arc<dyn StateView>,
    wall_clock: WallClock,
    confirm: mpsc::Sender<oneshot::Sender<bool>>,
}

impl FastRead {
    /// Starts the task that confirms leadership for `raft`: read-index rounds that time out
    /// after `confirm_timeout`, and a lease of `lease` after each (zero: no lease, every
    /// confirmation is a round).
    pub fn start(
        raft: Raft<TypeConfig>,
        sm: Arc<dyn StateView>,
        wall_clock: WallClock,
        confirm_timeout: Duration,
        lease: Duration,
        metrics: Arc<dyn ClusterObserver>,
        tasks: &Tasks,
    ) -> FastRead {
        let (tx, rx) = mpsc::channel(QUEUE);
        let confirmer = Confirmer { raft, sm: sm.clone(), timeout: confirm_timeout, lease, held: None, metrics };
        tasks.spawn(confirmer.run(rx));
        FastRead { sm, wall_clock, confirm: tx }
    }

    /// The settled answer to `op` when it is a Claim that may take the fast path, read
    /// linearizably; `None` sends the claim down the log path.
    pub async fn answer(&self, op: &Op, until: Instant) -> Option<Outcome> {
        let Op::Claim { id, fingerprint, .. } = op else { return None };
        let local = self.sm.get(id).await.ok()??;
        settled(&local.record, fingerprint.as_ref(), self.sm.clock(), (self.wall_clock)())?;
        let (tx, rx) = oneshot::channel();
        self.confirm.try_send(tx).ok()?;
        if !tokio::time::timeout_at(until, rx).await.ok()?.ok()? {
            return None;
        }
        // Applied up to the read index now. The record read above was committed (only
        // committed entries are applied) and its answer is final until it expires; expiring
        // (a sweep, or a claim that re-creates it) takes a clock at or past its expiry. So
        // checking the same record against the clock applied now, which covers everything
        // committed before this call arrived, is as good as reading it again, and cheaper.
        settled(&local.record, fingerprint.as_ref(), self.sm.clock(), (self.wall_clock)())
    }
}

/// A lease: the term it was earned in and the instant it ends.
#[derive(Clone, Copy, Debug)]
struct Lease {
    term: u64,
    until: Instant,
}

/// Confirms leadership for batches of waiting claims, under a lease when it can.
struct Confirmer {
    raft: Raft<TypeConfig>,
    sm: Arc<dyn StateView>,
    timeout: Duration,
    lease: Duration,
    held: Option<Lease>,
    metrics: Arc<dyn ClusterObserver>,
}

impl Confirmer {
    /// Runs one confirmation for every batch of waiters. A waiter joins the batch of a
    /// confirmation that starts after it queued, so the leadership it learns of holds at a
    /// moment after its arrival, which is what makes its read linearizable.
    async fn run(mut self, mut rx: mpsc::Receiver<oneshot::Sender<bool>>) {
        let mut batch = Vec::new();
        loop {
            let Some(first) = rx.recv().await else { return };
            batch.push(first);
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let ok = if self.leased().await {
                self.metrics.replay_confirmed("lease");
                true
            } else {
                self.metrics.replay_confirmed("read_index");
                self.read_index().await
            };
            for waiter in batch.drain(..) {
                let _ = waiter.send(ok);
            }
        }
    }

    /// A read-index round; on success it starts a new lease, on failure it drops the old.
    async fn read_index(&mut self) -> bool {
        let started = Instant::now();
        self.held = None;
        match tokio::time::timeout(self.timeout, self.raft.ensure_linearizable()).await {
            Ok(Ok(read)) => {
                // The read index is this leader's blank entry or a later one of its term, so
                // its term is the term the quorum acknowledged.
                if let Some(read) = read.filter(|_| !self.lease.is_zero()) {
                    self.held = Some(Lease { term: read.leader_id.get_term(), until: started + self.lease });
                }
                true
            }
            _ => false,
        }
    }

    /// Whether the lease, in its first half, confirms this node as leader now.
    async fn leased(&mut self) -> bool {
        let Some(lease) = self.held else { return false };
        if Instant::now() + self.lease / 2 >= lease.until {
            return false;
        }
        let term = lease.term;
        let state = self
            .raft
            .with_raft_state(move |st| {
                let leading = st.server_state == ServerState::Leader && st.vote_ref().leader_id().get_term() == term;
                st.committed.filter(|c| leading && c.leader_id.get_term() == term).map(|c| c.index)
            })
            .await;
        let Ok(Some(committed)) = state else {
            self.held = None;
            return false;
        };
        // Applied up to the commit index the core knew: everything committed before this
        // confirmation is then in the state the expiry check reads.
        self.sm.last_applied().await.is_some_and(|a| a.index >= committed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemraft_store::machine::{apply, StateStore};
    use idemraft_store::{Command, MemState, RecordKey, Response, Token};

    const T0: u64 = 1_700_000_000_000;
    const HOUR: u64 = 3_600_000;

    fn id() -> RecordKey {
        RecordKey::new("default", "bench", "key-0000000000000001").unwrap_or_else(|e| panic!("{e}"))
    }

    fn claim(fp: Option<Fingerprint>, owner: &str) -> Op {
        Op::Claim {
            id: id(),
            fingerprint: fp,
            owner: owner.into(),
            lease_ms: 30_000,
            ttl_ms: HOUR,
            allow_takeover: false,
        }
    }

    fn run(state: &mut MemState, index: u64, now_ms: u64, op: Op) -> Outcome {
        apply(state, Token::new(index, 0), &Command { now_ms, op }).unwrap_or_else(|e| match e {})
    }

    fn record(state: &mut MemState) -> Record {
        state.get(&id()).unwrap_or_else(|e| match e {}).unwrap_or_else(|| panic!("no record"))
    }

    /// A record completed at T0 by the owner of fingerprint `fp`.
    fn completed(fp: Option<Fingerprint>) -> MemState {
        let mut s = MemState::new();
        let Outcome::Acquired(g) = run(&mut s, 1, T0, claim(fp, "a")) else { panic!("not acquired") };
        let response = Response { status: 201, headers: vec![("x-id".into(), "7".into())], body: vec![b'r'; 256] };
        let done = run(&mut s, 2, T0 + 5, Op::Complete { id: id(), token: g.token, response });
        assert!(matches!(done, Outcome::Completed { .. }), "{done:?}");
        s
    }

    #[test]
    fn every_settled_answer_is_the_log_answer() {
        let fps = [None, Some([1u8; 32]), Some([2u8; 32])];
        for stored in fps {
            for asked in fps {
                let mut s = completed(stored);
                let rec = record(&mut s);
                let fast = settled(&rec, asked.as_ref(), s.clock(), T0 + 10);
                let log = run(&mut s.clone(), 3, T0 + 10, claim(asked, "b"));
                assert_eq!(fast.as_ref(), Some(&log), "stored {stored:?} asked {asked:?}");
                assert!(matches!(log, Outcome::Replay { .. } | Outcome::Mismatch));
            }
        }
    }

    #[test]
    fn a_mismatch_is_settled_while_in_progress_and_nothing_else_is() {
        let mut s = MemState::new();
        run(&mut s, 1, T0, claim(Some([1; 32]), "a"));
        let rec = record(&mut s);
        let fast = settled(&rec, Some(&[2; 32]), s.clock(), T0);
        assert_eq!(fast, Some(run(&mut s.clone(), 2, T0, claim(Some([2; 32]), "b"))));
        // Same fingerprint, or none: the answer depends on the lease, so it goes to the log.
        assert_eq!(settled(&rec, Some(&[1; 32]), s.clock(), T0), None);
        assert_eq!(settled(&rec, None, s.clock(), T0), None);
    }

    #[test]
    fn a_record_near_or_past_its_expiry_takes_the_log_path() {
        let mut s = completed(None);
        let rec = record(&mut s);
        assert!(settled(&rec, None, s.clock(), T0).is_some());
        // By the leader's wall clock, by the state clock, and within the margin.
        assert_eq!(settled(&rec, None, s.clock(), rec.expires_ms), None);
        assert_eq!(settled(&rec, None, rec.expires_ms + 1, T0), None);
        assert_eq!(settled(&rec, None, s.clock(), rec.expires_ms - MARGIN_MS), None);
        assert!(settled(&rec, None, s.clock(), rec.expires_ms - MARGIN_MS - 1).is_some());
        // The log path at that point re-grants the key: the fast path must not have replayed.
        let log = run(&mut s, 3, rec.expires_ms, claim(None, "b"));
        assert!(matches!(log, Outcome::Acquired(_)), "{log:?}");
    }
}
