//! The HTTP idempotency layer (feature `http`): a tower [`Layer`] that makes the handler it
//! wraps run at most once per `Idempotency-Key`, with the cluster as the single source of
//! truth, following contract §6–§7, the IETF `Idempotency-Key` draft and Stripe.
//!
//! This module owns only the HTTP side: reading and checking the header, the request
//! fingerprint, the size limit, mapping outcomes to statuses and RFC 9457 problem bodies,
//! choosing which responses are stored, and the replay. Claiming, keeping the lease alive
//! and settling the key are the SDK's ([`Client::claim_until`], [`Client::wait`],
//! [`Client::run_granted`]).
//!
//! | case | answer |
//! |---|---|
//! | missing key (route requires one) | 400 problem+json |
//! | malformed key | 400 problem+json |
//! | body over the limit | 413 problem+json |
//! | key reused with a different request | 422 problem+json |
//! | first call still in flight | 409 problem+json with `Retry-After: 1`, or a bounded wait and the first call's response |
//! | completed before | the stored status, body bytes and allowed headers, plus `Idempotent-Replayed: true` |
//! | cluster unavailable, overloaded, or the claim's outcome unknown (a connection broken mid-call) | 503 problem+json with `Retry-After` (fail-closed), or the handler runs unprotected (fail-open) |
//! | handler panicked or errored | 500 problem+json; the key is released so a retry runs at once |
//!
//! ```no_run
//! use axum::{routing::post, Router, Extension};
//! use idemraft_client::http::{FencingToken, IdempotencyLayer};
//! use idemraft_client::Client;
//! use std::time::Duration;
//!
//! async fn create_charge(Extension(FencingToken(token)): Extension<FencingToken>) -> &'static str {
//!     let _ = token; // pass it to the ledger, which refuses lower tokens
//!     "charged"
//! }
//!
//! # fn app() -> Result<Router, idemraft_client::Error> {
//! let client = Client::connect(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! let app = Router::new().route(
//!     "/v1/charges",
//!     post(create_charge).layer(IdempotencyLayer::new(client, "payments.create").lease(Duration::from_secs(10))),
//! );
//! # Ok(app)
//! # }
//! ```

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body::Body as HttpBody;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

use crate::fingerprint::{fingerprint, Fingerprint};
use crate::keys::{self, KeyError};
use crate::sdk::{ClaimOptions, Client, Error, ExecuteError, ExecuteOptions, Outcome, StoredResponse, WorkError};

mod body;
mod flow;
mod key;
mod layer;
mod problem;
mod settings;

pub use self::body::*;
use self::flow::*;
pub use self::key::*;
pub use self::layer::*;
pub use self::problem::*;
pub use self::settings::*;

#[cfg(test)]
mod tests;
