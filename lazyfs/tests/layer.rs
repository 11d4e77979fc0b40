//! The durability rules on the layer alone, without FUSE.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};

use lazyfs::layer::{Layer, ROOT};
use lazyfs::overlay::Overlay;

struct Fixture {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    layer: Layer,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing");
    fs::create_dir(&backing).unwrap();
    let layer = Layer::open(&backing, &dir.path().join("staging")).unwrap();
    Fixture { _dir: dir, backing, layer }
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

impl Fixture {
    fn read_all(&self, path: &str) -> Option<Vec<u8>> {
        let ino = self.layer.resolve(Path::new(path)).ok()?;
        let size = self.layer.getattr(ino).ok()?.size;
        self.layer.read(ino, 0, size as u32).ok()
    }

    fn new_file(&mut self, name: &str, data: &[u8]) -> u64 {
        let a = self.layer.create(ROOT, n(name), 0o644, 0, 0).unwrap();
        self.layer.write(a.ino, 0, data).unwrap();
        a.ino
    }

    fn durable_file(&mut self, name: &str, data: &[u8]) -> u64 {
        let ino = self.new_file(name, data);
        self.layer.fsync(ino).unwrap();
        self.layer.fsync_dir(ROOT).unwrap();
        ino
    }

    fn crash(&mut self) {
        self.layer.power_loss().unwrap();
    }
}

#[test]
fn unsynced_write_is_lost() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"hello");
    f.layer.write(ino, 5, b" world").unwrap();
    assert_eq!(f.read_all("a").unwrap(), b"hello world");
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"hello");
}

#[test]
fn synced_write_is_kept() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"hello");
    f.layer.write(ino, 0, b"HE").unwrap();
    f.layer.fsync(ino).unwrap();
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"HEllo");
    assert_eq!(fs::read(f.backing.join("a")).unwrap(), b"HEllo");
}

#[test]
fn overwrite_in_the_middle_is_lost_but_reads_see_it() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"0123456789");
    f.layer.write(ino, 3, b"xyz").unwrap();
    f.layer.write(ino, 12, b"!").unwrap();
    assert_eq!(f.read_all("a").unwrap(), b"012xyz6789\0\0!");
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"0123456789");
}

#[test]
fn created_file_needs_a_directory_fsync() {
    let mut f = fixture();
    let ino = f.new_file("a", b"data");
    f.layer.fsync(ino).unwrap();
    f.crash();
    assert!(f.read_all("a").is_none());

    let ino = f.new_file("a", b"data");
    f.layer.fsync(ino).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"data");
}

#[test]
fn directory_fsync_without_file_fsync_keeps_an_empty_file() {
    let mut f = fixture();
    f.new_file("a", b"data");
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"");
}

#[test]
fn unsynced_rename_is_undone() {
    let mut f = fixture();
    f.durable_file("a", b"A");
    f.layer.rename(ROOT, n("a"), ROOT, n("b"), false).unwrap();
    assert!(f.read_all("a").is_none());
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"A");
    assert!(f.read_all("b").is_none());

    f.layer.rename(ROOT, n("a"), ROOT, n("b"), false).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert!(f.read_all("a").is_none());
    assert_eq!(f.read_all("b").unwrap(), b"A");
}

#[test]
fn rename_over_existing_file_is_undone() {
    let mut f = fixture();
    f.durable_file("new", b"NEW");
    f.durable_file("cur", b"CUR");
    f.layer.rename(ROOT, n("new"), ROOT, n("cur"), false).unwrap();
    assert_eq!(f.read_all("cur").unwrap(), b"NEW");
    f.crash();
    assert_eq!(f.read_all("cur").unwrap(), b"CUR");
    assert_eq!(f.read_all("new").unwrap(), b"NEW");
}

#[test]
fn write_then_rename_pattern_needs_both_fsyncs() {
    // The classic atomic-replace: write tmp, fsync tmp, rename over target, fsync dir.
    let mut f = fixture();
    f.durable_file("cfg", b"old");
    let tmp = f.new_file("cfg.tmp", b"new");
    f.layer.fsync(tmp).unwrap();
    f.layer.rename(ROOT, n("cfg.tmp"), ROOT, n("cfg"), false).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert_eq!(f.read_all("cfg").unwrap(), b"new");
    assert!(f.read_all("cfg.tmp").is_none());
}

#[test]
fn unsynced_unlink_is_undone() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"synced");
    f.layer.write(ino, 0, b"UNSYNC").unwrap();
    f.layer.unlink(ROOT, n("a")).unwrap();
    assert!(f.read_all("a").is_none());
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"synced");

    f.layer.unlink(ROOT, n("a")).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert!(f.read_all("a").is_none());
    assert!(!f.backing.join("a").exists());
}

#[test]
fn unlinked_open_file_stays_readable_after_dir_fsync() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"content");
    f.layer.open_handle(ino).unwrap();
    f.layer.unlink(ROOT, n("a")).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    assert_eq!(f.layer.read(ino, 0, 100).unwrap(), b"content");
    f.layer.write(ino, 0, b"C").unwrap();
    f.layer.fsync(ino).unwrap();
    assert_eq!(f.layer.read(ino, 0, 100).unwrap(), b"Content");
}

#[test]
fn truncate_is_not_durable_until_fsync() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"0123456789");
    f.layer.set_size(ino, 4).unwrap();
    assert_eq!(f.read_all("a").unwrap(), b"0123");
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"0123456789");

    let ino = f.layer.resolve(Path::new("a")).unwrap();
    f.layer.set_size(ino, 4).unwrap();
    f.layer.fsync(ino).unwrap();
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"0123");
}

#[test]
fn truncate_then_extend_reads_zeroes_not_old_data() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"0123456789");
    f.layer.set_size(ino, 2).unwrap();
    f.layer.set_size(ino, 6).unwrap();
    assert_eq!(f.read_all("a").unwrap(), b"01\0\0\0\0");
    f.layer.fsync(ino).unwrap();
    f.crash();
    assert_eq!(f.read_all("a").unwrap(), b"01\0\0\0\0");
}

#[test]
fn mkdir_and_files_inside_need_parent_fsyncs() {
    let mut f = fixture();
    let d = f.layer.mkdir(ROOT, n("d"), 0o755, 0, 0).unwrap().ino;
    let a = f.layer.create(d, n("x"), 0o644, 0, 0).unwrap().ino;
    f.layer.write(a, 0, b"x").unwrap();
    f.layer.fsync(a).unwrap();
    // Syncing d makes its entry durable; the log is ordered, so the mkdir before it too.
    f.layer.fsync_dir(d).unwrap();
    f.crash();
    assert_eq!(f.read_all("d/x").unwrap(), b"x");
}

#[test]
fn unrelated_directory_fsync_keeps_later_changes_pending() {
    let mut f = fixture();
    let d = f.layer.mkdir(ROOT, n("d"), 0o755, 0, 0).unwrap().ino;
    f.layer.fsync_dir(ROOT).unwrap();
    f.layer.create(ROOT, n("late"), 0o644, 0, 0).unwrap();
    f.layer.fsync_dir(d).unwrap();
    f.crash();
    assert!(f.read_all("late").is_none());
    assert!(f.layer.resolve(Path::new("d")).is_ok());
}

#[test]
fn hard_link_needs_dir_fsync() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"A");
    f.layer.link(ino, ROOT, n("b")).unwrap();
    assert_eq!(f.read_all("b").unwrap(), b"A");
    f.crash();
    assert!(f.read_all("b").is_none());
    let ino = f.layer.resolve(Path::new("a")).unwrap();
    f.layer.link(ino, ROOT, n("b")).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    f.crash();
    assert_eq!(f.read_all("b").unwrap(), b"A");
    let b = f.layer.resolve(Path::new("b")).unwrap();
    assert_eq!(f.layer.getattr(b).unwrap().nlink, 2);
}

#[test]
fn stats_count_pending_state() {
    let mut f = fixture();
    let ino = f.new_file("a", b"12345");
    let s = f.layer.stats();
    assert_eq!((s.pending_bytes, s.dirty_files, s.pending_ops), (5, 1, 1));
    f.layer.fsync(ino).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    assert_eq!(f.layer.stats(), lazyfs::Stats::default());
}

#[test]
fn old_inode_numbers_are_stale_after_power_loss() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"A");
    f.crash();
    assert!(f.layer.getattr(ino).is_err());
    assert!(f.layer.resolve(Path::new("a")).unwrap() != ino);
}

#[test]
fn torn_write_keeps_a_prefix_of_whole_pages() {
    let mut f = fixture();
    let ino = f.durable_file("a", b"");
    f.layer.write(ino, 0, &vec![1u8; 4096 * 4]).unwrap();
    f.layer.set_torn(true);
    f.crash();
    let got = f.read_all("a").unwrap();
    assert_eq!(got.len(), 4096 * 2);
    assert!(got.iter().all(|b| *b == 1));
}

#[test]
fn overlay_merges_writes_into_ranges() {
    let mut o = Overlay::new(0);
    for i in 0..100u64 {
        o.write(i * 10, &[i as u8; 10]);
    }
    assert_eq!(o.size(), 1000);
    assert_eq!(o.pending_bytes(), 1000);
    o.write(5, &[0xff; 20]);
    o.write(2000, b"z");
    assert_eq!(o.pending_bytes(), 1001);
    o.set_size(7);
    assert_eq!(o.pending_bytes(), 7);
    assert_eq!(o.size(), 7);
}

#[test]
fn overlay_random_writes_match_a_flat_model() {
    // A small deterministic generator keeps this free of extra dependencies.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let base: Vec<u8> = (0..500).map(|i| i as u8).collect();
    let mut model = base.clone();
    let mut o = Overlay::new(base.len() as u64);
    for _ in 0..2000 {
        let r = next();
        if r % 7 == 0 {
            let size = (next() % 800) as usize;
            model.resize(size, 0);
            o.set_size(size as u64);
        } else {
            let off = (next() % 800) as usize;
            let len = 1 + (next() % 60) as usize;
            let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if model.len() < off + len {
                model.resize(off + len, 0);
            }
            model[off..off + len].copy_from_slice(&data);
            o.write(off as u64, &data);
        }
        let mut view = Vec::new();
        for p in o.pieces(0, o.size()) {
            match p {
                lazyfs::overlay::Piece::Durable { offset, len } => {
                    view.extend_from_slice(&base[offset as usize..(offset + len) as usize])
                }
                lazyfs::overlay::Piece::Pending(b) => view.extend_from_slice(b),
                lazyfs::overlay::Piece::Zeroes(z) => view.resize(view.len() + z as usize, 0),
            }
        }
        assert_eq!(view, model);
    }
}

#[test]
fn directory_rename_moves_durable_homes_of_files_inside() {
    let mut f = fixture();
    let d = f.layer.mkdir(ROOT, n("d"), 0o755, 0, 0).unwrap().ino;
    let x = f.layer.create(d, n("x"), 0o644, 0, 0).unwrap().ino;
    f.layer.write(x, 0, b"x1").unwrap();
    f.layer.fsync(x).unwrap();
    f.layer.fsync_dir(d).unwrap();
    f.layer.rename(ROOT, n("d"), ROOT, n("e"), false).unwrap();
    f.layer.fsync_dir(ROOT).unwrap();
    // The file's durable content now lives under the new name; a sync must reach it there.
    let x = f.layer.resolve(Path::new("e/x")).unwrap();
    f.layer.write(x, 0, b"x2").unwrap();
    f.layer.fsync(x).unwrap();
    f.crash();
    assert_eq!(f.read_all("e/x").unwrap(), b"x2");
    assert!(f.read_all("d/x").is_none());
}

#[test]
fn cross_directory_rename_is_durable_after_either_directory_fsync() {
    let mut f = fixture();
    let a = f.layer.mkdir(ROOT, n("a"), 0o755, 0, 0).unwrap().ino;
    let b = f.layer.mkdir(ROOT, n("b"), 0o755, 0, 0).unwrap().ino;
    let x = f.layer.create(a, n("x"), 0o644, 0, 0).unwrap().ino;
    f.layer.fsync(x).unwrap();
    f.layer.fsync_dir(a).unwrap();
    f.layer.rename(a, n("x"), b, n("y"), false).unwrap();
    f.crash();
    assert!(f.read_all("a/x").is_some());
    let (a, b) = (f.layer.resolve(Path::new("a")).unwrap(), f.layer.resolve(Path::new("b")).unwrap());
    f.layer.rename(a, n("x"), b, n("y"), false).unwrap();
    f.layer.fsync_dir(b).unwrap();
    f.crash();
    assert!(f.read_all("a/x").is_none());
    assert!(f.read_all("b/y").is_some());
}

#[test]
fn rename_noreplace_and_directory_rules() {
    let mut f = fixture();
    f.durable_file("a", b"A");
    f.durable_file("b", b"B");
    assert_eq!(f.layer.rename(ROOT, n("a"), ROOT, n("b"), true), Err(libc::EEXIST));
    let d = f.layer.mkdir(ROOT, n("d"), 0o755, 0, 0).unwrap().ino;
    f.layer.mkdir(d, n("sub"), 0o755, 0, 0).unwrap();
    assert_eq!(f.layer.rename(ROOT, n("d"), d, n("inside"), false), Err(libc::EINVAL));
    assert_eq!(f.layer.rmdir(ROOT, n("d")), Err(libc::ENOTEMPTY));
    assert_eq!(f.layer.unlink(ROOT, n("d")), Err(libc::EISDIR));
}
