//! `lazyfs --backing DIR --mount DIR --control SOCK [--staging DIR]`: mounts a lazy
//! filesystem and serves control commands until unmounted (by `umount DIR` or the `unmount`
//! control command).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use lazyfs::{LazyFs, Options};

const USAGE: &str = "usage: lazyfs --backing DIR --mount DIR --control SOCK [--staging DIR]";

fn parse() -> Result<Options, String> {
    let mut backing = None;
    let mut mount = None;
    let mut control = None;
    let mut staging = None;
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        let slot = match a.to_str() {
            Some("--backing") => &mut backing,
            Some("--mount") => &mut mount,
            Some("--control") => &mut control,
            Some("--staging") => &mut staging,
            Some("-h" | "--help") => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        };
        *slot = Some(PathBuf::from(args.next().ok_or_else(|| format!("{a:?} needs a value"))?));
    }
    Ok(Options {
        backing: backing.ok_or(USAGE)?,
        mount: mount.ok_or(USAGE)?,
        control: Some(control.ok_or(USAGE)?),
        staging,
    })
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let fs = match LazyFs::mount(&opts) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("lazyfs: mount failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("lazyfs: mounted {:?} over {:?}", opts.mount, opts.backing);
    while !fs.finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    match fs.unmount() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lazyfs: unmount: {e}");
            ExitCode::FAILURE
        }
    }
}
