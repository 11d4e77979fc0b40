//! Data-directory identity: which node of which cluster a data directory belongs to.
//!
//! Raft trusts its own disk completely. A node started on another node's directory (two
//! directories swapped by a deploy script) would vote and acknowledge with someone else's
//! log, and a node started on another cluster's directory would carry foreign records into
//! this one. Both break every promise silently, so the node refuses to start instead.
//!
//! `<data-dir>/IDENTITY` (TOML, written durably on first start) holds:
//!
//! | key | meaning |
//! |---|---|
//! | `format` | version of this file's layout ([`IDENTITY_FORMAT`]) |
//! | `node-id` | the `--id` the directory was created for |
//! | `cluster-id` | the cluster it belongs to; empty while a joiner has not heard from its leader |
//! | `restored-from` | the snapshot id a `--restore-from` start installed, if any |
//!
//! Where the cluster id comes from:
//! - **Founders** derive it, without talking to each other, from what they already share:
//!   SHA-256 over `--initial-cluster-token` and the `--initial-cluster` list sorted by id
//!   ([`cluster_id_for`]). Every founder started with the same flags computes the same id.
//!   Two clusters built with the same member list (a rebuild on the same hosts) get the same
//!   id unless their tokens differ, which is what the token is for.
//! - **Joiners** (no `--initial-cluster`) start with an empty id and adopt the id carried by
//!   the first AppendEntries or InstallSnapshot that reaches them, writing it durably before
//!   that message is handled. Every peer request carries the sender's id in the
//!   [`CLUSTER_ID_HEADER`] metadata; a node with an id refuses requests from any other
//!   cluster. A request without the header (a node of an older release during a rolling
//!   upgrade) is let through.
//!
//! On every start the file is compared with the flags: another node id, or an
//! `--initial-cluster` that describes another cluster, refuses the start (exit code 2) with
//! the directory, what it belongs to, and the fix. A directory that predates this file is
//! adopted as it is (the identity is written from the flags).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Config;

/// File name of the identity inside the data directory.
pub const IDENTITY_FILE: &str = "IDENTITY";
/// Layout version of the identity file this build reads and writes.
pub const IDENTITY_FORMAT: u32 = 1;
/// gRPC metadata key carrying the sender's cluster id on every peer request.
pub const CLUSTER_ID_HEADER: &str = "idemraft-cluster-id";

/// What the identity file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Identity {
    /// Layout version.
    pub format: u32,
    /// The node id the directory belongs to.
    pub node_id: u64,
    /// The cluster it belongs to; empty until a joiner hears from its leader.
    #[serde(default)]
    pub cluster_id: String,
    /// The snapshot id installed by `--restore-from`, if the directory was restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
}

/// A refusal to start on this data directory.
#[derive(Debug, thiserror::Error)]
#[error("data directory {dir}: {problem}; {fix}")]
pub struct IdentityError {
    /// The directory.
    pub dir: PathBuf,
    /// What is wrong.
    pub problem: String,
    /// What to do.
    pub fix: String,
}

/// The cluster id founders derive from `--initial-cluster-token` and `--initial-cluster`:
/// 32 hex digits (128 bits of SHA-256), the same on every founder given the same flags.
pub fn cluster_id_for(members: &BTreeMap<u64, String>, token: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"idemraft-cluster-id v1\n");
    h.update(token.len().to_le_bytes());
    h.update(token.as_bytes());
    // BTreeMap iterates in id order: the list's order on the command line does not matter.
    for (id, addr) in members {
        h.update(format!("\n{id}={}", addr.trim()).as_bytes());
    }
    h.finalize().iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The first characters of a cluster id, enough to tell two clusters apart in a message.
pub fn short(cluster_id: &str) -> String {
    if cluster_id.is_empty() {
        "(none yet)".into()
    } else {
        format!("{}…", cluster_id.chars().take(12).collect::<String>())
    }
}

/// The cluster id this start's flags call for: founders derive it, joiners have none yet.
pub fn expected_cluster_id(config: &Config) -> Option<String> {
    (!config.initial_cluster.is_empty()).then(|| cluster_id_for(&config.initial_cluster, &config.initial_cluster_token))
}

fn path_of(dir: &Path) -> PathBuf {
    dir.join(IDENTITY_FILE)
}

fn refuse(dir: &Path, problem: String, fix: String) -> IdentityError {
    IdentityError { dir: dir.to_path_buf(), problem, fix }
}

/// Reads the identity file, `None` when there is none.
pub fn read(dir: &Path) -> Result<Option<Identity>, IdentityError> {
    let path = path_of(dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(refuse(
                dir,
                format!("cannot read {IDENTITY_FILE}: {e}"),
                "check the directory's permissions (--data-dir)".into(),
            ))
        }
    };
    let id: Identity = toml::from_str(&text).map_err(|e| {
        refuse(
            dir,
            format!("its {IDENTITY_FILE} file is damaged: {e}"),
            "restore the directory from a backup, or wipe it to rejoin as a new node with a new id".into(),
        )
    })?;
    if id.format != IDENTITY_FORMAT {
        return Err(refuse(
            dir,
            format!("its {IDENTITY_FILE} is format {}, and this build reads format {IDENTITY_FORMAT}", id.format),
            "run the Idemraft release that wrote it".into(),
        ));
    }
    Ok(Some(id))
}

/// Compares a stored identity with this start's flags.
pub fn check(dir: &Path, stored: &Identity, config: &Config) -> Result<(), IdentityError> {
    let owner = format!("node {} of cluster {}", stored.node_id, short(&stored.cluster_id));
    if stored.node_id != config.id {
        return Err(refuse(
            dir,
            format!("this data dir belongs to {owner}, but this node was started as node {} (--id)", config.id),
            format!(
                "point --data-dir at node {}'s own directory, or wipe it to rejoin as a new node with a new id",
                config.id
            ),
        ));
    }
    if let Some(expected) = expected_cluster_id(config) {
        if !stored.cluster_id.is_empty() && stored.cluster_id != expected {
            return Err(refuse(
                dir,
                format!(
                    "this data dir belongs to {owner}, but --initial-cluster and --initial-cluster-token describe cluster {}",
                    short(&expected)
                ),
                "point --data-dir at this node's own directory or wipe it to rejoin as a new node with a new id; \
                 if it is the right directory, start the node with the --initial-cluster and --initial-cluster-token \
                 it was founded with (they only matter on the first start)"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// The check that runs before anything else at start (the binary exits with code 2 on a
/// refusal): reads the identity file, if any, and compares it with the flags.
pub fn preflight(config: &Config) -> Result<Option<Identity>, IdentityError> {
    let stored = read(&config.data_dir)?;
    if let Some(s) = &stored {
        check(&config.data_dir, s, config)?;
    }
    Ok(stored)
}

/// Writes the identity durably: temp file, fsync, rename, fsync of the directory.
fn write(dir: &Path, id: &Identity) -> Result<(), String> {
    let text = toml::to_string(id).map_err(|e| format!("encoding {IDENTITY_FILE}: {e}"))?;
    let text = format!("# Which node of which cluster this data directory belongs to. Do not edit.\n{text}");
    let path = path_of(dir);
    let tmp = dir.join(format!("{IDENTITY_FILE}.tmp"));
    let io = |what: &str, e: std::io::Error| format!("{what} {}: {e}", path.display());
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
        f.write_all(text.as_bytes()).map_err(|e| io("writing", e))?;
        f.sync_all().map_err(|e| io("syncing", e))?;
    }
    std::fs::rename(&tmp, &path).map_err(|e| io("renaming", e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing the directory of", e))
}

/// The identity of a running node, shared by the peer service (which checks and adopts) and
/// the network (which stamps outgoing requests).
#[derive(Clone)]
pub struct IdentityHandle {
    dir: PathBuf,
    current: Arc<Mutex<Identity>>,
}

impl IdentityHandle {
    /// Establishes the identity after the store opened: checks the stored one again, or
    /// writes a new one from the flags (first start, or a directory older than the file).
    pub fn establish(config: &Config, restored_from: Option<String>) -> Result<IdentityHandle, IdentityError> {
        let dir = config.data_dir.clone();
        let stored = preflight(config)?;
        let mut id = match stored {
            Some(s) => s,
            None => {
                tracing::info!(dir = %dir.display(), "writing the data directory's identity");
                Identity { format: IDENTITY_FORMAT, node_id: config.id, cluster_id: String::new(), restored_from: None }
            }
        };
        let before = id.clone();
        if id.cluster_id.is_empty() {
            if let Some(expected) = expected_cluster_id(config) {
                id.cluster_id = expected;
            }
        }
        if restored_from.is_some() {
            id.restored_from = restored_from;
        }
        if id != before || read(&dir)?.is_none() {
            write(&dir, &id).map_err(|e| {
                refuse(&dir, format!("cannot write its identity: {e}"), "check free space and permissions".into())
            })?;
        }
        tracing::info!(node_id = id.node_id, cluster_id = %short(&id.cluster_id), "data directory identity");
        Ok(IdentityHandle { dir, current: Arc::new(Mutex::new(id)) })
    }

    /// The identity as it stands.
    pub fn get(&self) -> Identity {
        self.current.lock().map(|g| g.clone()).unwrap_or_else(|p| p.into_inner().clone())
    }

    /// This node's cluster id, if it has one yet.
    pub fn cluster_id(&self) -> Option<String> {
        let id = self.get().cluster_id;
        (!id.is_empty()).then_some(id)
    }

    /// Adds this node's cluster id to an outgoing peer request.
    pub fn stamp(&self, md: &mut tonic::metadata::MetadataMap) {
        if let Some(v) = self.cluster_id().and_then(|id| id.parse().ok()) {
            md.insert(CLUSTER_ID_HEADER, v);
        }
    }

    /// Admits an incoming peer request, or refuses one from another cluster. With `adopt`
    /// (AppendEntries and InstallSnapshot, which only a leader sends), a node that has no
    /// cluster id yet takes the sender's and makes it durable before the message is handled.
    pub fn admit(&self, md: &tonic::metadata::MetadataMap, what: &str, adopt: bool) -> Result<(), tonic::Status> {
        self.admit_id(md.get(CLUSTER_ID_HEADER).and_then(|v| v.to_str().ok()), what, adopt)
    }

    /// [`IdentityHandle::admit`] for a request that carried the sender's cluster id, if any,
    /// in `theirs` rather than in gRPC metadata (the peer link).
    pub fn admit_id(&self, theirs: Option<&str>, what: &str, adopt: bool) -> Result<(), tonic::Status> {
        let Some(theirs) = theirs else {
            return Ok(());
        };
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.cluster_id == theirs {
            return Ok(());
        }
        if !current.cluster_id.is_empty() {
            tracing::warn!(from_cluster = %short(theirs), "refused a peer request from another cluster");
            return Err(tonic::Status::failed_precondition(format!(
                "a {what} from cluster {} reached node {} of cluster {}: the sender belongs to another cluster; \
                 check --initial-cluster and the peer addresses in the membership",
                short(theirs),
                current.node_id,
                short(&current.cluster_id)
            )));
        }
        if !adopt {
            return Ok(());
        }
        let valid = theirs.len() == 32 && theirs.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid {
            return Err(tonic::Status::invalid_argument(format!("cluster id {theirs:?} is not 32 hex digits")));
        }
        let mut next = current.clone();
        next.cluster_id = theirs.to_string();
        write(&self.dir, &next).map_err(|e| {
            tracing::error!(error = %e, "cannot record the cluster id");
            tonic::Status::unavailable(format!("node {} cannot record its cluster id: {e}", current.node_id))
        })?;
        tracing::info!(cluster_id = %short(theirs), "joined a cluster: recorded its id in the data directory");
        *current = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(list: &[(u64, &str)]) -> BTreeMap<u64, String> {
        list.iter().map(|(i, a)| (*i, a.to_string())).collect()
    }

    #[test]
    fn founders_agree_whatever_the_order_and_tokens_separate_clusters() {
        let a = cluster_id_for(&members(&[(1, "h1:7201"), (2, "h2:7202"), (3, "h3:7203")]), "");
        let b = cluster_id_for(&members(&[(3, "h3:7203"), (1, "h1:7201"), (2, "h2:7202")]), "");
        assert_eq!(a, b);
        assert_eq!(a.len(), 32);
        assert_ne!(a, cluster_id_for(&members(&[(1, "h1:7201"), (2, "h2:7202"), (3, "h3:7203")]), "rebuild-2"));
        assert_ne!(a, cluster_id_for(&members(&[(1, "h1:7201"), (2, "h2:7202"), (4, "h3:7203")]), ""));
    }

    #[test]
    fn the_file_round_trips_and_refuses_what_it_does_not_know() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let id = Identity { format: 1, node_id: 3, cluster_id: "ab".repeat(16), restored_from: Some("x".into()) };
        write(dir.path(), &id).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(dir.path()).unwrap_or_else(|e| panic!("{e}")), Some(id));
        std::fs::write(dir.path().join(IDENTITY_FILE), "format = 1\nnode-id = 3\nextra = 1\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(read(dir.path()).is_err());
        std::fs::write(dir.path().join(IDENTITY_FILE), "format = 9\nnode-id = 3\n").unwrap_or_else(|e| panic!("{e}"));
        let e = read(dir.path()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("format 9"), "{e}");
    }
}
