//! The one binary encoding of everything stored: bincode 1 with its default (fixed-width,
//! little-endian) options. One place, so the log, the state machine and snapshots can never
//! disagree on the format.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value. Serialization of our own types into memory cannot fail; if it ever did,
/// an empty buffer would fail loudly at decode time rather than here.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    bincode::serialize(value).unwrap_or_default()
}

/// Decodes a value, naming what was being decoded in the error.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, crate::StoreError> {
    bincode::deserialize(bytes)
        .map_err(|e| crate::StoreError::Corrupt { what: what.to_string(), detail: e.to_string() })
}
