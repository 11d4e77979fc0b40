//! The state in memory: a map of records and two ordered indexes.
//!
//! Used by the pure-machine tests and benchmark, and as the reference for the byte-identical
//! state digest that every store must produce for the same log.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::ops::Bound;

use crate::machine::StateStore;
use crate::types::{Quotas, Record, RecordKey, RecordState};

/// Records, expiry index, lease index, quotas and per-tenant counts in memory. Cannot fail.
#[derive(Clone, Debug, Default)]
pub struct MemState {
    clock: u64,
    records: BTreeMap<RecordKey, Record>,
    by_expiry: BTreeSet<(u64, RecordKey)>,
    by_lease: BTreeSet<(u64, RecordKey)>,
    quotas: Quotas,
    /// Stored records per tenant; tenants with none have no entry.
    per_tenant: BTreeMap<String, u64>,
}

impl MemState {
    /// An empty state at clock 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every stored record (expired ones included, until swept), in key order.
    pub fn records(&self) -> impl Iterator<Item = (&RecordKey, &Record)> {
        self.records.iter()
    }

    /// Number of stored records.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether no record is stored.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Digest of the clock, every record and the quotas, identical for identical states on
    /// any store.
    pub fn digest(&self) -> [u8; 32] {
        let mut d = crate::StateDigest::new(self.clock);
        for (id, rec) in &self.records {
            d.add(id, rec);
        }
        d.add_quotas(&self.quotas);
        d.finish()
    }

    /// Stored records per tenant, as the state machine counts them (tenants with none are
    /// left out).
    pub fn tenant_counts(&self) -> &BTreeMap<String, u64> {
        &self.per_tenant
    }

    fn count(&mut self, tenant: &str, added: bool) {
        if added {
            *self.per_tenant.entry(tenant.to_string()).or_default() += 1;
        } else if let Some(n) = self.per_tenant.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }
}

impl StateStore for MemState {
    type Error = Infallible;

    fn clock(&self) -> u64 {
        self.clock
    }

    fn set_clock(&mut self, ms: u64) {
        self.clock = ms;
    }

    fn get(&mut self, id: &RecordKey) -> Result<Option<Record>, Infallible> {
        Ok(self.records.get(id).cloned())
    }

    fn put(&mut self, id: &RecordKey, old: Option<&Record>, new: Record) -> Result<(), Infallible> {
        if let Some(old) = old {
            self.by_expiry.remove(&(old.expires_ms, id.clone()));
            if old.state == RecordState::InProgress {
                self.by_lease.remove(&(old.lease_expires_ms, id.clone()));
            }
        }
        self.by_expiry.insert((new.expires_ms, id.clone()));
        if new.state == RecordState::InProgress {
            self.by_lease.insert((new.lease_expires_ms, id.clone()));
        }
        // Counted by what the map holds, not by `old`, so the count cannot drift from it.
        if self.records.insert(id.clone(), new).is_none() {
            self.count(id.tenant(), true);
        }
        Ok(())
    }

    fn remove(&mut self, id: &RecordKey, old: &Record) -> Result<(), Infallible> {
        self.by_expiry.remove(&(old.expires_ms, id.clone()));
        if old.state == RecordState::InProgress {
            self.by_lease.remove(&(old.lease_expires_ms, id.clone()));
        }
        if self.records.remove(id).is_some() {
            self.count(id.tenant(), false);
        }
        Ok(())
    }

    fn tenant_records(&mut self, tenant: &str) -> Result<u64, Infallible> {
        Ok(self.per_tenant.get(tenant).copied().unwrap_or(0))
    }

    fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    fn set_quotas(&mut self, quotas: Quotas) {
        self.quotas = quotas;
    }

    fn expired(&mut self, clock_ms: u64, limit: usize) -> Result<Vec<RecordKey>, Infallible> {
        Ok(self.by_expiry.iter().take_while(|(at, _)| *at <= clock_ms).take(limit).map(|(_, id)| id.clone()).collect())
    }

    fn leases_after(&mut self, after_ms: u64) -> Result<Vec<RecordKey>, Infallible> {
        let from = after_ms.saturating_add(1);
        Ok(self.by_lease.iter().filter(|(at, _)| *at >= from).map(|(_, id)| id.clone()).collect())
    }

    fn scan(
        &mut self,
        prefix: &[u8],
        start_after: Option<&RecordKey>,
        visit: &mut dyn FnMut(RecordKey, Record) -> bool,
    ) -> Result<(), Infallible> {
        let lower = match start_after {
            Some(k) => Bound::Excluded(k.clone()),
            None => Bound::Unbounded,
        };
        for (id, rec) in self.records.range((lower, Bound::Unbounded)) {
            let enc = id.encode();
            if enc.as_slice() < prefix {
                continue;
            }
            if !enc.starts_with(prefix) {
                break;
            }
            if !visit(id.clone(), rec.clone()) {
                break;
            }
        }
        Ok(())
    }
}
