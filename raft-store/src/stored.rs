//! The stored form of a record, as the sled store keeps it and snapshots carry it.
//!
//! A record whose response body is at least [`PACK_MIN`] bytes is stored as a small stub that
//! names a range of a pack, a file that holds many such bodies one after the other; every
//! other record is its plain encoding. Releases before decision 0029 kept bodies of 64 KiB and
//! more in blob files, one per body; their stubs name a file of its own, and are still read.
//! sled rewrites a tree node, values included, whenever it consolidates one and frees old
//! copies lazily, which kept two to seven copies of each large body on disk; a blob or a pack
//! is written once, and a snapshot hard-links it instead of copying it.
//!
//! ```text
//! plain:  bincode(Record)
//! blob:   0xB1 | index u64 LE | n u32 LE | len u64 LE | crc32 u32 LE | bincode(Record, body empty)
//! packed: 0xB2 | index u64 LE | n u32 LE | len u64 LE | crc32 u32 LE | at u64 LE | bincode(Record, body empty)
//! ```
//!
//! `0xB1` and `0xB2` can never start a plain encoding: a record starts with its fingerprint,
//! an `Option`, whose bincode tag is 0 or 1. A file's name is `(index, n)`: the last log index
//! of the apply call that created it and its position among that call's files. Names are
//! local to a node (a replica that applied the same log may name its files differently;
//! snapshots carry the names they use) and never reused: later applies have larger indexes,
//! and a snapshot install or a restart keeps only names at or below the snapshot's index. The
//! CRC-32 and the length catch a damaged or truncated file before its bytes are ever served.

use crate::codec;
use crate::error::StoreError;
use crate::types::Record;

/// Bodies from this size on are kept in packs. Below it the stub and the pack's entry head
/// (about 60 bytes, plus the key) would save too little of sled's copies to pay for a second
/// read on every replay. Every larger body goes to a pack too: a file per body cost every node
/// a create, a rename, an fsync at the next snapshot and later an unlink, and a released
/// large body is freed by a punched hole instead of a compaction copy (decision 0029).
pub const PACK_MIN: usize = 512;

const STUB_TAG: u8 = 0xB1;
const PACKED_TAG: u8 = 0xB2;
const STUB_HEAD: usize = 1 + 8 + 4 + 8 + 4;
const PACKED_HEAD: usize = STUB_HEAD + 8;

/// Where a body that is not inline goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A blob file of its own.
    File,
    /// A range of the pack being filled.
    Pack,
}

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
    /// Where the body starts in a pack file; `None`: the file holds the body alone.
    pub at: Option<u64>,
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

    /// A reference to the whole file `(index, n)`, for the calls that only need its name.
    pub fn name(index: u64, n: u32) -> Self {
        BlobRef { index, n, len: 0, crc: 0, at: None }
    }

    /// The body's bytes within the whole file `file`, checked: `what` names the file.
    pub fn body_in<'f>(&self, file: &'f [u8], what: &str) -> Result<&'f [u8], StoreError> {
        let body = match self.at {
            None => file,
            Some(at) => {
                let range = usize::try_from(at)
                    .ok()
                    .and_then(|at| Some(at..at.checked_add(usize::try_from(self.len).ok()?)?))
                    .and_then(|r| file.get(r));
                range.ok_or_else(|| StoreError::Corrupt {
                    what: what.to_string(),
                    detail: format!(
                        "it holds {} bytes, a record expects {} at byte {at} (truncated)",
                        file.len(),
                        self.len
                    ),
                })?
            }
        };
        self.check(body, what)?;
        Ok(body)
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

/// Where `rec`'s body belongs when it is not kept inline: a pack. (The store writes a file
/// of its own instead only when told to make data of the releases before packs took every
/// size.)
pub fn placement(rec: &Record) -> Option<Placement> {
    match rec.response.as_ref().map(|r| r.body.len()) {
        Some(n) if n >= PACK_MIN => Some(Placement::Pack),
        _ => None,
    }
}

/// The stub of `rec` (whose body was moved to `blob`): `rec` must have an empty body.
pub fn encode_stub(rec: &Record, blob: &BlobRef) -> Result<Vec<u8>, StoreError> {
    Ok(restub(&codec::encode(rec)?, blob))
}

/// A stub naming `blob` over `plain`, the encoding of a record with an empty body.
fn restub(plain: &[u8], blob: &BlobRef) -> Vec<u8> {
    let mut out = Vec::with_capacity(PACKED_HEAD + plain.len());
    out.push(if blob.at.is_some() { PACKED_TAG } else { STUB_TAG });
    out.extend_from_slice(&blob.index.to_le_bytes());
    out.extend_from_slice(&blob.n.to_le_bytes());
    out.extend_from_slice(&blob.len.to_le_bytes());
    out.extend_from_slice(&blob.crc.to_le_bytes());
    if let Some(at) = blob.at {
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend_from_slice(plain);
    out
}

/// Stub `value` pointed at `to` instead (the same body moved elsewhere), without decoding its
/// record; `None` when `value` is not a stub.
pub fn moved(value: &[u8], to: &BlobRef) -> Option<Vec<u8>> {
    let head = head_len(value)?;
    Some(restub(value.get(head..)?, to))
}

fn head_len(value: &[u8]) -> Option<usize> {
    let head = match value.first() {
        Some(&STUB_TAG) => STUB_HEAD,
        Some(&PACKED_TAG) => PACKED_HEAD,
        _ => return None,
    };
    (value.len() >= head).then_some(head)
}

/// The blob a stored value names, if it is a stub (without decoding the record).
pub fn blob_of(value: &[u8]) -> Option<BlobRef> {
    let head = head_len(value)?;
    let u64_at = |at: usize| value.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    let u32_at = |at: usize| value.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
    let at = if head == PACKED_HEAD { Some(u64_at(STUB_HEAD)?) } else { None };
    Some(BlobRef { index: u64_at(1)?, n: u32_at(9)?, len: u64_at(13)?, crc: u32_at(21)?, at })
}

/// Decodes a stored value: the record (with an empty body when it is a stub) and the blob the
/// stub names.
pub fn decode(what: &str, value: &[u8]) -> Result<(Record, Option<BlobRef>), StoreError> {
    match value.first() {
        Some(&tag) if tag == STUB_TAG || tag == PACKED_TAG => {
            let head = if tag == STUB_TAG { STUB_HEAD } else { PACKED_HEAD };
            let blob = blob_of(value).ok_or_else(|| StoreError::Corrupt {
                what: what.to_string(),
                detail: format!("a blob stub of {} bytes, shorter than its {head}-byte head", value.len()),
            })?;
            let rec: Record = codec::decode(what, &value[head..])?;
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
        let body = vec![3u8; 256 * 1024];
        let full = record(body.clone());
        assert_eq!(placement(&full), Some(Placement::Pack));
        let blob = BlobRef { index: 9, n: 2, len: body.len() as u64, crc: crc32fast::hash(&body), at: None };
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
    }

    #[test]
    fn a_packed_stub_round_trips_moves_and_finds_its_range() {
        let body = vec![5u8; PACK_MIN];
        assert_eq!(placement(&record(body.clone())), Some(Placement::Pack));
        assert_eq!(placement(&record(vec![0; PACK_MIN - 1])), None);
        let crc = crc32fast::hash(&body);
        let blob = BlobRef { index: 3, n: 1, len: body.len() as u64, crc, at: Some(40) };
        let stub = encode_stub(&record(Vec::new()), &blob).unwrap();
        assert_eq!(decode("t", &stub).unwrap(), (record(Vec::new()), Some(blob)));
        let to = BlobRef { index: 8, n: 0, at: Some(0), ..blob };
        let moved_stub = moved(&stub, &to).unwrap();
        assert_eq!(decode("t", &moved_stub).unwrap(), (record(Vec::new()), Some(to)));
        let whole = BlobRef { at: None, ..blob };
        assert_eq!(blob_of(&moved(&stub, &whole).unwrap()), Some(whole));
        assert_eq!(moved(&codec::encode(&record(vec![1])).unwrap(), &to), None);

        let mut file = vec![9u8; 40];
        file.extend_from_slice(&body);
        file.extend_from_slice(&[1, 2, 3]);
        assert_eq!(blob.body_in(&file, "f").unwrap(), &body[..]);
        assert!(blob.body_in(&file[..50], "f").is_err());
        assert!(BlobRef { at: Some(41), ..blob }.body_in(&file, "f").is_err());
        assert!(BlobRef { at: Some(u64::MAX), ..blob }.body_in(&file, "f").is_err());
        assert_eq!(whole.body_in(&body, "f").unwrap(), &body[..]);
    }

    #[test]
    fn names_round_trip() {
        let b = BlobRef::name(u64::MAX, 7);
        assert_eq!(BlobRef::parse_name(&b.file_name()), Some((u64::MAX, 7)));
        assert_eq!(BlobRef::parse_name("x-1"), None);
        assert_eq!(BlobRef::parse_name("0000000000000001-0000000z"), None);
    }

    #[test]
    fn a_stub_with_a_body_is_refused() {
        let blob = BlobRef { index: 1, n: 0, len: 1, crc: 0, at: None };
        let stub = encode_stub(&record(vec![1]), &blob).unwrap();
        assert!(decode("t", &stub).is_err());
        assert!(decode("t", &stub[..10]).is_err());
    }
}
