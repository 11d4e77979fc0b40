//! The metrics page: names, labels and values as Prometheus reads them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use idemraft_store::{Grant, RecordState, Token};

fn line(page: &str, name: &str) -> Option<f64> {
    page.lines().find(|l| l.split_whitespace().next() == Some(name))?.split_whitespace().nth(1)?.parse().ok()
}

fn grant(takeover: bool) -> Outcome {
    Outcome::Acquired(Grant {
        token: Token(7),
        attempt: 1,
        takeover,
        lease_expires_ms: 0,
        expires_ms: 0,
        recovery_point: String::new(),
        checkpoint: Vec::new(),
    })
}

#[test]
fn names_follow_the_prometheus_conventions() {
    let m = Metrics::new();
    m.record_rpc("Claim", tonic::Code::Ok, Duration::from_millis(3));
    m.record_batch(5);
    m.append_fsynced(Duration::from_micros(300));
    let page = m.encode();
    for want in [
        "# TYPE idemraft_claims_total counter",
        "# TYPE idemraft_requests_total counter",
        "# TYPE idemraft_request_duration_seconds histogram",
        "# TYPE idemraft_batch_size histogram",
        "# TYPE idemraft_records gauge",
        "# TYPE idemraft_sweeper_deleted_total counter",
        "# TYPE idemraft_replication_timeouts_total counter",
        "# TYPE idemraft_replication_cuts_total counter",
        "# TYPE idemraft_raft_term gauge",
        "# TYPE idemraft_raft_leader_changes_total counter",
        "# TYPE idemraft_raft_applied_index gauge",
        "# TYPE idemraft_raft_apply_lag gauge",
        "# TYPE idemraft_log_fsync_duration_seconds histogram",
        "idemraft_build_info{version=\"",
        "idemraft_claims_total{outcome=\"acquired\"} 0",
        "idemraft_requests_total{rpc=\"Claim\",code=\"OK\"} 1",
        "idemraft_request_duration_seconds_count{rpc=\"Claim\"} 1",
        "idemraft_request_duration_seconds_bucket{rpc=\"Claim\",le=\"0.004\"} 1",
        "idemraft_records{state=\"in_progress\"} 0",
        "idemraft_raft_role{role=\"leader\"} 0",
    ] {
        assert!(page.contains(want), "missing {want:?} in\n{page}");
    }
    assert_eq!(line(&page, "idemraft_batch_size_count"), Some(1.0));
    assert_eq!(line(&page, "idemraft_batch_size_sum"), Some(5.0));
    assert_eq!(line(&page, "idemraft_log_fsync_duration_seconds_count"), Some(1.0));
    // No doubled suffix, no colliding names.
    assert!(!page.contains("_total_total"), "{page}");
    let mut types: Vec<&str> = page.lines().filter(|l| l.starts_with("# TYPE ")).collect();
    let n = types.len();
    types.dedup();
    assert_eq!(types.len(), n);
}

#[test]
fn outcomes_land_in_the_right_families() {
    let m = Metrics::new();
    m.record_outcome("Claim", &grant(false));
    m.record_outcome("Claim", &grant(true));
    m.record_outcome("Claim", &Outcome::Mismatch);
    m.record_outcome("Claim", &Outcome::InProgress { lease_expires_ms: 1, retry_after_ms: 1 });
    m.record_outcome("Claim", &Outcome::WrongState { state: RecordState::Completed });
    m.record_outcome("Takeover", &grant(true));
    m.record_outcome("Complete", &Outcome::StaleToken { current: Token(9) });
    m.record_outcome("Complete", &Outcome::Completed { token: Token(9) });
    let page = m.encode();
    assert_eq!(line(&page, "idemraft_claims_total{outcome=\"acquired\"}"), Some(2.0));
    assert_eq!(line(&page, "idemraft_claims_total{outcome=\"mismatch\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_claims_total{outcome=\"in_progress\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_claims_total{outcome=\"wrong_state\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_claims_total{outcome=\"replay\"}"), Some(0.0));
    assert_eq!(line(&page, "idemraft_takeovers_total{rpc=\"Claim\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_takeovers_total{rpc=\"Takeover\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_stale_tokens_total{rpc=\"Complete\"}"), Some(1.0));
}

#[test]
fn leader_changes_count_new_terms_and_leaders_only() {
    let m = Metrics::new();
    m.observe_leader(9, 1, None);
    m.observe_leader(9, 1, Some(2));
    m.observe_leader(9, 1, Some(2));
    m.observe_leader(9, 2, None);
    m.observe_leader(9, 3, Some(2));
    m.observe_leader(9, 4, Some(1));
    assert_eq!(line(&m.encode(), "idemraft_raft_leader_changes_total"), Some(3.0));
    let (count, last) = m.leader_changes();
    assert_eq!(count, 3);
    let last = last.expect("a change was seen");
    assert_eq!((last.term, last.from, last.to), (4, Some(2), 1));
}

#[test]
fn the_commit_index_is_never_below_the_applied_index() {
    let m = Metrics::new();
    let mut rm = RaftMetrics::new_initial(1);
    rm.current_term = 3;
    rm.state = ServerState::Leader;
    rm.current_leader = Some(1);
    rm.last_log_index = Some(20);
    rm.last_applied = Some(openraft::LogId::new(openraft::CommittedLeaderId::new(3, 1), 15));
    m.set_raft(&rm, true);
    let page = m.encode();
    assert_eq!(line(&page, "idemraft_raft_commit_index"), Some(15.0));
    assert_eq!(line(&page, "idemraft_raft_apply_lag"), Some(0.0));
    m.committed(18);
    m.set_raft(&rm, true);
    let page = m.encode();
    assert_eq!(line(&page, "idemraft_raft_commit_index"), Some(18.0));
    assert_eq!(line(&page, "idemraft_raft_apply_lag"), Some(3.0));
    assert_eq!(line(&page, "idemraft_raft_term"), Some(3.0));
    assert_eq!(line(&page, "idemraft_raft_role{role=\"leader\"}"), Some(1.0));
    assert_eq!(line(&page, "idemraft_raft_role{role=\"follower\"}"), Some(0.0));
    assert_eq!(line(&page, "idemraft_raft_has_leader"), Some(1.0));
    assert_eq!(line(&page, "idemraft_raft_log_entries"), Some(20.0));
}

#[test]
fn disk_sizes_add_up_the_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("snapshots")).unwrap();
    std::fs::create_dir_all(dir.path().join("db/blobs")).unwrap();
    std::fs::write(dir.path().join("snapshots/1.snap"), [0u8; 100]).unwrap();
    std::fs::write(dir.path().join("db/db"), [0u8; 40]).unwrap();
    std::fs::write(dir.path().join("db/blobs/1"), [0u8; 2]).unwrap();
    std::fs::create_dir_all(dir.path().join("log")).unwrap();
    std::fs::write(dir.path().join("log/00000000000000000001.seg"), [0u8; 7]).unwrap();
    std::fs::write(dir.path().join("log/meta"), [0u8; 3]).unwrap();
    let m = Metrics::new();
    m.set_disk(dir.path(), 0);
    let page = m.encode();
    assert_eq!(line(&page, "idemraft_snapshot_size_bytes"), Some(100.0));
    assert_eq!(line(&page, "idemraft_db_size_bytes"), Some(42.0));
    assert_eq!(line(&page, "idemraft_log_size_bytes"), Some(10.0));
}

#[test]
fn takeovers_and_stale_tokens_start_at_zero() {
    let page = Metrics::new().encode();
    for rpc in ["Claim", "Takeover"] {
        assert_eq!(line(&page, &format!("idemraft_takeovers_total{{rpc=\"{rpc}\"}}")), Some(0.0), "{page}");
    }
    for rpc in ["Complete", "Fail", "ExtendLease", "Checkpoint"] {
        assert_eq!(line(&page, &format!("idemraft_stale_tokens_total{{rpc=\"{rpc}\"}}")), Some(0.0), "{page}");
    }
}
