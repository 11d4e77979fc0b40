//! Per-tenant record quotas on a real 3-node cluster with bearer tokens: an admin sets a
//! quota, claims on new keys beyond it are refused with an error naming the tenant, the count
//! and the fix, claims on existing keys still get their answers, another tenant is not
//! affected, a tenant's token cannot set quotas, the quota and the counts survive a restart of
//! every node and reach a follower through a snapshot install, and once the records expire and
//! are swept new keys are accepted again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Access, Cluster, SERIAL};
use idemraft_client::{BearerToken, ClaimOptions, Client, ClientConfig, Error, Outcome, StoredResponse};
use sha2::Digest;
use tonic::Code;

const TOKEN_A: &str = "token-of-tenant-a-0123456789abcdef";
const TOKEN_B: &str = "token-of-tenant-b-0123456789abcdef";
const TOKEN_ADMIN: &str = "token-of-the-operator-0123456789ab";
/// The shortest TTL the node accepts: the records of tenant a expire within the test.
const TTL: Duration = Duration::from_secs(60);

fn hash(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn tokens_file() -> String {
    format!(
        "[[token]]\ntenant = \"a\"\nsha256 = \"{}\"\n\n[[token]]\ntenant = \"b\"\nsha256 = \"{}\"\n\n\
         [[token]]\nname = \"operator\"\nadmin = true\nsha256 = \"{}\"\n",
        hash(TOKEN_A),
        hash(TOKEN_B),
        hash(TOKEN_ADMIN)
    )
}

fn client(cluster: &Cluster, token: &str) -> Client {
    let mut c = ClientConfig::new((1..=3).map(|i| cluster.client_addr(i)));
    c.bearer_token = Some(BearerToken::new(token));
    c.deadline = Duration::from_secs(15);
    Client::new(c).unwrap()
}

/// The `idemctl` binary next to `idemraft` (built by `cargo test --workspace`).
fn idemctl(cluster: &Cluster, token: &str, args: &[&str]) -> (i32, String, String) {
    let node = std::path::PathBuf::from(env!("CARGO_BIN_EXE_idemraft"));
    let ctl = node.with_file_name(format!("idemctl{}", std::env::consts::EXE_SUFFIX));
    assert!(ctl.exists(), "{} is missing: build the workspace first (scripts/test.sh)", ctl.display());
    let endpoints: Vec<String> = (1..=3).map(|i| cluster.client_addr(i)).collect();
    let out = std::process::Command::new(ctl)
        .args(["--endpoints", &endpoints.join(",")])
        .args(args)
        .env("IDEMCTL_TOKEN", token)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn ttl_opts() -> ClaimOptions {
    ClaimOptions { ttl: Some(TTL), ..ClaimOptions::default() }
}

/// Records and the quota in force for one tenant, as the leader reports them.
async fn usage(admin: &Client, tenant: &str) -> (u64, Option<u64>, bool) {
    let q = admin.get_quota(Some(tenant)).await.unwrap();
    let t = &q.tenants[0];
    assert_eq!(t.tenant, tenant);
    (t.records, t.max_records, t.own)
}

async fn refused_as_over_quota(a: &Client, key: &str) {
    let started = Instant::now();
    let e = a.claim("pay", key, "owner-x", &ttl_opts()).await.unwrap_err();
    let Error::QuotaExceeded { tenant, limit, records, message } = &e else { panic!("not a quota refusal: {e:?}") };
    assert_eq!((tenant.as_str(), *limit, *records), ("a", 3, 3), "{e}");
    assert!(message.contains("tenant 'a' holds 3 records and its quota is 3"), "{message}");
    assert!(message.contains("idemctl quota set a"), "the message names the fix: {message}");
    assert!(!e.is_indeterminate());
    assert!(started.elapsed() < Duration::from_secs(2), "refused at once, not retried: {:?}", started.elapsed());
}

/// Digests of every node at one applied index (the sweeper keeps the log moving, so ask
/// until the three answers line up).
async fn replicas_agree(cluster: &Cluster) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut seen = Vec::new();
        for id in 1..=3 {
            if let Ok(s) = cluster.client_for(&[id]).node_digest(0).await {
                seen.push((s.digest_index, s.state_digest));
            }
        }
        if seen.len() == 3 && seen.iter().all(|s| s.0 == seen[0].0) {
            assert!(seen.iter().all(|s| s.1 == seen[0].1), "replicas differ at index {}", seen[0].0);
            return;
        }
        assert!(Instant::now() < end, "replicas never reported one index: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric_total(cluster: &Cluster, series: &str) -> f64 {
    let mut sum = 0.0;
    for id in cluster.running() {
        let body =
            reqwest::get(format!("http://{}/metrics", cluster.http_addr(id))).await.unwrap().text().await.unwrap();
        sum += body.lines().filter_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok()).sum::<f64>();
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_quota_refuses_new_keys_only_and_survives_restarts_snapshots_and_expiry() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start_with(3, |_, dir| {
        let path = dir.join("tokens.toml");
        std::fs::write(&path, tokens_file()).unwrap();
        let access = Access { token: Some(TOKEN_ADMIN.into()), ..Access::default() };
        let flags = vec!["--tokens-file".into(), path.display().to_string(), "--snapshot-every".into(), "100".into()];
        (flags, access)
    })
    .await;
    let (a, b, admin) = (client(&cluster, TOKEN_A), client(&cluster, TOKEN_B), client(&cluster, TOKEN_ADMIN));

    // Only an admin sets quotas.
    let e = a.set_quota(Some("a"), Some(1_000_000)).await.unwrap_err();
    assert!(matches!(&e, Error::Rpc { code: Code::PermissionDenied, .. }), "{e:?}");
    // A permission refusal is not unreachability: its own wording and exit code (6, not 5).
    let (code, _, err) = idemctl(&cluster, TOKEN_B, &["quota", "set", "b", "none"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("needs an admin token"), "{err}");
    let (code, out, err) = idemctl(&cluster, TOKEN_B, &["status"]);
    assert_eq!(code, 6, "{out}{err}");
    assert_eq!(
        out.lines().filter(|l| l.contains("refused: ") && l.contains("needs an admin token")).count(),
        3,
        "{out}"
    );
    assert!(!out.contains("unreachable"), "{out}");
    let (code, out, err) = idemctl(&cluster, "not-a-token-of-this-cluster-0123456789", &["status"]);
    assert_eq!(code, 6, "{out}{err}");
    assert!(out.contains("not in this node's tokens file"), "{out}");

    let set = admin.set_quota(Some("a"), Some(3)).await.unwrap();
    assert_eq!(set.tenants[0].max_records, Some(3));

    // Tenant a fills its quota: one completed, one in progress, one failed (retryable).
    let keys: Vec<String> = (0..4).map(|i| common::key("quota-a", i)).collect();
    let Outcome::Acquired(done) = a.claim("pay", &keys[0], "owner-0", &ttl_opts()).await.unwrap() else { panic!() };
    a.complete("pay", &keys[0], done.token, &StoredResponse::new(201, "charged")).await.unwrap();
    let Outcome::Acquired(held) = a.claim("pay", &keys[1], "owner-1", &ttl_opts()).await.unwrap() else { panic!() };
    let Outcome::Acquired(failed) = a.claim("pay", &keys[2], "owner-2", &ttl_opts()).await.unwrap() else { panic!() };
    a.fail("pay", &keys[2], failed.token, true, None).await.unwrap();
    let filled = Instant::now();
    assert_eq!(usage(&admin, "a").await, (3, Some(3), true));

    // A fourth key is refused at once, with the tenant, the count and the fix.
    refused_as_over_quota(&a, &keys[3]).await;
    assert!(metric_total(&cluster, "idemraft_quota_refusals_total").await >= 1.0);

    // Existing keys answer as always.
    let replay = a.claim("pay", &keys[0], "owner-9", &ttl_opts()).await.unwrap();
    assert!(matches!(&replay, Outcome::Replay { response, .. } if response.body == b"charged"), "{replay:?}");
    assert_eq!(a.claim("pay", &keys[1], "owner-1", &ttl_opts()).await.unwrap(), Outcome::Acquired(held.clone()));
    assert!(matches!(a.claim("pay", &keys[1], "owner-9", &ttl_opts()).await.unwrap(), Outcome::InProgress { .. }));
    let Outcome::Acquired(again) = a.claim("pay", &keys[2], "owner-3", &ttl_opts()).await.unwrap() else { panic!() };
    assert_eq!(again.attempt, 2, "a failed key is re-acquired within the quota");

    // Tenant b has no quota; its keys are accepted. Enough of them to force snapshots while
    // node 3 is down, so it comes back through a snapshot install.
    cluster.kill(3);
    let leader = cluster.wait_for_leader_other_than(&[1, 2], 3, Duration::from_secs(10)).await;
    for i in 0..1_300 {
        let k = common::key("quota-b", i);
        assert!(matches!(b.claim("pay", &k, "owner-b", &ClaimOptions::default()).await.unwrap(), Outcome::Acquired(_)));
    }
    assert_eq!(usage(&admin, "b").await, (1_300, None, false));
    let (code, out, err) = idemctl(&cluster, TOKEN_ADMIN, &["quota", "get"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("default quota: none"), "{out}");
    assert!(out.lines().any(|l| l.starts_with('a') && l.contains(" 3 ") && l.ends_with("3 (own)")), "{out}");
    assert!(out.lines().any(|l| l.starts_with('b') && l.contains("1300") && l.ends_with("none")), "{out}");

    cluster.restart(3);
    let status = cluster.client_for(&[leader]).node_status(0).await.unwrap();
    cluster.wait_applied(3, status.applied_index, Duration::from_secs(30)).await;
    let log3 = std::fs::read_to_string(cluster.log_path(3)).unwrap();
    assert!(log3.contains("installed a snapshot from the leader"), "node 3 caught up without a snapshot");
    replicas_agree(&cluster).await;

    // Every node restarts: the quota is read back and the counts rebuilt from the records.
    for id in 1..=3 {
        cluster.kill(id);
    }
    for id in 1..=3 {
        cluster.restart(id);
    }
    cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    assert_eq!(usage(&admin, "a").await, (3, Some(3), true));
    refused_as_over_quota(&a, &keys[3]).await;
    // Once tenant a's records expire and are swept, a new key is accepted again.
    let expiry = TTL + Duration::from_secs(3);
    tokio::time::sleep(expiry.saturating_sub(filled.elapsed())).await;
    let end = Instant::now() + Duration::from_secs(20);
    while usage(&admin, "a").await.0 > 0 {
        assert!(Instant::now() < end, "tenant a's expired records were not swept");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(matches!(a.claim("pay", &keys[3], "owner-x", &ttl_opts()).await.unwrap(), Outcome::Acquired(_)));
    assert_eq!(usage(&admin, "a").await, (1, Some(3), true));

    // Clearing the quota through idemctl lifts the limit.
    let (code, out, err) = idemctl(&cluster, TOKEN_ADMIN, &["quota", "set", "a", "none"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("none"), "{out}");
    assert_eq!(usage(&admin, "a").await, (1, None, false));
}
