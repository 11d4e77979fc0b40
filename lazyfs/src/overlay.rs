//! Pending (not yet fsynced) data of one regular file, kept as byte ranges over the durable
//! content so that a large file costs memory only for what was written since its last sync.

use std::collections::BTreeMap;

/// What a file looks like on top of its durable content until the next fsync.
///
/// Invariants: extents never overlap or touch each other (touching writes are merged so that
/// a stream of appends becomes one growing buffer), and no extent reaches past `size`.
#[derive(Debug, Clone)]
pub struct Overlay {
    /// Length of the durable content underneath.
    durable_size: u64,
    /// Length the file has now, as reads and stat see it.
    size: u64,
    /// Durable bytes at or past this offset were cut off by a truncate since the last sync,
    /// so they read as zeroes unless an extent covers them again.
    cut: u64,
    extents: BTreeMap<u64, Vec<u8>>,
    /// The most recent write not yet synced, for torn-write simulation.
    last_write: Option<(u64, u64)>,
}

/// Where a byte of the current view comes from.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Read `len` bytes of the durable content at this offset.
    Durable {
        /// Where in the durable file.
        offset: u64,
        /// How many bytes.
        len: u64,
    },
    /// Pending bytes.
    Pending(&'a [u8]),
    /// A hole or cut-off range: `len` zero bytes.
    Zeroes(u64),
}

impl Overlay {
    /// A clean overlay over durable content of `durable_size` bytes.
    pub fn new(durable_size: u64) -> Self {
        Overlay { durable_size, size: durable_size, cut: durable_size, extents: BTreeMap::new(), last_write: None }
    }

    /// The current (page-cache) size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The size the file would have after a power loss.
    pub fn durable_size(&self) -> u64 {
        self.durable_size
    }

    /// True when nothing differs from the durable content.
    pub fn is_clean(&self) -> bool {
        self.extents.is_empty() && self.size == self.durable_size && self.cut >= self.durable_size
    }

    /// Bytes held in memory.
    pub fn pending_bytes(&self) -> u64 {
        self.extents.values().map(|v| v.len() as u64).sum()
    }

    /// The last unsynced write, as (offset, length).
    pub fn last_write(&self) -> Option<(u64, u64)> {
        self.last_write
    }

    /// Records a write. Writing past the end extends the file; the gap reads as zeroes.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let end = offset + data.len() as u64;
        // Every extent that overlaps or touches [offset, end) is folded into one buffer; the
        // lowest one's allocation is reused, so a run of appends grows a single Vec.
        let keys: Vec<u64> = self
            .extents
            .range(..=end)
            .rev()
            .take_while(|(s, v)| **s + v.len() as u64 >= offset)
            .map(|(s, _)| *s)
            .collect();
        let start = keys.last().copied().unwrap_or(offset).min(offset);
        let mut buf = Vec::new();
        let mut others = Vec::new();
        for s in keys {
            if let Some(v) = self.extents.remove(&s) {
                if s == start {
                    buf = v;
                } else {
                    others.push((s, v));
                }
            }
        }
        let mut new_end = end.max(start + buf.len() as u64);
        for (s, v) in &others {
            new_end = new_end.max(*s + v.len() as u64);
        }
        buf.resize((new_end - start) as usize, 0);
        for (s, v) in others {
            let at = (s - start) as usize;
            buf[at..at + v.len()].copy_from_slice(&v);
        }
        let at = (offset - start) as usize;
        buf[at..at + data.len()].copy_from_slice(data);
        self.extents.insert(start, buf);
        self.size = self.size.max(end);
        self.last_write = Some((offset, data.len() as u64));
    }

    /// Records a truncate or extension to `new_size`.
    pub fn set_size(&mut self, new_size: u64) {
        if new_size < self.size {
            let doomed: Vec<u64> = self.extents.range(new_size..).map(|(s, _)| *s).collect();
            for s in doomed {
                self.extents.remove(&s);
            }
            if let Some((s, v)) = self.extents.range_mut(..new_size).next_back() {
                let keep = (new_size - *s) as usize;
                v.truncate(keep);
            }
            self.cut = self.cut.min(new_size);
        }
        self.size = new_size;
    }

    /// Describes the current content of [offset, offset+len) as durable reads, pending bytes
    /// and zeroes, clipped to the current size.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<Piece<'_>> {
        let end = (offset + len).min(self.size);
        let mut out = Vec::new();
        let mut pos = offset;
        if pos >= end {
            return out;
        }
        let mut iter = self.extents.range(..end).filter(|(s, v)| *s + v.len() as u64 > offset).peekable();
        while pos < end {
            match iter.peek() {
                Some((s, v)) if **s <= pos => {
                    let from = (pos - **s) as usize;
                    let to = ((end - **s) as usize).min(v.len());
                    out.push(Piece::Pending(&v[from..to]));
                    pos = **s + to as u64;
                    iter.next();
                }
                next => {
                    let gap_end = next.map(|(s, _)| **s).unwrap_or(end).min(end);
                    self.base_pieces(pos, gap_end, &mut out);
                    pos = gap_end;
                }
            }
        }
        out
    }

    fn base_pieces<'a>(&self, from: u64, to: u64, out: &mut Vec<Piece<'a>>) {
        let durable_end = self.durable_size.min(self.cut);
        if from < durable_end {
            let e = to.min(durable_end);
            out.push(Piece::Durable { offset: from, len: e - from });
            if e < to {
                out.push(Piece::Zeroes(to - e));
            }
        } else {
            out.push(Piece::Zeroes(to - from));
        }
    }

    /// What an fsync must do to the durable file: cut it to this length first (if any), then
    /// write these extents, then set the final length.
    pub fn sync_plan(&self) -> (Option<u64>, &BTreeMap<u64, Vec<u8>>, u64) {
        let cut = (self.cut < self.durable_size).then_some(self.cut);
        (cut, &self.extents, self.size)
    }

    /// Marks everything durable after the sync plan was carried out.
    pub fn synced(&mut self) {
        self.extents.clear();
        self.durable_size = self.size;
        self.cut = self.size;
        self.last_write = None;
    }

    /// The pending bytes of [offset, offset+len) that an extent holds, for torn writes.
    pub fn pending_slice(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let (s, v) = self.extents.range(..=offset).next_back()?;
        let from = (offset - s) as usize;
        let to = from.checked_add(len as usize)?;
        v.get(from..to)
    }
}
