//! The machine's floor for one replicated write: the p50 of one fsync of a 4 KiB append plus
//! the p50 of one loopback TCP round trip. No durable replicated store can acknowledge a
//! write faster than one disk flush plus one hop to a peer, so this is the yardstick the
//! single-client latencies are read against.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

/// The measured floor, microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Floor {
    /// p50 of write(4 KiB) + fdatasync on an appended file.
    pub fsync_us: f64,
    /// p50 of a 32-byte ping-pong over 127.0.0.1 with TCP_NODELAY, between two threads.
    pub rtt_us: f64,
}

impl Floor {
    /// fsync + RTT.
    pub fn total_us(&self) -> f64 {
        self.fsync_us + self.rtt_us
    }

    /// The line the driver prints.
    pub fn line(&self) -> String {
        format!(
            "floor: fsync of a 4 KiB append p50 {:.0} us + loopback TCP round trip p50 {:.0} us = {:.0} us",
            self.fsync_us,
            self.rtt_us,
            self.total_us()
        )
    }
}

fn p50(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Measures the floor with `n` samples of each, writing a scratch file in `dir`.
pub fn measure(dir: &Path, n: usize) -> Result<Floor, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join("floor.scratch");
    let mut file = std::fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    let block = [0x5au8; 4096];
    let mut fsyncs = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        file.write_all(&block).map_err(|e| format!("writing {}: {e}", path.display()))?;
        file.sync_data().map_err(|e| format!("syncing {}: {e}", path.display()))?;
        fsyncs.push(t.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(&path);

    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding 127.0.0.1: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 32];
        for _ in 0..n {
            s.read_exact(&mut buf)?;
            s.write_all(&buf)?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
    let mut rtts = Vec::with_capacity(n);
    let mut buf = [0u8; 32];
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(&buf).map_err(|e| format!("ping: {e}"))?;
        s.read_exact(&mut buf).map_err(|e| format!("pong: {e}"))?;
        rtts.push(t.elapsed());
    }
    drop(s);
    echo.join().map_err(|_| "the echo thread panicked".to_string())?.map_err(|e| format!("echo: {e}"))?;
    Ok(Floor { fsync_us: p50(fsyncs), rtt_us: p50(rtts) })
}
