//! One test per row of the Claim table in contract §4.2 (named after the row), then the other
//! commands' rules. All against the pure state machine on `MemState`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use idemraft_store::machine::{self, apply_batch};
use idemraft_store::{Command, Grant, MemState, Op, Outcome, RecordKey, RecordState, Response, Token, LIST_PAGE_BYTES};

const LEASE: u64 = 5_000;
const TTL: u64 = 60_000;

/// A state machine plus a log index counter, so each command lands in its own entry.
struct Sm {
    state: MemState,
    index: u64,
}

impl Sm {
    fn new() -> Self {
        Sm { state: MemState::new(), index: 0 }
    }

    fn run(&mut self, now_ms: u64, op: Op) -> Outcome {
        self.index += 1;
        let mut out = apply_batch(&mut self.state, self.index, &[Command { now_ms, op }]).unwrap();
        out.pop().unwrap()
    }

    fn claim(&mut self, now: u64, key: &str, owner: &str, fp: Option<u8>, takeover: bool) -> Outcome {
        self.run(
            now,
            Op::Claim {
                id: id(key),
                fingerprint: fp.map(|b| [b; 32]),
                owner: owner.into(),
                lease_ms: LEASE,
                ttl_ms: TTL,
                allow_takeover: takeover,
            },
        )
    }

    fn complete(&mut self, now: u64, key: &str, token: Token, body: &[u8]) -> Outcome {
        self.run(now, Op::Complete { id: id(key), token, response: response(body) })
    }

    fn fail(&mut self, now: u64, key: &str, token: Token, retryable: bool) -> Outcome {
        let response = (!retryable).then(|| response(b"card declined"));
        self.run(now, Op::Fail { id: id(key), token, retryable, response })
    }
}

fn id(key: &str) -> RecordKey {
    RecordKey::new("default", "payments.create", format!("key-{key:0>12}")).unwrap()
}

fn response(body: &[u8]) -> Response {
    Response { status: 201, headers: vec![("Location".into(), "/v1/charges/ch_1".into())], body: body.to_vec() }
}

fn acquired(outcome: Outcome) -> Grant {
    match outcome {
        Outcome::Acquired(g) => g,
        other => panic!("expected ACQUIRED, got {other:?}"),
    }
}

#[test]
fn claim_absent_acquires_with_this_entrys_token_and_attempt_1() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    assert_eq!(g.token, Token::new(1, 0));
    assert_eq!(g.token.log_index(), 1);
    assert_eq!(g.attempt, 1);
    assert!(!g.takeover);
    assert_eq!(g.lease_expires_ms, 1_000 + LEASE);
    assert_eq!(g.expires_ms, 1_000 + TTL);
}

#[test]
fn claim_expired_acquires_as_if_absent() {
    let mut sm = Sm::new();
    let first = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    sm.complete(2_000, "a", first.token, b"ok");
    // Retention runs from completion; at its end the record is gone, fingerprint included.
    let g = acquired(sm.claim(2_000 + TTL, "a", "w2", Some(2), false));
    assert_eq!(g.attempt, 1);
    assert!(g.token > first.token);
}

#[test]
fn claim_any_state_with_both_fingerprints_present_and_different_is_mismatch() {
    let mut sm = Sm::new();
    // IN_PROGRESS
    acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    assert_eq!(sm.claim(1_001, "a", "w1", Some(9), true), Outcome::Mismatch);
    // COMPLETED
    let g = acquired(sm.claim(1_000, "b", "w1", Some(1), false));
    sm.complete(1_100, "b", g.token, b"ok");
    assert_eq!(sm.claim(1_200, "b", "w2", Some(9), false), Outcome::Mismatch);
    // FAILED
    let g = acquired(sm.claim(1_000, "c", "w1", Some(1), false));
    sm.fail(1_100, "c", g.token, true);
    assert_eq!(sm.claim(1_200, "c", "w2", Some(9), false), Outcome::Mismatch);
    // A missing fingerprint on either side binds nothing.
    assert!(matches!(sm.claim(1_300, "c", "w2", None, false), Outcome::Acquired(_)));
}

#[test]
fn claim_in_progress_same_owner_as_the_holder_acquires_with_the_same_token() {
    let mut sm = Sm::new();
    let first = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    // The retry of a claim whose reply was lost, even after the lease ran out.
    let again = acquired(sm.claim(1_000 + LEASE + 1, "a", "w1", Some(1), true));
    assert_eq!(again, first);
}

#[test]
fn claim_in_progress_lease_alive_is_in_progress_with_lease_expiry_and_retry_hint() {
    let mut sm = Sm::new();
    acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    assert_eq!(
        sm.claim(2_000, "a", "w2", Some(1), true),
        Outcome::InProgress { lease_expires_ms: 1_000 + LEASE, retry_after_ms: LEASE - 1_000 }
    );
}

#[test]
fn claim_in_progress_lease_expired_takeover_allowed_acquires_new_token_attempt_plus_1_with_recovery_point() {
    let mut sm = Sm::new();
    let first = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    let cp = sm.run(
        2_000,
        Op::Checkpoint {
            id: id("a"),
            token: first.token,
            recovery_point: "charged".into(),
            data: b"ch_1".to_vec(),
            lease_ms: LEASE,
        },
    );
    assert_eq!(cp, Outcome::LeaseExtended { token: first.token, lease_expires_ms: 2_000 + LEASE });
    let g = acquired(sm.claim(2_000 + LEASE, "a", "w2", Some(1), true));
    assert!(g.token > first.token);
    assert_eq!(g.attempt, 2);
    assert!(g.takeover);
    assert_eq!(g.recovery_point, "charged");
    assert_eq!(g.checkpoint, b"ch_1");
    // The old owner is fenced off.
    assert_eq!(sm.complete(9_000, "a", first.token, b"late"), Outcome::StaleToken { current: g.token });
}

#[test]
fn claim_in_progress_lease_expired_takeover_not_allowed_stays_in_progress() {
    let mut sm = Sm::new();
    acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    let out = sm.claim(1_000 + LEASE + 10, "a", "w2", Some(1), false);
    assert_eq!(
        out,
        Outcome::InProgress { lease_expires_ms: 1_000 + LEASE, retry_after_ms: machine::MIN_RETRY_AFTER_MS }
    );
    // It stays until an explicit Takeover...
    let t = sm.run(1_000 + LEASE + 20, Op::Takeover { id: id("a"), owner: "op".into(), force: false, lease_ms: LEASE });
    assert!(matches!(t, Outcome::Acquired(Grant { attempt: 2, takeover: true, .. })));
    // ...or the TTL.
    let mut sm = Sm::new();
    acquired(sm.claim(1_000, "b", "w1", Some(1), false));
    assert_eq!(acquired(sm.claim(1_000 + TTL, "b", "w2", Some(1), false)).attempt, 1);
}

#[test]
fn claim_completed_replays_the_stored_response_byte_for_byte() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    let body: Vec<u8> = (0..=255u8).collect();
    assert_eq!(sm.complete(1_500, "a", g.token, &body), Outcome::Completed { token: g.token });
    let replay = sm.claim(1_600, "a", "w9", Some(1), true);
    assert_eq!(replay, Outcome::Replay { token: g.token, completed_ms: 1_500, response: response(&body) });
    // A terminal failure is stored as COMPLETED and replayed like any response.
    let g = acquired(sm.claim(1_000, "b", "w1", None, false));
    assert_eq!(sm.fail(1_100, "b", g.token, false), Outcome::Failed { token: g.token, retryable: false });
    assert!(matches!(sm.claim(1_200, "b", "w2", None, false), Outcome::Replay { .. }));
}

#[test]
fn claim_failed_acquires_with_new_token_attempt_plus_1() {
    let mut sm = Sm::new();
    let first = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    assert_eq!(sm.fail(1_100, "a", first.token, true), Outcome::Failed { token: first.token, retryable: true });
    let g = acquired(sm.claim(1_200, "a", "w2", Some(1), false));
    assert!(g.token > first.token);
    assert_eq!(g.attempt, 2);
    assert!(!g.takeover);
}

#[test]
fn complete_retry_with_same_token_answers_ok_and_wrong_token_is_stale_and_absent_is_not_found() {
    let mut sm = Sm::new();
    assert_eq!(sm.complete(1_000, "a", Token(77), b"x"), Outcome::NotFound);
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    assert_eq!(sm.complete(1_100, "a", Token(1), b"x"), Outcome::StaleToken { current: g.token });
    assert_eq!(sm.complete(1_100, "a", g.token, b"x"), Outcome::Completed { token: g.token });
    assert_eq!(sm.complete(1_200, "a", g.token, b"x"), Outcome::Completed { token: g.token });
    // The stored response never changes.
    assert_eq!(sm.complete(1_300, "a", g.token, b"other"), Outcome::WrongState { state: RecordState::Completed });
    assert!(
        matches!(sm.claim(1_400, "a", "w2", None, false), Outcome::Replay { response, .. } if response.body == b"x")
    );
}

#[test]
fn complete_resets_expiry_to_now_plus_retention() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    sm.complete(50_000, "a", g.token, b"x");
    let view = machine::get(&mut sm.state, &id("a")).unwrap().unwrap();
    assert_eq!(view.record.expires_ms, 50_000 + TTL);
    // Expired = absent as soon as the log's clock reaches the expiry, swept or not.
    sm.run(50_000 + TTL, Op::Sweep { limit: 0 });
    assert!(machine::get(&mut sm.state, &id("a")).unwrap().is_none(), "expired = absent");
}

#[test]
fn oversize_response_is_refused_and_the_record_stays_in_progress() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    let huge = vec![0u8; idemraft_store::Limits::CEILING.body_max_bytes + 1];
    let out = sm.complete(1_100, "a", g.token, &huge);
    let Outcome::Invalid(e) = out else { panic!("expected Invalid, got {out:?}") };
    assert!(e.to_string().contains("response body"), "{e}");
    let view = machine::get(&mut sm.state, &id("a")).unwrap().unwrap();
    assert_eq!(view.record.state, RecordState::InProgress);
}

#[test]
fn extend_lease_keeps_a_long_job_alive_and_never_shortens() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    let ext = |sm: &mut Sm, now, lease_ms| sm.run(now, Op::ExtendLease { id: id("a"), token: g.token, lease_ms });
    assert_eq!(ext(&mut sm, 4_000, LEASE), Outcome::LeaseExtended { token: g.token, lease_expires_ms: 9_000 });
    assert_eq!(ext(&mut sm, 4_500, 1_000), Outcome::LeaseExtended { token: g.token, lease_expires_ms: 9_000 });
    assert!(matches!(sm.claim(8_999, "a", "w2", None, true), Outcome::InProgress { .. }));
    assert_eq!(
        sm.run(9_000, Op::ExtendLease { id: id("a"), token: Token(5), lease_ms: LEASE }),
        Outcome::StaleToken { current: g.token }
    );
}

#[test]
fn takeover_force_takes_a_live_lease_and_retry_by_the_new_owner_is_the_same_grant() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    let op = Op::Takeover { id: id("a"), owner: "operator".into(), force: true, lease_ms: LEASE };
    let t = acquired(sm.run(1_100, op.clone()));
    assert!(t.token > g.token && t.takeover && t.attempt == 2);
    assert_eq!(acquired(sm.run(1_200, op)), t);
    let done = sm.run(1_300, Op::Takeover { id: id("zz"), owner: "operator".into(), force: true, lease_ms: LEASE });
    assert_eq!(done, Outcome::NotFound);
}

#[test]
fn grants_in_one_batched_entry_get_distinct_increasing_tokens() {
    let mut state = MemState::new();
    let claim = |key: &str, owner: &str| Command {
        now_ms: 1_000,
        op: Op::Claim {
            id: id(key),
            fingerprint: None,
            owner: owner.into(),
            lease_ms: LEASE,
            ttl_ms: TTL,
            allow_takeover: false,
        },
    };
    let fail = Command {
        now_ms: 1_000,
        op: Op::Fail { id: id("a"), token: Token::new(7, 0), retryable: true, response: None },
    };
    let out = apply_batch(&mut state, 7, &[claim("a", "w1"), claim("b", "w1"), fail, claim("a", "w2")]).unwrap();
    let tokens: Vec<Token> = out
        .iter()
        .filter_map(|o| match o {
            Outcome::Acquired(g) => Some(g.token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, vec![Token::new(7, 0), Token::new(7, 1), Token::new(7, 3)]);
    assert!(tokens.iter().all(|t| t.log_index() == 7));
}

#[test]
fn clock_never_goes_backwards() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(10_000, "a", "w1", None, false));
    // A command stamped earlier (a new leader with a slower clock) is judged at the later time.
    assert!(
        matches!(sm.claim(1_000, "a", "w2", None, true), Outcome::InProgress { lease_expires_ms, .. } if lease_expires_ms == g.lease_expires_ms)
    );
    use idemraft_store::machine::StateStore;
    assert_eq!(sm.state.clock(), 10_000);
}

#[test]
fn sweep_deletes_at_most_limit_expired_records_oldest_first_and_never_a_live_one() {
    let mut sm = Sm::new();
    for (i, key) in ["a", "b", "c", "d"].iter().enumerate() {
        let g = acquired(sm.claim(1_000 + i as u64, key, "w1", None, false));
        sm.complete(1_000 + i as u64, key, g.token, b"x");
    }
    acquired(sm.claim(TTL, "live", "w1", None, false));
    assert_eq!(sm.run(1_000 + TTL + 2, Op::Sweep { limit: 2 }), Outcome::Swept { deleted: 2 });
    let left: Vec<String> = sm.state.records().map(|(k, _)| k.key().to_string()).collect();
    assert_eq!(left, vec![id("c").key().to_string(), id("d").key().to_string(), id("live").key().to_string()]);
    assert_eq!(sm.run(1_000 + TTL + 100, Op::Sweep { limit: 100 }), Outcome::Swept { deleted: 2 });
    assert_eq!(sm.state.len(), 1);
}

#[test]
fn resume_stretches_live_leases_by_the_outage_gap_capped_and_leaves_dead_ones() {
    let mut sm = Sm::new();
    let alive = acquired(sm.claim(1_000, "a", "w1", None, false));
    acquired(sm.claim(1_000, "b", "w1", None, false));
    // b's lease dies (at 6_000) before the outage begins; a's is alive at the last clock.
    assert_eq!(
        sm.run(6_500, Op::ExtendLease { id: id("a"), token: alive.token, lease_ms: LEASE }),
        Outcome::LeaseExtended { token: alive.token, lease_expires_ms: 11_500 }
    );
    // 20 s without a leader; sweep interval 1 s, cap 15 s.
    let out = sm.run(26_500, Op::Resume { sweep_interval_ms: 1_000, max_stretch_ms: 15_000 });
    assert_eq!(out, Outcome::Resumed { stretched: 1, stretch_ms: 15_000 });
    let a = machine::get(&mut sm.state, &id("a")).unwrap().unwrap();
    assert_eq!(a.record.lease_expires_ms, 26_500);
    let b = machine::get(&mut sm.state, &id("b")).unwrap().unwrap();
    assert_eq!(b.record.lease_expires_ms, 1_000 + LEASE);
}

#[test]
fn invalid_commands_change_nothing_and_name_the_rule() {
    let mut sm = Sm::new();
    let out = sm.run(
        1_000,
        Op::Claim {
            id: id("a"),
            fingerprint: None,
            owner: "w1".into(),
            lease_ms: 0,
            ttl_ms: TTL,
            allow_takeover: false,
        },
    );
    let Outcome::Invalid(e) = out else { panic!("expected Invalid, got {out:?}") };
    assert!(e.to_string().starts_with("lease_ms is 0"), "{e}");
    assert!(sm.state.is_empty());
}

#[test]
fn list_finds_abandoned_in_progress_records_of_one_tenant_only() {
    let mut sm = Sm::new();
    acquired(sm.claim(1_000, "a", "w1", None, false));
    acquired(sm.claim(1_000, "b", "w1", None, false));
    let other = RecordKey::new("other", "payments.create", "key-0000000000aa").unwrap();
    sm.run(
        1_000,
        Op::Claim {
            id: other,
            fingerprint: None,
            owner: "w1".into(),
            lease_ms: LEASE,
            ttl_ms: TTL,
            allow_takeover: false,
        },
    );
    let g = acquired(sm.claim(1_000, "b", "w1", None, false));
    sm.run(2_000, Op::ExtendLease { id: id("b"), token: g.token, lease_ms: 60_000 });
    let q =
        idemraft_store::ListQuery { tenant: "default".into(), abandoned_only: true, limit: 10, ..Default::default() };
    sm.run(1_000 + LEASE, Op::Sweep { limit: 0 });
    let found = machine::list(&mut sm.state, &q, LIST_PAGE_BYTES).unwrap();
    assert_eq!(found.records.iter().map(|v| v.id.clone()).collect::<Vec<_>>(), vec![id("a")]);
    assert_eq!(found.next_after, None);
    let all = idemraft_store::ListQuery { tenant: "default".into(), limit: 1, ..Default::default() };
    let page1 = machine::list(&mut sm.state, &all, LIST_PAGE_BYTES).unwrap();
    assert_eq!(page1.next_after, Some(id("a")));
    let page2 = machine::list(
        &mut sm.state,
        &idemraft_store::ListQuery { start_after: page1.next_after, ..all },
        LIST_PAGE_BYTES,
    )
    .unwrap();
    assert_eq!((page1.records[0].id.clone(), page2.records[0].id.clone()), (id("a"), id("b")));
}

#[test]
fn a_badly_stamped_command_cannot_expire_everything() {
    let mut sm = Sm::new();
    let g = acquired(sm.claim(1_000, "a", "w1", None, false));
    sm.complete(2_000, "a", g.token, b"paid");
    // A stamp no honest clock produces is refused and leaves the clock alone.
    let out = sm.run(u64::MAX, Op::Sweep { limit: 10 });
    assert!(matches!(&out, Outcome::Invalid(e) if e.to_string().starts_with("now_ms is")), "{out:?}");
    assert!(matches!(sm.claim(3_000, "a", "w2", None, false), Outcome::Replay { .. }));
    // A leader clock jumping days ahead moves the log clock one hour per command at most, so a
    // single command cannot expire a record kept for a day.
    let day_ttl = Op::Claim {
        id: id("b"),
        fingerprint: None,
        owner: "w1".into(),
        lease_ms: LEASE,
        ttl_ms: 24 * 3_600_000,
        allow_takeover: false,
    };
    let b = acquired(sm.run(4_000, day_ttl));
    sm.complete(4_000, "b", b.token, b"kept");
    sm.run(4_000 + 3 * 24 * 3_600_000, Op::Sweep { limit: 10 });
    use idemraft_store::machine::StateStore;
    assert_eq!(sm.state.clock(), 4_000 + idemraft_store::machine::MAX_CLOCK_STEP_MS);
    assert!(matches!(sm.claim(4_000 + 3 * 24 * 3_600_000, "b", "w2", None, false), Outcome::Replay { .. }));
    // An invalid command does not move the clock either.
    let before = sm.state.clock();
    let bad = Op::ExtendLease { id: id("b"), token: b.token, lease_ms: 0 };
    assert!(matches!(sm.run(before + 1_000, bad), Outcome::Invalid(_)));
    assert_eq!(sm.state.clock(), before);
}

// Quotas: a claim that would add a record past the tenant's quota is refused; nothing that
// touches an existing record ever is.

fn set_quota(sm: &mut Sm, now: u64, tenant: Option<&str>, max: Option<u64>) -> Outcome {
    sm.run(now, Op::SetQuota { tenant: tenant.map(str::to_string), max_records: max })
}

fn records_of(sm: &mut Sm, tenant: &str) -> u64 {
    use idemraft_store::machine::StateStore;
    sm.state.tenant_records(tenant).unwrap()
}

#[test]
fn quota_refuses_only_claims_that_add_a_record_and_names_tenant_limit_and_count() {
    let mut sm = Sm::new();
    assert_eq!(set_quota(&mut sm, 1_000, Some("default"), Some(2)), Outcome::QuotaSet { limit: Some(2), records: 0 });
    let a = acquired(sm.claim(1_000, "a", "w1", Some(1), false));
    acquired(sm.claim(1_000, "b", "w1", None, false));
    let before: Vec<_> = sm.state.records().map(|(k, r)| (k.clone(), r.clone())).collect();
    let out = sm.claim(1_000, "c", "w1", None, false);
    assert_eq!(out, Outcome::QuotaExceeded { tenant: "default".into(), limit: 2, records: 2 });
    let after: Vec<_> = sm.state.records().map(|(k, r)| (k.clone(), r.clone())).collect();
    assert_eq!(before, after, "a refused claim changes no record");

    // Existing records answer as always: retry by the holder, conflict, mismatch, replay,
    // re-acquire after a retryable failure, takeover after the lease.
    assert_eq!(acquired(sm.claim(1_100, "a", "w1", Some(1), false)), a);
    assert!(matches!(sm.claim(1_100, "a", "w2", Some(1), false), Outcome::InProgress { .. }));
    assert_eq!(sm.claim(1_100, "a", "w2", Some(2), false), Outcome::Mismatch);
    sm.complete(1_200, "a", a.token, b"paid");
    assert!(matches!(sm.claim(1_300, "a", "w3", Some(1), false), Outcome::Replay { .. }));
    let b = acquired(sm.claim(1_300, "b", "w1", None, false));
    sm.fail(1_400, "b", b.token, true);
    let b2 = acquired(sm.claim(1_500, "b", "w2", None, false));
    assert_eq!(b2.attempt, 2);
    let b3 = acquired(sm.claim(1_500 + LEASE + 1, "b", "w3", None, true));
    assert!(b3.takeover);
    assert!(matches!(
        sm.run(1_600 + LEASE, Op::Takeover { id: id("b"), owner: "w4".into(), force: true, lease_ms: LEASE }),
        Outcome::Acquired(_)
    ));
    assert_eq!(records_of(&mut sm, "default"), 2);

    // Another tenant is not affected.
    let other = RecordKey::new("globex", "payments.create", "key-000000000001").unwrap();
    let claim_other = Op::Claim {
        id: other,
        fingerprint: None,
        owner: "w1".into(),
        lease_ms: LEASE,
        ttl_ms: TTL,
        allow_takeover: false,
    };
    assert!(matches!(sm.run(2_000, claim_other), Outcome::Acquired(_)));
}

#[test]
fn an_expired_record_is_replaced_within_the_quota_and_a_sweep_makes_room() {
    let mut sm = Sm::new();
    set_quota(&mut sm, 1_000, Some("default"), Some(1));
    let a = acquired(sm.claim(1_000, "a", "w1", None, false));
    sm.complete(1_000, "a", a.token, b"paid");
    let later = 1_000 + TTL + 1;
    // Expired but not swept: it still counts, so a new key is refused...
    assert!(matches!(sm.claim(later, "b", "w1", None, false), Outcome::QuotaExceeded { records: 1, .. }));
    // ...while the expired key itself is claimed afresh in its place.
    let again = acquired(sm.claim(later, "a", "w2", None, false));
    assert_eq!(again.attempt, 1);
    assert_eq!(records_of(&mut sm, "default"), 1);
    // Once swept, the room is there.
    sm.run(later + TTL + LEASE, Op::Sweep { limit: 10 });
    assert_eq!(records_of(&mut sm, "default"), 0);
    assert!(matches!(sm.claim(later + TTL + LEASE, "b", "w1", None, false), Outcome::Acquired(_)));
}

#[test]
fn the_default_quota_applies_to_tenants_without_their_own_and_none_clears() {
    let mut sm = Sm::new();
    assert_eq!(set_quota(&mut sm, 1_000, None, Some(0)), Outcome::QuotaSet { limit: Some(0), records: 0 });
    assert!(matches!(sm.claim(1_000, "a", "w1", None, false), Outcome::QuotaExceeded { limit: 0, records: 0, .. }));
    // The tenant's own quota wins over the default.
    set_quota(&mut sm, 1_000, Some("default"), Some(1));
    acquired(sm.claim(1_000, "a", "w1", None, false));
    assert!(matches!(sm.claim(1_000, "b", "w1", None, false), Outcome::QuotaExceeded { limit: 1, .. }));
    // Clearing the tenant's own falls back to the default; clearing the default lifts all.
    assert_eq!(set_quota(&mut sm, 1_000, Some("default"), None), Outcome::QuotaSet { limit: Some(0), records: 1 });
    assert!(matches!(sm.claim(1_000, "b", "w1", None, false), Outcome::QuotaExceeded { limit: 0, .. }));
    set_quota(&mut sm, 1_000, None, None);
    acquired(sm.claim(1_000, "b", "w1", None, false));
    // Lowering a quota below what the tenant holds deletes nothing.
    set_quota(&mut sm, 1_000, Some("default"), Some(1));
    assert_eq!(records_of(&mut sm, "default"), 2);
    assert!(matches!(sm.claim(1_000, "c", "w1", None, false), Outcome::QuotaExceeded { limit: 1, records: 2, .. }));
    // A malformed tenant is refused.
    assert!(matches!(set_quota(&mut sm, 1_000, Some("not a tenant"), Some(1)), Outcome::Invalid(_)));
}
