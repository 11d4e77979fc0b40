//! A byte corrupted at rest: the disk returns different bytes than were written, with no I/O
//! error. One node writes 300 completions of 250 KiB (two log segments, snapshots, packs of
//! sixteen bodies), stops cleanly, and then, on a fresh copy of its data directory for each case,
//! one byte of one stored file is flipped. The node must refuse to start over damaged
//! metadata, log segments and snapshots, naming the file, and must never serve a damaged
//! body: a read of it fails naming its pack, and a claim that must replay it stops the
//! node, naming the file, as does every restart until the file is repaired. The untouched copy
//! then starts and replays everything, so every refusal was the damage's doing.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{incompressible, key, Cluster, SERIAL};
use idemraft_client::{ClaimOptions, Client, Outcome, StoredResponse};

const SCOPE: &str = "disk.corrupt";
const WRITES: u64 = 300;
const BODY: usize = 250 * 1024;

/// Does not compress, so the log holds every body whole and spans two segments.
fn body(i: u64) -> Vec<u8> {
    incompressible(format!("response {i} ").as_bytes(), BODY)
}

async fn write_all(client: &Client) {
    for i in 0..WRITES {
        let k = key("corrupt", i);
        let g = match client.claim(SCOPE, &k, "writer", &ClaimOptions::default()).await.unwrap() {
            Outcome::Acquired(g) => g,
            other => panic!("claim {k}: {other:?}"),
        };
        client.complete(SCOPE, &k, g.token, &StoredResponse::new(200, body(i))).await.unwrap();
    }
}

/// Every completion replays byte for byte.
async fn replays_all(client: &Client) {
    for i in 0..WRITES {
        let k = key("corrupt", i);
        match client.claim(SCOPE, &k, "auditor", &ClaimOptions::default()).await.unwrap() {
            Outcome::Replay { response, .. } => assert!(response.body == body(i), "{k}: the body differs"),
            other => panic!("{k}: {other:?}"),
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().unwrap();
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

/// Flips every bit of the byte at `at` (from the end when negative).
fn flip(file: &Path, at: i64) {
    let mut bytes = std::fs::read(file).unwrap();
    let i = if at < 0 { bytes.len() - at.unsigned_abs() as usize } else { at as usize };
    bytes[i] ^= 0xff;
    std::fs::write(file, bytes).unwrap();
}

fn files_in(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

fn blob_files(data: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(data.join("blobs")).unwrap().flatten() {
        if sub.path().is_dir() {
            out.extend(files_in(&sub.path(), ""));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_byte_at_rest_is_refused_and_never_served() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start(1, &["--snapshot-every", "100"]).await;
    write_all(&cluster.client()).await;
    // The snapshot policy acts on its own schedule: wait for one to exist before stopping.
    let snapshots = cluster.data_dir(1).join("snapshots");
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while files_in(&snapshots, ".snap").is_empty() {
        assert!(std::time::Instant::now() < end, "no snapshot within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cluster.terminate(1, Duration::from_secs(30)).is_some(), "a clean stop");
    let pristine = cluster.dir.path().join("pristine");
    copy_dir(&cluster.data_dir(1), &pristine);
    let segments = files_in(&pristine.join("log"), ".seg");
    assert!(segments.len() >= 2, "want two log segments, have {segments:?}");
    let flags = cluster.identity_flags();

    // Damage the node must refuse at start, naming the file.
    let cases: Vec<(&str, PathBuf, i64)> = vec![
        ("the log's vote and purge point", PathBuf::from("log/meta"), 12),
        ("an earlier log segment", segments[0].strip_prefix(&pristine).unwrap().to_path_buf(), 1 << 20),
        (
            "the newest snapshot",
            files_in(&pristine.join("snapshots"), ".snap")
                .last()
                .unwrap()
                .strip_prefix(&pristine)
                .unwrap()
                .to_path_buf(),
            -100,
        ),
    ];
    for (n, (what, file, at)) in cases.into_iter().enumerate() {
        let dir = cluster.dir.path().join(format!("case-{n}"));
        copy_dir(&pristine, &dir);
        flip(&dir.join(&file), at);
        let (code, err) = cluster.run_expecting_refusal(1, &dir, &flags, Duration::from_secs(30));
        assert!(code > 0, "{what} ({}) damaged: the node must refuse to start, got code {code}: {err}", file.display());
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        assert!(err.contains(&name), "{what}: the refusal must name {name}: {err}");
        assert!(err.contains("restore"), "{what}: the refusal must say how to recover: {err}");
        println!("{what} ({}): refused with exit {code}", file.display());
    }

    // A damaged body: the node starts (bodies are checked where they are read, not all at
    // start). A read of one fails naming its file. A claim on its key is applied, and apply
    // must answer with the body: it stops the node with the file named rather than answer
    // from damaged bytes, and so does every restart, which applies the same entry again.
    let dir = cluster.data_dir(1);
    std::fs::remove_dir_all(&dir).unwrap();
    copy_dir(&pristine, &dir);
    let packs = blob_files(&dir);
    let bytes: u64 = packs.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert!(bytes >= WRITES * BODY as u64, "every body in a pack: {bytes} bytes in {} files", packs.len());
    // One byte in every 64 KiB: every body of 250 KiB is hit.
    for p in &packs {
        let len = std::fs::metadata(p).unwrap().len() as i64;
        for at in (32 * 1024..len).step_by(64 * 1024) {
            flip(p, at);
        }
    }
    cluster.restart(1);
    cluster.wait_for_leader(&[1], Duration::from_secs(30)).await;
    let client = cluster.client();
    for i in [0, WRITES / 2, WRITES - 1] {
        let k = key("corrupt", i);
        match client.get(SCOPE, &k).await {
            Ok(Some(rec)) => assert!(rec.response.is_none(), "{k}: Get served a damaged body"),
            Ok(None) => panic!("{k}: the record is gone"),
            Err(e) => assert!(e.to_string().contains("blobs/"), "{k}: the error must name the pack: {e}"),
        }
    }
    let k = key("corrupt", WRITES / 2);
    if let Ok(Outcome::Replay { .. }) = client.claim(SCOPE, &k, "auditor", &ClaimOptions::default()).await {
        panic!("{k}: a damaged body was replayed");
    }
    let exit = cluster.terminate(1, Duration::from_secs(30));
    let log = std::fs::read_to_string(cluster.log_path(1)).unwrap_or_default();
    assert!(exit.is_some_and(|s| !s.success()), "the node must stop with an error, got {exit:?}");
    assert!(log.contains("corrupt pack") && log.contains("blobs/"), "the log must name the damaged pack");
    let (code, err) = cluster.run_expecting_refusal(1, &dir, &flags, Duration::from_secs(30));
    assert!(code > 0 && err.contains("corrupt pack"), "a restart must refuse naming the pack: {code} {err}");
    println!("damaged bodies: never served; the claim stopped the node and restarts refuse, naming the file");

    // The untouched copy starts and replays every body: the refusals were the damage's doing.
    std::fs::remove_dir_all(&dir).unwrap();
    copy_dir(&pristine, &dir);
    cluster.restart(1);
    cluster.wait_for_leader(&[1], Duration::from_secs(30)).await;
    replays_all(&cluster.client()).await;
}
