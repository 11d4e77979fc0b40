//! Golden fixtures: committed byte-for-byte encodings of everything Idemraft persists or sends
//! to a peer, so that a change of encoding fails a test loudly instead of making every replica
//! read old log entries, snapshots or a peer's messages as something else.
//!
//! The encodings are bincode with enum variant indexes, so compatibility rests on the order
//! and shape of every variant and field. A test builds fixed values, encodes them and
//! compares the bytes with the fixture file; it also decodes the stored bytes and compares
//! the result with the value, which is the check that matters for data already on disk.
//!
//! The file is text, one `name hex` pair per line, so a change shows in review as the lines
//! that moved. Rewriting it is deliberate: run the test with `IDEMRAFT_BLESS=1`, and only
//! after giving old bytes a decoding that still works (a new variant appended last, a format
//! version).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The environment variable that rewrites a fixture file instead of checking it.
pub const BLESS_VAR: &str = "IDEMRAFT_BLESS";

const HEADER: &str = "\
# Golden encodings: name, then the bytes in hex. Written by the test that checks them; do not
# edit by hand. A changed line means data or peers of an earlier release would be read as
# something else: give the old bytes a working decoding first, then rewrite this file by
# running that test with IDEMRAFT_BLESS=1.
";

/// A set of named encodings checked against one fixture file.
pub struct Golden {
    path: PathBuf,
    cases: BTreeMap<String, Vec<u8>>,
}

impl Golden {
    /// A set to be checked against the fixture at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Golden {
        Golden { path: path.into(), cases: BTreeMap::new() }
    }

    /// Adds one encoding. Names must be unique: a repeated name is a mistake in the test.
    pub fn add(&mut self, name: &str, bytes: Vec<u8>) -> Result<(), String> {
        match self.cases.insert(name.to_string(), bytes) {
            None => Ok(()),
            Some(_) => Err(format!("golden case {name:?} is added twice")),
        }
    }

    /// Compares every case with the fixture file and reports every difference at once: a
    /// changed encoding, a case the file lacks, a case the file has that the test no longer
    /// builds. With `IDEMRAFT_BLESS=1` set, writes the file instead.
    pub fn check(&self) -> Result<(), String> {
        if std::env::var_os(BLESS_VAR).is_some_and(|v| v == "1") {
            return self.write();
        }
        let stored = read(&self.path)?;
        let mut problems = Vec::new();
        for (name, bytes) in &self.cases {
            match stored.get(name) {
                None => problems.push(format!("{name}: not in the fixture (a new encoding: bless it)")),
                Some(old) if old != bytes => problems.push(format!(
                    "{name}: encoding changed\n    fixture: {}\n    now:     {}",
                    hex(old),
                    hex(bytes)
                )),
                Some(_) => {}
            }
        }
        for name in stored.keys().filter(|n| !self.cases.contains_key(*n)) {
            problems.push(format!("{name}: in the fixture but no longer built (was the type removed?)"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} golden encoding(s) differ from {}:\n  {}\n\
                 Stored logs, snapshots and peers of an earlier release would be read differently. If the \
                 change is deliberate and old bytes still decode, rewrite the fixture with {BLESS_VAR}=1.",
                problems.len(),
                self.path.display(),
                problems.join("\n  ")
            ))
        }
    }

    fn write(&self) -> Result<(), String> {
        let mut out = String::from(HEADER);
        for (name, bytes) in &self.cases {
            let _ = writeln!(out, "{name} {}", hex(bytes));
        }
        std::fs::write(&self.path, out).map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// The fixture file's cases, by name: what tests decode to prove old bytes still read.
pub fn read(path: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read the golden fixture {}: {e} (create it by running the test with {BLESS_VAR}=1)",
            path.display()
        )
    })?;
    let mut cases = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, digits) =
            line.split_once(' ').ok_or_else(|| format!("{}:{}: expected `name hex`", path.display(), n + 1))?;
        let bytes = unhex(digits.trim()).ok_or_else(|| format!("{}:{}: bad hex for {name}", path.display(), n + 1))?;
        cases.insert(name.to_string(), bytes);
    }
    Ok(cases)
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// Where the frames of a log segment's bytes end, read by their length fields alone: at the
/// first zero length (the segment's reserved, unwritten room) or at the end of the bytes. The
/// room is not an encoding, so fixtures and tests compare only what comes before it.
pub fn segment_frames_end(segment: &[u8]) -> usize {
    use crate::file_log::{FRAME_HEADER, SEGMENT_MAGIC};
    let mut off = SEGMENT_MAGIC.len();
    while let Some(head) = segment.get(off..off + 4) {
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 {
            break;
        }
        off += FRAME_HEADER + len;
    }
    off.min(segment.len())
}

/// A format 3 snapshot stream of `state`, laid out as the sled store of a release before packs
/// streamed one: records whose bodies are at least 4 KiB (that release's blob threshold)
/// become blob stubs named `(snapshot index, n)`, and their bodies follow in the blob
/// section, in name order.
pub fn format3_snapshot(
    meta: &crate::raft::SnapshotMeta,
    state: &crate::MemState,
) -> Result<Vec<u8>, crate::StoreError> {
    use crate::machine::StateStore;
    use crate::stored;
    const FORMAT3_BLOB_MIN: usize = 4096;
    let index = meta.last_log_id.map_or(0, |l| l.index);
    let mut w = crate::snapshot::Writer::new(
        Vec::new(),
        "golden snapshot",
        meta,
        state.clock(),
        state.quotas(),
        crate::snapshot::Stubs::Blobs,
    )?;
    let mut bodies = Vec::new();
    for (id, rec) in state.records() {
        if rec.response.as_ref().is_some_and(|r| r.body.len() >= FORMAT3_BLOB_MIN) {
            let mut stub = rec.clone();
            let body = stub.response.as_mut().map(|r| std::mem::take(&mut r.body)).unwrap_or_default();
            let n = u32::try_from(bodies.len()).unwrap_or(u32::MAX);
            let blob = stored::BlobRef { index, n, len: body.len() as u64, crc: crc32fast::hash(&body), at: None };
            w.record(&id.encode(), &stored::encode_stub(&stub, &blob)?)?;
            bodies.push((n, body));
        } else {
            w.record(&id.encode(), &crate::codec::encode(rec)?)?;
        }
    }
    let mut out = w.finish()?;
    out.extend_from_slice(&crate::snapshot::blob_section_head(bodies.len() as u64));
    for (n, body) in bodies {
        out.extend_from_slice(&crate::snapshot::blob_head(index, n, body.len() as u64));
        out.extend_from_slice(&body);
    }
    Ok(out)
}

/// The fixed values the fixtures are made of, shared by the store's and the node's golden
/// tests so that both cover every variant with the same contents.
pub mod samples {
    use crate::types::{Grant, Op, Outcome, Record, RecordKey, RecordState, Response, Token};
    use crate::ValidationError;

    /// The record every sample command addresses.
    pub fn key() -> RecordKey {
        RecordKey::fixed("acme", "payments.create", "order-0000000000000001")
    }

    fn response(status: u32) -> Response {
        Response {
            status,
            headers: vec![("content-type".to_string(), "application/json".to_string())],
            body: br#"{"id":"ch_1","amount":1299}"#.to_vec(),
        }
    }

    /// One command of every kind (both forms of those with an option that changes the shape).
    pub fn ops() -> Vec<(&'static str, Op)> {
        let token = Token::new(7, 2);
        vec![
            (
                "claim",
                Op::Claim {
                    id: key(),
                    fingerprint: Some([0xab; 32]),
                    owner: "worker-1".to_string(),
                    lease_ms: 30_000,
                    ttl_ms: 86_400_000,
                    allow_takeover: true,
                },
            ),
            (
                "claim_without_fingerprint",
                Op::Claim {
                    id: key(),
                    fingerprint: None,
                    owner: "worker-2".to_string(),
                    lease_ms: 5_000,
                    ttl_ms: 3_600_000,
                    allow_takeover: false,
                },
            ),
            ("complete", Op::Complete { id: key(), token, response: response(201) }),
            ("fail_retryable", Op::Fail { id: key(), token, retryable: true, response: None }),
            ("fail_terminal", Op::Fail { id: key(), token, retryable: false, response: Some(response(402)) }),
            ("extend_lease", Op::ExtendLease { id: key(), token, lease_ms: 60_000 }),
            (
                "checkpoint",
                Op::Checkpoint {
                    id: key(),
                    token,
                    recovery_point: "charged".to_string(),
                    data: vec![0, 1, 2, 0xff],
                    lease_ms: 45_000,
                },
            ),
            ("takeover", Op::Takeover { id: key(), owner: "worker-3".to_string(), force: true, lease_ms: 30_000 }),
            ("sweep", Op::Sweep { limit: 512 }),
            ("resume", Op::Resume { sweep_interval_ms: 1_000, max_stretch_ms: 600_000 }),
            ("set_quota_tenant", Op::SetQuota { tenant: Some("acme".to_string()), max_records: Some(1_000) }),
            ("set_quota_default_cleared", Op::SetQuota { tenant: None, max_records: None }),
            // The envelope only: the frame's bytes are zstd's business, and may change with it.
            (
                "compressed",
                Op::Compressed(crate::compressed::Compressed {
                    raw_len: 70_000,
                    zstd: vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x01, 0x02, 0x03],
                }),
            ),
        ]
    }

    /// A record in each state.
    pub fn records() -> Vec<(&'static str, Record)> {
        let base = Record {
            fingerprint: Some([0xcd; 32]),
            state: RecordState::InProgress,
            token: Token::new(9, 1),
            owner: "worker-1".to_string(),
            attempt: 2,
            taken_over: true,
            lease_expires_ms: 1_700_000_030_000,
            created_ms: 1_700_000_000_000,
            updated_ms: 1_700_000_001_000,
            completed_ms: None,
            expires_ms: 1_700_086_400_000,
            retention_ms: 86_400_000,
            recovery_point: "charged".to_string(),
            checkpoint: vec![9, 8, 7],
            response: None,
        };
        let completed = Record {
            state: RecordState::Completed,
            lease_expires_ms: 0,
            completed_ms: Some(1_700_000_002_000),
            response: Some(response(201)),
            fingerprint: None,
            ..base.clone()
        };
        let failed = Record { state: RecordState::Failed, lease_expires_ms: 0, taken_over: false, ..base.clone() };
        vec![("in_progress", base), ("completed", completed), ("failed", failed)]
    }

    /// One outcome of every kind, and every kind of validation error inside `Invalid`.
    pub fn outcomes() -> Vec<(&'static str, Outcome)> {
        let token = Token::new(7, 2);
        vec![
            (
                "acquired",
                Outcome::Acquired(Grant {
                    token,
                    attempt: 1,
                    takeover: false,
                    lease_expires_ms: 1_700_000_030_000,
                    expires_ms: 1_700_086_400_000,
                    recovery_point: "charged".to_string(),
                    checkpoint: vec![1, 2],
                }),
            ),
            ("replay", Outcome::Replay { token, completed_ms: 1_700_000_002_000, response: response(201) }),
            ("in_progress", Outcome::InProgress { lease_expires_ms: 1_700_000_030_000, retry_after_ms: 250 }),
            ("mismatch", Outcome::Mismatch),
            ("stale_token", Outcome::StaleToken { current: Token::new(8, 0) }),
            ("not_found", Outcome::NotFound),
            ("wrong_state", Outcome::WrongState { state: RecordState::Failed }),
            ("completed", Outcome::Completed { token }),
            ("failed", Outcome::Failed { token, retryable: true }),
            ("lease_extended", Outcome::LeaseExtended { token, lease_expires_ms: 1_700_000_060_000 }),
            ("swept", Outcome::Swept { deleted: 17 }),
            ("resumed", Outcome::Resumed { stretched: 3, stretch_ms: 4_500 }),
            (
                "invalid_identifier",
                Outcome::Invalid(ValidationError::BadIdentifier {
                    field: "key".to_string(),
                    problem: "is 3 bytes long".to_string(),
                    rule: "16 to 255 bytes".to_string(),
                }),
            ),
            (
                "invalid_range",
                Outcome::Invalid(ValidationError::OutOfRange {
                    field: "lease_ms".to_string(),
                    got: 1,
                    min: 100,
                    max: 3_600_000,
                    unit: " ms".to_string(),
                    fix: "ask for a longer lease".to_string(),
                }),
            ),
            (
                "invalid_missing",
                Outcome::Invalid(ValidationError::Missing {
                    field: "response".to_string(),
                    why: "a terminal failure stores one".to_string(),
                }),
            ),
            ("invalid_batch", Outcome::Invalid(ValidationError::BatchTooLarge { max: 65_536 })),
            (
                "invalid_compressed",
                Outcome::Invalid(ValidationError::BadCompressedCommand { detail: "zstd: corrupt".to_string() }),
            ),
            ("quota_exceeded", Outcome::QuotaExceeded { tenant: "acme".to_string(), limit: 1_000, records: 1_000 }),
            ("quota_set", Outcome::QuotaSet { limit: Some(1_000), records: 12 }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_odd_or_foreign_digits() {
        let bytes = vec![0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(unhex(&hex(&bytes)), Some(bytes));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_changed_missing_or_extra_case_is_reported_by_name() {
        let dir = std::env::temp_dir().join(format!("idemraft-golden-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("g.txt");
        let text = format!("{HEADER}same 0102\nchanged 03\ngone 04\n");
        assert!(std::fs::write(&path, text).is_ok());
        let mut g = Golden::new(&path);
        assert!(g.add("same", vec![1, 2]).is_ok());
        assert!(g.add("changed", vec![5]).is_ok());
        assert!(g.add("new", vec![6]).is_ok());
        assert!(g.add("new", vec![6]).is_err());
        let err = g.check().err().unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.starts_with("3 golden encoding(s) differ"), "{err}");
        assert!(err.contains("changed: encoding changed"), "{err}");
        assert!(err.contains("new: not in the fixture"), "{err}");
        assert!(err.contains("gone: in the fixture but no longer built"), "{err}");
        assert!(!err.contains("same"), "{err}");
    }
}
