//! What the server processes cost: CPU time and peak resident memory, read from `/proc`.
//!
//! A target is a set of root pids (one per node). PostgreSQL serves each connection from a
//! child process, so each root counts with its descendants: the CPU of a child that exited
//! during a run has been added to its parent's `cutime`/`cstime` by then, and a live child
//! counts its own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The machine's CPU time so far, from the first line of `/proc/stat`: (idle, total) in clock
/// ticks over every CPU. Time waiting for IO or stolen by the hypervisor is not idle.
pub fn machine_ticks() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let mut fields = text.lines().next()?.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // user nice system idle iowait irq softirq steal
    let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    Some((*ticks.get(3)?, ticks.iter().sum()))
}

/// Clock ticks per second of `/proc/<pid>/stat` times. Linux reports them in USER_HZ, which
/// is 100 on every architecture this runs on; `getconf` confirms it where available.
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// (ppid, utime + stime + cutime + cstime in ticks) of a process, if it still exists.
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    let ppid = fields.get(1)?.parse().ok()?;
    let mut sum = 0u64;
    for i in 11..=14 {
        sum += fields.get(i)?.parse::<i64>().ok()?.max(0) as u64;
    }
    Some((ppid, sum))
}

/// Every pid under `roots` (the roots included).
fn tree(roots: &[u32]) -> BTreeSet<u32> {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((ppid, _)) = stat(pid) {
                parent.insert(pid, ppid);
            }
        }
    }
    let mut out: BTreeSet<u32> = roots.iter().copied().collect();
    // Parents are found by walking up; a chain longer than 64 is not a process tree we made.
    for &pid in parent.keys() {
        let mut p = pid;
        for _ in 0..64 {
            match parent.get(&p) {
                Some(&pp) if out.contains(&pp) => {
                    out.insert(pid);
                    break;
                }
                Some(&pp) if pp > 1 => p = pp,
                _ => break,
            }
        }
    }
    out
}

/// Samples of the server processes of one target.
#[derive(Clone, Debug)]
pub struct Procs {
    roots: Vec<u32>,
    tick: f64,
}

impl Procs {
    /// The processes rooted at `roots`.
    pub fn new(roots: Vec<u32>) -> Procs {
        Procs { roots, tick: ticks_per_second() }
    }

    /// CPU seconds used so far by the roots and their descendants.
    pub fn cpu_seconds(&self) -> f64 {
        let ticks: u64 = tree(&self.roots).into_iter().filter_map(stat).map(|(_, t)| t).sum();
        ticks as f64 / self.tick
    }

    /// Sum of `VmHWM` (peak resident set) over the roots and their descendants, in bytes.
    /// Pages shared between processes (PostgreSQL's shared buffers) count once per process.
    pub fn peak_rss_bytes(&self) -> u64 {
        tree(&self.roots).into_iter().map(|p| status_kib(p, "VmHWM:") * 1024).sum()
    }

    /// Sum of `VmRSS` (current resident set) over the roots and their descendants, in bytes.
    pub fn rss_bytes(&self) -> u64 {
        tree(&self.roots).into_iter().map(|p| status_kib(p, "VmRSS:") * 1024).sum()
    }
}

/// A `kB` field of `/proc/<pid>/status`, 0 when absent.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU seconds this process (the load generator) has used so far.
pub fn self_cpu_seconds() -> f64 {
    let tick = ticks_per_second();
    stat(std::process::id()).map_or(0.0, |(_, t)| t as f64 / tick)
}

/// Bytes the regular files under `dir` take on disk, recursively (depth-bounded), as `du`
/// counts them: allocated blocks, and a file with several links (a snapshot's hard link to a
/// blob or a pack) once.
pub fn dir_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, depth: u32, seen: &mut std::collections::HashSet<(u64, u64)>) -> u64 {
        if depth > 16 {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
        let mut sum = 0;
        for e in entries.flatten() {
            sum += match e.metadata() {
                Ok(m) if m.is_dir() => walk(&e.path(), depth + 1, seen),
                Ok(m) if m.is_file() && seen.insert((m.dev(), m.ino())) => m.blocks() * 512,
                _ => 0,
            };
        }
        sum
    }
    walk(dir, 0, &mut std::collections::HashSet::new())
}
