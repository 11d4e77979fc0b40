//! Which record keys the tree may hold: a Bloom filter in memory that answers "not stored"
//! for most keys that are not, so a claim on a fresh key (most claims) costs no sled lookup.
//!
//! A sled `get` walks the tree through its page cache even when the key is absent: in a
//! follower's profile at 64 clients, lookups were a fifth of its CPU and half of them were
//! the misses of fresh claims, and on the leader the replay fast path's read of every claim
//! added another (docs/benchmarks.md, "Levers tried").
//!
//! The one rule: every key in the tree is in the filter. Apply adds a key before it writes the
//! record to sled (in `Overlay::put`), a snapshot install or an open rebuilds the filter from
//! the indexes before anybody reads the new tree, and nothing ever takes a key out. A key that
//! is not in the filter is therefore not in the tree; a key that is may or may not be, and is
//! looked up. Removed keys stay set until the filter is rebuilt, which apply does once as many
//! keys were added since the last build as it was sized for: its cost (one pass over the
//! expiry index) is then spread over at least that many inserts.
//!
//! Blocked layout: each key sets [`BITS_PER_KEY`] bits inside one 512-bit block (one cache
//! line), chosen by the key's hash, at about [`BITS_PER_KEY_BUDGET`] bits of filter per key of
//! capacity: about 1 % false positives once it is full, far fewer before.

use std::hash::{DefaultHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// Bits set per key inside its block.
const BITS_PER_KEY: u32 = 6;
/// Filter bits per key of capacity.
const BITS_PER_KEY_BUDGET: u64 = 10;
/// The smallest capacity, so that a small or empty store does not rebuild every few applies
/// (small in unit tests, so that they can fill it).
#[cfg(not(test))]
const MIN_CAPACITY: u64 = 64 * 1024;
#[cfg(test)]
const MIN_CAPACITY: u64 = 256;
/// u64 words per block: 512 bits, one cache line.
const WORDS: usize = 8;

/// The filter a store's readers and its apply share.
pub(super) struct KeyFilter {
    current: RwLock<Bloom>,
}

struct Bloom {
    blocks: Box<[[AtomicU64; WORDS]]>,
    /// Keys it was sized for; past that, apply rebuilds it.
    capacity: u64,
    /// Keys added since it was built, counting the ones it was built from.
    added: AtomicU64,
}

fn hash(enc: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(enc);
    h.finish()
}

impl Bloom {
    fn with_capacity(keys: u64) -> Bloom {
        let capacity = keys.max(MIN_CAPACITY);
        let blocks = (capacity * BITS_PER_KEY_BUDGET).div_ceil(64 * WORDS as u64);
        let blocks = (0..blocks).map(|_| std::array::from_fn(|_| AtomicU64::new(0))).collect();
        Bloom { blocks, capacity, added: AtomicU64::new(0) }
    }

    /// The key's block and the bits it sets there, one bit index (0..512) per 9 bits of a
    /// second, mixed hash.
    fn place(&self, enc: &[u8]) -> (&[AtomicU64; WORDS], impl Iterator<Item = (usize, u64)>) {
        let h = hash(enc);
        let block = ((u128::from(h) * self.blocks.len() as u128) >> 64) as usize;
        let mut bits = h.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ h;
        let places = (0..BITS_PER_KEY).map(move |_| {
            let at = (bits & 511) as usize;
            bits >>= 9;
            (at / 64, 1u64 << (at % 64))
        });
        (&self.blocks[block], places)
    }

    fn insert(&self, enc: &[u8]) {
        let (block, places) = self.place(enc);
        for (word, bit) in places {
            block[word].fetch_or(bit, Ordering::Release);
        }
        self.added.fetch_add(1, Ordering::Relaxed);
    }

    fn may_contain(&self, enc: &[u8]) -> bool {
        let (block, mut places) = self.place(enc);
        places.all(|(word, bit)| block[word].load(Ordering::Acquire) & bit != 0)
    }
}

impl KeyFilter {
    /// A filter holding exactly `keys` (encoded record keys), sized for twice as many.
    pub(super) fn from_keys<'k>(keys: impl ExactSizeIterator<Item = &'k [u8]>) -> KeyFilter {
        KeyFilter { current: RwLock::new(Self::build(keys)) }
    }

    fn build<'k>(keys: impl ExactSizeIterator<Item = &'k [u8]>) -> Bloom {
        let bloom = Bloom::with_capacity(2 * keys.len() as u64);
        for k in keys {
            bloom.insert(k);
        }
        bloom
    }

    /// Runs `f` on the current filter under the read lock, which a rebuild takes for writing
    /// only to swap in a filter it built outside it.
    fn with<R>(&self, f: impl FnOnce(&Bloom) -> R) -> R {
        // A poisoned lock only means a panic elsewhere while it was held: the filter in it
        // was complete before and after any swap, so it is still right.
        f(&self.current.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether the tree may hold `enc`; `false` means it does not.
    pub(super) fn may_contain(&self, enc: &[u8]) -> bool {
        self.with(|b| b.may_contain(enc))
    }

    /// Adds a key apply is about to write.
    pub(super) fn insert(&self, enc: &[u8]) {
        self.with(|b| b.insert(enc));
    }

    /// Replaces the filter with one built from `keys`, which must be every key the tree holds
    /// now (the caller keeps apply and installs out meanwhile).
    pub(super) fn rebuild<'k>(&self, keys: impl ExactSizeIterator<Item = &'k [u8]>) {
        let fresh = Self::build(keys);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }

    /// Keys the filter is sized for.
    #[cfg(test)]
    pub(super) fn capacity(&self) -> u64 {
        self.with(|b| b.capacity)
    }

    /// Whether as many keys were added as the filter was sized for.
    pub(super) fn is_full(&self) -> bool {
        self.with(|b| b.added.load(Ordering::Relaxed) >= b.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u64) -> Vec<u8> {
        format!("tenant\0scope\0key-{i:016}").into_bytes()
    }

    #[test]
    fn every_inserted_key_is_found_and_few_others_are() {
        let stored: Vec<Vec<u8>> = (0..100_000).map(key).collect();
        let filter = KeyFilter::from_keys(stored[..50_000].iter().map(Vec::as_slice));
        for k in &stored[50_000..] {
            filter.insert(k);
        }
        assert!(stored.iter().all(|k| filter.may_contain(k)), "a stored key was reported absent");
        let false_positives = (100_000..200_000).filter(|i| filter.may_contain(&key(*i))).count();
        // 100k keys in a filter sized for 100k: about 1 % (blocked, 6 bits in 512).
        assert!(false_positives < 3_000, "{false_positives} false positives in 100000");
    }

    #[test]
    fn it_fills_and_a_rebuild_forgets_removed_keys_and_keeps_the_rest() {
        let filter = KeyFilter::from_keys(std::iter::empty());
        let mut i = 0;
        while !filter.is_full() {
            filter.insert(&key(i));
            i += 1;
        }
        assert_eq!(i, MIN_CAPACITY, "sized for its minimum capacity");
        let kept: Vec<Vec<u8>> = (0..10).map(key).collect();
        filter.rebuild(kept.iter().map(Vec::as_slice));
        assert!(!filter.is_full());
        assert!(kept.iter().all(|k| filter.may_contain(k)));
        let forgotten = (10..i).filter(|i| filter.may_contain(&key(*i))).count();
        assert!(forgotten < 10, "{forgotten} removed keys still reported after the rebuild");
    }
}
