//! Snapshot files: a self-describing, checksummed stream of the state machine's records.
//!
//! ```text
//! "IDEMSNAP" | format u32 LE | frames... | SHA-256 of everything before it (32 bytes)
//! frame = u32 LE length | bincode(Frame)
//! Frame::Header { meta, clock }, in format 2 then Frame::Quotas, then Frame::Record { key, value }
//! in key order, then Frame::End { records }
//! ```
//!
//! Format 3 is format 2 whose records may be blob stubs (see [`crate::stored`]), followed,
//! after the checksum, by the blob section that holds every blob they name:
//!
//! ```text
//! "IDEMBLOB" | count u64 LE | count × (index u64 LE | n u32 LE | len u64 LE | body)
//! ```
//!
//! Each body is checked against the length and CRC-32 of the stub that names it, and every
//! stub's blob must arrive. A writer uses format 3 only when the state holds blobs, so a
//! state without large bodies is written exactly as before.
//!
//! Format 4 is format 3 whose records may also be packed stubs: a pack travels in the blob
//! section as one file, whole, and every range its records name is checked. A writer uses it
//! only when the state holds packed bodies, so a release that reads format 3 refuses it by its
//! number rather than by a record it cannot decode.
//!
//! Format 2 differs from format 1 only by the quotas frame, and a writer uses it only when a
//! quota is set: a state without quotas is written in format 1, byte for byte as before, so
//! nodes of the previous release can still install snapshots (and restore backups) of a cluster
//! that uses no quotas. Both formats are read. Per-tenant record counts are not stored: they
//! are recomputed from the records while a snapshot loads.
//!
//! Writing and reading both stream, so memory stays bounded by the largest record whatever
//! the number of records. The same format serves the sled store (files) and the in-memory
//! store (byte buffers).

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::codec;
use crate::error::StoreError;
use crate::raft::SnapshotMeta;
use crate::stored::{self, BlobRef};
use crate::types::{Quotas, Record, RecordKey};

const MAGIC: &[u8; 8] = b"IDEMSNAP";
/// Without quotas.
const VERSION_1: u32 = 1;
/// With a quotas frame after the header.
const VERSION_2: u32 = 2;
/// Format 2 with blob stubs and a blob section after the checksum.
const VERSION_3: u32 = 3;
/// Format 3 whose records may be packed stubs.
const VERSION_4: u32 = 4;
/// Largest file the blob section may hold: a pack is sealed at a few MiB, a blob is one body.
const MAX_BLOB_FILE: u64 = 64 * 1024 * 1024;

/// Which stubs a snapshot's records may be, which picks its format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stubs {
    /// Every record inline (format 1 or 2).
    None,
    /// Blob stubs (format 3).
    Blobs,
    /// Packed stubs too (format 4).
    Packs,
}
const BLOB_MAGIC: &[u8; 8] = b"IDEMBLOB";
/// Bytes of one blob's head in the blob section.
pub(crate) const BLOB_HEAD: usize = 8 + 4 + 8;
/// Largest frame accepted when reading: a record is bounded well below this by the limits.
const MAX_FRAME: usize = 64 * 1024 * 1024;

#[derive(Serialize, Deserialize)]
pub(crate) enum Frame {
    Header {
        meta: SnapshotMeta,
        clock: u64,
    },
    Record {
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    End {
        records: u64,
    },
    /// Format 2 only, right after the header. Appended last so the older variants keep their
    /// bincode indexes.
    Quotas(Quotas),
}

/// Streams frames into `out` while hashing them.
pub(crate) struct Writer<W: Write> {
    out: W,
    hash: Sha256,
    records: u64,
    what: String,
}

impl<W: Write> Writer<W> {
    /// Starts a snapshot stream with its header and quotas; `what` names it in errors.
    /// `stubs`: which stubs its records may be; with any, a blob section will follow.
    pub(crate) fn new(
        out: W,
        what: impl Into<String>,
        meta: &SnapshotMeta,
        clock: u64,
        quotas: &Quotas,
        stubs: Stubs,
    ) -> Result<Self, StoreError> {
        let mut w = Writer { out, hash: Sha256::new(), records: 0, what: what.into() };
        w.raw(MAGIC)?;
        let version = if stubs == Stubs::Packs {
            VERSION_4
        } else if stubs == Stubs::Blobs {
            VERSION_3
        } else if quotas.is_empty() {
            VERSION_1
        } else {
            VERSION_2
        };
        w.raw(&version.to_le_bytes())?;
        w.frame(&Frame::Header { meta: meta.clone(), clock })?;
        if version >= VERSION_2 {
            w.frame(&Frame::Quotas(quotas.clone()))?;
        }
        Ok(w)
    }

    fn raw(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        self.hash.update(bytes);
        self.out.write_all(bytes).map_err(|e| StoreError::io(format!("writing {}", self.what), e))
    }

    fn frame(&mut self, frame: &Frame) -> Result<(), StoreError> {
        let bytes = codec::encode(frame)?;
        self.raw(&(bytes.len() as u32).to_le_bytes())?;
        self.raw(&bytes)
    }

    /// Adds one record: its encoded key and its stored bytes.
    pub(crate) fn record(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.records += 1;
        self.frame(&Frame::Record { key: key.to_vec(), value: value.to_vec() })
    }

    /// The records added so far.
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// Writes the end frame and the checksum and hands the output back (unsynced).
    pub(crate) fn finish(mut self) -> Result<W, StoreError> {
        self.frame(&Frame::End { records: self.records })?;
        let sum = self.hash.clone().finalize();
        self.out.write_all(&sum).map_err(|e| StoreError::io(format!("writing {}", self.what), e))?;
        self.out.flush().map_err(|e| StoreError::io(format!("writing {}", self.what), e))?;
        Ok(self.out)
    }
}

/// The head of the blob section: the magic and the number of blobs.
pub(crate) fn blob_section_head(count: u64) -> Vec<u8> {
    let mut out = BLOB_MAGIC.to_vec();
    out.extend_from_slice(&count.to_le_bytes());
    out
}

/// The head of one blob in the blob section.
pub(crate) fn blob_head(index: u64, n: u32, len: u64) -> [u8; BLOB_HEAD] {
    let mut out = [0u8; BLOB_HEAD];
    out[..8].copy_from_slice(&index.to_le_bytes());
    out[8..12].copy_from_slice(&n.to_le_bytes());
    out[12..].copy_from_slice(&len.to_le_bytes());
    out
}

/// Reads frames back, checking the structure and, at the end, the checksum.
pub(crate) struct Reader<R: Read> {
    version: u32,
    input: BufReader<R>,
    hash: Sha256,
    what: String,
    done: bool,
    seen: u64,
    /// The previous record's key, kept in one reused buffer (valid once `seen > 0`).
    last_key: Vec<u8>,
    /// The quotas frame of format 2; empty for format 1.
    quotas: Quotas,
}

/// One record read back and checked: its identity, its decoded form (with an empty body when
/// its stored form is a blob stub), the blob it names, and its stored bytes.
pub(crate) struct CheckedRecord {
    pub(crate) id: RecordKey,
    pub(crate) key: Vec<u8>,
    pub(crate) record: Record,
    pub(crate) blob: Option<BlobRef>,
    pub(crate) value: Vec<u8>,
}

impl<R: Read> Reader<R> {
    /// Opens a stream and reads its header.
    pub(crate) fn new(input: R, what: impl Into<String>) -> Result<(Self, SnapshotMeta, u64), StoreError> {
        let mut r = Reader {
            version: VERSION_1,
            input: BufReader::with_capacity(256 * 1024, input),
            hash: Sha256::new(),
            what: what.into(),
            done: false,
            seen: 0,
            last_key: Vec::new(),
            quotas: Quotas::default(),
        };
        let mut magic = [0u8; 12];
        r.read_exact_hashed(&mut magic)?;
        if &magic[..8] != MAGIC {
            return Err(r.corrupt("it does not start with the Idemraft snapshot magic"));
        }
        let version = u32::from_le_bytes([magic[8], magic[9], magic[10], magic[11]]);
        if !(VERSION_1..=VERSION_4).contains(&version) {
            return Err(r.corrupt(format!(
                "it is snapshot format {version}; this build reads {VERSION_1} to {VERSION_4} (a newer release wrote it?)"
            )));
        }
        r.version = version;
        let (meta, clock) = match r.frame()? {
            Frame::Header { meta, clock } => (meta, clock),
            _ => return Err(r.corrupt("its first frame is not a header")),
        };
        if version >= VERSION_2 {
            match r.frame()? {
                Frame::Quotas(q) => r.quotas = q,
                _ => return Err(r.corrupt("format 2 without its quotas frame after the header")),
            }
        }
        Ok((r, meta, clock))
    }

    /// The quotas the snapshot holds (none for format 1).
    pub(crate) fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Whether its records may name blobs (format 3 or 4, with a blob section after the
    /// records).
    pub(crate) fn has_blobs(&self) -> bool {
        self.version >= VERSION_3
    }

    /// Which stubs its records may be.
    pub(crate) fn stubs(&self) -> Stubs {
        match self.version {
            VERSION_4 => Stubs::Packs,
            VERSION_3 => Stubs::Blobs,
            _ => Stubs::None,
        }
    }

    /// After the last record: reads the blob section of a format 3 stream, handing each blob
    /// to `each` as `(index, n, len, body)`; `each` may read as much of the body as it
    /// wants. Then checks that the stream ends. Returns the number of blobs (0 before format 3).
    pub(crate) fn blobs(
        &mut self,
        mut each: impl FnMut(u64, u32, u64, &mut dyn Read) -> Result<(), StoreError>,
    ) -> Result<u64, StoreError> {
        if !self.done {
            return Err(self.corrupt("its blob section was read before its records"));
        }
        if !self.has_blobs() {
            return Ok(0);
        }
        let mut head = [0u8; 16];
        self.read_plain(&mut head, "its blob section is missing (truncated)")?;
        if &head[..8] != BLOB_MAGIC {
            return Err(self.corrupt("its blob section does not start with the blob magic"));
        }
        let count = u64::from_le_bytes([head[8], head[9], head[10], head[11], head[12], head[13], head[14], head[15]]);
        for i in 0..count {
            let mut h = [0u8; BLOB_HEAD];
            self.read_plain(&mut h, "its blob section ends early (truncated)")?;
            let index = u64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]);
            let n = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
            let len = u64::from_le_bytes([h[12], h[13], h[14], h[15], h[16], h[17], h[18], h[19]]);
            let mut body = (&mut self.input).take(len);
            each(index, n, len, &mut body)?;
            std::io::copy(&mut body, &mut std::io::sink())
                .map_err(|e| StoreError::io(format!("reading {}", self.what), e))?;
            if body.limit() > 0 {
                return Err(self.corrupt(format!("blob {} of {count} ends early (truncated)", i + 1)));
            }
        }
        let mut one = [0u8; 1];
        match self.input.read(&mut one) {
            Ok(0) => Ok(count),
            Ok(_) => Err(self.corrupt("it goes on after its blob section")),
            Err(e) => Err(StoreError::io(format!("reading {}", self.what), e)),
        }
    }

    fn read_plain(&mut self, buf: &mut [u8], short: &str) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.corrupt(short.to_string())
            } else {
                StoreError::io(format!("reading {}", self.what), e)
            }
        })
    }

    /// The unread rest of the stream (after the records: the blob section, if any).
    pub(crate) fn into_rest(self) -> BufReader<R> {
        self.input
    }

    fn corrupt(&self, detail: impl Into<String>) -> StoreError {
        StoreError::Corrupt { what: self.what.clone(), detail: detail.into() }
    }

    fn read_exact_hashed(&mut self, buf: &mut [u8]) -> Result<(), StoreError> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.corrupt("it ends early (truncated)")
            } else {
                StoreError::io(format!("reading {}", self.what), e)
            }
        })?;
        self.hash.update(&*buf);
        Ok(())
    }

    fn frame(&mut self) -> Result<Frame, StoreError> {
        let mut len = [0u8; 4];
        self.read_exact_hashed(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_FRAME {
            return Err(self.corrupt(format!("a frame claims {len} bytes")));
        }
        let mut buf = vec![0u8; len];
        self.read_exact_hashed(&mut buf)?;
        codec::decode(&self.what, &buf)
    }

    /// Opens a snapshot received from a peer as `sent_as`: its id must be a plain name and its
    /// own header must describe it. Returns the reader and the snapshot's clock.
    pub(crate) fn received(input: R, sent_as: &SnapshotMeta) -> Result<(Self, u64), StoreError> {
        check_snapshot_id(&sent_as.snapshot_id)?;
        let (reader, header, clock) = Reader::new(input, format!("received snapshot {}", sent_as.snapshot_id))?;
        check_header(&header, sent_as)?;
        Ok((reader, clock))
    }

    /// The next record, or `None` after the end frame once the count and checksum match.
    ///
    /// Every record is checked before it is handed out, so a snapshot that would fail later,
    /// after the state it replaces is gone, fails here instead: the key must name a valid
    /// record, keys must strictly ascend (no duplicates), and the value must decode.
    pub(crate) fn next_record(&mut self) -> Result<Option<CheckedRecord>, StoreError> {
        if self.done {
            return Ok(None);
        }
        match self.frame()? {
            Frame::Record { key, value } => {
                let id = RecordKey::decode(&key)
                    .ok_or_else(|| self.corrupt(format!("record {} has an invalid key {key:?}", self.seen + 1)))?;
                if self.seen > 0 && key <= self.last_key {
                    return Err(
                        self.corrupt(format!("record {} ({id}) is out of key order or repeated", self.seen + 1))
                    );
                }
                let (record, blob) = stored::decode(&format!("record {id} in {}", self.what), &value)?;
                if blob.is_some() && !self.has_blobs() {
                    return Err(self.corrupt(format!(
                        "record {id} names a blob, but format {} has no blob section",
                        self.version
                    )));
                }
                if blob.is_some_and(|b| b.at.is_some()) && self.stubs() < Stubs::Packs {
                    return Err(self.corrupt(format!(
                        "record {id} names a range of a pack, but format {} has no packs",
                        self.version
                    )));
                }
                self.seen += 1;
                self.last_key.clear();
                self.last_key.extend_from_slice(&key);
                Ok(Some(CheckedRecord { id, key, record, blob, value }))
            }
            Frame::End { records } => {
                let seen = self.seen;
                if records != seen {
                    return Err(self.corrupt(format!("its end frame counts {records} records but {seen} were read")));
                }
                let expected = self.hash.clone().finalize();
                let mut sum = [0u8; 32];
                self.input.read_exact(&mut sum).map_err(|_| self.corrupt("its checksum is missing (truncated)"))?;
                if sum[..] != expected[..] {
                    return Err(self.corrupt("its checksum does not match its contents"));
                }
                self.done = true;
                Ok(None)
            }
            Frame::Header { .. } => Err(self.corrupt("it has a second header")),
            Frame::Quotas(_) => Err(self.corrupt("its quotas frame is not right after the header")),
        }
    }
}

/// A snapshot id names a file in the snapshots directory, and ids come from peers: only plain
/// names are accepted, so no id can point outside that directory.
/// The files a snapshot's records name, with every body each must hold: filled from the
/// records, then checked against the blob section file by file.
/// A file of the blob section, read whole, and what each record that names it gave.
pub(crate) type Arrived<T> = (Vec<u8>, Vec<(BlobRef, T)>);

pub(crate) struct Wanted<T = ()> {
    files: BTreeMap<(u64, u32), Vec<(BlobRef, T)>>,
}

impl<T> Default for Wanted<T> {
    fn default() -> Self {
        Wanted { files: BTreeMap::new() }
    }
}

impl<T> Wanted<T> {
    /// A record names `b`; `with` travels with it until its file arrives.
    pub(crate) fn add(&mut self, b: BlobRef, with: T) {
        self.files.entry((b.index, b.n)).or_default().push((b, with));
    }

    /// Reads file `(index, n)` of the blob section (`len` bytes, from `body`) whole and checks
    /// every body the records expect in it. Returns its bytes and what each record gave.
    pub(crate) fn take(
        &mut self,
        index: u64,
        n: u32,
        len: u64,
        body: &mut dyn Read,
        what: &str,
    ) -> Result<Arrived<T>, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt { what: what.to_string(), detail };
        let named = self
            .files
            .remove(&(index, n))
            .ok_or_else(|| corrupt(format!("blob {index}-{n} is named by no record, or sent twice")))?;
        let packed = named.iter().filter(|(b, _)| b.at.is_some()).count();
        match (packed, named.as_slice()) {
            (0, [(b, _)]) if b.len != len => {
                return Err(corrupt(format!("blob {index}-{n} has {len} bytes, its record expects {}", b.len)));
            }
            (0, [_]) => {}
            (p, all) if p == all.len() => {}
            _ => return Err(corrupt(format!("file {index}-{n} is named as a blob and as a pack, or as two blobs"))),
        }
        if len > MAX_BLOB_FILE {
            return Err(corrupt(format!("file {index}-{n} has {len} bytes, more than the {MAX_BLOB_FILE} allowed")));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        body.take(len).read_to_end(&mut bytes).map_err(|e| StoreError::io(format!("reading {what}"), e))?;
        if bytes.len() as u64 != len {
            return Err(corrupt(format!("blob {index}-{n} ends early (truncated)")));
        }
        let file = format!("blob {index}-{n} in {what}");
        for (b, _) in &named {
            b.body_in(&bytes, &file)?;
        }
        Ok((bytes, named))
    }

    /// Every named file arrived.
    pub(crate) fn finish(&self, what: &str) -> Result<(), StoreError> {
        match self.files.first_key_value() {
            Some(((index, n), _)) => Err(StoreError::Corrupt {
                what: what.to_string(),
                detail: format!("{} files named by records never arrived, blob {index}-{n} first", self.files.len()),
            }),
            None => Ok(()),
        }
    }
}

fn check_snapshot_id(id: &str) -> Result<(), StoreError> {
    let plain = !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if plain {
        Ok(())
    } else {
        Err(StoreError::Corrupt {
            what: "snapshot id".into(),
            detail: format!("{id:?} is not a plain name of up to 200 characters from A-Z a-z 0-9 . _ -"),
        })
    }
}

/// The snapshot's own header must describe the snapshot it was sent as.
fn check_header(header: &SnapshotMeta, sent_as: &SnapshotMeta) -> Result<(), StoreError> {
    if header == sent_as {
        return Ok(());
    }
    Err(StoreError::Corrupt {
        what: format!("received snapshot {}", sent_as.snapshot_id),
        detail: format!(
            "its header describes snapshot {} up to {:?}, but it was sent as {} up to {:?}",
            header.snapshot_id, header.last_log_id, sent_as.snapshot_id, sent_as.last_log_id
        ),
    })
}
