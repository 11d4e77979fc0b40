//! The status page on the HTTP port, on a real 3-node cluster: a real headless browser
//! (Chromium) loads the page from a follower and from the leader, waits for its script to draw
//! `/status.json`, and the leader and members it shows must be the ones Admin Status reports; a
//! screenshot is kept. With bearer tokens on, `/status.json` and `/status` need an admin token.
//!
//! Chromium is found at `IDEMRAFT_CHROMIUM`, else `chromium` or `chromium-browser` on the
//! path. Without it the browser test prints "skipped: no chromium" and passes, unless
//! `IDEMRAFT_REQUIRE_BROWSER=1` (as CI sets it, having installed Chromium), when it fails.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Access, Cluster, SERIAL};
use idemraft_client::ClaimOptions;
use sha2::Digest;

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("IDEMRAFT_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).flat_map(|d| [d.join("chromium"), d.join("chromium-browser")]).find(|p| p.is_file())
}

/// Chromium's flags for a machine without a display or internet access: no sandbox (tests
/// may run as root), no GPU, and none of the background connections it would otherwise try.
fn headless(chromium: &PathBuf, profile: &std::path::Path) -> Command {
    let mut cmd = Command::new(chromium);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Virtual time runs the page's timers and fetches before the dump: the script has
        // drawn the first report by then.
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    cmd
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[at..].find('"')?;
    Some(&tag[at..at + end])
}

/// The `<tr data-member=…>` rows of the dumped DOM, as (member id, role shown).
fn member_rows(dom: &str) -> Vec<(u64, String)> {
    dom.match_indices("<tr data-member=")
        .filter_map(|(at, _)| {
            let tag = &dom[at..at + dom[at..].find('>')?];
            Some((attr(tag, "data-member")?.parse().ok()?, attr(tag, "data-role")?.to_string()))
        })
        .collect()
}

fn body_tag(dom: &str) -> &str {
    let at = dom.find("<body").unwrap_or(0);
    &dom[at..at + dom[at..].find('>').unwrap_or(0)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_shows_the_leader_and_members_that_admin_status_reports() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var("IDEMRAFT_REQUIRE_BROWSER").as_deref() != Ok("1"),
            "IDEMRAFT_REQUIRE_BROWSER=1 but no chromium was found (install Debian's chromium or set IDEMRAFT_CHROMIUM)"
        );
        eprintln!("skipped: no chromium on PATH (set IDEMRAFT_CHROMIUM)");
        return;
    };
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start(3, &[]).await;
    let client = cluster.client();
    for i in 0..20 {
        client.claim("status.page", &common::key("k", i), "owner-1", &ClaimOptions::default()).await.unwrap();
    }
    let leader = cluster.wait_for_leader(&[1, 2, 3], Duration::from_secs(30)).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let admin = cluster.client_for(&[leader]).node_status(0).await.unwrap();
    let profile = tempfile::tempdir().unwrap();

    for node in [follower, leader] {
        let url = format!("http://{}/", cluster.http_addr(node));
        let out = headless(&browser, profile.path()).arg("--dump-dom").arg(&url).output().unwrap();
        let dom = String::from_utf8_lossy(&out.stdout).to_string();
        let body = body_tag(&dom);
        assert_eq!(attr(body, "data-rendered"), Some("1"), "the page did not draw {url}: {body}\n{dom:.3000}");
        assert_eq!(attr(body, "data-node-id"), Some(node.to_string().as_str()), "{body}");
        assert_eq!(attr(body, "data-leader-id"), Some(leader.to_string().as_str()), "node {node}'s page: {body}");
        let rows = member_rows(&dom);
        let mut ids: Vec<u64> = rows.iter().map(|r| r.0).collect();
        ids.sort_unstable();
        let mut want: Vec<u64> = admin.members.iter().map(|m| m.id).collect();
        want.sort_unstable();
        assert_eq!(ids, want, "members shown on node {node}'s page");
        for (id, role) in &rows {
            let expected = if *id == leader { "leader" } else { "follower" };
            assert_eq!(role, expected, "node {id}'s role on node {node}'s page");
        }
        assert!(dom.contains(&format!("leader: node {leader}")), "headline on node {node}'s page");
    }

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let url = format!("http://{}/", cluster.http_addr(leader));
    let status = headless(&browser, profile.path())
        .args(["--window-size=1400,1500", "--hide-scrollbars"])
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url)
        .output()
        .unwrap();
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(size > 20_000, "no readable screenshot at {} ({size} bytes): {status:?}", shot.display());
    eprintln!("status page screenshot: {} ({size} bytes)", shot.display());
}

const TENANT: &str = "status-tenant-token-0123456789abcdef";
const ADMIN: &str = "status-admin-token-0123456789abcdef0";

fn hash(token: &str) -> String {
    sha2::Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_the_status_needs_an_admin_token() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_with(3, |_, dir| {
        let path = dir.join("tokens.toml");
        let text = format!(
            "[[token]]\ntenant = \"t\"\nsha256 = \"{}\"\n\n[[token]]\nname = \"ops\"\nadmin = true\nsha256 = \"{}\"\n",
            hash(TENANT),
            hash(ADMIN)
        );
        std::fs::write(&path, text).unwrap();
        let flags = vec!["--tokens-file".to_string(), path.display().to_string()];
        (flags, Access { token: Some(ADMIN.to_string()), ..Access::default() })
    })
    .await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", cluster.http_addr(1));
    for path in ["/status.json", "/status"] {
        let get = |token: Option<&str>| {
            let mut r = http.get(format!("{base}{path}"));
            if let Some(t) = token {
                r = r.bearer_auth(t);
            }
            r.send()
        };
        let none = get(None).await.unwrap();
        assert_eq!(none.status(), 401, "{path} without a token");
        assert!(none.text().await.unwrap().contains("needs an admin token"), "{path} says what to send");
        let tenant = get(Some(TENANT)).await.unwrap();
        assert_eq!(tenant.status(), 403, "{path} with a tenant's token");
        let wrong = get(Some("not-a-token-at-all-0123456789abcdef")).await.unwrap();
        assert_eq!(wrong.status(), 401, "{path} with an unknown token");
        let ok = get(Some(ADMIN)).await.unwrap();
        assert_eq!(ok.status(), 200, "{path} with the admin token");
        let body: serde_json::Value = serde_json::from_str(&ok.text().await.unwrap()).unwrap();
        assert_eq!(body["id"], 1, "{path}: {body}");
    }
    // The page holds no data: anyone may load it, and it asks for the token itself.
    let page = http.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("Admin token"));
    // Probes and scrapes stay open.
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(http.get(format!("{base}{path}")).send().await.unwrap().status(), 200, "{path}");
    }
}
