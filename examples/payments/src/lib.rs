//! A small payments API made exactly-once by the Idemraft HTTP layer, and a fenced
//! in-process "bank" that shows it worked.
//!
//! This crate owns:
//! - [`router`]: `POST /v1/charges` behind an [`IdempotencyLayer`], `GET /v1/charges/{id}`, and
//!   `GET /v1/bank/charges`, the bank's own books (charges per idempotency key);
//! - [`Bank`]: a ledger that refuses a charge carrying a lower fencing token than it has seen
//!   for that key (the downstream half of fencing), and counts charges per key, so a test or
//!   the demo can check "exactly once" against something other than the layer itself.
//!
//! The handler takes the key and the fencing token from the request extensions the layer
//! sets; it never reads the header itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use idemraft_client::http::{ClaimInfo, FencingToken, IdempotencyKey, IdempotencyLayer};
use idemraft_client::Client;
use serde::{Deserialize, Serialize};

/// The scope the charge route claims keys in.
pub const SCOPE: &str = "payments.create";

/// Longest simulated bank latency a request may ask for.
pub const MAX_DELAY_MS: u64 = 10_000;

/// One accepted charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Charge {
    /// `ch_` and a sequence number.
    pub id: String,
    /// Minor units.
    pub amount: u64,
    /// ISO 4217 code, lower case.
    pub currency: String,
    /// The idempotency key it was charged under.
    pub key: String,
    /// The fencing token it carried (`None`: charged unprotected, fail-open).
    pub token: Option<u64>,
}

/// The bank's books for one idempotency key.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeyBook {
    /// Charges accepted under the key: exactly-once means 1.
    pub charges: u64,
    /// Highest fencing token seen for the key.
    pub highest_token: u64,
    /// Charges refused because their token was lower than one already seen.
    pub refused_stale: u64,
    /// The ids of the accepted charges.
    pub charge_ids: Vec<String>,
}

/// The bank's books: what `GET /v1/bank/charges` answers.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Books {
    /// Keys charged at least once.
    pub keys: u64,
    /// Charges accepted in all.
    pub total_charges: u64,
    /// The most charges any one key has: 1 when every key was charged exactly once.
    pub max_charges_per_key: u64,
    /// Stale-token refusals in all.
    pub refused_stale: u64,
    /// Per key.
    pub by_key: BTreeMap<String, KeyBook>,
}

/// Why the bank refused a charge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BankError {
    /// The token is lower than one the bank has already seen for the key: the caller lost
    /// its claim and someone else now owns the key.
    StaleToken {
        /// The charge's token.
        token: u64,
        /// The highest the bank has seen.
        seen: u64,
    },
}

#[derive(Default)]
struct Ledger {
    books: BTreeMap<String, KeyBook>,
    charges: BTreeMap<String, Charge>,
    next_id: u64,
}

/// A fenced in-process ledger. Cheap to clone; clones share the books.
#[derive(Clone, Default)]
pub struct Bank {
    ledger: Arc<Mutex<Ledger>>,
    panics: Arc<AtomicU32>,
}

impl Bank {
    /// An empty bank.
    pub fn new() -> Bank {
        Bank::default()
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A poisoned lock only means a charge panicked elsewhere; the books are still whole
        // because every update happens after the checks that could fail.
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Fault injection for tests and the demo: the next `n` charges panic before touching
    /// the books, as a handler bug would.
    pub fn panic_on_next(&self, n: u32) {
        self.panics.store(n, Ordering::SeqCst);
    }

    /// Charges `amount` under `key`, fenced by `token`: a token lower than the highest seen
    /// for the key is refused (a token of `None`, from an unprotected run, is not fenced).
    ///
    /// # Panics
    ///
    /// Only when [`Bank::panic_on_next`] asked for it.
    pub fn charge(&self, key: &str, token: Option<u64>, amount: u64, currency: &str) -> Result<Charge, BankError> {
        let armed = self.panics.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if armed {
            panic!("simulated bank failure while charging {key}");
        }
        let mut ledger = self.ledger();
        let book = ledger.books.entry(key.to_string()).or_default();
        if let Some(t) = token {
            if t < book.highest_token {
                book.refused_stale += 1;
                return Err(BankError::StaleToken { token: t, seen: book.highest_token });
            }
            book.highest_token = t;
        }
        ledger.next_id += 1;
        let id = format!("ch_{:06}", ledger.next_id);
        let charge = Charge { id: id.clone(), amount, currency: currency.to_string(), key: key.to_string(), token };
        if let Some(book) = ledger.books.get_mut(key) {
            book.charges += 1;
            book.charge_ids.push(id.clone());
        }
        ledger.charges.insert(id, charge.clone());
        Ok(charge)
    }

    /// One charge by id.
    pub fn get(&self, id: &str) -> Option<Charge> {
        self.ledger().charges.get(id).cloned()
    }

    /// The books.
    pub fn books(&self) -> Books {
        let ledger = self.ledger();
        let by_key: BTreeMap<String, KeyBook> = ledger
            .books
            .iter()
            .filter(|(_, b)| b.charges > 0 || b.refused_stale > 0)
            .map(|(k, b)| (k.clone(), b.clone()))
            .collect();
        Books {
            keys: by_key.values().filter(|b| b.charges > 0).count() as u64,
            total_charges: by_key.values().map(|b| b.charges).sum(),
            max_charges_per_key: by_key.values().map(|b| b.charges).max().unwrap_or(0),
            refused_stale: by_key.values().map(|b| b.refused_stale).sum(),
            by_key,
        }
    }
}

/// The body of `POST /v1/charges`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChargeRequest {
    /// Minor units, above 0.
    pub amount: u64,
    /// Three ASCII letters.
    pub currency: String,
    /// Simulated bank latency in ms (at most [`MAX_DELAY_MS`]), so a demo or a test can
    /// keep a request in flight.
    #[serde(default)]
    pub delay_ms: u64,
    /// Free metadata; part of the fingerprint like everything else in the body.
    #[serde(default)]
    pub metadata: serde_json::Value,
}

/// The body of a created charge.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChargeResponse {
    /// The charge.
    #[serde(flatten)]
    pub charge: Charge,
    /// Which attempt at the key produced it.
    pub attempt: u32,
}

/// The layer the `payments` binary puts on the charge route: wait up to 5 s for an in-flight
/// duplicate, a 10 s lease kept alive in the background, fail-closed.
pub fn default_layer(client: Client) -> IdempotencyLayer {
    IdempotencyLayer::new(client, SCOPE).lease(Duration::from_secs(10)).wait_for_in_flight(Duration::from_secs(5))
}

/// The API: `POST /v1/charges` behind `layer`, `GET /v1/charges/{id}`, `GET /v1/bank/charges`.
pub fn router(bank: Bank, layer: IdempotencyLayer) -> Router {
    Router::new()
        .route("/v1/charges", post(create_charge).layer(layer))
        .route("/v1/charges/{id}", get(get_charge))
        .route("/v1/bank/charges", get(books))
        .with_state(bank)
}

fn problem(status: StatusCode, slug: &str, title: &str, detail: String) -> Response {
    let body = serde_json::json!({
        "type": format!("urn:idemraft:payments-example:{slug}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    (status, [(header::CONTENT_TYPE, "application/problem+json")], body.to_string()).into_response()
}

async fn create_charge(
    State(bank): State<Bank>,
    key: Option<Extension<IdempotencyKey>>,
    token: Option<Extension<FencingToken>>,
    claim: Option<Extension<ClaimInfo>>,
    body: Bytes,
) -> Response {
    let req: ChargeRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-charge",
                "Invalid charge request",
                format!("the body is not a charge ({e}); send {{\"amount\": <minor units>, \"currency\": \"usd\"}}"),
            )
        }
    };
    if req.amount == 0 || req.currency.len() != 3 || !req.currency.bytes().all(|b| b.is_ascii_alphabetic()) {
        return problem(
            StatusCode::BAD_REQUEST,
            "invalid-charge",
            "Invalid charge request",
            "amount must be above 0 and currency three letters, e.g. \"usd\"".into(),
        );
    }
    if req.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(req.delay_ms.min(MAX_DELAY_MS))).await;
    }
    // Without a key (fail-open) the bank has nothing to count under but the charge itself.
    let key = key.map(|Extension(IdempotencyKey(k))| k).unwrap_or_else(|| "unprotected".into());
    let token = token.map(|Extension(FencingToken(t))| t);
    match bank.charge(&key, token, req.amount, &req.currency.to_ascii_lowercase()) {
        Ok(charge) => {
            let location = format!("/v1/charges/{}", charge.id);
            let attempt = claim.map_or(0, |Extension(c)| c.attempt);
            (StatusCode::CREATED, [(header::LOCATION, location)], Json(ChargeResponse { charge, attempt }))
                .into_response()
        }
        Err(BankError::StaleToken { token, seen }) => problem(
            StatusCode::CONFLICT,
            "fenced",
            "Charge refused by the bank's fencing",
            format!("token {token} is lower than {seen}, already seen for this key; retry to get the stored response"),
        ),
    }
}

async fn get_charge(State(bank): State<Bank>, Path(id): Path<String>) -> Response {
    match bank.get(&id) {
        Some(c) => Json(c).into_response(),
        None => problem(StatusCode::NOT_FOUND, "no-such-charge", "No such charge", format!("no charge {id}")),
    }
}

async fn books(State(bank): State<Bank>) -> Json<Books> {
    Json(bank.books())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_bank_fences_lower_tokens_and_counts_per_key() {
        let bank = Bank::new();
        let first = bank.charge("key-a", Some(10), 100, "usd").unwrap();
        assert_eq!(first.id, "ch_000001");
        assert_eq!(bank.charge("key-a", Some(9), 100, "usd"), Err(BankError::StaleToken { token: 9, seen: 10 }));
        bank.charge("key-a", Some(12), 100, "usd").unwrap();
        bank.charge("key-b", Some(3), 5, "eur").unwrap();
        let books = bank.books();
        assert_eq!((books.keys, books.total_charges, books.max_charges_per_key, books.refused_stale), (2, 3, 2, 1));
        assert_eq!(books.by_key["key-a"].highest_token, 12);
        assert_eq!(bank.get("ch_000003").map(|c| c.key), Some("key-b".to_string()));
    }

    #[test]
    fn injected_panics_leave_the_books_untouched() {
        let bank = Bank::new();
        bank.panic_on_next(1);
        let r = std::panic::catch_unwind(|| bank.charge("key-a", Some(1), 1, "usd"));
        assert!(r.is_err());
        assert!(bank.charge("key-a", Some(2), 1, "usd").is_ok(), "only one panic was armed");
        assert_eq!(bank.books().total_charges, 1);
    }
}
