//! The one binary encoding of everything stored: bincode 1 with its default (fixed-width,
//! little-endian) options. One place, so the log, the state machine and snapshots can never
//! disagree on the format. Public so that tools outside the crate (the fuzz targets) decode
//! stored bytes exactly as the store does.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value. bincode fails only for types it cannot size up front, which none of ours
/// are; if one ever did, the write is refused here rather than stored as garbage.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, crate::StoreError> {
    bincode::serialize(value).map_err(bad)
}

fn bad(e: bincode::Error) -> crate::StoreError {
    crate::StoreError::Corrupt { what: "value to store".into(), detail: e.to_string() }
}

/// The length of `value`'s encoding, found by a walk that copies nothing.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, crate::StoreError> {
    usize::try_from(bincode::serialized_size(value).map_err(bad)?).map_err(|_| crate::StoreError::Corrupt {
        what: "value to store".into(),
        detail: "larger than memory can hold".into(),
    })
}

/// Appends the encoding of `value` to `buf`, reserving its exact length first, and returns
/// that length: the log frames large bodies this way, with no copy through a second buffer
/// and no regrowth of `buf` under it.
pub fn encode_into<T: Serialize>(buf: &mut Vec<u8>, value: &T) -> Result<usize, crate::StoreError> {
    let len = encoded_len(value)?;
    let start = buf.len();
    buf.reserve(len);
    bincode::serialize_into(&mut *buf, value).map_err(bad)?;
    if buf.len() - start != len {
        // Sizing and writing walk the same value with the same options; a mismatch would be a
        // bincode bug, and a frame whose length lies must never reach the disk.
        buf.truncate(start);
        return Err(crate::StoreError::Corrupt {
            what: "value to store".into(),
            detail: format!("sized at {len} bytes but encoded differently"),
        });
    }
    Ok(len)
}

/// Decodes a value, naming what was being decoded in the error.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, crate::StoreError> {
    bincode::deserialize(bytes)
        .map_err(|e| crate::StoreError::Corrupt { what: what.to_string(), detail: e.to_string() })
}
