//! Proves that the store's decoder (`idemraft_store::codec::decode`, bincode 1 with the store's
//! options) never panics and never allocates without bound on arbitrary bytes, for every type
//! the store reads back from disk or from a log entry: a command batch, an outcome batch, a
//! record, a log entry, and the Raft metadata kept beside them (vote, log ids, membership,
//! snapshot meta).
//!
//! Whatever decodes must round-trip stably: re-encoding it and decoding that again gives the
//! same value and the same bytes. A decoder that accepted a value the encoder then writes
//! differently would let two replicas hold different bytes for the same state.

#![no_main]

use std::fmt::Debug;

use idemraft_store::codec;
use idemraft_store::raft::{Entry, LogId, SnapshotMeta, StoredMembership};
use idemraft_store::{CommandBatch, OutcomeBatch, Record};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Decodes `data` as `T`; when that succeeds, checks that encode → decode → encode is stable.
/// Returns the decoded value for a value-level comparison by the caller.
fn round_trip<T: Serialize + DeserializeOwned + Debug>(what: &str, data: &[u8]) -> Option<(T, T)> {
    let value: T = codec::decode(what, data).ok()?;
    let first = match codec::encode(&value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("{what}: decoded {value:?} but it does not encode: {e}"),
    };
    let again: T = match codec::decode(what, &first) {
        Ok(v) => v,
        Err(e) => panic!("{what}: its own encoding {first:?} of {value:?} does not decode: {e}"),
    };
    let second = match codec::encode(&again) {
        Ok(bytes) => bytes,
        Err(e) => panic!("{what}: re-decoded {again:?} does not encode: {e}"),
    };
    assert_eq!(first, second, "{what}: encoding is not stable across a round trip of {value:?}");
    Some((value, again))
}

/// `round_trip` plus equality of the values, for the types that have it.
fn round_trip_eq<T: Serialize + DeserializeOwned + Debug + PartialEq>(what: &str, data: &[u8]) {
    if let Some((value, again)) = round_trip::<T>(what, data) {
        assert_eq!(value, again, "{what}: value changed across a round trip");
    }
}

fuzz_target!(|data: &[u8]| {
    // Every decoder sees every input: a seed of one type is a good start for the others, and
    // the store reads all of them from bytes it did not check.
    round_trip_eq::<CommandBatch>("command batch", data);
    round_trip_eq::<OutcomeBatch>("outcome batch", data);
    round_trip_eq::<Record>("record", data);
    round_trip::<Entry>("log entry", data);
    round_trip_eq::<openraft::Vote<u64>>("vote", data);
    round_trip_eq::<Option<LogId>>("log id", data);
    round_trip_eq::<StoredMembership>("membership", data);
    round_trip_eq::<SnapshotMeta>("snapshot meta", data);
});
