//! Progress of a run for a person watching it: one status line on stderr, redrawn in place,
//! with the elapsed and the estimated total time, the ops recorded, the faults fired and the
//! phase. It draws only when stderr is a terminal, so pipes, logs and CI see exactly what
//! they saw before; switched off, every call is a no-op.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::history::Recorder;

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(250);
/// The widest line drawn: a line that wraps cannot be redrawn in place.
const MAX_WIDTH: usize = 79;

/// The status line's sink; cheap to pass by reference into the run.
pub struct Progress {
    shared: Option<Arc<Shared>>,
    ticker: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    start: Instant,
    stop: AtomicBool,
    state: Mutex<State>,
}

struct State {
    phase: String,
    expected_end: Instant,
    faults: usize,
    recorder: Option<Recorder>,
}

impl Progress {
    /// Draws nothing.
    pub fn off() -> Progress {
        Progress { shared: None, ticker: Mutex::new(None) }
    }

    /// Draws on stderr if it is a terminal; `expected` is the first estimate of the run's
    /// length.
    pub fn on_terminal(expected: Duration) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress::off();
        }
        let now = Instant::now();
        let shared = Arc::new(Shared {
            start: now,
            stop: AtomicBool::new(false),
            state: Mutex::new(State { phase: "start".into(), expected_end: now + expected, faults: 0, recorder: None }),
        });
        let ticking = shared.clone();
        // A thread, not a task: the line keeps moving while the checkers hold the main thread.
        let ticker = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                while !ticking.stop.load(Ordering::Relaxed) {
                    ticking.draw();
                    std::thread::sleep(TICK);
                }
            })
            .ok();
        // Without a thread there is nothing to draw with: the run goes on quietly.
        let shared = ticker.as_ref().map(|_| shared);
        Progress { shared, ticker: Mutex::new(ticker) }
    }

    /// Whether anything is drawn.
    pub fn is_on(&self) -> bool {
        self.shared.is_some()
    }

    /// Enters `phase`; `left` is the estimate of the whole run's remaining time from now.
    pub fn phase(&self, phase: &str, left: Duration) {
        self.with(|s| {
            s.phase = phase.to_string();
            s.expected_end = Instant::now() + left;
        });
    }

    /// Names what the current phase is doing without moving the estimate.
    pub fn detail(&self, phase: &str) {
        self.with(|s| s.phase = phase.to_string());
    }

    /// Counts a fault that fired.
    pub fn fault(&self) {
        self.with(|s| s.faults += 1);
    }

    /// Counts the ops of `recorder` from now on.
    pub fn watch(&self, recorder: &Recorder) {
        self.with(|s| s.recorder = Some(recorder.clone()));
    }

    /// Stops drawing and clears the line, so what is printed next starts on a clean line.
    pub fn finish(&self) {
        let Some(shared) = &self.shared else { return };
        shared.stop.store(true, Ordering::Relaxed);
        let handle = self.ticker.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            let _ = h.join();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }

    fn with(&self, f: impl FnOnce(&mut State)) {
        if let Some(shared) = &self.shared {
            if let Ok(mut s) = shared.state.lock() {
                f(&mut s);
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Shared {
    fn draw(&self) {
        let now = Instant::now();
        let Ok(s) = self.state.lock() else { return };
        let ops = s.recorder.as_ref().map_or(0, Recorder::len);
        let text = line(now - self.start, s.expected_end.saturating_duration_since(now), ops, s.faults, &s.phase);
        drop(s);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{text}\x1b[K");
        let _ = err.flush();
    }
}

/// The status line: `[ 12.0s / ~45s, ~33s left ] ops 1534  faults 3  phase: warm-up`, cut to
/// the width that never wraps on a standard terminal.
pub fn line(elapsed: Duration, left: Duration, ops: usize, faults: usize, phase: &str) -> String {
    let e = elapsed.as_secs_f64();
    let l = left.as_secs_f64().round();
    let mut s = format!(
        "[ {e:>5.1}s / ~{:.0}s, ~{l:.0}s left ] ops {ops}  faults {faults}  phase: {phase}",
        (e + l).round().max(e.round())
    );
    if s.chars().count() > MAX_WIDTH {
        s = s.chars().take(MAX_WIDTH - 3).collect::<String>() + "...";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_shows_elapsed_total_ops_faults_and_phase() {
        let l = line(Duration::from_millis(12_040), Duration::from_secs(33), 1534, 3, "warm-up");
        assert_eq!(l, "[  12.0s / ~45s, ~33s left ] ops 1534  faults 3  phase: warm-up");
        let long = line(Duration::ZERO, Duration::ZERO, 1, 0, &"x".repeat(200));
        assert_eq!(long.chars().count(), MAX_WIDTH);
    }

    #[test]
    fn off_is_silent_and_inert() {
        let p = Progress::off();
        p.phase("faults", Duration::from_secs(1));
        p.fault();
        p.watch(&Recorder::new());
        assert!(!p.is_on());
        p.finish();
    }
}
