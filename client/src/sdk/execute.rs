//! [`Client::execute`]: run a piece of work at most once per key, with a background lease
//! keep-alive, then settle the key; and [`Client::run_granted`], its second half.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::fingerprint::Fingerprint;

use super::*;

impl Client {
    /// Runs `work` at most once for this key, per contract §4 and §5.7:
    /// - claims (one owner id for all retries of this execution);
    /// - on ACQUIRED runs `work` with the grant, extending the lease in the background
    ///   while it runs; then completes with its response, or fails the claim (retryable or
    ///   terminal, by the work's choice);
    /// - on REPLAY returns the stored response with `replayed = true`;
    /// - on IN_PROGRESS waits for the holder (server-side Wait) and claims again, until the
    ///   options' deadline;
    /// - MISMATCH and a lost lease surface as [`ExecuteError`]s.
    pub async fn execute<F, Fut>(
        &self,
        scope: &str,
        key: &str,
        fingerprint: Option<Fingerprint>,
        opts: &ExecuteOptions,
        work: F,
    ) -> Result<Executed, ExecuteError>
    where
        F: FnOnce(WorkGrant) -> Fut,
        Fut: Future<Output = Result<StoredResponse, WorkError>>,
    {
        let deadline = Instant::now() + opts.deadline;
        let owner = opts.owner.clone().unwrap_or_else(|| crate::keys::random("owner-"));
        let claim_opts =
            ClaimOptions { fingerprint, lease: Some(opts.lease), ttl: opts.ttl, allow_takeover: opts.allow_takeover };
        let grant = loop {
            match self.claim_until(deadline, scope, key, &owner, &claim_opts).await? {
                Outcome::Acquired(g) => break g,
                Outcome::Replay { token, response, .. } => return Ok(Executed { token, response, replayed: true }),
                Outcome::Mismatch => return Err(ExecuteError::Mismatch),
                Outcome::InProgress { lease_expires_ms, retry_after_ms } => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left < Duration::from_millis(10) {
                        return Err(ExecuteError::InProgress { lease_expires_ms });
                    }
                    // Wait for the holder to settle, at most until its lease could expire
                    // (so a takeover is attempted promptly) and never past our deadline.
                    let wait = left.min(Duration::from_millis(retry_after_ms.max(100)) * 4);
                    self.wait(scope, key, wait).await?;
                    // A wait that used up the deadline leaves no time to claim again: the
                    // answer is what was seen, IN_PROGRESS, not a deadline error whose
                    // outcome would look unknown.
                    if deadline.saturating_duration_since(Instant::now()) < Duration::from_millis(10) {
                        return Err(ExecuteError::InProgress { lease_expires_ms });
                    }
                }
                other => return Err(ExecuteError::Unexpected(other.name())),
            }
        };

        self.run_granted(scope, key, grant, opts, work).await
    }

    /// The second half of [`Client::execute`], for a caller that made the claim itself (the
    /// HTTP layer, which answers IN_PROGRESS and MISMATCH in its own way): runs `work` under
    /// `grant`, extending the lease every third of `opts.lease` in the background while it
    /// runs, then completes with its response or fails the claim (retryable or terminal, by
    /// the work's choice). Settling is retried for up to `opts.deadline` while the cluster is
    /// unreachable. `opts.owner` and `opts.allow_takeover` are not used here.
    ///
    /// The background extension stops when this future finishes or is dropped.
    pub async fn run_granted<F, Fut>(
        &self,
        scope: &str,
        key: &str,
        grant: Grant,
        opts: &ExecuteOptions,
        work: F,
    ) -> Result<Executed, ExecuteError>
    where
        F: FnOnce(WorkGrant) -> Fut,
        Fut: Future<Output = Result<StoredResponse, WorkError>>,
    {
        let token = grant.token;
        let (lost_tx, lost_rx) = tokio::sync::watch::channel(false);
        // Aborted on drop, so a caller that gives up on this future (an HTTP client hanging
        // up) does not leave a task renewing a lease nobody will settle.
        let keeper = AbortOnDrop({
            let client = self.clone();
            let (scope, key) = (scope.to_string(), key.to_string());
            let lease = opts.lease;
            tokio::spawn(async move {
                let period = lease / 3;
                loop {
                    tokio::time::sleep(period).await;
                    match client.extend_lease(&scope, &key, token, Some(lease)).await {
                        Ok(Outcome::LeaseExtended { .. }) => {}
                        Ok(other) => {
                            tracing::warn!(outcome = other.name(), token, "lease lost while the work ran");
                            let _ = lost_tx.send(true);
                            return;
                        }
                        Err(e) => tracing::debug!(error = %e, "lease extension failed; retrying"),
                    }
                }
            })
        });
        let result = work(WorkGrant { grant, lost: lost_rx }).await;
        // The work is done and its result is in hand: settling it is worth a long fight. An
        // unsettled key would make a retry wait out the lease and run the work again, so the
        // settle is repeated (it is idempotent) for up to `opts.deadline` more while the
        // cluster is unreachable, and the lease is kept alive meanwhile.
        let settle_until = Instant::now() + opts.deadline;
        let settle = loop {
            let r = match &result {
                Ok(response) => self.complete(scope, key, token, response).await,
                Err(WorkError::Retryable(_)) => self.fail(scope, key, token, true, None).await,
                Err(WorkError::Terminal(response)) => self.fail(scope, key, token, false, Some(response)).await,
            };
            match r {
                Err(e) if e.is_indeterminate() && Instant::now() < settle_until => {
                    tracing::warn!(error = %e, token, "settling the key failed; retrying");
                }
                Err(e) => {
                    drop(keeper);
                    return Err(e.into());
                }
                Ok(o) => break o,
            }
        };
        drop(keeper);
        match (settle, result) {
            (Outcome::Completed { .. }, Ok(response)) => Ok(Executed { token, response, replayed: false }),
            (Outcome::Failed { retryable: false, .. }, Err(WorkError::Terminal(response))) => {
                Ok(Executed { token, response, replayed: false })
            }
            (Outcome::Failed { retryable: true, .. }, Err(WorkError::Retryable(reason))) => {
                Err(ExecuteError::WorkFailed(reason))
            }
            (Outcome::StaleToken { current }, _) => Err(ExecuteError::LostOwnership { token, current }),
            (other, _) => Err(ExecuteError::Unexpected(other.name())),
        }
    }
}

/// Aborts a spawned task when dropped.
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Options of [`Client::execute`].
#[derive(Clone, Debug)]
pub struct ExecuteOptions {
    /// Lease to hold while the work runs; extended every third of it.
    pub lease: Duration,
    /// Record TTL/retention; `None` takes the scope's default.
    pub ttl: Option<Duration>,
    /// How long to keep trying (claims, waiting for another holder) before giving up.
    pub deadline: Duration,
    /// Owner id; a fresh random one by default. Give your own to make a restarted process
    /// resume its own claims.
    pub owner: Option<String>,
    /// Take the key over when its holder's lease has expired (the holder crashed). Off, a
    /// dead holder's key waits for an explicit Takeover or its TTL.
    pub allow_takeover: bool,
}

impl Default for ExecuteOptions {
    fn default() -> Self {
        ExecuteOptions {
            lease: Duration::from_secs(30),
            ttl: None,
            deadline: Duration::from_secs(30),
            owner: None,
            allow_takeover: true,
        }
    }
}

/// What the work receives: the grant, and a way to learn that ownership was lost.
pub struct WorkGrant {
    /// The grant (token, attempt, recovery point of a previous owner).
    pub grant: Grant,
    lost: tokio::sync::watch::Receiver<bool>,
}

impl WorkGrant {
    /// The fencing token: pass it to every downstream write.
    pub fn token(&self) -> u64 {
        self.grant.token
    }

    /// Resolves if the lease was lost while the work runs (another owner may now hold the
    /// key): stop, the fencing token will be refused downstream.
    pub async fn lost(&mut self) {
        let _ = self.lost.wait_for(|l| *l).await;
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }
}

/// How a piece of work failed.
#[derive(Clone, Debug)]
pub enum WorkError {
    /// Try again later: the claim is released as FAILED and the next claim re-acquires it.
    Retryable(String),
    /// Final: this error response is stored and replayed to every retry.
    Terminal(StoredResponse),
}

/// The result of [`Client::execute`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executed {
    /// The token of the grant that produced the response.
    pub token: u64,
    /// The response (a terminal failure's stored error response included).
    pub response: StoredResponse,
    /// The response was stored by an earlier execution, not produced now.
    pub replayed: bool,
}

/// Why [`Client::execute`] produced no response.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecuteError {
    /// The key is bound to a different request fingerprint.
    #[error("the idempotency key was used with a different request (fingerprint mismatch)")]
    Mismatch,
    /// Another worker still holds the key at the deadline.
    #[error("another worker holds the key (its lease runs until {lease_expires_ms})")]
    InProgress {
        /// The holder's lease deadline.
        lease_expires_ms: u64,
    },
    /// The work failed retryably; the key was released for a retry.
    #[error("the work failed and may be retried: {0}")]
    WorkFailed(String),
    /// The lease was lost and another owner took the key over; this worker's completion was
    /// refused. Downstream writes fenced with the old token are refused too.
    #[error("ownership lost: token {token} was superseded by {current}")]
    LostOwnership {
        /// Our token.
        token: u64,
        /// The current one.
        current: u64,
    },
    /// An outcome that should not happen in this flow.
    #[error("unexpected outcome {0}")]
    Unexpected(&'static str),
    /// The cluster could not be reached or refused the request.
    #[error(transparent)]
    Client(#[from] Error),
}
