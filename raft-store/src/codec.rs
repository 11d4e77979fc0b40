//! The one binary encoding of everything stored: bincode 1 with its default (fixed-width,
//! little-endian) options. One place, so the log, the state machine and snapshots can never
//! disagree on the format. Public so that tools outside the crate (the fuzz targets) decode
//! stored bytes exactly as the store does.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes a value. bincode fails only for types it cannot size up front, which none of ours
/// are; if one ever did, the write is refused here rather than stored as garbage.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, crate::StoreError> {
    bincode::serialize(value).map_err(refused)
}

fn refused(why: impl ToString) -> crate::StoreError {
    crate::StoreError::Corrupt { what: "value to store".into(), detail: why.to_string() }
}

/// The length of `value`'s encoding, found by a walk that copies nothing.
pub fn encoded_len<T: Serialize>(value: &T) -> Result<usize, crate::StoreError> {
    usize::try_from(bincode::serialized_size(value).map_err(refused)?)
        .map_err(|_| refused("larger than memory can hold"))
}

/// Appends the encoding of `value` to `buf` and returns its length (`buf` is left as it was
/// on an error). A caller that reserves [`encoded_len`] first encodes a large body with no
/// copy through a second buffer and no regrowth of `buf` under it.
pub fn encode_into<T: Serialize>(buf: &mut Vec<u8>, value: &T) -> Result<usize, crate::StoreError> {
    let start = buf.len();
    if let Err(e) = bincode::serialize_into(&mut *buf, value) {
        buf.truncate(start);
        return Err(refused(e));
    }
    Ok(buf.len() - start)
}

/// Decodes a value, naming what was being decoded in the error.
pub fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, crate::StoreError> {
    bincode::deserialize(bytes)
        .map_err(|e| crate::StoreError::Corrupt { what: what.to_string(), detail: e.to_string() })
}
