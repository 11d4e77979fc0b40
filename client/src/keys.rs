//! Idempotency-key generators, and the key rule they keep to.
//!
//! The rule is the server's (contract §1.1): 16 to 255 bytes of `[A-Za-z0-9_.:-]`. Every
//! generator here returns a key that satisfies it, so a key mistake shows up where the key is
//! made and not as a 400 from the server at request time.
//!
//! Which generator to use depends on what makes two calls "the same operation":
//! - [`random`]: nothing the caller can name; generate once per logical operation and reuse the
//!   key on every retry of it.
//! - [`from_parts`]: the operation is named by data (an order id, a message id), so a process
//!   that restarts and rebuilds the key from the same data retries instead of repeating.
//! - [`time_bucketed`]: the same data may legitimately repeat later (a daily report), so the
//!   time window is part of the name.
//! - [`composite`]: like [`from_parts`], but readable in logs, for parts that allow it.

use std::fmt;

use idemraft_rules::is_key_byte;

use crate::fingerprint::{fingerprint_parts, push_hex};

/// Shortest key the server accepts, in bytes (the rule lives in `idemraft-rules`).
pub const MIN_LEN: usize = idemraft_rules::KEY_MIN_LEN;

/// Longest key the server accepts, in bytes.
pub const MAX_LEN: usize = idemraft_rules::KEY_MAX_LEN;

/// Joins the parts of a [`composite`] key; so parts may not contain it.
const SEPARATOR: char = ':';

/// Length of the hash in [`from_parts`] and [`time_bucketed`] keys: 128 bits, hex.
const HASH_HEX_LEN: usize = 32;

/// Length of a UUID in its hyphenated text form.
const UUID_LEN: usize = 36;

/// Why a key, or the parts of a [`composite`] key, break the key rule.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyError {
    /// [`composite`] was given no parts.
    NoParts,
    /// A part of a [`composite`] key is empty.
    EmptyPart {
        /// Position of the part in the list.
        index: usize,
    },
    /// A part of a [`composite`] key has a character it may not contain.
    BadPartCharacter {
        /// Position of the part in the list.
        index: usize,
        /// The part.
        part: String,
        /// The first character that is not allowed.
        found: char,
    },
    /// A key has a character outside `[A-Za-z0-9_.:-]`.
    BadCharacter {
        /// Byte offset of the character in the key.
        offset: usize,
        /// The character.
        found: char,
    },
    /// A key, or the joined parts of a [`composite`] key, is shorter than [`MIN_LEN`] or
    /// longer than [`MAX_LEN`].
    Length {
        /// Its length in bytes.
        len: usize,
    },
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const RULE: &str = "keys are 16 to 255 bytes of A-Z a-z 0-9 _ . : -";
        const FIX: &str = "use keys::from_parts, which hashes any parts into a valid key";
        match self {
            KeyError::NoParts => write!(f, "a composite key needs at least one part; {FIX}, or keys::random"),
            KeyError::EmptyPart { index } => {
                write!(f, "part {index} of the composite key is empty, which would make parts ambiguous; {FIX}")
            }
            KeyError::BadPartCharacter { index, part, found: SEPARATOR } => write!(
                f,
                "part {index} ({part:?}) of the composite key contains ':', which joins the parts, so two different \
                 lists of parts could give the same key; {FIX}"
            ),
            KeyError::BadPartCharacter { index, part, found } => write!(
                f,
                "part {index} ({part:?}) of the composite key contains {found:?}; composite parts may only use \
                 A-Z a-z 0-9 _ . -; {FIX}"
            ),
            KeyError::BadCharacter { offset, found } => {
                write!(f, "the key has {found:?} at byte {offset}; {RULE} (a UUID works); {FIX}")
            }
            KeyError::Length { len } => write!(f, "the key is {len} bytes long; {RULE}; {FIX} (34 bytes)"),
        }
    }
}

impl std::error::Error for KeyError {}

/// Checks a key against the server's rule: 16 to 255 bytes of `[A-Za-z0-9_.:-]`.
///
/// # Errors
///
/// [`KeyError::BadCharacter`] for the first character outside the rule, else
/// [`KeyError::Length`].
pub fn validate(key: &str) -> Result<(), KeyError> {
    if let Some((offset, found)) = key.char_indices().find(|&(_, c)| !u8::try_from(c).is_ok_and(is_key_byte)) {
        return Err(KeyError::BadCharacter { offset, found });
    }
    if !(MIN_LEN..=MAX_LEN).contains(&key.len()) {
        return Err(KeyError::Length { len: key.len() });
    }
    Ok(())
}

/// A fresh random key: `prefix` followed by a version 4 UUID, e.g. `pay_` gives
/// `pay_3f0c9a4e-6b1d-4c2a-9e55-0d7f3b8a1c26`.
///
/// The prefix is used as given, so the caller includes its own separator. It is only there to
/// make keys recognisable in logs (the 122 random bits are what make the key unique), so rather
/// than fail, a prefix is made to fit the key rule: each character outside `[A-Za-z0-9_.:-]`
/// becomes `_`, and it is cut to the 219 bytes that leave room for the UUID.
#[must_use]
pub fn random(prefix: &str) -> String {
    let mut key = String::with_capacity(prefix.len().min(MAX_LEN));
    key.extend(prefix.chars().map(|c| if u8::try_from(c).is_ok_and(is_key_byte) { c } else { '_' }));
    // Only ASCII remains, so any byte length is a char boundary.
    key.truncate(MAX_LEN - UUID_LEN);
    key.push_str(&uuid_v4(rand::random::<u128>()));
    key
}

/// The RFC 9562 text form of `bits` made a version 4 (random) UUID.
fn uuid_v4(bits: u128) -> String {
    let mut bytes = bits.to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut text = String::with_capacity(UUID_LEN);
    for (group, range) in [0..4, 4..6, 6..8, 8..10, 10..16].into_iter().enumerate() {
        if group > 0 {
            text.push('-');
        }
        push_hex(&mut text, &bytes[range]);
    }
    text
}

/// A deterministic key for an operation named by data: `d_` and the first 128 bits of a
/// SHA-256 of the parts, in hex (34 bytes).
///
/// The same parts in the same order always give the same key; each part is hashed with its
/// length ([`fingerprint_parts`]), so `["ab", "c"]` and `["a", "bc"]` give different keys.
/// Any text may be a part. 128 bits keep accidental collisions out of reach for any number
/// of keys one deployment will ever hold.
#[must_use]
pub fn from_parts(parts: &[&str]) -> String {
    let mut key = String::from("d_");
    key.push_str(&parts_hash(parts));
    key
}

fn parts_hash(parts: &[&str]) -> String {
    let bytes: Vec<&[u8]> = parts.iter().map(|part| part.as_bytes()).collect();
    let mut hash = fingerprint_parts(&bytes).to_hex();
    hash.truncate(HASH_HEX_LEN);
    hash
}

/// A deterministic key that also changes with time: `t`, the bucket number
/// `at_ms / bucket_ms`, `_`, and the same hash as [`from_parts`].
///
/// For an operation that may legitimately be repeated with the same data in a later window
/// (one report per day): calls in one bucket share a key, calls in different buckets do not.
/// Take `at_ms` once per logical operation and keep it for its retries; a retry that takes a
/// new time may fall into the next bucket and run the operation again. A `bucket_ms` of 0 is
/// treated as 1.
#[must_use]
pub fn time_bucketed(parts: &[&str], at_ms: u64, bucket_ms: u64) -> String {
    let bucket = at_ms / bucket_ms.max(1);
    format!("t{bucket}_{}", parts_hash(parts))
}

/// A readable deterministic key: the parts joined with `:`, e.g. `["tenant-7", "order",
/// "2024-06-01.0042"]` gives `tenant-7:order:2024-06-01.0042`.
///
/// Joining is only unambiguous, and the result only a valid key, when every part is non-empty,
/// uses only `[A-Za-z0-9_.-]` (no `:`), and the whole is 16 to 255 bytes. Anything else is
/// an error naming the offending part; [`from_parts`] takes any parts.
///
/// # Errors
///
/// [`KeyError::NoParts`], [`KeyError::EmptyPart`] or [`KeyError::BadPartCharacter`] for the
/// first unusable part, else [`KeyError::Length`] when the joined key is too short or too long.
pub fn composite(parts: &[&str]) -> Result<String, KeyError> {
    if parts.is_empty() {
        return Err(KeyError::NoParts);
    }
    for (index, part) in parts.iter().enumerate() {
        if part.is_empty() {
            return Err(KeyError::EmptyPart { index });
        }
        if let Some(found) = part.chars().find(|&c| c == SEPARATOR || !u8::try_from(c).is_ok_and(is_key_byte)) {
            return Err(KeyError::BadPartCharacter { index, part: (*part).to_string(), found });
        }
    }
    let key = parts.join(&SEPARATOR.to_string());
    if !(MIN_LEN..=MAX_LEN).contains(&key.len()) {
        return Err(KeyError::Length { len: key.len() });
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_valid(key: &str) {
        if let Err(e) = validate(key) {
            panic!("{key:?}: {e}");
        }
    }

    #[test]
    fn validate_follows_the_server_rule() {
        assert_valid("0123456789abcdef");
        assert_valid("AZaz09_.:-AZaz09");
        assert_valid(&"k".repeat(255));
        assert_eq!(validate("0123456789abcde"), Err(KeyError::Length { len: 15 }));
        assert_eq!(validate(&"k".repeat(256)), Err(KeyError::Length { len: 256 }));
        assert_eq!(validate(""), Err(KeyError::Length { len: 0 }));
        assert_eq!(validate("0123456789 abcdef"), Err(KeyError::BadCharacter { offset: 10, found: ' ' }));
        assert_eq!(validate("0123456789/abcdef"), Err(KeyError::BadCharacter { offset: 10, found: '/' }));
        assert_eq!(validate("0123456789\u{e9}abcdef"), Err(KeyError::BadCharacter { offset: 10, found: '\u{e9}' }));
    }

    #[test]
    fn random_keys_are_prefixed_uuids_and_differ() {
        let a = random("pay_");
        let b = random("pay_");
        assert_ne!(a, b);
        for key in [&a, &b] {
            assert_valid(key);
            let uuid = key.strip_prefix("pay_").unwrap();
            assert_eq!(uuid.len(), 36);
            let groups: Vec<&str> = uuid.split('-').collect();
            assert_eq!(groups.iter().map(|g| g.len()).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
            assert!(groups[2].starts_with('4'), "version 4: {uuid}");
            assert!(groups[3].starts_with(['8', '9', 'a', 'b']), "RFC 9562 variant: {uuid}");
            assert!(uuid.bytes().all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
        assert_valid(&random(""));
        assert_eq!(random("").len(), 36);
    }

    #[test]
    fn random_makes_any_prefix_fit_the_rule() {
        let key = random("pay ment/\u{e9}:");
        assert!(key.starts_with("pay_ment__:"), "{key}");
        assert_valid(&key);
        let key = random(&"p".repeat(1000));
        assert_eq!(key.len(), 255);
        assert_valid(&key);
    }

    #[test]
    fn uuid_v4_sets_version_and_variant_bits() {
        assert_eq!(uuid_v4(0), "00000000-0000-4000-8000-000000000000");
        assert_eq!(uuid_v4(u128::MAX), "ffffffff-ffff-4fff-bfff-ffffffffffff");
        assert_eq!(uuid_v4(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef), "01234567-89ab-4def-8123-456789abcdef");
    }

    #[test]
    fn from_parts_is_deterministic_and_order_and_boundary_sensitive() {
        let key = from_parts(&["order", "42"]);
        assert_eq!(key, from_parts(&["order", "42"]));
        assert_ne!(key, from_parts(&["42", "order"]));
        assert_ne!(from_parts(&["ab", "c"]), from_parts(&["a", "bc"]));
        assert_ne!(from_parts(&[]), from_parts(&[""]));
        assert_eq!(key.len(), 34);
        assert!(key.starts_with("d_"));
        assert_valid(&key);
        // Pinned (computed independently), so a change to the derivation, which would make
        // restarted processes miss the keys they stored before, fails here.
        assert_eq!(key, "d_aa5497ca378a52a6e4e387843da9c7d0");
        assert_valid(&from_parts(&["any text: spaces, \u{e9}, /slashes/", ""]));
    }

    #[test]
    fn time_bucketed_keys_change_only_across_buckets() {
        let hour = 3_600_000;
        let a = time_bucketed(&["report", "daily"], 7 * hour, hour);
        assert_eq!(a, time_bucketed(&["report", "daily"], 7 * hour + hour - 1, hour));
        assert_ne!(a, time_bucketed(&["report", "daily"], 8 * hour, hour));
        assert_ne!(a, time_bucketed(&["report", "weekly"], 7 * hour, hour));
        assert_eq!(a, format!("t7_{}", &from_parts(&["report", "daily"])[2..]));
        assert_valid(&a);
        assert_eq!(time_bucketed(&["x"], 5, 0), time_bucketed(&["x"], 5, 1));
        assert!(time_bucketed(&["x"], 5, 0).starts_with("t5_"));
        let widest = time_bucketed(&["x"], u64::MAX, 1);
        assert!(widest.starts_with(&format!("t{}_", u64::MAX)));
        assert_valid(&widest);
    }

    #[test]
    fn composite_joins_readable_parts() {
        assert_eq!(composite(&["tenant-7", "order", "2024-06-01.0042"]).unwrap(), "tenant-7:order:2024-06-01.0042");
        assert_eq!(composite(&["a_very_long_single_part"]).unwrap(), "a_very_long_single_part");
        let longest = ["p".repeat(127), "q".repeat(127)];
        assert_eq!(composite(&[&longest[0], &longest[1]]).unwrap().len(), 255);
    }

    #[test]
    fn composite_refuses_what_it_cannot_join_unambiguously() {
        assert_eq!(composite(&[]), Err(KeyError::NoParts));
        assert_eq!(composite(&["tenant-7", "", "order-42"]), Err(KeyError::EmptyPart { index: 1 }));
        let err = composite(&["tenant-7", "order:42", "x"]).unwrap_err();
        assert_eq!(err, KeyError::BadPartCharacter { index: 1, part: "order:42".to_string(), found: ':' });
        let message = err.to_string();
        assert!(message.contains("part 1 (\"order:42\")") && message.contains("from_parts"), "{message}");
        assert_eq!(
            composite(&["tenant 7", "order-42"]),
            Err(KeyError::BadPartCharacter { index: 0, part: "tenant 7".to_string(), found: ' ' })
        );
        assert!(matches!(
            composite(&["caf\u{e9}", "order-42"]),
            Err(KeyError::BadPartCharacter { found: '\u{e9}', .. })
        ));
        assert_eq!(composite(&["a", "b"]), Err(KeyError::Length { len: 3 }));
        let long = "p".repeat(200);
        assert_eq!(composite(&[&long, &long]), Err(KeyError::Length { len: 401 }));
        assert!(composite(&["a", "b"]).unwrap_err().to_string().contains("16 to 255 bytes"));
    }
}
