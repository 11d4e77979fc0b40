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
use std::time::{Duration, Instant};

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
    const NO_FAULTS: &str =
        "fail_fsync=0 fail_write=0 fsync_delay_ms=0 failed_fsyncs=0 failed_writes=0 delayed_fsyncs=0";
    assert_eq!(ask("stats"), format!("pending_bytes=3 dirty_files=1 pending_ops=1 {NO_FAULTS}"));
    assert_eq!(ask("torn on"), "ok");
    assert_eq!(ask("torn off"), "ok");
    assert_eq!(ask("power-loss"), "ok");
    assert_eq!(ask("stats"), format!("pending_bytes=0 dirty_files=0 pending_ops=0 {NO_FAULTS}"));
    assert!(ask("bogus").starts_with("error:"));
    assert!(!m.p("a").exists());

    assert_eq!(ask("fail fsync on"), "ok");
    assert_eq!(ask("fail write on"), "ok");
    assert_eq!(ask("delay fsync 250"), "ok");
    assert_eq!(
        ask("stats"),
        "pending_bytes=0 dirty_files=0 pending_ops=0 fail_fsync=1 fail_write=1 fsync_delay_ms=250 \
         failed_fsyncs=0 failed_writes=0 delayed_fsyncs=0"
    );
    let active = m.fs.active_faults();
    assert!(active.fail_fsync && active.fail_write);
    assert_eq!(active.fsync_delay, Duration::from_millis(250));
    assert_eq!(ask("fail write off"), "ok");
    assert_eq!(ask("delay fsync 0"), "ok");
    assert!(File::create(m.p("b")).unwrap().write_all(b"x").is_ok());
    assert!(File::open(&m.mnt).unwrap().sync_all().is_err());
    assert_eq!(ask("fail fsync off"), "ok");
    assert_eq!(
        ask("stats"),
        "pending_bytes=1 dirty_files=1 pending_ops=1 fail_fsync=0 fail_write=0 fsync_delay_ms=0 \
         failed_fsyncs=1 failed_writes=0 delayed_fsyncs=0"
    );
    assert_eq!(ask("fail fsync on"), "ok");
    assert_eq!(ask("delay fsync 10"), "ok");
    assert_eq!(ask("faults off"), "ok");
    assert_eq!(m.fs.active_faults(), lazyfs::ActiveFaults::default());
    assert!(ask("fail fsync maybe").starts_with("error:"));
    assert!(ask("delay fsync soon").starts_with("error:"));
    assert!(ask("delay fsync -1").starts_with("error:"));
    assert!(ask("fail read on").starts_with("error:"));
    assert!(ask("faults").starts_with("error:"));
}

fn assert_eio<T: std::fmt::Debug>(r: std::io::Result<T>) {
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
}

#[test]
fn failed_fsync_makes_nothing_durable() {
    let Some(m) = mount() else { return };
    write_file(&m.p("a"), b"old", true);
    fsync_dir(&m.mnt);
    m.fs.set_fail_fsync(true);
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(b"new", 0).unwrap();
    assert_eio(f.sync_all());
    assert_eio(f.sync_data());
    write_file(&m.p("b"), b"b", false);
    assert_eio(File::open(&m.mnt).unwrap().sync_all());
    assert_eq!(m.fs.fault_stats().failed_fsyncs, 3);
    // Nothing was lost either: the changes are still there, and still pending.
    assert_eq!(fs::read(m.p("a")).unwrap(), b"new");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"b");
    let s = m.fs.stats();
    assert_eq!((s.dirty_files, s.pending_ops), (2, 1));
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"old");
    assert!(!m.p("b").exists());

    // An O_SYNC write is a write and an fsync: it reaches the view but fails, and is not durable.
    {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new().write(true).custom_flags(libc::O_SYNC).open(m.p("a")).unwrap();
        assert_eio(f.write_at(b"syn", 0));
    }
    assert_eq!(fs::read(m.p("a")).unwrap(), b"syn");
    assert_eq!(m.fs.fault_stats().failed_fsyncs, 4);
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"old");

    // A failed fsync leaves its data pending, so one retried after the fault makes it durable.
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(b"re", 0).unwrap();
    assert_eio(f.sync_all());
    m.fs.set_fail_fsync(false);
    f.sync_all().unwrap();
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"red");

    // With the fault off, everything works as before it.
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(b"new", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    write_file(&m.p("b"), b"b", true);
    fsync_dir(&m.mnt);
    m.crash();
    assert_eq!(fs::read(m.p("a")).unwrap(), b"new");
    assert_eq!(fs::read(m.p("b")).unwrap(), b"b");
    assert_eq!(m.fs.fault_stats(), lazyfs::FaultStats { failed_fsyncs: 5, failed_writes: 0, delayed_fsyncs: 0 });
}

#[test]
fn failed_write_changes_nothing() {
    let Some(m) = mount() else { return };
    write_file(&m.p("w"), b"before", true);
    fsync_dir(&m.mnt);
    m.fs.set_fail_write(true);
    let mut f = OpenOptions::new().write(true).open(m.p("w")).unwrap();
    assert_eio(f.write_at(b"XX", 0));
    assert_eio(f.write_at(b"past the end", 6));
    assert_eq!(fs::read(m.p("w")).unwrap(), b"before");
    assert_eq!(fs::metadata(m.p("w")).unwrap().len(), 6);
    assert_eq!(m.fs.stats().dirty_files, 0);
    assert_eq!(m.fs.fault_stats().failed_writes, 2);
    // fsync still works: a disk that refuses writes need not refuse flushes.
    f.sync_all().unwrap();
    m.fs.clear_faults();
    f.write_all(b"after").unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("w")).unwrap(), b"aftere");
    assert_eq!(m.fs.fault_stats(), lazyfs::FaultStats { failed_fsyncs: 0, failed_writes: 2, delayed_fsyncs: 0 });
}

#[test]
fn slow_fsync_takes_at_least_the_delay() {
    let Some(m) = mount() else { return };
    const DELAY: Duration = Duration::from_millis(200);
    m.fs.set_fsync_delay(DELAY);
    let f = File::create(m.p("s")).unwrap();
    f.write_all_at(b"slow", 0).unwrap();
    let t = Instant::now();
    f.sync_all().unwrap();
    assert!(t.elapsed() >= DELAY, "file fsync took {:?}", t.elapsed());
    let t = Instant::now();
    f.sync_data().unwrap();
    assert!(t.elapsed() >= DELAY, "file fdatasync took {:?}", t.elapsed());
    let t = Instant::now();
    fsync_dir(&m.mnt);
    assert!(t.elapsed() >= DELAY, "directory fsync took {:?}", t.elapsed());
    assert_eq!(m.fs.fault_stats().delayed_fsyncs, 3);
    drop(f);
    m.crash();
    assert_eq!(fs::read(m.p("s")).unwrap(), b"slow");
    m.fs.set_fsync_delay(Duration::ZERO);
    File::open(m.p("s")).unwrap().sync_all().unwrap();
    assert_eq!(m.fs.fault_stats(), lazyfs::FaultStats { failed_fsyncs: 0, failed_writes: 0, delayed_fsyncs: 3 });
}

/// Starts `f` on a thread and hands back a receiver for its result.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// Waits until `n` fsyncs have started waiting out the delay.
fn wait_delayed(m: &Mounted, n: u64) {
    let start = Instant::now();
    while m.fs.fault_stats().delayed_fsyncs < n {
        assert!(start.elapsed() < Duration::from_secs(30), "fsync never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
}

const LONG: Duration = Duration::from_secs(3600);

/// Runs `f` on a thread and expects it to finish while a delayed fsync still waits. On a
/// timeout the delay is lifted first, so that a failing test does not hang.
fn meanwhile<T: Send + 'static>(m: &Mounted, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let got = spawn(f).recv_timeout(Duration::from_secs(30));
    if got.is_err() {
        m.fs.clear_faults();
    }
    got.unwrap_or_else(|_| panic!("{what} waited for a delayed fsync"))
}

#[test]
fn slow_file_fsync_holds_up_only_its_own_file() {
    let Some(m) = mount() else { return };
    write_file(&m.p("f"), b"aaaa", true);
    fsync_dir(&m.mnt);
    m.fs.set_fsync_delay(LONG);
    let path = m.p("f");
    let syncing = spawn(move || {
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"bbbb", 0).unwrap();
        f.sync_all().map_err(|e| e.raw_os_error())
    });
    wait_delayed(&m, 1);
    let (f, g) = (m.p("f"), m.p("g"));
    let read = meanwhile(&m, "other work", move || {
        write_file(&g, b"g", false);
        fs::read(f).unwrap()
    });
    assert_eq!(read, b"bbbb");
    assert!(syncing.try_recv().is_err(), "the fsync did not wait");
    // A write to the file itself waits until the fsync is answered (the kernel holds the
    // file's lock), so the fsync does not make it durable.
    let path = m.p("f");
    let writing = spawn(move || OpenOptions::new().write(true).open(path).unwrap().write_all_at(b"cccc", 4).unwrap());
    std::thread::sleep(Duration::from_millis(200));
    m.fs.clear_faults();
    assert_eq!(syncing.recv_timeout(Duration::from_secs(30)).unwrap(), Ok(()));
    writing.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"bbbbcccc");
    m.crash();
    assert_eq!(fs::read(m.p("f")).unwrap(), b"bbbb");
    assert!(!m.p("g").exists());
}

#[test]
fn slow_dir_fsync_keeps_only_what_came_before_it() {
    let Some(m) = mount() else { return };
    fs::create_dir(m.p("d")).unwrap();
    fsync_dir(&m.mnt);
    write_file(&m.p("x"), b"x", true);
    m.fs.set_fsync_delay(LONG);
    let root = m.mnt.clone();
    let syncing = spawn(move || File::open(root).unwrap().sync_all().map_err(|e| e.raw_os_error()));
    wait_delayed(&m, 1);
    let other = m.p("d/z");
    meanwhile(&m, "a create in another directory", move || write_file(&other, b"z", false));
    assert!(syncing.try_recv().is_err(), "the fsync did not wait");
    // A create in the directory being synced waits for the fsync (the kernel holds the
    // directory's lock), so the fsync does not make it durable.
    let path = m.p("y");
    let creating = spawn(move || write_file(&path, b"y", false));
    std::thread::sleep(Duration::from_millis(200));
    m.fs.clear_faults();
    assert_eq!(syncing.recv_timeout(Duration::from_secs(30)).unwrap(), Ok(()));
    creating.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(m.p("y").exists() && m.p("d/z").exists());
    m.crash();
    assert_eq!(fs::read(m.p("x")).unwrap(), b"x");
    assert!(!m.p("y").exists());
    assert!(!m.p("d/z").exists());
}

#[test]
fn power_loss_during_a_slow_fsync_fails_it() {
    let Some(m) = mount() else { return };
    write_file(&m.p("f"), b"old", true);
    fsync_dir(&m.mnt);
    m.fs.set_fsync_delay(LONG);
    let path = m.p("f");
    let syncing = spawn(move || {
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"new", 0).unwrap();
        f.sync_all().map_err(|e| e.raw_os_error())
    });
    wait_delayed(&m, 1);
    // The power loss does not wait for the fsync, and the fsync never reaches the disk.
    m.crash();
    m.fs.clear_faults();
    assert_eq!(syncing.recv_timeout(Duration::from_secs(30)).unwrap(), Err(Some(libc::EIO)));
    assert_eq!(fs::read(m.p("f")).unwrap(), b"old");
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
