//! The control socket: a line protocol on a Unix socket outside the mount, so the program
//! under test cannot see or trip it.
//!
//! Commands, one per line, each answered with one line:
//! - `power-loss`: drop everything not durable; answers `ok`.
//! - `stats`: answers `pending_bytes=N dirty_files=N pending_ops=N`.
//! - `torn on` / `torn off`: answers `ok`.
//! - `unmount`: asks the binary to unmount and exit; answers `ok`.
//!
//! Anything else answers `error: ...`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::layer::Layer;

/// A running control server.
pub struct Server {
    stop: Arc<AtomicBool>,
    unmount: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// Answers one command line.
pub fn handle(layer: &Mutex<Layer>, line: &str, unmount: &AtomicBool) -> String {
    let mut l = crate::lock(layer);
    match line.trim() {
        "power-loss" => match l.power_loss() {
            Ok(()) => "ok".into(),
            Err(e) => format!("error: {e}"),
        },
        "stats" => {
            let s = l.stats();
            format!("pending_bytes={} dirty_files={} pending_ops={}", s.pending_bytes, s.dirty_files, s.pending_ops)
        }
        "torn on" => {
            l.set_torn(true);
            "ok".into()
        }
        "torn off" => {
            l.set_torn(false);
            "ok".into()
        }
        "unmount" => {
            unmount.store(true, Ordering::SeqCst);
            "ok".into()
        }
        other => format!("error: unknown command {other:?}"),
    }
}

impl Server {
    /// Listens on `path` (replacing a stale socket file).
    pub fn start(path: &Path, layer: Arc<Mutex<Layer>>) -> io::Result<Server> {
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
                    Ok((conn, _)) => serve(conn, &layer, &u),
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

fn serve(conn: UnixStream, layer: &Mutex<Layer>, unmount: &AtomicBool) {
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
        let answer = handle(layer, &line, unmount);
        if writeln!(out, "{answer}").is_err() {
            return;
        }
    }
}
