//! The FUSE adapter: translates kernel requests into layer operations and applies the disk
//! faults. It holds no state of its own beyond the shared layer and fault switches.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::faults::Faults;
use crate::layer::{Attr, Ino, Kind, Layer};

/// Zero: the kernel must ask again every time, because a power loss can change any answer
/// behind its back.
const TTL: Duration = Duration::ZERO;

/// The filesystem the kernel talks to.
pub struct LazyFilesystem {
    layer: Arc<Mutex<Layer>>,
    faults: Arc<Faults>,
}

impl LazyFilesystem {
    /// Serves `layer`, with the disk faults switched in `faults`.
    pub fn new(layer: Arc<Mutex<Layer>>, faults: Arc<Faults>) -> Self {
        LazyFilesystem { layer, faults }
    }

    fn layer(&self) -> MutexGuard<'_, Layer> {
        crate::lock(&self.layer)
    }

    /// Carries out an fsync of `ino` (the entries of a directory when `dir`) after the fsync
    /// delay, and answers it.
    fn sync(&self, ino: Ino, dir: bool, reply: ReplyEmpty) {
        if self.faults.fsync_delay().is_zero() {
            empty(reply, sync_locked(&mut self.layer(), &self.faults, ino, dir));
            return;
        }
        // The fsync waits on a thread of its own, which then answers the kernel, so that the
        // session goes on serving other requests as a slow disk would. This is still exact:
        // the kernel holds the inode's lock until the fsync is answered, so no write,
        // truncate or unlink of the file (or entry change in the directory) that the fsync
        // could pick up gets here meanwhile.
        let arrived = Instant::now();
        let generation = self.layer().generation();
        self.faults.count_delayed_fsync();
        let layer = self.layer.clone();
        let faults = self.faults.clone();
        // Should the thread not start, the closure is dropped with its reply, and fuser
        // answers an unanswered reply with EIO: a failed fsync, never a hang.
        let _ = std::thread::Builder::new().name("lazyfs-fsync".into()).spawn(move || {
            let r = if faults.wait_delay(arrived) {
                let mut l = crate::lock(&layer);
                if l.generation() == generation {
                    sync_locked(&mut l, &faults, ino, dir)
                } else {
                    // The power went out while this fsync waited: it never reached the disk.
                    Err(libc::EIO)
                }
            } else {
                // Unmounting: the fsync never reached the disk, and unmounting flushes nothing.
                Err(libc::EIO)
            };
            empty(reply, r);
        });
    }
}

/// An fsync carried out now, unless fsyncs are failing.
fn sync_locked(l: &mut Layer, faults: &Faults, ino: Ino, dir: bool) -> Result<(), i32> {
    if faults.fail_fsync() {
        faults.count_failed_fsync();
        return Err(libc::EIO);
    }
    if dir {
        l.fsync_dir(ino)
    } else {
        l.fsync(ino)
    }
}

fn err(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn kind(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

fn is_sync(flags: i32) -> bool {
    flags & (libc::O_SYNC | libc::O_DSYNC) != 0
}

fn entry(reply: ReplyEntry, gen: u64, r: Result<Attr, i32>) {
    match r {
        Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(gen)),
        Err(e) => reply.error(err(e)),
    }
}

fn empty(reply: ReplyEmpty, r: Result<(), i32>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(err(e)),
    }
}

impl Filesystem for LazyFilesystem {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let l = self.layer();
        entry(reply, l.generation(), l.lookup(parent.0, name));
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.layer().getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut l = self.layer();
        let ino = ino.0;
        let r = (|| {
            if let Some(m) = mode {
                l.set_mode(ino, m)?;
            }
            if uid.is_some() || gid.is_some() {
                l.set_owner(ino, uid, gid)?;
            }
            if let Some(s) = size {
                l.set_size(ino, s)?;
            }
            if atime.is_some() || mtime.is_some() {
                l.set_times(ino, atime.map(time), mtime.map(time))?;
            }
            l.getattr(ino)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(err(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.layer().readlink(ino.0) {
            Ok(t) => reply.data(t.as_os_str().as_encoded_bytes()),
            Err(e) => reply.error(err(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            // Only regular files are modelled.
            reply.error(Errno::EPERM);
            return;
        }
        let mut l = self.layer();
        let r = l.create(parent.0, name, mode & !umask, req.uid(), req.gid());
        entry(reply, l.generation(), r);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let mut l = self.layer();
        let r = l.mkdir(parent.0, name, mode & !umask, req.uid(), req.gid());
        entry(reply, l.generation(), r);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.layer().unlink(parent.0, name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.layer().rmdir(parent.0, name));
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let mut l = self.layer();
        let r = l.symlink(parent.0, link_name, target, req.uid(), req.gid());
        entry(reply, l.generation(), r);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            reply.error(Errno::EINVAL);
            return;
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        empty(reply, self.layer().rename(parent.0, name, newparent.0, newname, noreplace));
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let mut l = self.layer();
        let r = l.link(ino.0, newparent.0, newname);
        entry(reply, l.generation(), r);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut l = self.layer();
        let r = (|| {
            if flags.0 & libc::O_TRUNC != 0 {
                l.set_size(ino.0, 0)?;
            }
            l.open_handle(ino.0)
        })();
        match r {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(err(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.layer().read(ino.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(err(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut l = self.layer();
        if self.faults.fail_write() {
            self.faults.count_failed_write();
            reply.error(Errno::EIO);
            return;
        }
        let n = match l.write(ino.0, offset, data) {
            Ok(n) => n,
            Err(e) => {
                reply.error(err(e));
                return;
            }
        };
        // O_SYNC and O_DSYNC writes are durable when they return, so they fail with the fsyncs.
        // They are not delayed here: the kernel follows each with an fsync of its own, which
        // is delayed, and delaying both would make such writes twice as slow.
        let r = if is_sync(flags.0) { sync_locked(&mut l, &self.faults, ino.0, false) } else { Ok(()) };
        match r {
            Ok(()) => reply.written(n),
            Err(e) => reply.error(err(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close() makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.layer().release(ino.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync(ino.0, false, reply);
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.layer().readdir(ino.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(err(e));
                return;
            }
        };
        let skip = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, (ino, k, name)) in entries.iter().enumerate().skip(skip) {
            if reply.add(INodeNo(*ino), (i + 1) as u64, kind(*k), name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.sync(ino.0, true, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Space accounting is not modelled; report plenty so that callers do not refuse to write.
        reply.statfs(1 << 28, 1 << 28, 1 << 28, 1 << 24, 1 << 24, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.layer().getattr(ino.0).map(|_| ()));
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut l = self.layer();
        let r = l.create(parent.0, name, mode & !umask, req.uid(), req.gid());
        let r = r.and_then(|a| l.open_handle(a.ino).map(|()| a));
        match r {
            Ok(a) => {
                reply.created(&TTL, &file_attr(&a), Generation(l.generation()), FileHandle(0), FopenFlags::empty())
            }
            Err(e) => reply.error(err(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            reply.error(Errno::EOPNOTSUPP);
            return;
        }
        let mut l = self.layer();
        let r = (|| {
            let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
            if end > l.getattr(ino.0)?.size {
                l.set_size(ino.0, end)?;
            }
            Ok(())
        })();
        empty(reply, r);
    }
}
