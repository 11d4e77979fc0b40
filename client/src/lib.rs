//! `idemraft-client` owns the client side of Idemraft:
//! - [`Client`]: connects to a list of endpoints, finds and caches the leader, and retries
//!   UNAVAILABLE with jittered exponential backoff inside the caller's deadline. Every call is
//!   safe to retry as is (a claim carries the same owner id on every retry, an owner's calls
//!   carry its token), which is what lets the SDK retry a call whose reply was lost.
//! - [`Client::execute`]: run a piece of work exactly once per key: claim, run with the
//!   fencing token while a background task keeps the lease alive, then complete or fail; a
//!   retry of a finished request gets the stored response back, marked as replayed.
//! - [`fingerprint`]: the request fingerprint of semantics §6 (RFC 8785 + SHA-256).
//! - [`keys`]: idempotency-key generators.
//! - the `idemctl` operator CLI (`src/bin/idemctl.rs`).

pub mod fingerprint;
pub mod keys;
mod sdk;

pub use fingerprint::{fingerprint, Fingerprint};
pub use idemraft_proto::v1 as proto;
pub use sdk::*;
