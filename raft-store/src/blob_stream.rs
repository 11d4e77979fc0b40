//! A snapshot with blobs as one seekable byte stream: the snapshot file, then the blob
//! section made from the blob files and packs it links (format 3 or 4, see `snapshot`).
//!
//! Nothing is copied to build it: a snapshot on disk is its records file plus hard links, and
//! this stream presents them, in order, as the bytes a peer or a backup receives. Reads are
//! positional (`pread`), so a seek is free; the blob directory is listed at the first read.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::snapshot::{blob_head, blob_section_head};
use crate::stored::BlobRef;

#[derive(Debug)]
enum Part {
    File { path: PathBuf, len: u64 },
    Bytes(Vec<u8>),
}

impl Part {
    fn len(&self) -> u64 {
        match self {
            Part::File { len, .. } => *len,
            Part::Bytes(b) => b.len() as u64,
        }
    }
}

/// Snapshots with open streams, by id, with their number of streams: the store keeps their
/// files while any stream is open, since a stream opens its files as it reaches them (a
/// newer snapshot would otherwise delete them under a leader that is still sending one).
pub(crate) type Pins = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>;

/// One stream's hold on its snapshot's files.
#[derive(Debug)]
struct Hold {
    id: String,
    pins: Pins,
}

impl Hold {
    fn new(id: String, pins: Pins) -> Self {
        *lock_pins(&pins).entry(id.clone()).or_insert(0) += 1;
        Hold { id, pins }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut pins = lock_pins(&self.pins);
        if let Some(n) = pins.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.id);
            }
        }
    }
}

pub(crate) fn lock_pins(pins: &Pins) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, usize>> {
    pins.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The byte stream of a snapshot file and its blob directory.
#[derive(Debug)]
pub struct BlobStream {
    snap: PathBuf,
    blobs: PathBuf,
    /// Keeps the files from being deleted while the stream is open (`None` outside a store).
    pin: Option<(String, Pins)>,
    _held: Option<Hold>,
    /// `(start offset, part)`, built at the first read or seek.
    parts: Option<Vec<(u64, Part)>>,
    total: u64,
    pos: u64,
    /// The file of the part read last, kept open across reads.
    open: Option<(usize, std::fs::File)>,
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    // Reads hit the disk: on a multi-threaded runtime, let the other tasks of this worker
    // move on meanwhile (a leader keeps sending heartbeats while it streams a snapshot).
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl BlobStream {
    /// The stream of snapshot file `snap` with the blobs in directory `blobs`.
    pub fn new(snap: PathBuf, blobs: PathBuf) -> Self {
        BlobStream { snap, blobs, pin: None, _held: None, parts: None, total: 0, pos: 0, open: None }
    }

    /// [`BlobStream::new`] for snapshot `id` of a store, whose files it keeps while open.
    pub(crate) fn pinned(snap: PathBuf, blobs: PathBuf, id: String, pins: Pins) -> Self {
        let held = Hold::new(id.clone(), pins.clone());
        BlobStream { pin: Some((id, pins)), _held: Some(held), ..BlobStream::new(snap, blobs) }
    }

    /// Another stream over the same files, from the start.
    pub fn reopen(&self) -> Self {
        match &self.pin {
            Some((id, pins)) => BlobStream::pinned(self.snap.clone(), self.blobs.clone(), id.clone(), pins.clone()),
            None => BlobStream::new(self.snap.clone(), self.blobs.clone()),
        }
    }

    fn build(&mut self) -> std::io::Result<()> {
        if self.parts.is_some() {
            return Ok(());
        }
        let named =
            |e: std::io::Error, p: &std::path::Path| std::io::Error::new(e.kind(), format!("{}: {e}", p.display()));
        let snap_len = std::fs::metadata(&self.snap).map_err(|e| named(e, &self.snap))?.len();
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&self.blobs).map_err(|e| named(e, &self.blobs))? {
            let entry = entry.map_err(|e| named(e, &self.blobs))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some((index, n)) = BlobRef::parse_name(&name) {
                names.push((index, n, entry.path()));
            }
        }
        names.sort();
        let mut parts = vec![Part::File { path: self.snap.clone(), len: snap_len }];
        parts.push(Part::Bytes(blob_section_head(names.len() as u64)));
        for (index, n, path) in names {
            let len = std::fs::metadata(&path).map_err(|e| named(e, &path))?.len();
            parts.push(Part::Bytes(blob_head(index, n, len).to_vec()));
            parts.push(Part::File { path, len });
        }
        let mut at = 0;
        let mut placed = Vec::with_capacity(parts.len());
        for p in parts {
            let len = p.len();
            placed.push((at, p));
            at += len;
        }
        self.total = at;
        self.parts = Some(placed);
        Ok(())
    }

    /// Total length in bytes.
    pub fn len(&mut self) -> std::io::Result<u64> {
        self.build()?;
        Ok(self.total)
    }

    /// Whether the stream is empty (never, once built: it holds at least the snapshot head).
    pub fn is_empty(&mut self) -> std::io::Result<bool> {
        Ok(self.len()? == 0)
    }

    fn read_at_pos(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.build()?;
        let Some(parts) = self.parts.as_ref() else { return Ok(0) };
        if self.pos >= self.total || buf.is_empty() {
            return Ok(0);
        }
        let i = match parts.binary_search_by(|(start, _)| start.cmp(&self.pos)) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let (start, part) = &parts[i];
        let off = self.pos - start;
        let want = usize::try_from(part.len() - off).unwrap_or(usize::MAX).min(buf.len());
        let n = match part {
            Part::Bytes(b) => {
                let from = usize::try_from(off).unwrap_or(usize::MAX);
                buf[..want].copy_from_slice(&b[from..from + want]);
                want
            }
            Part::File { path, .. } => {
                if self.open.as_ref().is_none_or(|(at, _)| *at != i) {
                    let f = std::fs::File::open(path)
                        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
                    self.open = Some((i, f));
                }
                let Some((_, f)) = self.open.as_ref() else { return Ok(0) };
                let n = f.read_at(&mut buf[..want], off)?;
                if n == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("{} is shorter than when the snapshot was listed", path.display()),
                    ));
                }
                n
            }
        };
        self.pos += n as u64;
        Ok(n)
    }

    fn seek_to(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.build()?;
        let target = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.total.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start of a snapshot")
        })?;
        self.pos = target;
        Ok(target)
    }
}

impl Read for BlobStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_at_pos(buf)
    }
}

impl Seek for BlobStream {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.seek_to(to)
    }
}

impl tokio::io::AsyncRead for BlobStream {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let me = self.get_mut();
        let out = buf.initialize_unfilled();
        let read = blocking(|| me.read_at_pos(out));
        Poll::Ready(read.map(|n| buf.advance(n)))
    }
}

impl tokio::io::AsyncSeek for BlobStream {
    fn start_seek(self: Pin<&mut Self>, to: SeekFrom) -> std::io::Result<()> {
        let me = self.get_mut();
        blocking(|| me.seek_to(to)).map(|_| ())
    }

    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

impl tokio::io::AsyncWrite for BlobStream {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, _buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "a stored snapshot is read-only; received snapshots are written to a file",
        )))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
