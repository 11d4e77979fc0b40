//! A digest of a state machine's contents, to prove that two stores that applied the same log
//! hold the same bytes.

use sha2::{Digest, Sha256};

use crate::types::{Quotas, Record, RecordKey};

/// Accumulates the clock and records in key order into a SHA-256.
pub struct StateDigest(Sha256);

impl StateDigest {
    /// Starts a digest with the machine's clock.
    pub fn new(clock: u64) -> Self {
        let mut h = Sha256::new();
        h.update(b"idemraft-state-v1");
        h.update(clock.to_be_bytes());
        StateDigest(h)
    }

    /// Adds one record; callers add records in key order.
    pub fn add(&mut self, id: &RecordKey, rec: &Record) {
        match crate::codec::encode(rec) {
            Ok(bytes) => self.add_raw(&id.encode(), &bytes),
            // Cannot happen for our types; if it did, the digest must not match any store's.
            Err(e) => self.add_raw(&id.encode(), format!("unencodable: {e}").as_bytes()),
        }
    }

    /// Adds one record given as its encoded key and stored bytes.
    pub fn add_raw(&mut self, key: &[u8], value: &[u8]) {
        self.0.update((key.len() as u64).to_be_bytes());
        self.0.update(key);
        self.0.update((value.len() as u64).to_be_bytes());
        self.0.update(value);
    }

    /// Adds the quotas, after the records. Nothing at all when none is set, so a state
    /// without quotas digests exactly as it did before quotas existed, and replicas of
    /// different releases stay comparable while no quota is in use. Per-tenant record counts
    /// are not added: they are a function of the records, which are.
    pub fn add_quotas(&mut self, quotas: &Quotas) {
        if quotas.is_empty() {
            return;
        }
        match crate::codec::encode(quotas) {
            Ok(bytes) => self.add_raw(b"\xffquotas", &bytes),
            Err(e) => self.add_raw(b"\xffquotas", format!("unencodable: {e}").as_bytes()),
        }
    }

    /// The digest.
    pub fn finish(self) -> [u8; 32] {
        self.0.finalize().into()
    }
}
