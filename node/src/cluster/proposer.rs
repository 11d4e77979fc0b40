//! Group commit: one task turns concurrent client commands into as few log entries as it
//! can. openraft 0.9 writes and fsyncs each `client_write` on its own, so the batch is what
//! buys throughput. It waits for a free in-flight slot first and only then takes everything
//! that queued meanwhile: under load a batch fills while the previous one is being written,
//! and a lone caller pays no wait at all.
//!
//! The proposer also stamps the leader's clock on every command (contract §2.1) and puts
//! `Resume` at the head of the first batch it writes in each new term, before any claim of
//! that term can look at a lease, and of any batch that finds the log's clock more than two
//! sweep intervals behind: the leader kept its term through a lost quorum (its followers
//! came back before either started an election), and the time it could not hear renewals
//! must not count against the leases either.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idemraft_store::{Command, CommandBatch, Op, Outcome, TypeConfig, WriteResponder};
use openraft::error::{ClientWriteError, Fatal};
use openraft::{Raft, ServerState};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::cluster::observer::ClusterObserver;
use crate::cluster::tasks::Tasks;
use crate::cluster::transport::Transport;
use crate::error::NodeError;

/// A command waiting for its outcome.
struct Pending {
    op: Op,
    /// Its encoded size, for the entry's byte budget.
    bytes: usize,
    reply: oneshot::Sender<Result<Outcome, NodeError>>,
}

/// The commands of the next log entry, bounded in count and in bytes. The byte bound keeps
/// every entry far below what one AppendEntries may carry, whatever the mix of sizes; the
/// first command always goes in, so a command larger than the bound (which the configuration
/// does not allow) still gets an entry of its own rather than none.
struct Batch<T> {
    items: Vec<T>,
    bytes: usize,
    max_items: usize,
    max_bytes: usize,
}

impl<T> Batch<T> {
    fn new(first: T, bytes: usize, max_items: usize, max_bytes: usize) -> Batch<T> {
        Batch { items: vec![first], bytes, max_items, max_bytes }
    }

    fn is_full(&self) -> bool {
        self.items.len() >= self.max_items || self.bytes >= self.max_bytes
    }

    /// Adds `item` if it fits; otherwise hands it back for the next batch.
    fn offer(&mut self, item: T, bytes: usize) -> Result<(), T> {
        if self.items.len() >= self.max_items || self.bytes.saturating_add(bytes) > self.max_bytes {
            return Err(item);
        }
        self.items.push(item);
        self.bytes += bytes;
        Ok(())
    }
}

/// Settings the proposer needs.
#[derive(Clone)]
pub struct ProposerConfig {
    /// Most commands per entry.
    pub batch_max: usize,
    /// Most encoded bytes of commands per entry.
    pub entry_max_bytes: usize,
    /// Extra wait to fill a batch.
    pub batch_wait: Duration,
    /// Entries in flight.
    pub max_inflight: usize,
    /// Sweep period, for Resume.
    pub sweep_interval: Duration,
    /// Resume stretch bound.
    pub max_resume_stretch: Duration,
    /// Most commands queued for the next batches; past it a write is refused at once.
    pub max_pending: usize,
    /// The leader's wall clock, stamped on every batch.
    pub wall_clock: WallClock,
    /// Whether large commands may be compressed at all (decision 0030).
    pub compress: bool,
}

/// A source of wall-clock milliseconds: [`system_clock`] in a server, a simulated one in a
/// test that runs nodes in one process.
pub type WallClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's wall clock.
pub fn system_clock() -> WallClock {
    Arc::new(now_ms)
}

/// Whether the next batch starts with Resume: the first batch this leader writes in `term`,
/// or one that finds the log's clock (`clock_ms`, the applied stamp) more than two sweep
/// intervals behind `now_ms`. The sweeper stamps the log every interval, so a wider gap means
/// no entry committed for that long: the quorum was lost. Resume is harmless when the gap is
/// small (it stretches leases by the gap less one interval, so by nothing).
pub fn needs_resume(leader: bool, resumed_term: u64, term: u64, now_ms: u64, clock_ms: u64, sweep_ms: u64) -> bool {
    leader && (resumed_term != term || now_ms.saturating_sub(clock_ms) > 2 * sweep_ms)
}

/// Handle for submitting commands.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Pending>,
    max_pending: usize,
    /// Whether every other member decodes compressed commands, as of the last batch this node
    /// proposed as leader (decision 0030).
    compress: Arc<AtomicBool>,
    metrics: Arc<dyn ClusterObserver>,
}

impl Proposer {
    /// Starts the proposer task.
    /// `clock` reads the log's clock as applied (the state machine's).
    /// `transport` tells which members decode compressed commands.
    pub fn start(
        raft: Raft<TypeConfig>,
        config: ProposerConfig,
        metrics: Arc<dyn ClusterObserver>,
        clock: Arc<dyn Fn() -> u64 + Send + Sync>,
        transport: Arc<dyn Transport>,
        tasks: &Tasks,
    ) -> Proposer {
        let max_pending = config.max_pending.max(1);
        let (tx, rx) = mpsc::channel(max_pending);
        let compress = Arc::new(AtomicBool::new(false));
        let gate = Gate { allowed: config.compress, transport, compress: compress.clone() };
        tasks.spawn(run(raft, config, rx, metrics.clone(), clock, gate));
        Proposer { tx, max_pending, compress, metrics }
    }

    /// Proposes one command and waits for its outcome. A full queue refuses at once rather
    /// than letting callers pile up behind it: a queue that only grows turns overload into
    /// timeouts for everyone and unbounded memory, while a quick refusal lets clients back
    /// off and keeps the calls already accepted on time.
    pub async fn submit(&self, op: Op) -> Result<Outcome, NodeError> {
        // On the caller's task, so that the compression of many large bodies spreads over the
        // runtime's workers instead of queueing on the proposer's one task.
        let op = if self.compress.load(Ordering::Relaxed) { self.compressed(op) } else { op };
        let (reply, rx) = oneshot::channel();
        // `now_ms` adds 8 bytes to the op; a size the encoding cannot state fills an entry.
        let bytes = crate::wire::encoded_len(&op).map_or(usize::MAX, |n| n.saturating_add(8));
        self.tx.try_send(Pending { op, bytes, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => NodeError::Overloaded(format!(
                "{} writes are already queued on the leader; back off and retry (raise --max-pending-writes only if the node has CPU and disk to spare)",
                self.max_pending
            )),
            mpsc::error::TrySendError::Closed(_) => NodeError::ShuttingDown,
        })?;
        rx.await.map_err(|_| NodeError::ShuttingDown)?
    }

    fn compressed(&self, op: Op) -> Op {
        let op = idemraft_store::compressed::compress(op);
        if let Op::Compressed(c) = &op {
            self.metrics.command_compressed(c.raw_len as usize, c.zstd.len());
        }
        op
    }
}

/// Decides, once per batch, whether the next commands may be compressed.
struct Gate {
    /// `--compress-commands`.
    allowed: bool,
    transport: Arc<dyn Transport>,
    compress: Arc<AtomicBool>,
}

impl Gate {
    /// Compression is on while this node leads and every other member, learners included,
    /// is known to decode compressed commands: a member of an older release (mid rolling
    /// upgrade) or one not reached yet turns it off until the next batch finds otherwise.
    fn update(&self, m: &openraft::RaftMetrics<u64, openraft::BasicNode>) {
        let on = self.allowed
            && m.state == ServerState::Leader
            && m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != m.id)
                .all(|(id, node)| self.transport.decodes_compressed(*id, &node.addr));
        self.compress.store(on, Ordering::Relaxed);
    }
}

/// Wall-clock milliseconds, the leader's stamp. A clock before 1970 stamps 0, which the state
/// machine ignores (its clock only moves forward).
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

async fn run(
    raft: Raft<TypeConfig>,
    config: ProposerConfig,
    mut rx: mpsc::Receiver<Pending>,
    metrics: Arc<dyn ClusterObserver>,
    clock: Arc<dyn Fn() -> u64 + Send + Sync>,
    gate: Gate,
) {
    let slots = Arc::new(Semaphore::new(config.max_inflight.max(1)));
    let resumed_term = Arc::new(AtomicU64::new(0));
    // The command that did not fit the previous entry opens the next one.
    let mut carried: Option<Pending> = None;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let first = match carried.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let first_bytes = first.bytes;
        let mut batch = Batch::new(first, first_bytes, config.batch_max, config.entry_max_bytes);
        if !config.batch_wait.is_zero() {
            let until = tokio::time::Instant::now() + config.batch_wait;
            while !batch.is_full() {
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(p)) => {
                        let bytes = p.bytes;
                        if let Err(p) = batch.offer(p, bytes) {
                            carried = Some(p);
                            break;
                        }
                    }
                    _ => break,
                }
            }
        }
        while carried.is_none() && !batch.is_full() {
            match rx.try_recv() {
                Ok(p) => {
                    let bytes = p.bytes;
                    if let Err(p) = batch.offer(p, bytes) {
                        carried = Some(p);
                    }
                }
                Err(_) => break,
            }
        }
        let batch = batch.items;

        let now = (config.wall_clock)();
        let (term, leader) = {
            let m = raft.metrics();
            let m = m.borrow();
            gate.update(&m);
            (m.current_term, m.state == ServerState::Leader)
        };
        let sweep_ms = config.sweep_interval.as_millis() as u64;
        let resume = needs_resume(leader, resumed_term.load(Ordering::Acquire), term, now, clock(), sweep_ms);
        let mut commands = Vec::with_capacity(batch.len() + usize::from(resume));
        if resume {
            commands.push(Command {
                now_ms: now,
                op: Op::Resume {
                    sweep_interval_ms: config.sweep_interval.as_millis() as u64,
                    max_stretch_ms: config.max_resume_stretch.as_millis() as u64,
                },
            });
        }
        let mut replies = Vec::with_capacity(batch.len());
        for p in batch {
            commands.push(Command { now_ms: now, op: p.op });
            replies.push(p.reply);
        }
        metrics.batch_proposed(commands.len());
        // The callers are answered by the responder, on whichever task has the entry's result
        // (the state machine worker, once the entry is applied), and the in-flight slot goes
        // with them. The proposer keeps a handle for the one case where openraft never takes
        // the responder: a core that has stopped.
        let delivery = Arc::new(std::sync::Mutex::new(Some(Delivery {
            replies,
            resume,
            term,
            resumed_term: resumed_term.clone(),
            _slot: permit,
        })));
        let responder = {
            let delivery = delivery.clone();
            WriteResponder::callback(move |result| {
                if let Some(d) = take(&delivery) {
                    d.finish(result.map(|resp| resp.data.0).map_err(|e| match e {
                        ClientWriteError::ForwardToLeader(f) => NodeError::NoLeader {
                            why: "this node lost leadership before the write committed".into(),
                            leader_id: f.leader_id,
                            leader_addr: None,
                        },
                        other => NodeError::Internal(other.to_string()),
                    }));
                }
            })
        };
        if resume {
            // Marked before the write goes out, since its result may come back (and a refusal
            // reset the mark, `Delivery::fail`) before `client_write_with` returns.
            resumed_term.store(term, Ordering::Release);
        }
        // client_write_with is called here, in order, so entries reach the log in the order the
        // batches were formed (Resume first in a term).
        if let Err(fatal) = raft.client_write_with(CommandBatch(commands), responder).await {
            if let Some(d) = take(&delivery) {
                d.finish(Err(fatal_error(&fatal)));
            }
        }
    }
}

/// Takes the delivery out of its shared slot, once.
fn take(slot: &std::sync::Mutex<Option<Delivery>>) -> Option<Delivery> {
    slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()
}

/// The callers of one entry's commands, answered from whichever task has the entry's result.
/// Dropped unanswered (the node stopped before the result came), it tells them so.
struct Delivery {
    replies: Vec<oneshot::Sender<Result<Outcome, NodeError>>>,
    /// Whether the entry starts with Resume, whose outcome is the proposer's, not a caller's.
    resume: bool,
    term: u64,
    resumed_term: Arc<AtomicU64>,
    /// The in-flight slot this entry holds until its callers have their answers.
    _slot: OwnedSemaphorePermit,
}

impl Delivery {
    fn finish(mut self, result: Result<Vec<Outcome>, NodeError>) {
        let mut outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(e) => return self.fail(e),
        };
        let term = self.term;
        if self.resume {
            match outcomes.first() {
                Some(Outcome::Resumed { stretched, stretch_ms }) if *stretched > 0 => {
                    tracing::info!(term, stretched, stretch_ms, "pushed live leases back by the outage")
                }
                other => tracing::debug!(term, outcome = ?other, "resumed the new term"),
            }
            if !outcomes.is_empty() {
                outcomes.remove(0);
            }
        }
        if outcomes.len() != self.replies.len() {
            let e = NodeError::Internal(format!("{} outcomes for {} commands", outcomes.len(), self.replies.len()));
            return self.fail(e);
        }
        for (r, o) in std::mem::take(&mut self.replies).into_iter().zip(outcomes) {
            let _ = r.send(Ok(o));
        }
    }

    fn fail(&mut self, e: NodeError) {
        if self.resume {
            // Resume did not land: the next batch of this term carries it again.
            let _ = self.resumed_term.compare_exchange(self.term, 0, Ordering::AcqRel, Ordering::Acquire);
        }
        for r in std::mem::take(&mut self.replies) {
            let _ = r.send(Err(e.clone()));
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.replies.is_empty() {
            self.fail(NodeError::ShuttingDown);
        }
    }
}

fn fatal_error(f: &Fatal<u64>) -> NodeError {
    match f {
        Fatal::Stopped => NodeError::ShuttingDown,
        other => NodeError::Internal(format!("raft stopped: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use idemraft_store::Outcome;
    use tokio::sync::{oneshot, Semaphore};

    use super::{needs_resume, Batch, Delivery};
    use crate::error::NodeError;

    type Reply = oneshot::Receiver<Result<Outcome, NodeError>>;

    /// A delivery for `n` callers, holding the only slot of `slots`.
    fn delivery(
        n: usize,
        resume: bool,
        resumed_term: &Arc<AtomicU64>,
        slots: &Arc<Semaphore>,
    ) -> (Delivery, Vec<Reply>) {
        let (replies, rxs) = (0..n).map(|_| oneshot::channel()).unzip();
        let slot = slots.clone().try_acquire_owned().unwrap_or_else(|e| panic!("slot taken: {e}"));
        (Delivery { replies, resume, term: 7, resumed_term: resumed_term.clone(), _slot: slot }, rxs)
    }

    fn answer(rx: Reply) -> Result<Outcome, NodeError> {
        let mut rx = rx;
        rx.try_recv().unwrap_or_else(|e| panic!("no answer: {e}"))
    }

    #[test]
    fn a_delivery_answers_each_caller_drops_resume_and_frees_the_slot() {
        let (term, slots) = (Arc::new(AtomicU64::new(7)), Arc::new(Semaphore::new(1)));
        let (d, rxs) = delivery(2, true, &term, &slots);
        assert_eq!(slots.available_permits(), 0);
        let resumed = Outcome::Resumed { stretched: 0, stretch_ms: 0 };
        d.finish(Ok(vec![resumed, Outcome::NotFound, Outcome::Mismatch]));
        let got: Vec<_> = rxs.into_iter().map(answer).collect();
        assert!(matches!(got[0], Ok(Outcome::NotFound)), "{got:?}");
        assert!(matches!(got[1], Ok(Outcome::Mismatch)), "{got:?}");
        assert_eq!(slots.available_permits(), 1, "the in-flight slot goes with the answers");
        assert_eq!(term.load(Ordering::Acquire), 7, "a landed Resume stays marked");
    }

    #[test]
    fn a_refused_or_dropped_delivery_tells_every_caller_and_resumes_again() {
        let (term, slots) = (Arc::new(AtomicU64::new(7)), Arc::new(Semaphore::new(1)));
        let (d, rxs) = delivery(2, true, &term, &slots);
        d.finish(Err(NodeError::ShuttingDown));
        assert!(rxs.into_iter().map(answer).all(|r| matches!(r, Err(NodeError::ShuttingDown))));
        assert_eq!(term.load(Ordering::Acquire), 0, "the next batch of the term carries Resume again");

        term.store(7, Ordering::Release);
        let (d, rxs) = delivery(1, true, &term, &slots);
        drop(d);
        assert!(matches!(
            answer(rxs.into_iter().next().unwrap_or_else(|| panic!("one caller"))),
            Err(NodeError::ShuttingDown)
        ));
        assert_eq!(term.load(Ordering::Acquire), 0);
        assert_eq!(slots.available_permits(), 1);

        let (d, rxs) = delivery(2, false, &term, &slots);
        d.finish(Ok(vec![Outcome::NotFound]));
        assert!(
            rxs.into_iter()
                .map(answer)
                .all(|r| matches!(r, Err(NodeError::Internal(ref m)) if m == "1 outcomes for 2 commands")),
            "a count that does not match is an error for every caller, not a wrong answer for some"
        );
    }

    #[test]
    fn resume_leads_a_new_term_and_any_batch_after_the_log_clock_fell_behind() {
        let now = 1_000_000;
        assert!(needs_resume(true, 0, 3, now, now - 10, 1000), "first batch of the term");
        assert!(!needs_resume(true, 3, 3, now, now - 10, 1000), "same term, clock close");
        assert!(!needs_resume(true, 3, 3, now, now - 2000, 1000), "two intervals is still normal");
        assert!(needs_resume(true, 3, 3, now, now - 2001, 1000), "quorum lost and regained in the same term");
        assert!(!needs_resume(false, 0, 3, now, 0, 1000), "only a leader resumes");
        assert!(!needs_resume(true, 3, 3, now, now + 50, 1000), "a clock ahead of this leader's is no gap");
    }

    #[test]
    fn a_batch_is_cut_by_count_and_by_bytes_and_hands_back_what_does_not_fit() {
        let mut b = Batch::new(0, 300, 4, 1000);
        assert!(b.offer(1, 300).is_ok());
        assert!(b.offer(2, 300).is_ok());
        assert_eq!(b.offer(3, 300), Err(3), "1200 bytes would pass the 1000-byte bound");
        assert!(!b.is_full(), "a smaller command may still fit");
        assert!(b.offer(4, 100).is_ok());
        assert!(b.is_full());
        assert_eq!(b.items, vec![0, 1, 2, 4]);

        let mut by_count = Batch::new(0, 1, 2, 1 << 20);
        assert!(by_count.offer(1, 1).is_ok());
        assert_eq!(by_count.offer(2, 1), Err(2));

        let oversize = Batch::new(0, 5000, 4, 1000);
        assert_eq!(oversize.items.len(), 1, "a command over the bound still gets an entry");
        assert!(oversize.is_full());
    }
}
