//! The disk seam: how the raft log's frames reach the disk.
//!
//! In production the log writes its file directly ([`Disk::direct`]). The simulation
//! (`crates/sim`) puts [`VolatileFile`] in between: a model of the operating system's write-back
//! cache, in which a write reaches the file only when it is synced, and a power loss (the file
//! dropped without a sync, as when a simulated host crashes) lets each unsynced page reach the
//! disk or not. What the log acknowledged must survive that, and what it did not may be torn.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// The page size a power loss tears writes at.
pub const PAGE_BYTES: u64 = 4096;

/// The log's open file, as the log writer uses it.
pub trait LogFile: Send + fmt::Debug {
    /// Writes all of `buf` at `offset`.
    fn write(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every write so far durable (`fdatasync`).
    fn sync(&mut self) -> io::Result<()>;
}

impl LogFile for File {
    fn write(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_all_at(buf, offset)
    }

    fn sync(&mut self) -> io::Result<()> {
        self.sync_data()
    }
}

type Wrap = dyn Fn(File) -> Box<dyn LogFile> + Send + Sync;

/// How the log's file meets the disk: directly, or through a model of one.
#[derive(Clone, Default)]
pub struct Disk {
    model: Option<Arc<Wrap>>,
}

impl Disk {
    /// Writes go to the file; `fdatasync` makes them durable.
    pub fn direct() -> Disk {
        Disk::default()
    }

    /// Every file the log opens for writing is handed to `wrap`, and written through what it
    /// returns.
    pub fn modelled(wrap: impl Fn(File) -> Box<dyn LogFile> + Send + Sync + 'static) -> Disk {
        Disk {
            model: Some(Arc::new(wrap)),
        }
    }

    /// A disk with a write-back cache that a crash empties: see [`VolatileFile`].
    pub fn volatile(on_crash: OnCrash) -> Disk {
        Disk::modelled(move |file| Box::new(VolatileFile::new(file, on_crash)))
    }

    pub(crate) fn open(&self, file: File) -> Box<dyn LogFile> {
        match &self.model {
            Some(wrap) => wrap(file),
            None => Box::new(file),
        }
    }
}

impl fmt::Debug for Disk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.model.is_some() {
            "Disk::modelled"
        } else {
            "Disk::direct"
        })
    }
}

/// What a power loss does to a [`VolatileFile`]'s unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCrash {
    /// Each page of them reaches the disk or not, at random (from
    /// [`palisade_clock::entropy`], so a seeded simulation replays it).
    TearPages,
    /// None of them reaches the disk.
    LoseAll,
}

/// A file behind a write-back cache. Writes are held in memory until `sync_data`
/// writes them to the file and syncs it. Dropped with writes still held (the machine lost
/// power), it lets them reach the file as [`OnCrash`] says, page by page in any order.
#[derive(Debug)]
pub struct VolatileFile {
    file: File,
    unsynced: Vec<(u64, Vec<u8>)>,
    on_crash: OnCrash,
}

impl VolatileFile {
    pub fn new(file: File, on_crash: OnCrash) -> VolatileFile {
        VolatileFile {
            file,
            unsynced: Vec::new(),
            on_crash,
        }
    }
}

impl LogFile for VolatileFile {
    fn write(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.unsynced.push((offset, buf.to_vec()));
        Ok(())
    }

    fn sync(&mut self) -> io::Result<()> {
        for (offset, bytes) in self.unsynced.drain(..) {
            self.file.write_all_at(&bytes, offset)?;
        }
        self.file.sync_data()
    }
}

impl Drop for VolatileFile {
    fn drop(&mut self) {
        if self.on_crash == OnCrash::LoseAll {
            return;
        }
        for (offset, bytes) in std::mem::take(&mut self.unsynced) {
            let mut at = offset;
            let end = offset + bytes.len() as u64;
            while at < end {
                let page_end = ((at / PAGE_BYTES + 1) * PAGE_BYTES).min(end);
                let landed = palisade_clock::entropy::u64().is_ok_and(|draw| draw & 1 == 1);
                if landed {
                    let slice = &bytes[(at - offset) as usize..(page_end - offset) as usize];
                    let _ = self.file.write_all_at(slice, at);
                }
                at = page_end;
            }
        }
    }
}
