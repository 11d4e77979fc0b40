//! Response bodies the workload completes with, and how the history remembers them.
//!
//! A body is a header naming its key, token and owner, then filler drawn from a generator
//! seeded by that header and written as hex text (so large bodies compress, as text answers
//! do, and travel compressed through the log), so every byte of it follows from what it was stored for: a replay
//! served for another record, or with one byte changed, cannot pass for the right one. The
//! history keeps only [`digest`] (length and SHA-256 of the whole body), never the body,
//! because a run completes thousands of bodies of up to 256 KiB; the checkers compare those
//! digests, which is a byte-for-byte comparison without the memory.

use std::str::FromStr;

use rand::Rng;
use sha2::{Digest, Sha256};

/// Smallest body of the mix.
pub const MIN_BODY: usize = 64;
/// Largest body of the mix: the node's default `--max-response-bytes`.
pub const MAX_BODY: usize = 256 * 1024;
/// Smallest body while a catch-up fault asks for large ones.
pub const LARGE_MIN: usize = 128 * 1024;

/// Which bodies the workload completes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payloads {
    /// A few bytes naming the owner (the harness's original bodies).
    Tiny,
    /// Key- and token-derived bodies of 64 B to 256 KiB, heavy-tailed.
    Mix,
}

impl FromStr for Payloads {
    type Err = String;

    fn from_str(s: &str) -> Result<Payloads, String> {
        match s {
            "tiny" => Ok(Payloads::Tiny),
            "mix" => Ok(Payloads::Mix),
            other => Err(format!("unknown payload mix '{other}': use tiny or mix")),
        }
    }
}

impl std::fmt::Display for Payloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Payloads::Tiny => "tiny",
            Payloads::Mix => "mix",
        })
    }
}

/// A body size: most 64 B–4 KiB, some 16–64 KiB, a few up to 256 KiB; 128–256 KiB when
/// `large` (a follower is down and must later catch up on big entries). Log-uniform within
/// each band so small sizes inside a band are as common as large ones.
pub fn draw_size(rng: &mut impl Rng, large: bool) -> usize {
    let (lo, hi) = if large {
        (LARGE_MIN, MAX_BODY)
    } else {
        match rng.random_range(0..100u32) {
            0..=84 => (MIN_BODY, 4 * 1024),
            85..=96 => (16 * 1024, 64 * 1024),
            _ => (64 * 1024, MAX_BODY),
        }
    };
    let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
    let size = rng.random_range(l..=h).exp() as usize;
    size.clamp(lo, hi)
}

fn header(kind: &str, key: &str, token: u64, owner: &str, len: usize) -> String {
    format!("{kind} key={key} token={token} owner={owner} len={len}\n")
}

/// splitmix64, written out in hex: fast in a debug build too, where CI runs the harness.
fn fill(seed: &[u8], out: &mut Vec<u8>, len: usize) {
    let d = Sha256::digest(seed);
    let mut state = u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // As hex text: half the entropy per byte, so the leader logs a large body compressed
        // (decision 0030), as it would a real API's text answers.
        let hex = format!("{z:016x}");
        let take = (len - out.len()).min(16);
        out.extend_from_slice(&hex.as_bytes()[..take]);
    }
}

/// The body `owner` stores under `token` for `key`: `kind` tells a Complete (`v`), a terminal
/// Fail (`e`) and a deliberately stale Complete (`stale`) apart. At least `len` bytes (the
/// header alone may be longer than a small `len`).
pub fn body(kind: &str, key: &str, token: u64, owner: &str, len: usize) -> Vec<u8> {
    let h = header(kind, key, token, owner, len);
    let mut out = Vec::with_capacity(len.max(h.len()));
    out.extend_from_slice(h.as_bytes());
    fill(h.as_bytes(), &mut out, len);
    out
}

/// What the history keeps of a body: its length and the SHA-256 of every byte.
pub fn digest(body: &[u8]) -> String {
    let d = Sha256::digest(body);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}B sha256:{hex}", body.len())
}

/// The length a [`digest`] names; `None` for a value of another shape (hand-written
/// histories).
pub fn digest_len(value: &str) -> Option<usize> {
    value.split_once("B sha256:")?.0.parse().ok()
}

/// The history's record of a body served back for `key` under `token`. A body the mix made is
/// also regenerated from its own header and compared byte for byte, so a wrong record or a
/// wrong byte is named as such in the anomaly rather than only as an unknown digest; a body
/// of another shape (the tiny mix) is kept by digest alone.
pub fn observed(key: &str, token: u64, body: &[u8]) -> String {
    let d = digest(body);
    match self_check(key, token, body) {
        Ok(()) => d,
        Err(why) => format!("{d} BAD: {why}"),
    }
}

fn self_check(key: &str, token: u64, got: &[u8]) -> Result<(), String> {
    let Some(end) = got.iter().position(|&b| b == b'\n') else { return Ok(()) };
    let Ok(line) = std::str::from_utf8(&got[..end]) else { return Ok(()) };
    let mut parts = line.split(' ');
    let kind = parts.next().unwrap_or_default();
    let mut field = |name: &str| parts.next().and_then(|p| p.strip_prefix(name)).map(str::to_string);
    let (Some(k), Some(t), Some(o), Some(l)) = (field("key="), field("token="), field("owner="), field("len=")) else {
        return Ok(());
    };
    if k != key {
        return Err(format!("the body was stored for key {k}"));
    }
    if t.parse::<u64>().ok() != Some(token) {
        return Err(format!("the body was stored under token {t}, not {token}"));
    }
    let Ok(len) = l.parse::<usize>() else { return Err(format!("bad length {l:?} in its header")) };
    let want = body(kind, &k, token, &o, len);
    if want.len() != got.len() {
        return Err(format!("{} bytes where {} were stored", got.len(), want.len()));
    }
    match want.iter().zip(got).position(|(a, b)| a != b) {
        Some(at) => Err(format!("byte {at} differs from what was stored")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn sizes_are_heavy_tailed_and_in_range() {
        let mut rng = StdRng::seed_from_u64(7);
        let sizes: Vec<usize> = (0..10_000).map(|_| draw_size(&mut rng, false)).collect();
        assert!(sizes.iter().all(|&s| (MIN_BODY..=MAX_BODY).contains(&s)));
        let small = sizes.iter().filter(|&&s| s <= 4096).count();
        let big = sizes.iter().filter(|&&s| s > 64 * 1024).count();
        assert!((8_000..9_000).contains(&small), "{small}");
        assert!((100..600).contains(&big), "{big}");
        assert!((0..100).all(|_| draw_size(&mut rng, true) >= LARGE_MIN));
    }

    #[test]
    fn a_body_follows_from_its_record_and_any_change_shows() {
        let b = body("v", "jk-1", 42, "c1-7", 5000);
        assert_eq!(b.len(), 5000);
        assert_eq!(b, body("v", "jk-1", 42, "c1-7", 5000));
        assert_eq!(digest_len(&digest(&b)), Some(5000));
        assert_eq!(observed("jk-1", 42, &b), digest(&b));
        assert!(observed("jk-2", 42, &b).contains("stored for key jk-1"));
        assert!(observed("jk-1", 43, &b).contains("under token 42"));
        let mut flipped = b.clone();
        flipped[4000] ^= 1;
        assert!(observed("jk-1", 42, &flipped).contains("byte 4000 differs"));
        assert_ne!(digest(&flipped), digest(&b));
        assert!(observed("jk-1", 42, &b[..4999]).contains("4999 bytes where 5000"));
        // A header longer than the asked length still makes a whole, checkable body.
        let short = body("e", "jk-1", 1, "c2-1", 1);
        assert_eq!(observed("jk-1", 1, &short), digest(&short));
        assert_eq!(observed("jk-1", 1, b"v-c1-1"), digest(b"v-c1-1"));
    }
}
