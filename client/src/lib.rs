//! `idemraft-client` owns the client side of Idemraft:
//! - [`Client`]: connects to a list of endpoints, finds and caches the leader, and retries
//!   UNAVAILABLE with jittered exponential backoff inside the caller's deadline. Every call is
//!   safe to retry as is (a claim carries the same owner id on every retry, an owner's calls
//!   carry its token), which is what lets the SDK retry a call whose reply was lost.
//! - [`Client::execute`]: run a piece of work exactly once per key: claim, run with the
//!   fencing token while a background task keeps the lease alive, then complete or fail; a
//!   retry of a finished request gets the stored response back, marked as replayed.
//! - [`fingerprint`]: the request fingerprint of contract §6 (RFC 8785 + SHA-256).
//! - [`keys`]: idempotency-key generators.
//! - `http` (feature `http`): a tower/axum layer that makes an HTTP handler exactly-once per
//!   `Idempotency-Key` header (contract §7), built on `execute`'s claim/run/settle.
//!
//! The `idemctl` operator CLI and the development certificates live in the `idemctl` crate,
//! so a service that links this one builds no CLI dependencies.
//!
//! ```no_run
//! use idemraft_client::{fingerprint, Client, ExecuteOptions, StoredResponse, WorkError};
//!
//! async fn charge_card(token: u64) -> Result<(), std::io::Error> {
//!     // Pass the fencing token to the downstream system, which refuses lower ones.
//!     let _ = token;
//!     Ok(())
//! }
//!
//! # async fn example(key: String, body: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! let fp = fingerprint("POST", "/v1/charges", Some(body));
//! let done = client
//!     .execute("payments.create", &key, Some(fp), &ExecuteOptions::default(), |grant| async move {
//!         // Runs at most once per key; the lease is extended in the background meanwhile.
//!         charge_card(grant.token()).await.map_err(|e| WorkError::Retryable(e.to_string()))?;
//!         Ok(StoredResponse::new(201, r#"{"status":"charged"}"#))
//!     })
//!     .await?;
//! println!("{} (replayed: {})", done.response.status, done.replayed);
//! # Ok(())
//! # }
//! ```

mod backup;
pub mod fingerprint;
#[cfg(feature = "http")]
pub mod http;
pub mod keys;
mod sdk;
#[cfg(test)]
mod test_support;

pub use backup::SavedSnapshot;
pub use fingerprint::{fingerprint, Fingerprint};
pub use idemraft_proto::v1 as proto;
pub use sdk::*;
