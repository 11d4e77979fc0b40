//! Placeholder ledger with the agreed API; replaced by the checker's ledger module.

#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Refused {
    pub highest: u64,
}

#[derive(Clone, Default)]
pub struct Ledger {
    inner: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Ledger {
    pub fn snapshot(&self) -> Vec<u8> {
        Vec::new()
    }
    pub fn charge(&self, key: &str, token: u64, _charge_id: &str) -> Result<(), Refused> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let h = g.entry(key.to_string()).or_insert(0);
        if token < *h {
            return Err(Refused { highest: *h });
        }
        *h = token;
        Ok(())
    }
}
