//! Real `idemraft` processes on 127.0.0.1 for the harness: ports, data dirs and logs per node,
//! the proxied peer network, and the process-level faults (SIGKILL, SIGSTOP/SIGCONT, restart,
//! a shifted wall clock through libfaketime), and the disk-level ones: with
//! [`ClusterSpec::lazy_disks`] each node's data directory is a [`lazyfs`] mount, so a power
//! loss can drop what a node wrote but never fsynced, and its disk can fail or slow down.
//!
//! Every node dials every other node through [`Net`]'s proxy for that link (`--peer-route`),
//! while the membership, replicated in the log, keeps each node's real peer address. Slots for
//! nodes that join later (membership faults) are allocated up front so every running node
//! already has a route to them.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use idemraft_client::{Client, ClientConfig};

use crate::proxy::Net;

/// How to start the cluster.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The `idemraft` binary.
    pub binary: PathBuf,
    /// Founding members: ids 1..=founders.
    pub founders: u64,
    /// Extra id slots for nodes that join during the run.
    pub spare: u64,
    /// Where data dirs and logs go.
    pub dir: PathBuf,
    /// Extra flags for every node (timings, planted bugs).
    pub flags: Vec<String>,
    /// libfaketime's library, when clock faults are wanted.
    pub faketime: Option<PathBuf>,
    /// Mount every node's data directory through the lazy filesystem (power-loss and disk
    /// faults need it; it needs root and `/dev/fuse`).
    pub lazy_disks: bool,
}

/// One node slot.
struct Slot {
    client: SocketAddr,
    peer: SocketAddr,
    http: SocketAddr,
    child: Option<Child>,
    paused: bool,
    /// The node's data directory as a lazy filesystem, when the spec asks for one.
    disk: Option<lazyfs::LazyFs>,
}

/// A cluster of real processes.
pub struct Cluster {
    spec: ClusterSpec,
    slots: BTreeMap<u64, Slot>,
    /// The proxied peer network.
    pub net: Net,
}

/// Picks a free loopback port below the kernel's ephemeral range (32768 and up on Linux), so
/// that an outgoing connection cannot take it between this check and the node's bind, which
/// for a node that joins late can be minutes.
///
/// `IDEMRAFT_JEPSEN_PORTS=LOW-HIGH` narrows the range, so that harnesses running side by side
/// (`jepsen-suite.sh --jobs`) never pick a port another one's stopped node will bind again.
fn free_port(taken: &mut std::collections::BTreeSet<u16>) -> std::io::Result<SocketAddr> {
    use rand::Rng;
    let mut rng = rand::rng();
    let (low, high) = port_range();
    for _ in 0..1000 {
        let port = rng.random_range(low..high);
        if taken.contains(&port) {
            continue;
        }
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            taken.insert(port);
            return l.local_addr();
        }
    }
    Err(std::io::Error::other(format!("no free port in {low}..{high} after 1000 tries")))
}

/// The ports to pick from: `IDEMRAFT_JEPSEN_PORTS` (`LOW-HIGH`, within 1024..32768), else
/// 10000..30000.
fn port_range() -> (u16, u16) {
    let parsed = std::env::var("IDEMRAFT_JEPSEN_PORTS").ok().and_then(|v| {
        let (a, b) = v.split_once('-')?;
        let (a, b) = (a.trim().parse::<u16>().ok()?, b.trim().parse::<u16>().ok()?);
        (1024 <= a && a + 100 <= b && b <= 32_768).then_some((a, b))
    });
    parsed.unwrap_or((10_000, 30_000))
}

/// The libfaketime library, if it is installed in a usual place.
pub fn find_faketime() -> Option<PathBuf> {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ];
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// Sends a signal with the system's `kill`: the crate forbids `unsafe`, and a signal is rare
/// enough that a process spawn costs nothing that matters.
fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run kill: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid} failed"))
    }
}

impl Cluster {
    /// Allocates ports, starts the proxies and the founding nodes (it does not wait for a leader).
    pub async fn start(spec: ClusterSpec) -> Result<Cluster, String> {
        if !spec.binary.exists() {
            return Err(format!(
                "the idemraft binary {} does not exist; build it first with `cargo build -p idemraft-node` \
                 (or pass --binary)",
                spec.binary.display()
            ));
        }
        // A rerun of the same seed starts from nothing: stale data dirs would hold another
        // cluster's log. Only a directory this harness made (it has node dirs) is removed.
        if spec.dir.join("n1").is_dir() {
            // A harness that was killed leaves its lazy mounts behind; detach them first.
            for entry in std::fs::read_dir(&spec.dir).into_iter().flatten().flatten() {
                let data = entry.path().join("data");
                if is_mount_point(&data) {
                    lazyfs::lazy_unmount(&data);
                }
            }
            std::fs::remove_dir_all(&spec.dir)
                .map_err(|e| format!("cannot clear the old run directory {}: {e}", spec.dir.display()))?;
        }
        std::fs::create_dir_all(&spec.dir).map_err(|e| format!("cannot create {}: {e}", spec.dir.display()))?;
        let ids: Vec<u64> = (1..=spec.founders + spec.spare).collect();
        let mut slots = BTreeMap::new();
        let mut taken = std::collections::BTreeSet::new();
        for &id in &ids {
            let io = |e: std::io::Error| format!("no free port: {e}");
            slots.insert(
                id,
                Slot {
                    client: free_port(&mut taken).map_err(io)?,
                    peer: free_port(&mut taken).map_err(io)?,
                    http: free_port(&mut taken).map_err(io)?,
                    child: None,
                    paused: false,
                    disk: None,
                },
            );
        }
        let peers: BTreeMap<u64, SocketAddr> = slots.iter().map(|(i, s)| (*i, s.peer)).collect();
        let net = Net::start(&ids, |b| peers[&b]).await.map_err(|e| format!("cannot start proxies: {e}"))?;
        let mut c = Cluster { spec, slots, net };
        if let Some(f) = &c.spec.faketime {
            if !f.exists() {
                return Err(format!("libfaketime not found at {}", f.display()));
            }
        }
        for id in 1..=c.spec.founders {
            c.reset_clock(id)?;
            c.spawn(id)?;
        }
        Ok(c)
    }

    /// Every slot id, founders first.
    pub fn slot_ids(&self) -> Vec<u64> {
        self.slots.keys().copied().collect()
    }

    /// Ids whose process runs (paused or not).
    pub fn running(&self) -> Vec<u64> {
        self.slots.iter().filter(|(_, s)| s.child.is_some()).map(|(i, _)| *i).collect()
    }

    /// The client address of node `id`.
    pub fn client_addr(&self, id: u64) -> Option<SocketAddr> {
        self.slots.get(&id).map(|s| s.client)
    }

    /// The real peer address of node `id` (what the membership records).
    pub fn peer_addr(&self, id: u64) -> Option<SocketAddr> {
        self.slots.get(&id).map(|s| s.peer)
    }

    /// This node's directory (data and log).
    pub fn node_dir(&self, id: u64) -> PathBuf {
        self.spec.dir.join(format!("n{id}"))
    }

    /// The node's data directory, as the node sees it (the lazy mount, when there is one).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("data")
    }

    /// Mounts node `id`'s data directory through the lazy filesystem, once: the backing
    /// directory beside it holds exactly what the node made durable.
    fn mount_disk(&mut self, id: u64) -> Result<(), String> {
        if !self.spec.lazy_disks || self.slots.get(&id).is_some_and(|s| s.disk.is_some()) {
            return Ok(());
        }
        let backing = self.node_dir(id).join("disk");
        let mount = self.data_dir(id);
        for d in [&backing, &mount] {
            std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let opts = lazyfs::Options { backing, mount: mount.clone(), staging: None, control: None };
        let fs = lazyfs::LazyFs::mount(&opts).map_err(|e| {
            format!(
                "cannot mount the lazy filesystem on {}: {e}; power-loss and disk faults need root and /dev/fuse",
                mount.display()
            )
        })?;
        if let Some(s) = self.slots.get_mut(&id) {
            s.disk = Some(fs);
        }
        Ok(())
    }

    /// Node `id`'s lazy disk, when the cluster runs on lazy disks.
    pub fn disk(&self, id: u64) -> Option<&lazyfs::LazyFs> {
        self.slots.get(&id).and_then(|s| s.disk.as_ref())
    }

    /// Simulated power loss of a node that is not running: everything it wrote but did not
    /// make durable is gone. Returns the bytes and entry changes dropped.
    pub fn power_loss(&mut self, id: u64) -> Result<String, String> {
        if self.slots.get(&id).is_some_and(|s| s.child.is_some()) {
            return Err(format!("node {id} still runs; stop it before its power loss"));
        }
        let disk = self.disk(id).ok_or("power-loss faults need lazy disks (--faults power-loss turns them on)")?;
        let before = disk.stats();
        disk.power_loss().map_err(|e| format!("power loss of node {id} failed: {e}"))?;
        Ok(format!(
            "node {id} lost {} unsynced bytes in {} files and {} entry changes",
            before.pending_bytes, before.dirty_files, before.pending_ops
        ))
    }

    /// Takes back a node that exited on its own (an expected exit, such as after a failed
    /// disk), waiting up to `within`; returns its exit status, or `None` if it still runs.
    pub fn reap(&mut self, id: u64, within: Duration) -> Option<String> {
        let slot = self.slots.get_mut(&id)?;
        let child = slot.child.as_mut()?;
        let end = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                slot.child = None;
                slot.paused = false;
                return Some(st.to_string());
            }
            if std::time::Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The node's log file.
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("node.log")
    }

    fn clock_file(&self, id: u64) -> PathBuf {
        self.node_dir(id).join("faketime")
    }

    /// Shifts node `id`'s wall clock by `offset_s` seconds (it takes effect within a second,
    /// libfaketime's re-read interval). Monotonic time is untouched, so timers still work.
    pub fn set_clock_offset(&self, id: u64, offset_s: i64) -> Result<(), String> {
        if self.spec.faketime.is_none() {
            return Err("clock faults need libfaketime (Debian package `faketime`)".into());
        }
        let text = format!("{offset_s:+}\n");
        std::fs::write(self.clock_file(id), text).map_err(|e| format!("cannot write the clock file: {e}"))
    }

    /// Puts node `id`'s clock back to real time.
    pub fn reset_clock(&self, id: u64) -> Result<(), String> {
        std::fs::create_dir_all(self.node_dir(id)).map_err(|e| format!("cannot create the node dir: {e}"))?;
        if self.spec.faketime.is_some() {
            std::fs::write(self.clock_file(id), "+0\n").map_err(|e| format!("cannot write the clock file: {e}"))?;
        }
        Ok(())
    }

    /// Starts node `id`'s process (a founder with --initial-cluster, a joiner without).
    pub fn spawn(&mut self, id: u64) -> Result<(), String> {
        let founders = self.spec.founders;
        let initial: Vec<String> =
            (1..=founders).filter_map(|i| self.slots.get(&i).map(|s| format!("{i}={}", s.peer))).collect();
        let routes: Vec<String> = self
            .slot_ids()
            .into_iter()
            .filter(|&b| b != id)
            .filter_map(|b| self.net.proxy_addr(id, b).map(|a| format!("{b}={a}")))
            .collect();
        let dir = self.node_dir(id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if self.slots.get(&id).is_some_and(|s| s.child.is_some()) {
            return Err(format!("node {id} already runs"));
        }
        self.mount_disk(id)?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .map_err(|e| format!("cannot open the node log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("cannot open the node log: {e}"))?;
        let slot = self.slots.get(&id).ok_or_else(|| format!("node {id} has no slot"))?;
        let mut cmd = Command::new(&self.spec.binary);
        cmd.arg("--id")
            .arg(id.to_string())
            .arg("--client-addr")
            .arg(slot.client.to_string())
            .arg("--peer-addr")
            .arg(slot.peer.to_string())
            .arg("--http-addr")
            .arg(slot.http.to_string())
            .arg("--data-dir")
            .arg(self.data_dir(id))
            .arg("--peer-route")
            .arg(routes.join(","))
            .args(&self.spec.flags)
            .env("RUST_LOG", std::env::var("IDEMRAFT_JEPSEN_NODE_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        if id <= founders {
            cmd.arg("--initial-cluster").arg(initial.join(","));
        }
        if let Some(lib) = &self.spec.faketime {
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME_TIMESTAMP_FILE", self.clock_file(id))
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
                .env("FAKETIME_CACHE_DURATION", "1");
        }
        let child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", self.spec.binary.display()))?;
        if let Some(s) = self.slots.get_mut(&id) {
            s.child = Some(child);
            s.paused = false;
        }
        Ok(())
    }

    /// SIGKILL: no flush, no goodbye.
    pub fn kill(&mut self, id: u64) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or_else(|| format!("node {id} has no slot"))?;
        let Some(mut child) = slot.child.take() else { return Err(format!("node {id} is not running")) };
        child.kill().map_err(|e| format!("cannot kill node {id}: {e}"))?;
        let _ = child.wait();
        slot.paused = false;
        Ok(())
    }

    /// SIGTERM and wait (bounded) for a clean exit; SIGKILL if it does not come.
    pub fn stop(&mut self, id: u64) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or_else(|| format!("node {id} has no slot"))?;
        let Some(mut child) = slot.child.take() else { return Ok(()) };
        if slot.paused {
            let _ = signal(child.id(), "CONT");
            slot.paused = false;
        }
        let _ = signal(child.id(), "TERM");
        for _ in 0..100 {
            if let Ok(Some(_)) = child.try_wait() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        Ok(())
    }

    /// SIGSTOP: the process freezes with its sockets open.
    pub fn pause(&mut self, id: u64) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or_else(|| format!("node {id} has no slot"))?;
        let pid = slot.child.as_ref().map(Child::id).ok_or_else(|| format!("node {id} is not running"))?;
        signal(pid, "STOP")?;
        slot.paused = true;
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self, id: u64) -> Result<(), String> {
        let slot = self.slots.get_mut(&id).ok_or_else(|| format!("node {id} has no slot"))?;
        let pid = slot.child.as_ref().map(Child::id).ok_or_else(|| format!("node {id} is not running"))?;
        signal(pid, "CONT")?;
        slot.paused = false;
        Ok(())
    }

    /// Whether node `id` is paused.
    pub fn is_paused(&self, id: u64) -> bool {
        self.slots.get(&id).is_some_and(|s| s.paused)
    }

    /// Nodes whose process died on its own (not killed by the harness), with their exit status.
    pub fn crashed(&mut self) -> Vec<(u64, String)> {
        let mut out = Vec::new();
        for (id, s) in self.slots.iter_mut() {
            if let Some(child) = s.child.as_mut() {
                if let Ok(Some(st)) = child.try_wait() {
                    out.push((*id, st.to_string()));
                    s.child = None;
                }
            }
        }
        out
    }

    /// A client for node `id` alone (no failover), for reads aimed at one replica and for
    /// status. `attempt` bounds each call.
    pub fn node_client(&self, id: u64, attempt: Duration) -> Result<Client, String> {
        let addr = self.client_addr(id).ok_or_else(|| format!("node {id} has no slot"))?;
        let cfg = ClientConfig { attempt_timeout: attempt, deadline: attempt, ..ClientConfig::new([addr.to_string()]) };
        Client::new(cfg).map_err(|e| e.to_string())
    }

    /// A failover client over the given members' client addresses.
    pub fn client(&self, members: &[u64], attempt: Duration, deadline: Duration) -> Result<Client, String> {
        let endpoints: Vec<String> =
            members.iter().filter_map(|i| self.client_addr(*i)).map(|a| a.to_string()).collect();
        let cfg = ClientConfig { attempt_timeout: attempt, deadline, ..ClientConfig::new(endpoints) };
        Client::new(cfg).map_err(|e| e.to_string())
    }

    /// The leader as the running, unpaused nodes report it (the id most of them name).
    pub async fn leader(&self) -> Option<u64> {
        let mut votes: BTreeMap<u64, usize> = BTreeMap::new();
        for id in self.running() {
            if self.is_paused(id) {
                continue;
            }
            let Ok(c) = self.node_client(id, Duration::from_millis(300)) else { continue };
            if let Ok(s) = c.node_status(0).await {
                if s.leader_id != 0 {
                    *votes.entry(s.leader_id).or_default() += 1;
                }
            }
        }
        votes.into_iter().max_by_key(|(_, n)| *n).map(|(id, _)| id)
    }

    /// Every line of node `id`'s log (none when it never started).
    pub fn log_lines(&self, id: u64) -> Vec<String> {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default().lines().map(str::to_string).collect()
    }

    /// The last lines of node `id`'s log, for failure reports.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(id)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }

    /// Stops every process (SIGCONT first for paused ones).
    pub fn shutdown(&mut self) {
        for id in self.running() {
            let _ = self.stop(id);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in self.slots.values_mut() {
            if let Some(mut c) = s.child.take() {
                if s.paused {
                    let _ = signal(c.id(), "CONT");
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        // Only once no node holds a file open can the mounts go quietly.
        for s in self.slots.values_mut() {
            drop(s.disk.take());
        }
    }
}

/// Whether `path` is a mount point right now (a lazy mount left by a killed harness).
fn is_mount_point(path: &Path) -> bool {
    // The parent, not the path: a dead FUSE mount cannot be resolved itself.
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { return false };
    let Ok(canonical) = parent.canonicalize().map(|p| p.join(name)) else { return false };
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let target = canonical.to_string_lossy();
    mounts.lines().any(|l| l.split_whitespace().nth(1) == Some(&*target))
}
