//! The durability rules through a real FUSE mount, checked with std::fs.
//!
//! Without FUSE (no /dev/fuse, or mounting not permitted) each test prints why and passes,
//! unless IDEMRAFT_REQUIRE_FUSE=1, when it fails instead.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use lazyfs::{LazyFs, Options};

/// A mounted filesystem in a temp dir. Field order matters: the mount drops (unmounts)
/// before the temp dir is removed, also when a test panics.
struct Mounted {
    fs: LazyFs,
    _watchdog: Watchdog,
    mnt: PathBuf,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    fn crash(&self) {
        self.fs.power_loss().unwrap();
    }
}

/// Bounds a test: a filesystem call that never returns would otherwise hang the run. When
/// the limit passes, the mount is detached and the process exits, which closes the FUSE
/// device and fails every call still waiting on it.
struct Watchdog {
    done: Option<mpsc::Sender<()>>,
}

const TEST_LIMIT: Duration = Duration::from_secs(300);

impl Watchdog {
    fn start(mnt: PathBuf) -> Watchdog {
        let (tx, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(TEST_LIMIT) {
                eprintln!("test exceeded {TEST_LIMIT:?} on {mnt:?}; detaching and exiting");
                lazyfs::lazy_unmount(&mnt);
                std::process::exit(101);
            }
        });
        Watchdog { done: Some(tx) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
    }
}

fn mount() -> Option<Mounted> {
    let required = std::env::var("IDEMRAFT_REQUIRE_FUSE").as_deref() == Ok("1");
    let skip = |why: String| {
        assert!(!required, "FUSE required but unavailable: {why}");
        println!("skipped: FUSE unavailable ({why})");
        None
    };
    if !Path::new("/dev/fuse").exists() {
        return skip("no /dev/fuse".into());
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    let mnt = dir.path().join("mnt");
    let sock = dir.path().join("control.sock");
    fs::create_dir(&backing).unwrap();
    fs::create_dir(&mnt).unwrap();
    let opts = Options { backing, mount: mnt.clone(), staging: None, control: Some(sock.clone()) };
    match LazyFs::mount(&opts) {
        Ok(fs) => Some(Mounted { fs, _watchdog: Watchdog::start(mnt.clone()), mnt, sock, _dir: dir }),
        Err(e) => skip(format!("mount failed: {e}")),
    }
}

fn fsync_dir(path: &Path) {
    File::open(path).unwrap().sync_all().unwrap();
}

fn write_file(path: &Path, data: &[u8], sync: bool) {
    let mut f = File::create(path).unwrap();
    f.write_all(data).unwrap();
    if sync {
        f.sync_all().unwrap();
    }
}

#[test]
fn write_without_fsync_is_lost() {
    let Some(m) = mount() else { return };
    write_file(&m.p("a"), b"durable", true);
    fsync_dir(&m.mnt);
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(b"DUR", 0).unwrap();
    f.write_all_at(b"+tail", 7).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("a")).unwrap(), b"DURable+tail");
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"durable");
}

#[test]
fn write_with_fsync_is_kept() {
    let Some(m) = mount() else { return };
    write_file(&m.p("a"), b"one", true);
    fsync_dir(&m.mnt);
    let mut f = OpenOptions::new().append(true).open(m.p("a")).unwrap();
    f.write_all(b" two").unwrap();
    f.sync_data().unwrap();
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"one two");
}

#[test]
fn created_file_without_dir_fsync_disappears() {
    let Some(m) = mount() else { return };
    write_file(&m.p("new"), b"x", true);
    assert!(m.p("new").exists());
    m.crash();
    assert!(!m.p("new").exists());
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0);
}

#[test]
fn created_file_with_dir_fsync_is_kept() {
    let Some(m) = mount() else { return };
    write_file(&m.p("new"), b"x", true);
    fsync_dir(&m.mnt);
    m.crash();
    assert_eq!(fs::read(m.p("new")).unwrap(), b"x");
}

#[test]
fn rename_without_dir_fsync_is_undone() {
    let Some(m) = mount() else { return };
    write_file(&m.p("old"), b"content", true);
    fsync_dir(&m.mnt);
    fs::rename(m.p("old"), m.p("new")).unwrap();
    assert!(!m.p("old").exists());
    m.crash();
    assert_eq!(fs::read(m.p("old")).unwrap(), b"content");
    assert!(!m.p("new").exists());
    fs::rename(m.p("old"), m.p("new")).unwrap();
    fsync_dir(&m.mnt);
    m.crash();
    assert_eq!(fs::read(m.p("new")).unwrap(), b"content");
    assert!(!m.p("old").exists());
}

#[test]
fn unlink_without_dir_fsync_is_undone() {
    let Some(m) = mount() else { return };
    write_file(&m.p("f"), b"synced", true);
    fsync_dir(&m.mnt);
    fs::remove_file(m.p("f")).unwrap();
    assert!(!m.p("f").exists());
    m.crash();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"synced");
    fs::remove_file(m.p("f")).unwrap();
    fsync_dir(&m.mnt);
    m.crash();
    assert!(!m.p("f").exists());
}

#[test]
fn truncate_needs_fsync() {
    let Some(m) = mount() else { return };
    write_file(&m.p("t"), b"0123456789", true);
    fsync_dir(&m.mnt);
    OpenOptions::new().write(true).open(m.p("t")).unwrap().set_len(3).unwrap();
    assert_eq!(fs::metadata(m.p("t")).unwrap().len(), 3);
    m.crash();
    assert_eq!(fs::read(m.p("t")).unwrap(), b"0123456789");
    let f = OpenOptions::new().write(true).open(m.p("t")).unwrap();
    f.set_len(3).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("t")).unwrap(), b"012");
    // O_TRUNC on open is a truncate too.
    drop(File::create(m.p("t")).unwrap());
    assert_eq!(fs::metadata(m.p("t")).unwrap().len(), 0);
    m.crash();
    assert_eq!(fs::read(m.p("t")).unwrap(), b"012");
}

#[test]
fn large_file_keeps_exactly_the_synced_prefix() {
    let Some(m) = mount() else { return };
    const MIB: usize = 1 << 20;
    let chunk = |i: usize| vec![(i % 251) as u8 + 1; MIB];
    let mut f = File::create(m.p("big")).unwrap();
    fsync_dir(&m.mnt);
    for i in 0..100 {
        f.write_all(&chunk(i)).unwrap();
        // Sync after chunks 0..=9, 10..=19, ... but not after the last ones (95..=99).
        if i % 10 == 9 && i < 95 {
            f.sync_data().unwrap();
        }
    }
    drop(f);
    assert_eq!(fs::metadata(m.p("big")).unwrap().len(), (100 * MIB) as u64);
    m.crash();
    let got = fs::read(m.p("big")).unwrap();
    assert_eq!(got.len(), 90 * MIB);
    for (i, c) in got.chunks(MIB).enumerate() {
        assert!(c == chunk(i).as_slice(), "chunk {i} differs");
    }
}

#[test]
fn control_socket_answers() {
    let Some(m) = mount() else { return };
    write_file(&m.p("a"), b"abc", false);
    let conn = UnixStream::connect(&m.sock).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = conn.try_clone().unwrap();
    let mut lines = BufReader::new(conn).lines();
    let mut ask = |cmd: &str| {
        writeln!(out, "{cmd}").unwrap();
        lines.next().unwrap().unwrap()
    };
    assert_eq!(ask("stats"), "pending_bytes=3 dirty_files=1 pending_ops=1");
    assert_eq!(ask("torn on"), "ok");
    assert_eq!(ask("torn off"), "ok");
    assert_eq!(ask("power-loss"), "ok");
    assert_eq!(ask("stats"), "pending_bytes=0 dirty_files=0 pending_ops=0");
    assert!(ask("bogus").starts_with("error:"));
    assert!(!m.p("a").exists());
}

#[test]
fn mount_is_gone_after_a_panicking_test() {
    if mount().is_none() {
        return;
    }
    let mnt = std::panic::catch_unwind(|| {
        let m = mount().unwrap();
        let mnt = m.mnt.clone();
        std::panic::panic_any(mnt);
    })
    .unwrap_err();
    let mnt = mnt.downcast::<PathBuf>().unwrap();
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(mnt.to_str().unwrap()), "still mounted");
}
