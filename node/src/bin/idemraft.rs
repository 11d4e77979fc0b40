//! The `idemraft` node binary. `idemraft --help` lists every option.

use idemraft_node::config::{LogFormat, Options};
use tracing_subscriber::EnvFilter;

// A request allocates and frees many small buffers on several threads at once; glibc's
// malloc spent a fifth of a busy node's CPU on that (docs/benchmarks.md, "Profile").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let thp = transparent_huge_pages_off();
    let config = match Options::load().and_then(|o| o.resolve()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("idemraft: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // A data directory of another node or cluster, or a restore that cannot apply, is a
    // usage error: refused before anything is opened, with the fix.
    if let Err(e) = idemraft_node::cluster::restore::startup_check(&config) {
        eprintln!("idemraft: {e}");
        return std::process::ExitCode::from(2);
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn"));
    // Colour only on a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    if let Err(e) = thp {
        tracing::warn!(error = %e, "cannot turn transparent huge pages off for this process; its memory may grow to several times its heap");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idemraft: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let result = runtime.block_on(idemraft_node::server::run(config, idemraft_node::server::signal()));
    if let Err(e) = &result {
        eprintln!("idemraft: {e}");
        tracing::error!(error = %e, "node stopped with an error");
        // Leave without running destructors. After a disk error sled's own drop fsyncs the
        // failed file again and panics on the error (sled 0.34 unwraps that fsync), and
        // nothing is left to make durable: after a fatal error the state machine is not
        // trusted, and the next start rebuilds it from the newest snapshot and the log.
        std::process::exit(1);
    }
    // After a storage failure a thread can stay blocked in the store for good (sled 0.34 never
    // finishes a flush once a write to its log failed), and dropping the runtime would wait
    // for it: the process would hang instead of exiting for its supervisor to restart it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::ExitCode::SUCCESS
}

/// Turns transparent huge pages off for this process, first thing, before the runtime's
/// threads allocate. mimalloc frees and purges memory in 64 KiB steps, but a 2 MiB huge page
/// stays resident while any of it is live, and khugepaged fills sparse regions back into
/// whole huge pages: under a steady mixed-size load a node's RSS was several times its
/// live heap and kept climbing (docs/deployment.md, "Memory").
#[cfg(target_os = "linux")]
fn transparent_huge_pages_off() -> Result<(), String> {
    nix::sys::prctl::set_thp_disable(true).map_err(|e| e.to_string())
}

#[cfg(not(target_os = "linux"))]
fn transparent_huge_pages_off() -> Result<(), String> {
    Ok(())
}
