//! `idemctl` against a real cluster: the documented exit codes and the JSON output.
//! `idemctl` is built by `cargo test --workspace` (what `scripts/test.sh` runs) next to the
//! `idemraft` binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Cluster, SERIAL};

fn idemctl() -> PathBuf {
    let node = PathBuf::from(env!("CARGO_BIN_EXE_idemraft"));
    let ctl = node.with_file_name(format!("idemctl{}", std::env::consts::EXE_SUFFIX));
    assert!(
        ctl.exists(),
        "{} is missing: build it with `cargo build -p idemctl` or run the whole suite with scripts/test.sh",
        ctl.display()
    );
    ctl
}

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(endpoints: &str, args: &[&str]) -> Ran {
    let out = Command::new(idemctl()).arg("--endpoints").arg(endpoints).args(args).output().unwrap();
    Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_and_json_output() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &[]).await;
    let eps = (1..=3).map(|i| cluster.client_addr(i)).collect::<Vec<_>>().join(",");
    let key = "cli-key-0000000000000001";

    let r = run(&eps, &["-w", "json", "claim", "cli.test", key, "--owner", "a"]);
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["outcome"], "ACQUIRED");
    let token = v["token"].as_u64().unwrap().to_string();

    let r = run(&eps, &["claim", "cli.test", key, "--owner", "b"]);
    assert_eq!(r.code, 3, "IN_PROGRESS is a conflict: {}", r.stdout);
    assert!(r.stdout.starts_with("IN_PROGRESS"), "{}", r.stdout);

    let r = run(
        &eps,
        &["complete", "cli.test", key, &token, "--status", "201", "--body", "done", "--header", "Location: /x/1"],
    );
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    let r = run(&eps, &["-w", "json", "claim", "cli.test", key, "--owner", "c"]);
    assert_eq!(r.code, 0);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v["outcome"], "REPLAY");
    assert_eq!(v["response"]["status"], 201);
    assert_eq!(v["response"]["body"], "done");
    assert_eq!(v["response"]["headers"][0][1], "/x/1");

    let r = run(&eps, &["complete", "cli.test", key, "1", "--body", "late"]);
    assert_eq!(r.code, 3, "STALE_TOKEN: {}", r.stdout);

    let r = run(&eps, &["get", "cli.test", "cli-key-0000000000000404"]);
    assert_eq!(r.code, 4, "NOT_FOUND: {}", r.stdout);

    let r = run(&eps, &["claim", "cli.test", "short"]);
    assert_eq!(r.code, 2, "INVALID_ARGUMENT: {}", r.stderr);
    assert!(r.stderr.contains("key is 5 bytes long"), "{}", r.stderr);

    let r = run(&eps, &["-w", "json", "status"]);
    assert_eq!(r.code, 0);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 3);

    let r = run(&eps, &["member", "list"]);
    assert_eq!(r.code, 0);
    assert_eq!(r.stdout.matches("voter").count(), 3, "{}", r.stdout);

    // Paging: one page and where the next starts, the next page from there, and every page.
    let keys: Vec<String> = (1..=5).map(|i| format!("cli-list-{i:016}")).collect();
    for k in &keys {
        assert_eq!(run(&eps, &["claim", "cli.list", k]).code, 0);
    }
    let line_of = |k: &str| format!("cli.list/{k}  IN_PROGRESS");
    let r = run(&eps, &["list", "--scope", "cli.list", "--limit", "2"]);
    assert_eq!(r.code, 0, "{} {}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&line_of(&keys[1])) && !r.stdout.contains(&keys[2]), "{}", r.stdout);
    let resume = format!("cli.list/{}", keys[1]);
    assert!(r.stdout.contains(&format!("--start-after {resume}, or --all")), "{}", r.stdout);
    let r = run(&eps, &["list", "--scope", "cli.list", "--limit", "2", "--start-after", &resume]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let listed: Vec<&str> = r.stdout.lines().filter(|l| l.starts_with("cli.list/")).collect();
    assert_eq!(listed.len(), 2, "{}", r.stdout);
    assert!(listed[0].starts_with(&line_of(&keys[2])) && listed[1].starts_with(&line_of(&keys[3])), "{}", r.stdout);
    let r = run(&eps, &["list", "--scope", "cli.list", "--limit", "2", "--all"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for k in &keys {
        assert_eq!(r.stdout.matches(&line_of(k)).count(), 1, "{k} not listed once: {}", r.stdout);
    }
    assert!(r.stdout.contains("(5 records)") && !r.stdout.contains("more records follow"), "{}", r.stdout);
    let r = run(&eps, &["-w", "json", "list", "--scope", "cli.list", "--limit", "2", "--all"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let pages: Vec<serde_json::Value> = r.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(pages.len(), 3, "{}", r.stdout);
    let listed: Vec<&str> =
        pages.iter().flat_map(|p| p["records"].as_array().unwrap()).map(|v| v["key"].as_str().unwrap()).collect();
    assert_eq!(listed, keys.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(pages[0]["next_after"], serde_json::json!(format!("cli.list/{}", keys[1])));
    assert_eq!(pages[2]["more"], false);
    let r = run(&eps, &["list", "--start-after", &keys[0]]);
    assert_eq!(r.code, 2, "a key without its scope: {}", r.stderr);
    assert!(r.stderr.contains("--scope"), "{}", r.stderr);

    // Nothing listening: unavailable, exit 5, within the timeout.
    let started = std::time::Instant::now();
    let r = run("127.77.251.1:7101", &["--timeout", "800ms", "claim", "cli.test", key]);
    assert_eq!(r.code, 5, "{} {}", r.stdout, r.stderr);
    assert!(started.elapsed() < Duration::from_secs(5));
}
