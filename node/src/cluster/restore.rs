//! Restore at start: `--restore-from FILE` (a backup saved by `idemctl snapshot save`, whose
//! stream `crate::api::snapshot` serves).
//!
//! **Restore.** `--restore-from FILE` on an empty data directory installs the file as the
//! initial state before Raft starts (see `idemraft_store::backup` for why every founder
//! restoring the same file ends up identical). The identity file then records the restored
//! snapshot id, so restarting with the same flags does not restore again.

use std::path::Path;

use idemraft_store::backup;
use idemraft_store::{LogStore, StateMachineStore};
use openraft::BasicNode;

use crate::cluster::identity::{self, Identity};
use crate::config::Config;

/// A refusal to restore, phrased for the operator.
#[derive(Debug, thiserror::Error)]
#[error("--restore-from {file}: {problem}; {fix}")]
pub struct RestoreError {
    /// The file.
    pub file: String,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

fn refuse(file: &Path, problem: impl Into<String>, fix: impl Into<String>) -> RestoreError {
    RestoreError { file: file.display().to_string(), problem: problem.into(), fix: fix.into() }
}

/// What to do with `--restore-from` on this data directory.
#[derive(Debug, PartialEq, Eq)]
pub enum RestorePlan {
    /// No `--restore-from`.
    None,
    /// The directory already holds this restore: start from it.
    AlreadyDone(String),
    /// Install the file (its restored snapshot id).
    Install(String),
}

fn is_fresh(dir: &Path) -> Result<bool, std::io::Error> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    }
}

/// Decides, from files alone, whether `--restore-from` applies; refuses a directory that
/// holds other state or was restored from another file. Runs before anything is opened (the
/// binary exits with code 2 on a refusal) and again in `Node::start`.
pub fn preflight(config: &Config, stored: Option<&Identity>) -> Result<RestorePlan, RestoreError> {
    let Some(file) = &config.restore_from else { return Ok(RestorePlan::None) };
    let header = backup::read_header(file).map_err(|e| {
        refuse(file, format!("cannot be used: {e}"), "give the path of a file written by `idemctl snapshot save`")
    })?;
    let wanted = backup::restored_snapshot_id(&header.snapshot_id, header.last_log_id.map_or(0, |l| l.index));
    let dir = &config.data_dir;
    let fresh = is_fresh(dir)
        .map_err(|e| refuse(file, format!("cannot read data directory {}: {e}", dir.display()), "check --data-dir"))?;
    if fresh {
        return Ok(RestorePlan::Install(wanted));
    }
    match stored.and_then(|s| s.restored_from.clone()) {
        Some(done) if done == wanted => Ok(RestorePlan::AlreadyDone(done)),
        Some(done) => Err(refuse(
            file,
            format!("data directory {} was restored from another snapshot ({done})", dir.display()),
            "drop --restore-from to keep running from the state it holds, or wipe the directory to restore again",
        )),
        None => Err(refuse(
            file,
            format!("data directory {} is not empty: a restore only fills an empty directory", dir.display()),
            "give each node of the new cluster an empty --data-dir, or drop --restore-from to start from the state it holds",
        )),
    }
}

/// Carries out `--restore-from` on the freshly opened stores, before Raft starts. Returns the
/// restored snapshot id to record in the identity file.
pub async fn restore_at_start(
    config: &Config,
    stored: Option<&Identity>,
    log: &mut LogStore,
    sm: &mut StateMachineStore,
) -> Result<Option<String>, RestoreError> {
    let Some(file) = &config.restore_from else { return Ok(None) };
    // The directory is no longer empty (the store just opened it), so this decides by the
    // identity file; `backup::restore` itself refuses a store that holds any state.
    let header = backup::read_header(file).map_err(|e| {
        refuse(file, format!("cannot be used: {e}"), "give the path of a file written by `idemctl snapshot save`")
    })?;
    let wanted = backup::restored_snapshot_id(&header.snapshot_id, header.last_log_id.map_or(0, |l| l.index));
    match stored.and_then(|s| s.restored_from.clone()) {
        Some(done) if done == wanted => {
            tracing::info!(snapshot = %done, "this data directory was already restored from --restore-from; starting from it");
            return Ok(None);
        }
        Some(done) => {
            return Err(refuse(
                file,
                format!("data directory {} was restored from another snapshot ({done})", config.data_dir.display()),
                "drop --restore-from to keep running from the state it holds, or wipe the directory to restore again",
            ))
        }
        None => {}
    }
    let members: std::collections::BTreeMap<u64, BasicNode> =
        config.initial_cluster.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
    let started = std::time::Instant::now();
    let summary = backup::restore(log, sm, file, &members).await.map_err(|e| {
        refuse(file, e.to_string(), "check the file with `idemctl snapshot save` again, or use another backup")
    })?;
    tracing::info!(
        index = summary.last_index,
        records = summary.records,
        bytes = summary.size_bytes,
        ms = started.elapsed().as_millis() as u64,
        "restored the state from --restore-from; the new cluster's log continues after the snapshot's index"
    );
    Ok(Some(backup::restored_snapshot_id(&summary.snapshot_id, summary.last_index)))
}

/// The identity module's refusal or the restore's, for the binary's start-up check.
pub fn startup_check(config: &Config) -> Result<(), String> {
    let stored = identity::preflight(config).map_err(|e| e.to_string())?;
    preflight(config, stored.as_ref()).map(|_| ()).map_err(|e| e.to_string())
}
