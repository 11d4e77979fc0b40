//! The one binary encoding of everything stored: bincode 1 with its default (fixed-width,
//! little-endian) options. One place, so the log, the state machine and snapshots can never
//! disagree on the format. Public so that tools outside the crate (the fuzz targets) decode
//! stored bytes exactly as the store does.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value. bincode fails only for types it cannot size up front, which none of ours
/// are; if one ever did, the write is refused here rather than stored as garbage.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, crate::StoreError> {
    bincode::serialize(value)
        .map_err(|e| crate::StoreError::Corrupt { what: "value to store".into(), detail: e.to_string() })
}

/// Decodes a value, naming what was being decoded in the error.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, crate::StoreError> {
    bincode::deserialize(bytes)
        .map_err(|e| crate::StoreError::Corrupt { what: what.to_string(), detail: e.to_string() })
}
