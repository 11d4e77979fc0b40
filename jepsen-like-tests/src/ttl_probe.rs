//! The expiry probe: a record past its TTL must never be replayed (contract §4.2 row 2), and the
//! main workload cannot see that, because its keys live for an hour. One extra client keeps
//! completing keys with a short TTL and then claiming them again until they expire, always
//! paired with a claim on a fresh key that tells it how far the log's clock has come.
//!
//! Why the pair proves an anomaly without trusting any wall clock: a fresh key's grant carries
//! `lease_expires_ms = T + lease`, where `T` is the log's clock when that claim was applied.
//! The claim on the probed key is sent only after that grant came back, so it is applied later
//! in the log, at a clock of at least `T` (the log's clock never goes back). A record completed
//! at `completed_ms` with TTL `ttl` has expired once the clock reaches `completed_ms + ttl`; if
//! that is at most `T`, the only correct answer is a fresh grant, and a replay is a bug.
//! These keys stay out of the linearizability history: its model has no expiry.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};
use tokio::time::Instant;

use crate::workload::SCOPE;

/// The TTL the probe's keys ask for (the nodes run with `--min-ttl` at most this).
pub const PROBE_TTL: Duration = Duration::from_secs(1);

/// The lease of the probe's claims.
const PROBE_LEASE: Duration = Duration::from_secs(1);

/// Gap between two probe pairs: the sweeper deletes an expired record within about a second,
/// so a pair every few tens of milliseconds lands in that window many times.
const PAIR_GAP: Duration = Duration::from_millis(25);

/// How long one key is probed past its expiry before the probe moves on (a fault may keep
/// every claim from landing for a while).
const GIVE_UP_AFTER: Duration = Duration::from_secs(8);

/// What the probe saw.
#[derive(Clone, Debug, Default)]
pub struct ProbeReport {
    /// Keys completed and then probed.
    pub keys: u64,
    /// Keys seen granted afresh after their expiry: the correct end of a probe.
    pub expired_seen: u64,
    /// Probe claims answered with a replay while the key could still be alive.
    pub replays_alive: u64,
    /// Replays of records that had expired: each one an anomaly, described.
    pub anomalies: Vec<String>,
}

/// The log's clock as of a grant on a fresh key (its lease runs from then).
fn clock_of_grant(o: &Outcome) -> Option<u64> {
    match o {
        Outcome::Acquired(g) => g.lease_expires_ms.checked_sub(PROBE_LEASE.as_millis() as u64),
        _ => None,
    }
}

/// Runs until `stop` or `hard_end`, then hands back its report through `out`.
pub async fn run(client: Client, seed: u64, stop: Arc<AtomicBool>, hard_end: Instant, out: Arc<Mutex<ProbeReport>>) {
    let opts = ClaimOptions { fingerprint: None, lease: Some(PROBE_LEASE), ttl: Some(PROBE_TTL), allow_takeover: true };
    let ttl_ms = PROBE_TTL.as_millis() as u64;
    let live = || !stop.load(Ordering::Relaxed) && Instant::now() < hard_end;
    let mut fresh = 0u64;
    let fresh_key = |fresh: &mut u64| {
        *fresh += 1;
        format!("jt-clock-{seed}-{fresh:010}")
    };
    let mut n = 0u64;
    while live() {
        n += 1;
        let key = format!("jt-expiry-{seed}-{n:010}");
        // Claim and complete the probed key; any failure just moves on to the next key.
        let token = match client.claim(SCOPE, &key, "ttl-probe", &opts).await {
            Ok(Outcome::Acquired(g)) => g.token,
            _ => continue,
        };
        if client.complete(SCOPE, &key, token, &StoredResponse::new(200, key.clone())).await.is_err() {
            continue;
        }
        if let Ok(mut r) = out.lock() {
            r.keys += 1;
        }
        let give_up = Instant::now() + PROBE_TTL + GIVE_UP_AFTER;
        while live() && Instant::now() < give_up {
            tokio::time::sleep(PAIR_GAP).await;
            let Ok(clock) = client.claim(SCOPE, &fresh_key(&mut fresh), "ttl-probe", &opts).await else { continue };
            let Some(clock_ms) = clock_of_grant(&clock) else { continue };
            match client.claim(SCOPE, &key, "ttl-probe-again", &opts).await {
                Ok(Outcome::Replay { completed_ms, token, .. }) => {
                    let expires_ms = completed_ms.saturating_add(ttl_ms);
                    if expires_ms <= clock_ms {
                        if let Ok(mut r) = out.lock() {
                            r.anomalies.push(format!(
                                "expired_replay: key {key} (token {token}) completed at log time {completed_ms} ms \
                                 with a {ttl_ms} ms TTL, so expired at {expires_ms} ms, was replayed by a claim \
                                 applied at log time {clock_ms} ms or later"
                            ));
                        }
                        break;
                    }
                    if let Ok(mut r) = out.lock() {
                        r.replays_alive += 1;
                    }
                }
                Ok(Outcome::Acquired(_)) => {
                    if let Ok(mut r) = out.lock() {
                        r.expired_seen += 1;
                    }
                    break;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idemraft_client::Grant;

    #[test]
    fn a_fresh_grant_tells_the_log_clock() {
        let g = Grant {
            token: 1,
            attempt: 1,
            takeover: false,
            lease_expires_ms: 10_000 + PROBE_LEASE.as_millis() as u64,
            expires_ms: 0,
            recovery_point: String::new(),
            checkpoint: Vec::new(),
        };
        assert_eq!(clock_of_grant(&Outcome::Acquired(g)), Some(10_000));
        assert_eq!(clock_of_grant(&Outcome::Mismatch), None);
    }
}
