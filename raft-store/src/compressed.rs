//! Commands carried compressed through the log and between nodes (decision 0030).
//!
//! A command with a large payload (a stored response, checkpoint data) is written once, by the
//! leader, as [`Op::Compressed`]: the command's own encoding, compressed with zstd. Every node
//! then logs, fsyncs, sends and reads back the smaller form, and [`crate::machine::apply`]
//! unpacks it before deciding anything, so the state, its digest and snapshots are exactly
//! what the plain command would have made. Whether to compress at all is the leader's
//! choice ([`compress`] is only called once every member is known to decode the variant);
//! unpacking is deterministic, so every replica decides a damaged one the same way.

use std::cell::RefCell;

use serde::{Deserialize, Serialize};

use crate::types::Op;
use crate::validate::ValidationError;

/// Commands whose payload is smaller than this are left as they are. Compressing costs the
/// leader a pass over the command and every node a pass to unpack it, while the passes it
/// saves (log, fsync, peer link, reading entries back) shrink with the body: side by side,
/// 4 KiB bodies cost more CPU compressed than plain, 8 KiB ones about the same, 16 KiB and
/// larger ones less (docs/decisions/0030).
pub const COMPRESS_MIN: usize = 8 * 1024;

/// The largest decoded command a compressed one may claim to hold. Larger than any command
/// the limits allow (a 256 KiB response with its headers, or checkpoint data), and a bound
/// on what a damaged length could make a node allocate.
pub const MAX_UNPACKED: usize = 8 << 20;

/// zstd's fastest regular level: most of the size reduction for the least CPU, which is what
/// a leader that compresses every large command on its own can afford.
const LEVEL: i32 = 1;

/// The encoding of a command, compressed: the payload of [`Op::Compressed`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compressed {
    /// Bytes of the command's encoding before compression.
    pub raw_len: u32,
    /// One zstd frame of that encoding, with its checksum.
    #[serde(with = "serde_bytes")]
    pub zstd: Vec<u8>,
}

thread_local! {
    // A context per thread: making one costs about as much as compressing 16 KiB.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Bytes of `op`'s payload that compression is for: the response body of a Complete or a
/// terminal Fail, the data of a Checkpoint.
fn payload_len(op: &Op) -> usize {
    match op {
        Op::Complete { response, .. } | Op::Fail { response: Some(response), .. } => response.body.len(),
        Op::Checkpoint { data, .. } => data.len(),
        _ => 0,
    }
}

/// `op` as the leader logs it: compressed when its payload is at least [`COMPRESS_MIN`] bytes
/// and compression saves at least an eighth of its encoding; otherwise `op` unchanged (an
/// incompressible body, an already compressed command, a small one).
pub fn compress(op: Op) -> Op {
    if payload_len(&op) < COMPRESS_MIN {
        return op;
    }
    match pack(&op) {
        Some(c) if c.zstd.len() <= c.raw_len as usize - c.raw_len as usize / 8 => Op::Compressed(c),
        _ => op,
    }
}

/// Any command compressed, whatever it saves; `None` when it cannot be encoded or zstd fails.
pub fn pack(op: &Op) -> Option<Compressed> {
    let raw = crate::codec::encode(op).ok()?;
    let raw_len = u32::try_from(raw.len()).ok()?;
    let zstd = COMPRESSOR.with(|slot| {
        let mut slot = slot.borrow_mut();
        if slot.is_none() {
            // The frame's checksum (4 bytes) makes a damaged frame fail to unpack: zstd alone
            // would hand back a literal with a flipped bit as if it were the command.
            *slot = zstd::bulk::Compressor::new(LEVEL).ok().and_then(|mut c| c.include_checksum(true).ok().map(|()| c));
        }
        slot.as_mut().and_then(|c| c.compress(&raw).ok())
    })?;
    Some(Compressed { raw_len, zstd })
}

impl Compressed {
    /// The command inside. A frame that does not decompress to exactly `raw_len` bytes of a
    /// command, or holds another compressed one, is refused with the same error on every node.
    pub fn unpack(&self) -> Result<Op, ValidationError> {
        let bad = |detail: String| ValidationError::BadCompressedCommand { detail };
        let raw_len = self.raw_len as usize;
        if raw_len > MAX_UNPACKED {
            return Err(bad(format!("it claims {raw_len} bytes, more than the {MAX_UNPACKED} any command may have")));
        }
        let raw = DECOMPRESSOR.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                *slot = Some(zstd::bulk::Decompressor::new().map_err(|e| bad(format!("no zstd context: {e}")))?);
            }
            match slot.as_mut() {
                Some(d) => d.decompress(&self.zstd, raw_len).map_err(|e| bad(format!("zstd: {e}"))),
                None => Err(bad("no zstd context".into())),
            }
        })?;
        if raw.len() != raw_len {
            return Err(bad(format!("it holds {} bytes, its header says {raw_len}", raw.len())));
        }
        match crate::codec::decode::<Op>("compressed command", &raw) {
            Ok(Op::Compressed(_)) => Err(bad("it holds another compressed command".into())),
            Ok(op) => Ok(op),
            Err(e) => Err(bad(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RecordKey, Response, Token};

    fn complete(body: Vec<u8>) -> Op {
        Op::Complete {
            id: RecordKey::new("t", "s", "k-0123456789abcdef").unwrap_or_else(|e| panic!("{e}")),
            token: Token(7),
            response: Response { status: 200, headers: vec![("content-type".into(), "application/json".into())], body },
        }
    }

    fn json(len: usize) -> Vec<u8> {
        let mut s = String::new();
        let mut i = 0u64;
        while s.len() < len {
            s.push_str(&format!("{{\"id\":\"ch_{:016x}\",\"amount\":{},\"currency\":\"usd\"}},", i * 7919, i % 1000));
            i += 1;
        }
        s.into_bytes()[..len].to_vec()
    }

    #[test]
    fn a_large_command_round_trips_and_a_small_or_random_one_is_left_alone() {
        let op = complete(json(64 * 1024));
        let Op::Compressed(c) = compress(op.clone()) else { panic!("a 64 KiB JSON body was not compressed") };
        assert!(c.zstd.len() < 64 * 1024 / 2, "{} bytes", c.zstd.len());
        assert_eq!(c.unpack(), Ok(op));

        let small = complete(json(COMPRESS_MIN - 1));
        assert_eq!(compress(small.clone()), small);
        // xorshift bytes: zstd cannot shrink them by an eighth, so they stay as they are.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let random: Vec<u8> = (0..16384)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        assert_eq!(compress(complete(random.clone())), complete(random));
        let once = compress(complete(json(16 * 1024)));
        assert_eq!(compress(once.clone()), once, "a compressed command is not compressed again");
    }

    #[test]
    fn damaged_frames_are_refused_naming_the_problem() {
        let Op::Compressed(c) = compress(complete(json(16 * 1024))) else { panic!("not compressed") };
        let err = |c: Compressed| c.unpack().err().map(|e| e.to_string()).unwrap_or_default();

        let mut flipped = c.clone();
        let mid = flipped.zstd.len() / 2;
        flipped.zstd[mid] ^= 0x40;
        assert!(err(flipped).contains("compressed command"));
        assert!(err(Compressed { raw_len: c.raw_len + 1, ..c.clone() }).contains("its header says"));
        assert!(err(Compressed { raw_len: c.raw_len - 1, ..c.clone() }).contains("zstd"));
        assert!(err(Compressed { raw_len: u32::MAX, ..c.clone() }).contains("more than"));
        assert!(err(Compressed { raw_len: c.raw_len, zstd: c.zstd[..c.zstd.len() - 3].to_vec() }).contains("zstd"));

        let nested = pack(&Op::Compressed(c)).unwrap_or_else(|| panic!("pack failed"));
        assert!(err(nested).contains("another compressed command"));
    }
}
