//! A lazy filesystem for crash tests.
//!
//! This crate owns a FUSE filesystem that passes every call through to a backing directory
//! but keeps whatever is not yet durable (writes and truncates not followed by an fsync of the
//! file, directory-entry changes not followed by an fsync of the directory) in memory. A
//! simulated power loss drops that memory, so the mount then shows what a real disk would
//! hold after the machine lost power: exactly what the program made durable, and nothing it
//! merely wrote. Killing a process (SIGKILL) cannot show this, because the kernel's page cache
//! survives the process.
//!
//! The rules live in [`layer::Layer`], which needs no FUSE and can be tested alone;
//! [`LazyFs`] mounts it in the background for in-process tests, and the `lazyfs` binary
//! mounts it for other programs, controlled over a Unix socket (see [`control`]).
//! Both can also make the disk fail or slow down (see [`faults`]).
//! The README states the durability model precisely.

pub mod control;
pub mod faults;
pub mod fs;
pub mod layer;
pub mod overlay;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

pub use faults::{ActiveFaults, FaultStats, Faults};
pub use layer::{Layer, Stats};

/// How long unmounting may take before falling back to a lazy unmount.
const UNMOUNT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where to mount what.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory holding the durable state; its content at mount time is taken as durable.
    pub backing: PathBuf,
    /// Empty directory to mount on.
    pub mount: PathBuf,
    /// Scratch directory on the same filesystem as `backing` for files that have content but
    /// no durable name yet; defaults to a hidden sibling of `backing`. Emptied on mount and
    /// on every power loss.
    pub staging: Option<PathBuf>,
    /// Unix socket to serve control commands on, if any.
    pub control: Option<PathBuf>,
}

/// A mounted lazy filesystem. Dropping it unmounts.
pub struct LazyFs {
    layer: Arc<Mutex<Layer>>,
    faults: Arc<Faults>,
    session: Option<fuser::BackgroundSession>,
    mount: PathBuf,
    control: Option<control::Server>,
}

/// Locks a layer, also after a panic elsewhere: operations leave it consistent.
pub fn lock(layer: &Mutex<Layer>) -> MutexGuard<'_, Layer> {
    layer.lock().unwrap_or_else(|e| e.into_inner())
}

impl LazyFs {
    /// Mounts. Fails if FUSE is unavailable (no `/dev/fuse`, or not allowed to mount).
    pub fn mount(opts: &Options) -> io::Result<LazyFs> {
        let staging = opts.staging.clone().unwrap_or_else(|| Layer::default_staging(&opts.backing));
        let layer = Arc::new(Mutex::new(Layer::open(&opts.backing, &staging)?));
        let mut config = fuser::Config::default();
        config.mount_options =
            vec![fuser::MountOption::FSName("lazyfs".into()), fuser::MountOption::Subtype("lazyfs".into())];
        let faults = Arc::new(Faults::new());
        let filesystem = fs::LazyFilesystem::new(layer.clone(), faults.clone());
        let session = fuser::spawn_mount(filesystem, &opts.mount, &config)?;
        let mut me = LazyFs {
            layer: layer.clone(),
            faults: faults.clone(),
            session: Some(session),
            mount: opts.mount.clone(),
            control: None,
        };
        if let Some(sock) = &opts.control {
            me.control = Some(control::Server::start(sock, layer, faults)?);
        }
        Ok(me)
    }

    /// The mount point.
    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// Simulated power loss: drops everything not durable.
    pub fn power_loss(&self) -> io::Result<()> {
        lock(&self.layer).power_loss()
    }

    /// Pending state.
    pub fn stats(&self) -> Stats {
        lock(&self.layer).stats()
    }

    /// Turns torn writes on or off for later power losses.
    pub fn set_torn(&self, on: bool) {
        lock(&self.layer).set_torn(on);
    }

    /// While on, every fsync and fdatasync (of a file or a directory, and the sync of an
    /// `O_SYNC`/`O_DSYNC` write) answers `EIO` and makes nothing durable: what was pending
    /// stays pending, and a power loss drops it.
    pub fn set_fail_fsync(&self, on: bool) {
        self.faults.set_fail_fsync(on);
    }

    /// While on, every write answers `EIO` and changes nothing.
    pub fn set_fail_write(&self, on: bool) {
        self.faults.set_fail_write(on);
    }

    /// Every fsync and fdatasync waits `d` before it is carried out (zero turns this off).
    /// Fsyncs already waiting go ahead once the new delay has passed since they arrived.
    pub fn set_fsync_delay(&self, d: Duration) {
        self.faults.set_fsync_delay(d);
    }

    /// Turns every disk fault off; fsyncs still waiting go ahead at once.
    pub fn clear_faults(&self) {
        self.faults.clear();
    }

    /// The disk faults switched on now.
    pub fn active_faults(&self) -> ActiveFaults {
        self.faults.active()
    }

    /// How often each disk fault fired since the mount.
    pub fn fault_stats(&self) -> FaultStats {
        self.faults.stats()
    }

    /// True once the filesystem stopped serving (unmounted from outside), or the control
    /// socket asked for an unmount.
    pub fn finished(&self) -> bool {
        let served = self.session.as_ref().is_none_or(|s| s.guard.is_finished());
        served || self.control.as_ref().is_some_and(|c| c.unmount_requested())
    }

    /// Unmounts, waiting a bounded time.
    pub fn unmount(mut self) -> io::Result<()> {
        self.do_unmount()
    }

    fn do_unmount(&mut self) -> io::Result<()> {
        if let Some(c) = self.control.take() {
            c.stop();
        }
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // An fsync still waiting out its delay would otherwise hold the unmount up.
        self.faults.close();
        let staging = lock(&self.layer).staging().to_owned();
        let (tx, rx) = mpsc::channel();
        // Joining can block on requests the kernel still has in flight; never wait forever.
        std::thread::spawn(move || {
            let _ = tx.send(session.umount_and_join());
        });
        match rx.recv_timeout(UNMOUNT_TIMEOUT) {
            Ok(Ok(())) => {
                // Staging only ever holds state without a durable name.
                let _ = std::fs::remove_dir_all(&staging);
                Ok(())
            }
            Ok(Err(e)) => {
                lazy_unmount(&self.mount);
                Err(e)
            }
            Err(_) => {
                lazy_unmount(&self.mount);
                Err(io::Error::new(io::ErrorKind::TimedOut, "unmount timed out; detached lazily"))
            }
        }
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        let _ = self.do_unmount();
    }
}

/// Detaches a mount even while it is busy; the last user closing it finishes the unmount.
pub fn lazy_unmount(mount: &Path) {
    let _ = Command::new("umount").arg("-l").arg(mount).status();
}
