//! The lazy layer: the current view of the filesystem (what a program sees through the page
//! cache) on top of the durable state in the backing directory, and the rules that move state
//! from one to the other. Nothing here knows about FUSE, so the rules can be tested alone.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::overlay::{Overlay, Piece};

/// Inode number of the current view. Numbers are never reused, also not across a power loss,
/// so a handle from before a power loss can never reach a file from after it.
pub type Ino = u64;
/// The mount's root directory.
pub const ROOT: Ino = 1;
/// Page size that torn writes are cut at.
pub const PAGE: u64 = 4096;

/// Errors are plain errno values, as the kernel wants them.
pub type Errno = i32;
/// Result of a layer operation.
pub type Res<T> = Result<T, Errno>;

fn errno(e: io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// Kind of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
}

/// Attributes of a node in the current view.
#[derive(Debug, Clone)]
pub struct Attr {
    /// Inode number.
    pub ino: Ino,
    /// Kind.
    pub kind: Kind,
    /// Size in bytes as the page cache sees it.
    pub size: u64,
    /// Permission bits.
    pub perm: u16,
    /// Number of names in the current view.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Last access.
    pub atime: SystemTime,
    /// Last modification.
    pub mtime: SystemTime,
    /// Last status change.
    pub ctime: SystemTime,
}

/// Counters for the control interface.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes written but not fsynced.
    pub pending_bytes: u64,
    /// Files whose content or size differ from their durable state.
    pub dirty_files: u64,
    /// Directory-entry operations not yet made durable by a directory fsync.
    pub pending_ops: u64,
}

#[derive(Debug)]
enum Body {
    /// `home` is the backing file holding the durable content: a name in the backing
    /// directory, or a file in the staging directory while the file has no durable name.
    File {
        home: PathBuf,
        overlay: Overlay,
    },
    Dir {
        entries: BTreeMap<OsString, Ino>,
        parent: Ino,
    },
    Symlink {
        target: PathBuf,
    },
}

#[derive(Debug)]
struct Node {
    body: Body,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    nlink: u32,
    opens: u32,
}

/// A directory-entry change, with paths relative to the backing root as they were when the
/// change was made. Replaying the log in order against the backing directory is exact because
/// the backing directory always equals the current view as of some prefix of the log.
#[derive(Debug)]
enum NsOp {
    CreateFile { path: PathBuf, ino: Ino },
    Mkdir { path: PathBuf, perm: u16 },
    Symlink { path: PathBuf, target: PathBuf },
    Link { ino: Ino, path: PathBuf },
    Unlink { path: PathBuf },
    Rmdir { path: PathBuf },
    Rename { from: PathBuf, to: PathBuf },
}

#[derive(Debug)]
struct Pending {
    op: NsOp,
    /// Directories whose fsync makes this change durable.
    dirs: Vec<Ino>,
}

/// The current view plus everything needed to forget the part that is not durable.
#[derive(Debug)]
pub struct Layer {
    backing: PathBuf,
    staging: PathBuf,
    nodes: HashMap<Ino, Node>,
    log: Vec<Pending>,
    next_ino: Ino,
    next_staging: u64,
    torn: bool,
    power_losses: u64,
}

fn now() -> SystemTime {
    SystemTime::now()
}

impl Layer {
    /// Opens a layer over `backing`, whose content is taken as durable. `staging` holds files
    /// that have content but no durable name yet; it must be on the same filesystem as
    /// `backing` (files move between them by rename and hard link) and is emptied here.
    pub fn open(backing: &Path, staging: &Path) -> io::Result<Layer> {
        let backing = fs::canonicalize(backing)?;
        if staging.exists() {
            fs::remove_dir_all(staging)?;
        }
        fs::create_dir_all(staging)?;
        let staging = fs::canonicalize(staging)?;
        let mut layer = Layer {
            backing,
            staging,
            nodes: HashMap::new(),
            log: Vec::new(),
            next_ino: ROOT + 1,
            next_staging: 0,
            torn: false,
            power_losses: 0,
        };
        layer.load()?;
        Ok(layer)
    }

    /// The default staging directory: a hidden sibling of the backing directory.
    pub fn default_staging(backing: &Path) -> PathBuf {
        let name = backing.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "backing".into());
        backing.parent().unwrap_or_else(|| Path::new(".")).join(format!(".{name}.lazyfs-staging"))
    }

    /// The staging directory in use.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Turns torn-write simulation on or off.
    pub fn set_torn(&mut self, on: bool) {
        self.torn = on;
    }

    /// How many power losses this layer went through; used as the inode generation.
    pub fn generation(&self) -> u64 {
        self.power_losses
    }

    fn load(&mut self) -> io::Result<()> {
        self.nodes.clear();
        let meta = fs::metadata(&self.backing)?;
        self.nodes.insert(ROOT, node_from_meta(&meta, dir_body(ROOT)));
        let mut seen: HashMap<(u64, u64), Ino> = HashMap::new();
        let mut todo = vec![(ROOT, self.backing.clone())];
        while let Some((dir_ino, dir_path)) = todo.pop() {
            for entry in fs::read_dir(&dir_path)? {
                let entry = entry?;
                let path = entry.path();
                if path == self.staging {
                    continue;
                }
                let meta = fs::symlink_metadata(&path)?;
                let ft = meta.file_type();
                let ino = if ft.is_file() {
                    if let Some(&ino) = seen.get(&(meta.dev(), meta.ino())) {
                        if let Some(n) = self.nodes.get_mut(&ino) {
                            n.nlink += 1;
                        }
                        ino
                    } else {
                        let ino = self.alloc_ino();
                        let body = Body::File { home: path.clone(), overlay: Overlay::new(meta.len()) };
                        self.nodes.insert(ino, node_from_meta(&meta, body));
                        seen.insert((meta.dev(), meta.ino()), ino);
                        ino
                    }
                } else if ft.is_dir() {
                    let ino = self.alloc_ino();
                    self.nodes.insert(ino, node_from_meta(&meta, dir_body(dir_ino)));
                    todo.push((ino, path.clone()));
                    ino
                } else if ft.is_symlink() {
                    let ino = self.alloc_ino();
                    let body = Body::Symlink { target: fs::read_link(&path)? };
                    self.nodes.insert(ino, node_from_meta(&meta, body));
                    ino
                } else {
                    // Devices, fifos and sockets are not part of what this models.
                    continue;
                };
                if let Some(Node { body: Body::Dir { entries, .. }, .. }) = self.nodes.get_mut(&dir_ino) {
                    entries.insert(entry.file_name(), ino);
                }
            }
        }
        Ok(())
    }

    fn alloc_ino(&mut self) -> Ino {
        let ino = self.next_ino;
        self.next_ino += 1;
        ino
    }

    fn node(&self, ino: Ino) -> Res<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn node_mut(&mut self, ino: Ino) -> Res<&mut Node> {
        self.nodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn entries(&self, dir: Ino) -> Res<&BTreeMap<OsString, Ino>> {
        match &self.node(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: Ino) -> Res<&mut BTreeMap<OsString, Ino>> {
        match &mut self.node_mut(dir)?.body {
            Body::Dir { entries, .. } => Ok(entries),
            _ => Err(libc::ENOTDIR),
        }
    }

    /// Path of a directory relative to the backing root, in the current view.
    fn dir_path(&self, dir: Ino) -> Res<PathBuf> {
        let mut names = Vec::new();
        let mut cur = dir;
        while cur != ROOT {
            let parent = match &self.node(cur)?.body {
                Body::Dir { parent, .. } => *parent,
                _ => return Err(libc::ENOTDIR),
            };
            let name =
                self.entries(parent)?.iter().find(|(_, i)| **i == cur).map(|(n, _)| n.clone()).ok_or(libc::ENOENT)?;
            names.push(name);
            cur = parent;
        }
        Ok(names.iter().rev().collect())
    }

    fn child_path(&self, dir: Ino, name: &OsStr) -> Res<PathBuf> {
        Ok(self.dir_path(dir)?.join(name))
    }

    /// Attributes of a node.
    pub fn getattr(&self, ino: Ino) -> Res<Attr> {
        let n = self.node(ino)?;
        let (kind, size, nlink) = match &n.body {
            Body::File { overlay, .. } => (Kind::File, overlay.size(), n.nlink),
            Body::Dir { .. } => (Kind::Dir, 4096, 2),
            Body::Symlink { target } => (Kind::Symlink, target.as_os_str().len() as u64, n.nlink),
        };
        Ok(Attr {
            ino,
            kind,
            size,
            perm: n.perm,
            nlink,
            uid: n.uid,
            gid: n.gid,
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
        })
    }

    /// Looks a name up in a directory.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Res<Attr> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        self.getattr(ino)
    }

    /// Entries of a directory, `.` and `..` first.
    pub fn readdir(&self, dir: Ino) -> Res<Vec<(Ino, Kind, OsString)>> {
        let parent = match &self.node(dir)?.body {
            Body::Dir { parent, .. } => *parent,
            _ => return Err(libc::ENOTDIR),
        };
        let mut out = vec![(dir, Kind::Dir, OsString::from(".")), (parent, Kind::Dir, OsString::from(".."))];
        for (name, ino) in self.entries(dir)? {
            out.push((*ino, self.getattr(*ino)?.kind, name.clone()));
        }
        Ok(out)
    }

    fn check_new_name(&self, parent: Ino, name: &OsStr) -> Res<()> {
        if name.is_empty() || name == "." || name == ".." || name.len() > 255 {
            return Err(libc::EINVAL);
        }
        if self.entries(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    fn add_entry(&mut self, parent: Ino, name: &OsStr, ino: Ino, node: Node, op: NsOp) -> Res<Attr> {
        self.nodes.insert(ino, node);
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.touch_dir(parent);
        self.log.push(Pending { op, dirs: vec![parent] });
        self.getattr(ino)
    }

    fn touch_dir(&mut self, dir: Ino) {
        if let Some(n) = self.nodes.get_mut(&dir) {
            n.mtime = now();
            n.ctime = n.mtime;
        }
    }

    /// Creates an empty regular file.
    pub fn create(&mut self, parent: Ino, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Res<Attr> {
        self.check_new_name(parent, name)?;
        let path = self.child_path(parent, name)?;
        let home = self.staging.join(self.next_staging.to_string());
        self.next_staging += 1;
        OpenOptions::new().write(true).create_new(true).mode(mode & 0o7777).open(&home).map_err(errno)?;
        let ino = self.alloc_ino();
        let node = new_node(Body::File { home, overlay: Overlay::new(0) }, mode, uid, gid);
        self.add_entry(parent, name, ino, node, NsOp::CreateFile { path, ino })
    }

    /// Creates a directory.
    pub fn mkdir(&mut self, parent: Ino, name: &OsStr, mode: u32, uid: u32, gid: u32) -> Res<Attr> {
        self.check_new_name(parent, name)?;
        let path = self.child_path(parent, name)?;
        let ino = self.alloc_ino();
        let node = new_node(dir_body(parent), mode, uid, gid);
        let perm = node.perm;
        self.add_entry(parent, name, ino, node, NsOp::Mkdir { path, perm })
    }

    /// Creates a symbolic link.
    pub fn symlink(&mut self, parent: Ino, name: &OsStr, target: &Path, uid: u32, gid: u32) -> Res<Attr> {
        self.check_new_name(parent, name)?;
        let path = self.child_path(parent, name)?;
        let ino = self.alloc_ino();
        let node = new_node(Body::Symlink { target: target.to_owned() }, 0o777, uid, gid);
        let target = target.to_owned();
        self.add_entry(parent, name, ino, node, NsOp::Symlink { path, target })
    }

    /// Target of a symbolic link.
    pub fn readlink(&self, ino: Ino) -> Res<PathBuf> {
        match &self.node(ino)?.body {
            Body::Symlink { target } => Ok(target.clone()),
            _ => Err(libc::EINVAL),
        }
    }

    /// Adds a hard link to a regular file.
    pub fn link(&mut self, ino: Ino, parent: Ino, name: &OsStr) -> Res<Attr> {
        if !matches!(self.node(ino)?.body, Body::File { .. }) {
            return Err(libc::EPERM);
        }
        self.check_new_name(parent, name)?;
        let path = self.child_path(parent, name)?;
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        let n = self.node_mut(ino)?;
        n.nlink += 1;
        n.ctime = now();
        self.touch_dir(parent);
        self.log.push(Pending { op: NsOp::Link { ino, path }, dirs: vec![parent] });
        self.getattr(ino)
    }

    /// Removes a name of a non-directory.
    pub fn unlink(&mut self, parent: Ino, name: &OsStr) -> Res<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if matches!(self.node(ino)?.body, Body::Dir { .. }) {
            return Err(libc::EISDIR);
        }
        let path = self.child_path(parent, name)?;
        self.entries_mut(parent)?.remove(name);
        self.drop_link(ino);
        self.touch_dir(parent);
        self.log.push(Pending { op: NsOp::Unlink { path }, dirs: vec![parent] });
        Ok(())
    }

    fn drop_link(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.nlink = n.nlink.saturating_sub(1);
            n.ctime = now();
        }
        self.forget_data_if_unreachable(ino);
    }

    /// Once a file has no name and no open handle, nobody can observe its pending data, and
    /// it can no longer become durable, so the memory is given back. The node itself stays:
    /// pending log entries may still refer to it.
    fn forget_data_if_unreachable(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            if n.nlink == 0 && n.opens == 0 {
                if let Body::File { overlay, .. } = &mut n.body {
                    *overlay = Overlay::new(overlay.durable_size());
                }
            }
        }
    }

    /// Removes an empty directory.
    pub fn rmdir(&mut self, parent: Ino, name: &OsStr) -> Res<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        if !self.entries(ino)?.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        let path = self.child_path(parent, name)?;
        self.entries_mut(parent)?.remove(name);
        self.nodes.remove(&ino);
        self.touch_dir(parent);
        self.log.push(Pending { op: NsOp::Rmdir { path }, dirs: vec![parent] });
        Ok(())
    }

    /// Renames, replacing the target unless `noreplace`.
    pub fn rename(&mut self, parent: Ino, name: &OsStr, new_parent: Ino, new_name: &OsStr, noreplace: bool) -> Res<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        self.entries(new_parent)?;
        if new_name.is_empty() || new_name == "." || new_name == ".." || new_name.len() > 255 {
            return Err(libc::EINVAL);
        }
        let src_is_dir = matches!(self.node(ino)?.body, Body::Dir { .. });
        if src_is_dir {
            // A directory cannot move below itself.
            let mut cur = new_parent;
            loop {
                if cur == ino {
                    return Err(libc::EINVAL);
                }
                if cur == ROOT {
                    break;
                }
                cur = match &self.node(cur)?.body {
                    Body::Dir { parent, .. } => *parent,
                    _ => break,
                };
            }
        }
        let existing = self.entries(new_parent)?.get(new_name).copied();
        if let Some(old) = existing {
            if noreplace {
                return Err(libc::EEXIST);
            }
            if old == ino {
                return Ok(());
            }
            let old_is_dir = matches!(self.node(old)?.body, Body::Dir { .. });
            match (src_is_dir, old_is_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !self.entries(old)?.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        if let Some(old) = existing {
            self.entries_mut(new_parent)?.remove(new_name);
            if src_is_dir {
                self.nodes.remove(&old);
            } else {
                self.drop_link(old);
            }
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?.insert(new_name.to_owned(), ino);
        if let Body::Dir { parent: p, .. } = &mut self.node_mut(ino)?.body {
            *p = new_parent;
        }
        self.node_mut(ino)?.ctime = now();
        self.touch_dir(parent);
        self.touch_dir(new_parent);
        let mut dirs = vec![parent];
        if new_parent != parent {
            dirs.push(new_parent);
        }
        self.log.push(Pending { op: NsOp::Rename { from, to }, dirs });
        Ok(())
    }

    /// Notes an open handle, so that the data of an unlinked file stays readable through it.
    pub fn open_handle(&mut self, ino: Ino) -> Res<()> {
        self.node_mut(ino)?.opens += 1;
        Ok(())
    }

    /// Notes a closed handle.
    pub fn release(&mut self, ino: Ino) {
        if let Some(n) = self.nodes.get_mut(&ino) {
            n.opens = n.opens.saturating_sub(1);
        }
        self.forget_data_if_unreachable(ino);
    }

    fn file(&self, ino: Ino) -> Res<(&PathBuf, &Overlay)> {
        match &self.node(ino)?.body {
            Body::File { home, overlay } => Ok((home, overlay)),
            Body::Dir { .. } => Err(libc::EISDIR),
            Body::Symlink { .. } => Err(libc::EINVAL),
        }
    }

    fn file_mut(&mut self, ino: Ino) -> Res<&mut Overlay> {
        let n = self.node_mut(ino)?;
        n.mtime = now();
        n.ctime = n.mtime;
        match &mut n.body {
            Body::File { overlay, .. } => Ok(overlay),
            Body::Dir { .. } => Err(libc::EISDIR),
            Body::Symlink { .. } => Err(libc::EINVAL),
        }
    }

    /// Reads through the page cache: pending data over durable data.
    pub fn read(&self, ino: Ino, offset: u64, len: u32) -> Res<Vec<u8>> {
        let (home, overlay) = self.file(ino)?;
        let mut out = Vec::with_capacity(len as usize);
        let mut base: Option<File> = None;
        for piece in overlay.pieces(offset, u64::from(len)) {
            match piece {
                Piece::Pending(bytes) => out.extend_from_slice(bytes),
                Piece::Zeroes(n) => out.resize(out.len() + n as usize, 0),
                Piece::Durable { offset, len } => {
                    if base.is_none() {
                        base = Some(File::open(home).map_err(errno)?);
                    }
                    let start = out.len();
                    out.resize(start + len as usize, 0);
                    if let Some(f) = &base {
                        read_full_at(f, &mut out[start..], offset).map_err(errno)?;
                    }
                }
            }
        }
        Ok(out)
    }

    /// Writes into the page cache.
    pub fn write(&mut self, ino: Ino, offset: u64, data: &[u8]) -> Res<u32> {
        let len = u32::try_from(data.len()).map_err(|_| libc::EINVAL)?;
        offset.checked_add(data.len() as u64).ok_or(libc::EFBIG)?;
        self.file_mut(ino)?.write(offset, data);
        Ok(len)
    }

    /// Truncates or extends in the page cache.
    pub fn set_size(&mut self, ino: Ino, size: u64) -> Res<()> {
        self.file_mut(ino)?.set_size(size);
        Ok(())
    }

    /// Changes permission bits. Not modelled as lazy: applied to the durable file at once.
    pub fn set_mode(&mut self, ino: Ino, mode: u32) -> Res<()> {
        let n = self.node_mut(ino)?;
        n.perm = (mode & 0o7777) as u16;
        n.ctime = now();
        if let Body::File { home, .. } = &n.body {
            fs::set_permissions(home, fs::Permissions::from_mode(mode & 0o7777)).map_err(errno)?;
        }
        Ok(())
    }

    /// Changes owner and group, in memory only.
    pub fn set_owner(&mut self, ino: Ino, uid: Option<u32>, gid: Option<u32>) -> Res<()> {
        let n = self.node_mut(ino)?;
        if let Some(u) = uid {
            n.uid = u;
        }
        if let Some(g) = gid {
            n.gid = g;
        }
        n.ctime = now();
        Ok(())
    }

    /// Sets timestamps, in memory only.
    pub fn set_times(&mut self, ino: Ino, atime: Option<SystemTime>, mtime: Option<SystemTime>) -> Res<()> {
        let n = self.node_mut(ino)?;
        if let Some(t) = atime {
            n.atime = t;
        }
        if let Some(t) = mtime {
            n.mtime = t;
        }
        n.ctime = now();
        Ok(())
    }

    /// fsync/fdatasync: makes a file's content and size durable; on a directory, its entries.
    pub fn fsync(&mut self, ino: Ino) -> Res<()> {
        let n = self.node_mut(ino)?;
        match &mut n.body {
            Body::File { home, overlay } => {
                if overlay.is_clean() {
                    return Ok(());
                }
                let f = OpenOptions::new().write(true).open(&*home).map_err(errno)?;
                let (cut, extents, size) = overlay.sync_plan();
                if let Some(c) = cut {
                    f.set_len(c).map_err(errno)?;
                }
                for (off, data) in extents {
                    f.write_all_at(data, *off).map_err(errno)?;
                }
                f.set_len(size).map_err(errno)?;
                f.sync_data().map_err(errno)?;
                overlay.synced();
                Ok(())
            }
            Body::Dir { .. } => self.fsync_dir(ino),
            Body::Symlink { .. } => Ok(()),
        }
    }

    /// fsync on a directory: makes the pending entry changes that involve it durable, and,
    /// because the changes form one ordered log, every change made before them too.
    pub fn fsync_dir(&mut self, dir: Ino) -> Res<()> {
        let Some(last) = self.log.iter().rposition(|p| p.dirs.contains(&dir)) else {
            return Ok(());
        };
        let mut batch: Vec<Pending> = self.log.drain(..=last).collect();
        let mut touched: Vec<PathBuf> = Vec::new();
        let mut ops = batch.drain(..);
        while let Some(p) = ops.next() {
            match self.apply(p.op) {
                Ok(dirs) => touched.extend(dirs),
                Err(e) => {
                    // What was not applied stays pending, in order, so the log still replays
                    // exactly; the failed change itself is dropped rather than retried forever.
                    let rest: Vec<Pending> = ops.collect();
                    self.log.splice(0..0, rest);
                    return Err(errno(e));
                }
            }
        }
        touched.sort();
        touched.dedup();
        for d in touched {
            if let Ok(f) = File::open(&d) {
                f.sync_all().map_err(errno)?;
            }
        }
        Ok(())
    }

    /// Carries one entry change out on the backing directory; returns the backing
    /// directories it changed.
    fn apply(&mut self, op: NsOp) -> io::Result<Vec<PathBuf>> {
        let b = self.backing.clone();
        let parent_of = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
        match op {
            NsOp::CreateFile { path, ino } => {
                let target = b.join(&path);
                if let Some(Node { body: Body::File { home, .. }, .. }) = self.nodes.get_mut(&ino) {
                    if home.starts_with(&self.staging) {
                        fs::rename(&*home, &target)?;
                    } else {
                        fs::hard_link(&*home, &target)?;
                    }
                    *home = target.clone();
                } else {
                    File::create(&target)?;
                }
                Ok(vec![parent_of(&target)])
            }
            NsOp::Mkdir { path, perm } => {
                let target = b.join(&path);
                fs::create_dir(&target)?;
                fs::set_permissions(&target, fs::Permissions::from_mode(u32::from(perm)))?;
                Ok(vec![parent_of(&target)])
            }
            NsOp::Symlink { path, target } => {
                let at = b.join(&path);
                std::os::unix::fs::symlink(target, &at)?;
                Ok(vec![parent_of(&at)])
            }
            NsOp::Link { ino, path } => {
                let target = b.join(&path);
                if let Ok((home, _)) = self.file(ino) {
                    fs::hard_link(home, &target)?;
                }
                Ok(vec![parent_of(&target)])
            }
            NsOp::Unlink { path } => {
                let target = b.join(&path);
                self.evict_home(&target)?;
                fs::remove_file(&target)?;
                Ok(vec![parent_of(&target)])
            }
            NsOp::Rmdir { path } => {
                let target = b.join(&path);
                fs::remove_dir(&target)?;
                Ok(vec![parent_of(&target)])
            }
            NsOp::Rename { from, to } => {
                let src = b.join(&from);
                let dst = b.join(&to);
                if fs::symlink_metadata(&dst).map(|m| m.is_file()).unwrap_or(false) {
                    self.evict_home(&dst)?;
                }
                fs::rename(&src, &dst)?;
                for n in self.nodes.values_mut() {
                    if let Body::File { home, .. } = &mut n.body {
                        if let Ok(rest) = home.strip_prefix(&src) {
                            // Joining an empty rest would add a trailing slash.
                            *home = if rest.as_os_str().is_empty() { dst.clone() } else { dst.join(rest) };
                        }
                    }
                }
                Ok(vec![parent_of(&src), parent_of(&dst)])
            }
        }
    }

    /// A durable name is about to go away; a file whose content lives under that name gets a
    /// staging link first, so it stays readable and syncable through open handles.
    fn evict_home(&mut self, path: &Path) -> io::Result<()> {
        let fresh = self.staging.join(self.next_staging.to_string());
        let mut moved = false;
        for n in self.nodes.values_mut() {
            if let Body::File { home, .. } = &mut n.body {
                if home == path {
                    if !moved {
                        fs::hard_link(path, &fresh)?;
                        moved = true;
                    }
                    *home = fresh.clone();
                }
            }
        }
        if moved {
            self.next_staging += 1;
        }
        Ok(())
    }

    /// Simulated power loss: everything not durable is dropped and the view is rebuilt from
    /// the backing directory. In torn mode the last unsynced write of each file that has a
    /// durable name first reaches the disk partially: its first half of whole pages.
    pub fn power_loss(&mut self) -> io::Result<()> {
        if self.torn {
            self.tear_last_writes()?;
        }
        self.log.clear();
        self.power_losses += 1;
        fs::remove_dir_all(&self.staging)?;
        fs::create_dir_all(&self.staging)?;
        self.load()
    }

    fn tear_last_writes(&self) -> io::Result<()> {
        for n in self.nodes.values() {
            let Body::File { home, overlay } = &n.body else {
                continue;
            };
            if home.starts_with(&self.staging) {
                continue;
            }
            let Some((off, len)) = overlay.last_write() else {
                continue;
            };
            let end = (off + len).min(overlay.size());
            if end <= off {
                continue;
            }
            let first_page = off / PAGE;
            let pages = end.div_ceil(PAGE) - first_page;
            let keep_end = ((first_page + pages / 2) * PAGE).min(end);
            if keep_end <= off {
                continue;
            }
            if let Some(bytes) = overlay.pending_slice(off, keep_end - off) {
                let f = OpenOptions::new().write(true).open(home)?;
                f.write_all_at(bytes, off)?;
                f.sync_data()?;
            }
        }
        Ok(())
    }

    /// Pending state, for the control interface.
    pub fn stats(&self) -> Stats {
        let mut s = Stats { pending_ops: self.log.len() as u64, ..Stats::default() };
        for n in self.nodes.values() {
            if let Body::File { overlay, .. } = &n.body {
                s.pending_bytes += overlay.pending_bytes();
                if !overlay.is_clean() {
                    s.dirty_files += 1;
                }
            }
        }
        s
    }

    /// Resolves a path relative to the mount root in the current view (for tests and tools).
    pub fn resolve(&self, path: &Path) -> Res<Ino> {
        let mut cur = ROOT;
        for c in path.components() {
            match c {
                std::path::Component::Normal(name) => {
                    cur = *self.entries(cur)?.get(name).ok_or(libc::ENOENT)?;
                }
                std::path::Component::RootDir | std::path::Component::CurDir => {}
                _ => return Err(libc::EINVAL),
            }
        }
        Ok(cur)
    }
}

fn read_full_at(f: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            // The durable file is shorter than recorded; the rest reads as zeroes.
            break;
        }
        done += n;
    }
    Ok(())
}

fn dir_body(parent: Ino) -> Body {
    Body::Dir { entries: BTreeMap::new(), parent }
}

fn new_node(body: Body, mode: u32, uid: u32, gid: u32) -> Node {
    let t = now();
    Node { body, perm: (mode & 0o7777) as u16, uid, gid, atime: t, mtime: t, ctime: t, nlink: 1, opens: 0 }
}

fn node_from_meta(meta: &fs::Metadata, body: Body) -> Node {
    Node {
        body,
        perm: (meta.mode() & 0o7777) as u16,
        uid: meta.uid(),
        gid: meta.gid(),
        atime: meta.accessed().unwrap_or_else(|_| now()),
        mtime: meta.modified().unwrap_or_else(|_| now()),
        ctime: meta.modified().unwrap_or_else(|_| now()),
        nlink: 1,
        opens: 0,
    }
}
