//! The segment-file log on its own: what it stores comes back, across reopening, truncation
//! and purging; a partial write at the end is cut off and damage anywhere else is refused;
//! and a random sequence of operations agrees with a plain in-memory model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader, Vote};
use proptest::prelude::*;
use tempfile::TempDir;

use super::*;
use crate::raft::CommandBatch;
use crate::types::{Command, Op};

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// An entry whose size varies with `weight` (so segments fill at different points).
fn entry(term: u64, index: u64, weight: u32) -> Entry {
    let commands = (0..weight).map(|i| Command { now_ms: index * 10 + u64::from(i), op: Op::Sweep { limit: i } });
    Entry { log_id: log_id(term, index), payload: EntryPayload::Normal(CommandBatch(commands.collect())) }
}

fn bytes_of(entries: &[Entry]) -> Vec<Vec<u8>> {
    entries.iter().map(|e| codec::encode(e).unwrap()).collect()
}

fn fresh(dir: &TempDir) -> PathBuf {
    let path = dir.path().join("log");
    create(&path).unwrap();
    path
}

fn open(path: &Path, segment_bytes: u64) -> LogStore {
    LogStore::open(path, segment_bytes, None).unwrap()
}

fn open_err(path: &Path) -> String {
    match LogStore::open(path, SEGMENT_BYTES, None) {
        Ok(_) => panic!("{} opened, but it should have been refused", path.display()),
        Err(e) => {
            assert!(matches!(e, StoreError::DataDir { .. }), "{e:?}");
            e.to_string()
        }
    }
}

async fn all(log: &mut LogStore) -> Vec<Entry> {
    log.try_get_log_entries(..).await.unwrap()
}

fn segments(path: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == SEGMENT_EXT))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn appended_entries_read_back_in_any_range_and_after_reopening() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let written: Vec<Entry> = (1..=50).map(|i| entry(1, i, (i % 7) as u32)).collect();
    {
        let mut log = open(&path, SEGMENT_BYTES);
        for chunk in written.chunks(8) {
            log.append_durably(chunk.to_vec()).await.unwrap();
        }
        assert_eq!(bytes_of(&all(&mut log).await), bytes_of(&written));
        assert_eq!(bytes_of(&log.try_get_log_entries(10..20).await.unwrap()), bytes_of(&written[9..19]));
        assert_eq!(bytes_of(&log.try_get_log_entries(45..=60).await.unwrap()), bytes_of(&written[44..]));
        assert!(log.try_get_log_entries(51..).await.unwrap().is_empty());
        let state = log.get_log_state().await.unwrap();
        assert_eq!((state.last_log_id, state.last_purged_log_id), (Some(log_id(1, 50)), None));
    }
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(bytes_of(&all(&mut log).await), bytes_of(&written));
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 50)));
}

#[tokio::test]
async fn an_append_that_leaves_a_hole_or_overlaps_is_refused_and_one_below_the_purge_point_is_dropped() {
    let dir = TempDir::new().unwrap();
    let log = open(&fresh(&dir), SEGMENT_BYTES);
    log.append_durably((1..=3).map(|i| entry(1, i, 1))).await.unwrap();
    assert!(log.append_durably([entry(1, 5, 1)]).await.is_err(), "hole");
    assert!(log.append_durably([entry(1, 3, 1)]).await.is_err(), "overlap");
    log.append_durably([entry(1, 4, 1)]).await.unwrap();
    // Entries at or below the purge point are already covered by a snapshot: dropped.
    let mut log = log;
    log.purge(log_id(1, 9)).await.unwrap();
    log.append_durably([entry(1, 7, 1)]).await.unwrap();
    assert!(all(&mut log).await.is_empty());
    log.append_durably([entry(1, 10, 1)]).await.unwrap();
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 10)));
}

#[tokio::test]
async fn truncate_removes_the_suffix_durably_and_the_log_continues_from_there() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    {
        let mut log = open(&path, 600);
        log.append_durably((1..=40).map(|i| entry(1, i, 3))).await.unwrap();
        log.save_committed(Some(log_id(1, 10))).await.unwrap();
        assert!(segments(&path).len() == 1, "one append is one write into one segment");
        log.append_durably((41..=80).map(|i| entry(1, i, 3))).await.unwrap();
        for i in 81..=120 {
            log.append_durably([entry(1, i, 3)]).await.unwrap();
        }
        assert!(segments(&path).len() > 2);
        log.truncate(log_id(1, 30)).await.unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 29)));
        assert_eq!(segments(&path).len(), 1, "segments after the cut are deleted");
        log.append_durably((30..=35).map(|i| entry(2, i, 1))).await.unwrap();
    }
    let mut log = open(&path, 600);
    let got = all(&mut log).await;
    assert_eq!(got.len(), 35);
    assert_eq!(got[28].log_id, log_id(1, 29));
    assert_eq!(got[29].log_id, log_id(2, 30));
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 10)), "committed survives the cut");
    // Truncating everything leaves an empty log that takes the same index again.
    log.truncate(log_id(1, 1)).await.unwrap();
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, None);
    log.append_durably([entry(3, 1, 1)]).await.unwrap();
}

#[tokio::test]
async fn purge_deletes_whole_segments_and_remembers_the_purge_point() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    {
        let mut log = open(&path, 400);
        for i in 1..=100 {
            log.append_durably([entry(1, i, 2)]).await.unwrap();
        }
        let before = segments(&path).len();
        assert!(before > 5, "{before} segments");
        log.purge(log_id(1, 60)).await.unwrap();
        let after = segments(&path).len();
        assert!(after < before, "{after} of {before} segments remain");
        let state = log.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(1, 60)), Some(log_id(1, 100))));
        let got = all(&mut log).await;
        assert_eq!(got.first().map(|e| e.log_id), Some(log_id(1, 61)));
        assert_eq!(got.len(), 40);
        // A purge behind the purge point changes nothing.
        log.purge(log_id(1, 20)).await.unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_purged_log_id, Some(log_id(1, 60)));
    }
    let mut log = open(&path, 400);
    assert_eq!(all(&mut log).await.len(), 40);
    // Purging past the end (a snapshot install) empties the log; it continues above.
    log.purge(log_id(4, 500)).await.unwrap();
    let state = log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(4, 500)), Some(log_id(4, 500))));
    assert!(all(&mut log).await.is_empty());
    assert_eq!(segments(&path).len(), 1, "only the active segment is left");
    log.append_durably([entry(4, 501, 1)]).await.unwrap();
    drop(log);
    let mut log = open(&path, 400);
    assert_eq!(all(&mut log).await.iter().map(|e| e.log_id).collect::<Vec<_>>(), vec![log_id(4, 501)]);
    assert_eq!(log.get_log_state().await.unwrap().last_purged_log_id, Some(log_id(4, 500)));
}

#[tokio::test]
async fn the_vote_is_on_disk_when_save_vote_returns() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(log.read_vote().await.unwrap(), None);
    let vote = Vote::new(7, 2);
    log.save_vote(&vote).await.unwrap();
    // Read straight from the file while the store is still open: nothing is left in memory only.
    assert_eq!(read_meta(&path).unwrap().vote, Some(vote));
    let committed = Vote::new_committed(8, 3);
    log.save_vote(&committed).await.unwrap();
    log.purge(log_id(1, 0)).await.unwrap();
    drop(log);
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(log.read_vote().await.unwrap(), Some(committed), "purge keeps the vote");
    assert!(!path.join("meta.tmp").exists());
}

/// Writes 20 entries in one segment and returns where its frames end.
async fn twenty(path: &Path) -> u64 {
    let log = open(path, SEGMENT_BYTES);
    for i in 1..=20 {
        log.append_durably([entry(1, i, 2)]).await.unwrap();
    }
    frames_end(&segments(path)[0])
}

fn frames_end(seg: &Path) -> u64 {
    crate::golden::segment_frames_end(&std::fs::read(seg).unwrap()) as u64
}

fn write_at(seg: &Path, at: u64, bytes: &[u8]) {
    std::fs::OpenOptions::new().write(true).open(seg).unwrap().write_all_at(bytes, at).unwrap();
}

#[tokio::test]
async fn a_new_segment_reserves_its_room_and_its_zeros_are_the_clean_end() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let len = twenty(&path).await;
    let seg = segments(&path)[0].clone();
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), SEGMENT_BYTES, "the segment's room is reserved");
    assert!(len < SEGMENT_BYTES);
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(all(&mut log).await.len(), 20);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), SEGMENT_BYTES, "reopening keeps the room");
    log.append_durably([entry(1, 21, 1)]).await.unwrap();
    drop(log);
    assert_eq!(all(&mut open(&path, SEGMENT_BYTES)).await.len(), 21);
    assert!(frames_end(&seg) > len, "the new entry went into the room");
}

#[tokio::test]
async fn a_partial_write_at_the_end_is_cut_off_and_the_log_goes_on() {
    for tail in [&[0x40u8, 0, 0][..], &[0x10, 0, 0, 0, 1, 2, 3, 4, 1, 9][..], &[0u8; 64][..]] {
        let dir = TempDir::new().unwrap();
        let path = fresh(&dir);
        let len = twenty(&path).await;
        let seg = segments(&path)[0].clone();
        write_at(&seg, len, tail);
        let mut log = open(&path, SEGMENT_BYTES);
        assert_eq!(frames_end(&seg), len, "the torn tail is gone");
        assert_eq!(all(&mut log).await.len(), 20);
        log.append_durably([entry(1, 21, 1)]).await.unwrap();
        drop(log);
        assert_eq!(all(&mut open(&path, SEGMENT_BYTES)).await.len(), 21);
    }
    // A last record cut in the middle (the process died inside the write).
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let len = twenty(&path).await;
    let seg = segments(&path)[0].clone();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 5).unwrap();
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(all(&mut log).await.len(), 19);
    assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(1, 19)));
}

#[tokio::test]
async fn damage_before_the_last_segment_refuses_to_start_naming_file_and_offset() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    {
        let log = open(&path, 300);
        for i in 1..=40 {
            log.append_durably([entry(1, i, 2)]).await.unwrap();
        }
    }
    let segs = segments(&path);
    assert!(segs.len() >= 3);
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let at = SEGMENT_MAGIC.len() + FRAME_HEADER + 4;
    bytes[at] ^= 0x55;
    std::fs::write(victim, &bytes).unwrap();
    let msg = open_err(&path);
    assert!(msg.contains(&victim.display().to_string()), "{msg}");
    assert!(msg.contains("byte offset 8") && msg.contains("CRC") && msg.contains("restore"), "{msg}");
    assert_eq!(std::fs::read(victim).unwrap(), bytes, "nothing was cut from a damaged middle segment");

    // A record whose CRC holds but whose entry does not decode is damage even at the end.
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let len = twenty(&path).await;
    let seg = segments(&path)[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes.truncate(len as usize);
    push_frame(&mut bytes, KIND_ENTRY, b"not an entry").unwrap();
    std::fs::write(&seg, &bytes).unwrap();
    let msg = open_err(&path);
    assert!(msg.contains("damaged at byte offset") && msg.contains("log entry"), "{msg}");

    // A header that is not ours.
    std::fs::write(&seg, b"GARBAGE!and more").unwrap();
    assert!(open_err(&path).contains("segment header"));

    // A damaged or missing meta file.
    std::fs::write(path.join(META_FILE), b"IDEMMETA\x01\x02").unwrap();
    assert!(open_err(&path).contains("meta is damaged"));
    std::fs::remove_file(path.join(META_FILE)).unwrap();
    assert!(open_err(&path).contains("missing"));
}

#[tokio::test]
async fn a_segment_whose_header_never_reached_the_disk_is_started_afresh() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    twenty(&path).await;
    std::fs::write(path.join(segment_name(2)), b"").unwrap();
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(all(&mut log).await.len(), 20);
    log.append_durably([entry(1, 21, 1)]).await.unwrap();
    drop(log);
    assert_eq!(all(&mut open(&path, SEGMENT_BYTES)).await.len(), 21);
}

#[tokio::test]
async fn committed_is_kept_and_a_committed_index_beyond_the_log_is_ignored() {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    {
        let mut log = open(&path, SEGMENT_BYTES);
        log.append_durably((1..=5).map(|i| entry(1, i, 1))).await.unwrap();
        log.save_committed(Some(log_id(1, 4))).await.unwrap();
    }
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 4)));
    log.save_committed(Some(log_id(1, 99))).await.unwrap();
    drop(log);
    let mut log = open(&path, SEGMENT_BYTES);
    assert_eq!(log.read_committed().await.unwrap(), None);
}

#[tokio::test]
async fn appends_queued_together_share_fsyncs_and_complete_in_order() {
    use std::sync::atomic::AtomicU64;
    #[derive(Default)]
    struct Count(AtomicU64);
    impl LogObserver for Count {
        fn append_fsynced(&self, _: Duration) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    let dir = TempDir::new().unwrap();
    let count = Arc::new(Count::default());
    let log = open(&fresh(&dir), SEGMENT_BYTES).with_observer(count.clone());
    let mut waits = Vec::new();
    for i in 1..=64 {
        let (tx, rx) = tokio::sync::oneshot::channel();
        log.submit([entry(1, i, 1)], Waiter::Oneshot(tx)).unwrap();
        waits.push(rx);
    }
    for rx in waits {
        rx.await.unwrap().unwrap();
    }
    let fsyncs = count.0.load(Ordering::Relaxed);
    assert!((1..=64).contains(&fsyncs), "{fsyncs}");
}

// ---- model check ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum Step {
    Append { n: u64, weight: u32, new_term: bool },
    Truncate { back: u64 },
    Purge { back: u64 },
    PurgePastEnd { ahead: u64 },
    Commit { back: u64 },
    Vote { term: u64 },
    Reopen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (1..6u64, 0..12u32, proptest::bool::weighted(0.2)).prop_map(|(n, weight, new_term)| Step::Append { n, weight, new_term }),
        2 => (0..10u64).prop_map(|back| Step::Truncate { back }),
        2 => (0..20u64).prop_map(|back| Step::Purge { back }),
        1 => (1..5u64).prop_map(|ahead| Step::PurgePastEnd { ahead }),
        2 => (0..5u64).prop_map(|back| Step::Commit { back }),
        1 => (1..50u64).prop_map(|term| Step::Vote { term }),
        2 => Just(Step::Reopen),
    ]
}

/// The reference: a map of live entries and the purge point, kept by hand.
#[derive(Default)]
struct Model {
    entries: BTreeMap<u64, Entry>,
    purged: Option<LogId>,
    committed: Option<LogId>,
    vote: Option<Vote<u64>>,
    term: u64,
}

impl Model {
    fn last(&self) -> Option<LogId> {
        self.entries.values().next_back().map(|e| e.log_id).or(self.purged)
    }
    fn next(&self) -> u64 {
        self.last().map_or(1, |l| l.index + 1)
    }
}

async fn run_steps(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dir = TempDir::new().unwrap();
    let path = fresh(&dir);
    let seg = 700;
    let mut log = open(&path, seg);
    let mut m = Model { term: 1, ..Model::default() };
    for (i, s) in steps.into_iter().enumerate() {
        match s {
            Step::Append { n, weight, new_term } => {
                if new_term {
                    m.term += 1;
                }
                let first = m.next();
                let batch: Vec<Entry> = (first..first + n).map(|ix| entry(m.term, ix, weight)).collect();
                for e in &batch {
                    m.entries.insert(e.log_id.index, e.clone());
                }
                log.append_durably(batch).await.unwrap();
            }
            Step::Truncate { back } => {
                // Committed entries are never truncated.
                let floor = m.committed.map_or(0, |c| c.index) + 1;
                let Some(&last) = m.entries.keys().next_back() else { continue };
                let at = last.saturating_sub(back).max(floor);
                if at > last || !m.entries.contains_key(&at) {
                    continue;
                }
                let id = m.entries[&at].log_id;
                m.entries.split_off(&at);
                log.truncate(id).await.unwrap();
            }
            Step::Purge { back } => {
                let Some(last) = m.last() else { continue };
                let at = last.index.saturating_sub(back);
                let Some(e) = m.entries.get(&at) else { continue };
                let id = e.log_id;
                m.entries = m.entries.split_off(&(at + 1));
                m.purged = Some(id);
                log.purge(id).await.unwrap();
            }
            Step::PurgePastEnd { ahead } => {
                let id = log_id(m.term, m.next() + ahead);
                m.entries.clear();
                m.purged = Some(id);
                m.committed = m.committed.filter(|c| c.index <= id.index);
                log.purge(id).await.unwrap();
            }
            Step::Commit { back } => {
                let Some(&last) = m.entries.keys().next_back() else { continue };
                let id = m.entries[&last.saturating_sub(back).max(*m.entries.keys().next().unwrap())].log_id;
                if m.committed.is_some_and(|c| c.index > id.index) {
                    continue;
                }
                m.committed = Some(id);
                log.save_committed(Some(id)).await.unwrap();
            }
            Step::Vote { term } => {
                let v = Vote::new(term, 1);
                m.vote = Some(v);
                log.save_vote(&v).await.unwrap();
            }
            Step::Reopen => {
                drop(log);
                log = open(&path, seg);
                // The committed index is a hint that may lag after a reopen, never lead.
                let got = log.read_committed().await.unwrap();
                prop_assert!(got <= m.committed, "step {i}: committed {got:?} ahead of {:?}", m.committed);
                m.committed = got;
            }
        }
        let state = log.get_log_state().await.unwrap();
        prop_assert_eq!(state.last_log_id, m.last(), "step {}: last log id", i);
        prop_assert_eq!(state.last_purged_log_id, m.purged, "step {}: purged", i);
        prop_assert_eq!(log.read_vote().await.unwrap(), m.vote, "step {}: vote", i);
        let got = all(&mut log).await;
        let want: Vec<Entry> = m.entries.values().cloned().collect();
        prop_assert_eq!(bytes_of(&got), bytes_of(&want), "step {}: entries", i);
        if let Some((&lo, _)) = m.entries.iter().next() {
            let mid = lo + (m.entries.len() as u64) / 2;
            let part = log.try_get_log_entries(mid..).await.unwrap();
            prop_assert_eq!(part.first().map(|e| e.log_id.index), Some(mid), "step {}: range read", i);
        }
    }
    // Whatever happened, one more reopen shows the same log.
    drop(log);
    let mut log = open(&path, seg);
    let want: Vec<Entry> = m.entries.values().cloned().collect();
    prop_assert_eq!(bytes_of(&all(&mut log).await), bytes_of(&want), "after the final reopen");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random appends, truncations, purges (also past the end), commits, votes and reopens on
    /// small segments agree with the model after every step.
    #[test]
    fn random_operations_match_an_in_memory_model(steps in proptest::collection::vec(step(), 1..60)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(run_steps(steps))?;
    }
}
