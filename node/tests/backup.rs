//! Backup and restore on real processes: `idemctl snapshot save` from a cluster holding
//! completed keys (a tenth of them with bodies large enough for packs), a new cluster
//! founded from the file with `--restore-from`, and every old completion replaying there with
//! its token and its body; new tokens are larger than every restored one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};
use tokio::time::Instant;

const SCOPE: &str = "backup.test";

fn idemctl() -> PathBuf {
    let node = PathBuf::from(env!("CARGO_BIN_EXE_idemraft"));
    let ctl = node.with_file_name(format!("idemctl{}", std::env::consts::EXE_SUFFIX));
    assert!(ctl.exists(), "{} is missing: build it with `cargo build -p idemctl`", ctl.display());
    ctl
}

/// Claim + complete `n` keys with 8 workers; returns (key, token, body) of each.
async fn fill(client: &Client, n: u64) -> Vec<(String, u64, Vec<u8>)> {
    let done = Arc::new(Mutex::new(Vec::new()));
    let per = n.div_ceil(8);
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let (client, done) = (client.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..per {
                let k = key(&format!("b{w}"), i);
                let g = match client.claim(SCOPE, &k, "filler", &ClaimOptions::default()).await.unwrap() {
                    Outcome::Acquired(g) => g,
                    other => panic!("{other:?}"),
                };
                let mut body = format!("response of {k}").into_bytes();
                if i % 10 == 0 {
                    // Large enough to be kept in a pack: the backup then carries a blob
                    // section, and the restore must put every body back.
                    body = body.repeat(12_000 / body.len() + 1);
                }
                client.complete(SCOPE, &k, g.token, &StoredResponse::new(201, body.clone())).await.unwrap();
                done.lock().unwrap().push((k, g.token, body));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let v = done.lock().unwrap().clone();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_saved_snapshot_founds_a_new_cluster_that_replays_every_completion() {
    let _serial = SERIAL.lock().await;
    const N: u64 = 2000;
    let old = Cluster::start(3, &[]).await;
    let client = old.client();
    let t = Instant::now();
    let completed = fill(&client, N).await;
    eprintln!("filled {} completed keys in {:?}", completed.len(), t.elapsed());
    // One key left IN_PROGRESS: restored as it is, still owned by its holder.
    let held = match client.claim(SCOPE, &key("held", 1), "holder", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("{other:?}"),
    };

    let file = old.dir.path().join("backup.snap");
    let endpoints: Vec<String> = (1..=3).map(|i| old.client_addr(i)).collect();
    let t = Instant::now();
    let out = Command::new(idemctl())
        .args(["--endpoints", &endpoints.join(","), "-w", "json", "snapshot", "save"])
        .arg(&file)
        .output()
        .unwrap();
    let save_time = t.elapsed();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let size = std::fs::metadata(&file).unwrap().len();
    assert_eq!(saved["records"].as_u64(), Some(N + 1), "{saved}");
    assert_eq!(saved["size_bytes"].as_u64(), Some(size), "{saved}");
    let index = saved["index"].as_u64().unwrap();
    assert!(index > 0, "{saved}");
    // No temporary file is left beside it.
    let leftovers: Vec<_> = std::fs::read_dir(old.dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    eprintln!(
        "saved {} records at index {index}: {size} bytes ({} bytes/record) in {save_time:?}",
        N + 1,
        size / (N + 1)
    );
    let max_old_token = completed.iter().map(|c| c.1).max().unwrap().max(held.token);
    drop(client);
    // Stop the old cluster but keep its directory: the backup file lives there.
    let mut old = old;
    for id in 1..=3 {
        old.kill(id);
    }

    // A new cluster (its own addresses), every founder restoring the same file.
    let path = file.to_string_lossy().to_string();
    let t = Instant::now();
    let mut new = Cluster::start(3, &["--restore-from", &path]).await;
    eprintln!("new cluster restored and elected a leader in {:?}", t.elapsed());
    let client = new.client();
    for (k, token, body) in &completed {
        match client.claim(SCOPE, k, "auditor", &ClaimOptions::default()).await.unwrap() {
            Outcome::Replay { token: t, response, .. } => {
                assert_eq!(t, *token, "{k}");
                assert_eq!(&response.body, body, "{k}");
                assert_eq!(response.status, 201, "{k}");
            }
            other => panic!("{k} did not replay after the restore: {other:?}"),
        }
    }
    match client.claim(SCOPE, &key("held", 1), "someone-else", &ClaimOptions::default()).await.unwrap() {
        Outcome::InProgress { .. } => {}
        other => panic!("the held key should still be held: {other:?}"),
    }
    let fresh = match client.claim(SCOPE, &key("fresh", 1), "new-owner", &ClaimOptions::default()).await.unwrap() {
        Outcome::Acquired(g) => g,
        other => panic!("{other:?}"),
    };
    assert!(fresh.token > max_old_token, "new token {} not above restored {}", fresh.token, max_old_token);
    assert!(fresh.token >> 16 > index, "the new log must continue after the snapshot's index {index}");

    // Restarting with the same flags does not restore again: the new write survives.
    assert!(new.terminate(2, Duration::from_secs(15)).is_some());
    new.restart(2);
    new.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    let c2 = new.client_for(&[2]);
    client.complete(SCOPE, &key("fresh", 1), fresh.token, &StoredResponse::new(200, "new")).await.unwrap();
    match c2.claim(SCOPE, &key("fresh", 1), "auditor", &ClaimOptions::default()).await.unwrap() {
        Outcome::Replay { token, .. } => assert_eq!(token, fresh.token),
        other => panic!("{other:?}"),
    }

    // A restore onto a directory that holds state is refused, naming the fix.
    assert!(new.terminate(3, Duration::from_secs(15)).is_some());
    let mut flags = new.identity_flags();
    flags.extend(["--restore-from".to_string(), path.clone()]);
    let other = new.dir.path().join("not-empty");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("something"), "x").unwrap();
    let (code, err) = new.run_expecting_refusal(3, &other, &flags, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not empty") && err.contains("empty --data-dir"), "{err}");
    // A damaged file is refused before anything is touched.
    let damaged = new.dir.path().join("damaged.snap");
    std::fs::write(&damaged, b"IDEMSNAP-not-really").unwrap();
    let mut flags = new.identity_flags();
    flags.extend(["--restore-from".to_string(), damaged.to_string_lossy().to_string()]);
    let (code, err) = new.run_expecting_refusal(3, &new.dir.path().join("empty-3"), &flags, Duration::from_secs(20));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("idemctl snapshot save"), "{err}");
}
