//! A real cluster for tests: `idemraft` processes on a loopback address of their own
//! (127.77.x.y, so tests never collide with a developer's cluster on 127.0.0.1 or with each
//! other), each with its own data directory and log file in a temporary directory.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use idemraft_client::{BearerToken, Client, ClientConfig, TlsIdentity};
use tokio::time::Instant;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// Cluster tests share two cores: running them one at a time keeps timing assertions honest.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub ip: String,
    pub founders: Vec<u64>,
    pub children: BTreeMap<u64, Child>,
    pub extra_flags: Vec<String>,
    /// The nodes' `RUST_LOG`.
    pub rust_log: String,
    /// How the harness's own clients connect (TLS, token); plain by default.
    pub access: Access,
}

/// How a test client reaches a cluster started with TLS or a tokens file.
#[derive(Clone, Default)]
pub struct Access {
    pub tls_ca: Option<Vec<u8>>,
    pub tls_identity: Option<TlsIdentity>,
    pub token: Option<String>,
}

impl Access {
    pub fn apply(&self, mut config: ClientConfig) -> ClientConfig {
        config.tls_ca = self.tls_ca.clone();
        config.tls_identity = self.tls_identity.clone();
        config.bearer_token = self.token.clone().map(BearerToken::new);
        config
    }
}

impl Cluster {
    fn pick_ip() -> String {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        format!("127.77.{}.{}", (pid % 200) + 20, (n % 250) + 1)
    }

    /// Starts `n` founding nodes and waits until every one knows the leader.
    pub async fn start(n: u64, extra_flags: &[&str]) -> Cluster {
        let flags: Vec<String> = extra_flags.iter().map(|s| s.to_string()).collect();
        Self::start_with(n, |_, _| (flags, Access::default())).await
    }

    /// [`Cluster::start`] with the nodes' `RUST_LOG` set to `rust_log`.
    pub async fn start_with_log(n: u64, extra_flags: &[&str], rust_log: &str) -> Cluster {
        let mut c = Self::stopped(n, extra_flags);
        c.rust_log = rust_log.to_string();
        for id in 1..=n {
            c.spawn(id, true);
        }
        c.wait_for_leader(&c.founders.clone(), Duration::from_secs(30)).await;
        c
    }

    /// Like [`Cluster::start`], with flags and client access chosen once the cluster's IP and
    /// directory are known (certificates must name the IP).
    pub async fn start_with(n: u64, setup: impl FnOnce(&str, &std::path::Path) -> (Vec<String>, Access)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ip = Self::pick_ip();
        let (extra_flags, access) = setup(&ip, dir.path());
        let mut c = Cluster {
            dir,
            ip,
            founders: (1..=n).collect(),
            children: BTreeMap::new(),
            extra_flags,
            access,
            rust_log: "info,openraft=warn".to_string(),
        };
        for id in 1..=n {
            c.spawn(id, true);
        }
        c.wait_for_leader(&c.founders.clone(), Duration::from_secs(30)).await;
        c
    }

    /// A cluster of `n` founders that is not started yet (to prepare data directories first).
    pub fn stopped(n: u64, extra_flags: &[&str]) -> Cluster {
        Cluster {
            dir: tempfile::tempdir().unwrap(),
            ip: Self::pick_ip(),
            founders: (1..=n).collect(),
            children: BTreeMap::new(),
            extra_flags: extra_flags.iter().map(|s| s.to_string()).collect(),
            access: Access::default(),
            rust_log: "info,openraft=warn".to_string(),
        }
    }

    pub fn client_addr(&self, id: u64) -> String {
        format!("{}:{}", self.ip, 7100 + id)
    }

    pub fn http_addr(&self, id: u64) -> String {
        format!("{}:{}", self.ip, 7300 + id)
    }

    pub fn peer_addr(&self, id: u64) -> String {
        format!("{}:{}", self.ip, 7200 + id)
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}.log"))
    }

    fn initial_cluster(&self) -> String {
        self.founders.iter().map(|i| format!("{i}={}", self.peer_addr(*i))).collect::<Vec<_>>().join(",")
    }

    /// Starts node `id` (a founder gets --initial-cluster; a joiner does not).
    pub fn spawn(&mut self, id: u64, founder: bool) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(id)).unwrap();
        let mut cmd = self.node_command(id, &self.data_dir(id));
        cmd.args(&self.extra_flags)
            .env("RUST_LOG", &self.rust_log)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        if founder {
            cmd.arg("--initial-cluster").arg(self.initial_cluster());
        }
        let child = cmd.spawn().unwrap();
        self.children.insert(id, child);
    }

    /// The data directory of node `id`.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("node-{id}"))
    }

    /// `idemraft` with node `id`'s addresses and `data_dir`; the caller adds the rest.
    fn node_command(&self, id: u64, data_dir: &std::path::Path) -> Command {
        // IDEMRAFT_TEST_BINARY runs the same scenario against another build (an A/B of an
        // older release, say); by default, the binary cargo built with these tests.
        let binary = std::env::var_os("IDEMRAFT_TEST_BINARY")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_idemraft")));
        let mut cmd = Command::new(binary);
        cmd.arg("--id")
            .arg(id.to_string())
            .arg("--client-addr")
            .arg(self.client_addr(id))
            .arg("--peer-addr")
            .arg(self.peer_addr(id))
            .arg("--http-addr")
            .arg(self.http_addr(id))
            .arg("--data-dir")
            .arg(data_dir);
        cmd
    }

    /// The flags a founder of this cluster starts with: `--initial-cluster LIST`.
    pub fn identity_flags(&self) -> Vec<String> {
        vec!["--initial-cluster".to_string(), self.initial_cluster()]
    }

    /// Runs node `id` of this cluster in the foreground on `data_dir` with `extra` flags,
    /// expecting it to refuse to start: returns its exit code and stderr. A node that is
    /// still running after `within` is killed and reported as code -1.
    pub fn run_expecting_refusal(
        &self,
        id: u64,
        data_dir: &std::path::Path,
        extra: &[String],
        within: Duration,
    ) -> (i32, String) {
        let err_path = self.dir.path().join(format!("refusal-{id}-{}.err", NEXT.fetch_add(1, Ordering::Relaxed)));
        let err = std::fs::File::create(&err_path).unwrap();
        let mut child =
            self.node_command(id, data_dir).args(extra).stdout(Stdio::null()).stderr(Stdio::from(err)).spawn().unwrap();
        let end = std::time::Instant::now() + within;
        let code = loop {
            if let Ok(Some(s)) = child.try_wait() {
                break s.code().unwrap_or(-1);
            }
            if std::time::Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                break -1;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        (code, std::fs::read_to_string(&err_path).unwrap_or_default())
    }

    pub fn restart(&mut self, id: u64) {
        let founder = self.founders.contains(&id);
        self.spawn(id, founder);
    }

    /// SIGKILL: a crash.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.children.remove(&id) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then the exit status (None if it did not exit within `within`).
    pub fn terminate(&mut self, id: u64, within: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.children.remove(&id)?;
        let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            if let Ok(Some(s)) = c.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    pub fn running(&self) -> Vec<u64> {
        self.children.keys().copied().collect()
    }

    /// A client for the given nodes.
    pub fn client_for(&self, ids: &[u64]) -> Client {
        let mut config = self.access.apply(ClientConfig::new(ids.iter().map(|i| self.client_addr(*i))));
        config.deadline = Duration::from_secs(15);
        Client::new(config).unwrap()
    }

    pub fn client(&self) -> Client {
        self.client_for(&self.running())
    }

    /// Waits until every node in `ids` reports the same leader; returns it.
    pub async fn wait_for_leader(&self, ids: &[u64], within: Duration) -> u64 {
        self.wait_for_leader_other_than(ids, 0, within).await
    }

    /// Waits until every node in `ids` reports the same leader, other than `old`.
    pub async fn wait_for_leader_other_than(&self, ids: &[u64], old: u64, within: Duration) -> u64 {
        let end = Instant::now() + within;
        loop {
            let mut leaders = Vec::new();
            for id in ids {
                let c = self.client_for(&[*id]);
                if let Ok(s) = c.node_status(0).await {
                    leaders.push(s.leader_id);
                }
            }
            if leaders.len() == ids.len()
                && leaders[0] != 0
                && leaders[0] != old
                && leaders.iter().all(|l| *l == leaders[0])
            {
                return leaders[0];
            }
            if Instant::now() > end {
                self.dump_logs();
                panic!("no agreed leader among {ids:?} within {within:?} (saw {leaders:?})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until node `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, within: Duration) {
        let end = Instant::now() + within;
        let c = self.client_for(&[id]);
        loop {
            if let Ok(s) = c.node_status(0).await {
                if s.applied_index >= index {
                    return;
                }
            }
            if Instant::now() > end {
                self.dump_logs();
                panic!("node {id} did not apply index {index} within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn dump_logs(&self) {
        for id in 1..=9 {
            if let Ok(text) = std::fs::read_to_string(self.log_path(id)) {
                let lines: Vec<&str> = text.lines().collect();
                let from = lines.len().saturating_sub(40);
                eprintln!("----- node {id} log (last {} lines) -----", lines.len() - from);
                for l in &lines[from..] {
                    eprintln!("{l}");
                }
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for (_, mut c) in std::mem::take(&mut self.children) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A valid key, unique per call.
/// Sends `sig` (as `kill` spells it: "-STOP", "-CONT") to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill {sig} {pid}");
}

pub fn key(prefix: &str, i: u64) -> String {
    format!("{prefix}-{i:016}")
}

/// A body of `size` bytes that starts with `head` and goes on with bytes no compressor can
/// shrink (xorshift from `head`), for tests about large entries: a leader logs and sends a
/// compressible body of 8 KiB or more at a fraction of its size (decision 0030), which would
/// leave such a test's log and AppendEntries small.
pub fn incompressible(head: &[u8], size: usize) -> Vec<u8> {
    let mut x =
        head.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)) | 1;
    let mut out = head.to_vec();
    while out.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes()[..(size - out.len()).min(8)]);
    }
    out.truncate(size);
    out
}

/// A plain HTTP/1.1 GET; returns the status code and the body.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut s, &mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), fetch).await.expect("HTTP GET timed out");
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    assert!(!head.to_ascii_lowercase().contains("transfer-encoding: chunked"), "expected a sized body: {head}");
    (status, body.to_string())
}

/// The samples of a Prometheus text page: `name{labels}` -> value.
pub fn parse(page: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in page.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        out.insert(series.to_string(), value);
    }
    out
}

/// One node's `/metrics`, parsed.
pub async fn scrape(cluster: &Cluster, id: u64) -> BTreeMap<String, f64> {
    let (status, body) = http_get(&cluster.http_addr(id), "/metrics").await;
    assert_eq!(status, 200, "{body}");
    parse(&body)
}

/// A series that must be on the page.
pub fn get(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series).unwrap_or_else(|| panic!("no series {series}"))
}
