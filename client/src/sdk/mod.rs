//! The SDK proper: connection, leader caching, retries within a deadline, typed outcomes,
//! and `execute`. One file per concern:
//! - `client`: the connection, the call machinery, the Idempotency calls;
//! - `retry`: which failures are retried and what a given-up call reports;
//! - `error`: the [`Error`] of a failed call;
//! - `types`: outcomes, grants, records, stored responses;
//! - `config`: [`ClientConfig`], TLS and the bearer token;
//! - `admin`: membership, quotas and node status, in typed results;
//! - `execute`: [`Client::execute`] and its lease keep-alive.

mod admin;
mod client;
mod config;
mod error;
mod execute;
mod retry;
mod types;

pub use self::admin::{Member, Members, NodeStatus, Quotas, Role, TenantQuota};
pub use self::client::*;
pub use self::config::*;
pub use self::error::*;
pub use self::execute::*;
use self::retry::*;
pub use self::types::*;

#[cfg(test)]
mod tests;
