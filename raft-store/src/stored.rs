//! The stored form of a record, as the sled store keeps it and snapshots carry it.
//!
//! A record whose response body is at least [`BLOB_MIN`] bytes is stored as a small stub that
//! names a blob, a file of its own that holds the body; every other record is its plain
//! encoding. sled rewrites a tree node, values included, whenever it consolidates one and
//! frees old copies lazily, which kept two to seven copies of each large body on disk; a blob
//! is written once, and a snapshot hard-links it instead of copying it.
//!
//! ```text
//! plain: bincode(Record)
//! stub:  0xB1 | index u64 LE | n u32 LE | len u64 LE | crc32 u32 LE | bincode(Record, body empty)
//! ```
//!
//! `0xB1` can never start a plain encoding: a record starts with its fingerprint, an `Option`,
//! whose bincode tag is 0 or 1. A blob's name is `(index, n)`: the last log index of the
//! apply call that wrote it and its position among that call's blobs. Names are local to a
//! node (a replica that applied the same log may name its blobs differently; snapshots carry
//! the names they use) and never reused: later applies have larger indexes, and a snapshot
//! install or a restart keeps only names at or below the snapshot's index. The CRC-32 and the
//! length catch a damaged or truncated file before its bytes are ever served.

use crate::codec;
use crate::error::StoreError;
use crate::types::Record;

/// Bodies from this size on are kept in blob files. Below it a file's 4 KiB block and inode
/// would cost more than sled's copies of the value.
pub const BLOB_MIN: usize = 4096;

const STUB_TAG: u8 = 0xB1;
const STUB_HEAD: usize = 1 + 8 + 4 + 8 + 4;

/// The blob a stub names, with what its file must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlobRef {
    /// Last log index of the apply call that wrote it.
    pub index: u64,
    /// Its position among that call's blobs.
    pub n: u32,
    /// Body length in bytes.
    pub len: u64,
    /// CRC-32 (IEEE) of the body.
    pub crc: u32,
}

impl BlobRef {
    /// The blob's file name, the same in the blob directory and in a snapshot's.
    pub fn file_name(&self) -> String {
        format!("{:016x}-{:08x}", self.index, self.n)
    }

    /// Parses a file name made by [`BlobRef::file_name`]: `(index, n)`.
    pub fn parse_name(name: &str) -> Option<(u64, u32)> {
        let (i, n) = name.split_once('-')?;
        if i.len() != 16 || n.len() != 8 {
            return None;
        }
        Some((u64::from_str_radix(i, 16).ok()?, u32::from_str_radix(n, 16).ok()?))
    }

    /// Checks a body read back against the stub: `what` names the file in the error.
    pub fn check(&self, body: &[u8], what: &str) -> Result<(), StoreError> {
        if body.len() as u64 != self.len {
            return Err(StoreError::Corrupt {
                what: what.to_string(),
                detail: format!("it holds {} bytes, its record expects {}", body.len(), self.len),
            });
        }
        if crc32fast::hash(body) != self.crc {
            return Err(StoreError::Corrupt {
                what: what.to_string(),
                detail: "its CRC-32 does not match its record's: the file was damaged at rest".into(),
            });
        }
        Ok(())
    }
}

/// Whether `rec`'s body belongs in a blob.
pub fn wants_blob(rec: &Record) -> bool {
    rec.response.as_ref().is_some_and(|r| r.body.len() >= BLOB_MIN)
}

/// The stub of `rec` (whose body was moved to blob `blob`): `rec` must have an empty body.
pub fn encode_stub(rec: &Record, blob: &BlobRef) -> Result<Vec<u8>, StoreError> {
    let plain = codec::encode(rec)?;
    let mut out = Vec::with_capacity(STUB_HEAD + plain.len());
    out.push(STUB_TAG);
    out.extend_from_slice(&blob.index.to_le_bytes());
    out.extend_from_slice(&blob.n.to_le_bytes());
    out.extend_from_slice(&blob.len.to_le_bytes());
    out.extend_from_slice(&blob.crc.to_le_bytes());
    out.extend_from_slice(&plain);
    Ok(out)
}

/// The blob a stored value names, if it is a stub (without decoding the record).
pub fn blob_of(value: &[u8]) -> Option<BlobRef> {
    if value.first() != Some(&STUB_TAG) || value.len() < STUB_HEAD {
        return None;
    }
    let u64_at = |at: usize| value.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let u32_at = |at: usize| value.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    Some(BlobRef { index: u64_at(1)?, n: u32_at(9)?, len: u64_at(13)?, crc: u32_at(21)? })
}

/// Decodes a stored value: the record (with an empty body when it is a stub) and the blob the
/// stub names.
pub fn decode(what: &str, value: &[u8]) -> Result<(Record, Option<BlobRef>), StoreError> {
    match value.first() {
        Some(&STUB_TAG) => {
            let blob = blob_of(value).ok_or_else(|| StoreError::Corrupt {
                what: what.to_string(),
                detail: format!("a blob stub of {} bytes, shorter than its {STUB_HEAD}-byte head", value.len()),
            })?;
            let rec: Record = codec::decode(what, &value[STUB_HEAD..])?;
            if rec.response.as_ref().is_none_or(|r| !r.body.is_empty()) {
                return Err(StoreError::Corrupt {
                    what: what.to_string(),
                    detail: "a blob stub whose record has no response or a body of its own".into(),
                });
            }
            Ok((rec, Some(blob)))
        }
        _ => Ok((codec::decode(what, value)?, None)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::types::{RecordState, Response, Token};

    fn record(body: Vec<u8>) -> Record {
        Record {
            fingerprint: Some([7; 32]),
            state: RecordState::Completed,
            token: Token(42),
            owner: "w".into(),
            attempt: 1,
            taken_over: false,
            lease_expires_ms: 0,
            created_ms: 1,
            updated_ms: 2,
            completed_ms: Some(2),
            expires_ms: 100,
            retention_ms: 50,
            recovery_point: String::new(),
            checkpoint: Vec::new(),
            response: Some(Response { status: 200, headers: vec![("a".into(), "b".into())], body }),
        }
    }

    #[test]
    fn a_stub_round_trips_and_a_plain_value_is_never_taken_for_one() {
        let body = vec![3u8; BLOB_MIN];
        let full = record(body.clone());
        assert!(wants_blob(&full));
        let blob = BlobRef { index: 9, n: 2, len: body.len() as u64, crc: crc32fast::hash(&body) };
        let stub = encode_stub(&record(Vec::new()), &blob).unwrap();
        let (back, found) = decode("t", &stub).unwrap();
        assert_eq!(found, Some(blob));
        assert_eq!(back, record(Vec::new()));
        blob.check(&body, "f").unwrap();
        assert!(blob.check(&body[1..], "f").is_err());
        let mut flipped = body.clone();
        flipped[10] ^= 1;
        assert!(blob.check(&flipped, "f").is_err());

        let plain = codec::encode(&full).unwrap();
        assert_eq!(blob_of(&plain), None);
        assert_eq!(decode("t", &plain).unwrap(), (full, None));
        let mut no_fp = record(vec![1]);
        no_fp.fingerprint = None;
        assert_eq!(blob_of(&codec::encode(&no_fp).unwrap()), None);
        assert!(!wants_blob(&record(vec![0; BLOB_MIN - 1])));
    }

    #[test]
    fn names_round_trip() {
        let b = BlobRef { index: u64::MAX, n: 7, len: 0, crc: 0 };
        assert_eq!(BlobRef::parse_name(&b.file_name()), Some((u64::MAX, 7)));
        assert_eq!(BlobRef::parse_name("x-1"), None);
        assert_eq!(BlobRef::parse_name("0000000000000001-0000000z"), None);
    }

    #[test]
    fn a_stub_with_a_body_is_refused() {
        let blob = BlobRef { index: 1, n: 0, len: 1, crc: 0 };
        let stub = encode_stub(&record(vec![1]), &blob).unwrap();
        assert!(decode("t", &stub).is_err());
        assert!(decode("t", &stub[..10]).is_err());
    }
}
