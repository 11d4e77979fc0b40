//! The control socket: a line protocol on a Unix socket outside the mount, so the program
//! under test cannot see or trip it.
//!
//! Commands, one per line, each answered with one line:
//! - `power-loss`: drop everything not durable; answers `ok`.
//! - `stats`: answers `pending_bytes=N dirty_files=N pending_ops=N fail_fsync=0|1
//!   fail_write=0|1 fsync_delay_ms=N failed_fsyncs=N failed_writes=N delayed_fsyncs=N`
//!   (one line): the pending state, the disk faults switched on, and how often each fired.
//! - `torn on` / `torn off`: answers `ok`.
//! - `fail fsync on` / `fail fsync off`: fsync and fdatasync answer `EIO`; answers `ok`.
//! - `fail write on` / `fail write off`: write answers `EIO`; answers `ok`.
//! - `delay fsync MS`: every fsync waits `MS` milliseconds first (0 is off); answers `ok`.
//! - `faults off`: all three off, releasing fsyncs still waiting; answers `ok`.
//! - `unmount`: asks the binary to unmount and exit; answers `ok`.
//!
//! Anything else answers `error: ...`. See [`crate::faults`] for what the faults do.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::faults::Faults;
use crate::layer::Layer;

/// A running control server.
pub struct Server {
    stop: Arc<AtomicBool>,
    unmount: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// Answers one command line.
pub fn handle(layer: &Mutex<Layer>, faults: &Faults, line: &str, unmount: &AtomicBool) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["power-loss"] => match crate::lock(layer).power_loss() {
            Ok(()) => "ok".into(),
            Err(e) => format!("error: {e}"),
        },
        ["stats"] => {
            let s = crate::lock(layer).stats();
            let a = faults.active();
            let f = faults.stats();
            format!(
                "pending_bytes={} dirty_files={} pending_ops={} fail_fsync={} fail_write={} fsync_delay_ms={} \
                 failed_fsyncs={} failed_writes={} delayed_fsyncs={}",
                s.pending_bytes,
                s.dirty_files,
                s.pending_ops,
                u8::from(a.fail_fsync),
                u8::from(a.fail_write),
                a.fsync_delay.as_millis(),
                f.failed_fsyncs,
                f.failed_writes,
                f.delayed_fsyncs
            )
        }
        ["torn", word] => switch(word, |on| crate::lock(layer).set_torn(on)),
        ["fail", "fsync", word] => switch(word, |on| faults.set_fail_fsync(on)),
        ["fail", "write", word] => switch(word, |on| faults.set_fail_write(on)),
        ["delay", "fsync", ms] => match ms.parse::<u64>() {
            Ok(ms) => {
                faults.set_fsync_delay(Duration::from_millis(ms));
                "ok".into()
            }
            Err(_) => format!("error: not a number of milliseconds: {ms:?}"),
        },
        ["faults", "off"] => {
            faults.clear();
            "ok".into()
        }
        ["unmount"] => {
            unmount.store(true, Ordering::SeqCst);
            "ok".into()
        }
        _ => format!("error: unknown command {:?}", line.trim()),
    }
}

/// Sets a switch from `on` or `off`, and answers.
fn switch(word: &str, set: impl FnOnce(bool)) -> String {
    let on = match word {
        "on" => true,
        "off" => false,
        other => return format!("error: expected on or off, not {other:?}"),
    };
    set(on);
    "ok".into()
}

impl Server {
    /// Listens on `path` (replacing a stale socket file).
    pub fn start(path: &Path, layer: Arc<Mutex<Layer>>, faults: Arc<Faults>) -> io::Result<Server> {
        if path.exists() {
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)?;
        // Non-blocking accept lets the thread notice `stop` without a wake-up connection.
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let unmount = Arc::new(AtomicBool::new(false));
        let (s, u) = (stop.clone(), unmount.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => serve(conn, &layer, &faults, &u),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        Ok(Server { stop, unmount, thread: Some(thread), path: path.to_owned() })
    }

    /// True after an `unmount` command.
    pub fn unmount_requested(&self) -> bool {
        self.unmount.load(Ordering::SeqCst)
    }

    /// Stops serving and removes the socket file.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(conn: UnixStream, layer: &Mutex<Layer>, faults: &Faults, unmount: &AtomicBool) {
    // One slow client must not block the next one forever.
    let _ = conn.set_nonblocking(false);
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let reader = BufReader::new(conn);
    for line in reader.lines() {
        let Ok(line) = line else {
            return;
        };
        if line.trim().is_empty() {
            continue;
        }
        let answer = handle(layer, faults, &line, unmount);
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}
