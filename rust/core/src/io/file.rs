//! Writing a whole file (parameters, symbol JSON, optimizer states) without ever leaving a
//! half-written one behind, and without replacing what is not a regular file.
//!
//! A regular file (or a path with nothing there yet) is written to a temporary file in the same
//! directory, flushed to disk and renamed over the destination: the old contents stay intact
//! until the new ones are complete, whatever fails midway. A symbolic link is followed and its
//! target replaced that way, so the link keeps pointing where it did (MXNet writes through links
//! too). A character or block device, a FIFO or a socket has no contents to replace: the bytes are
//! written into it in place, as MXNet does (`/dev/null` discards them; a FIFO blocks until a reader
//! opens it). A directory is refused.

use std::fs::{self, OpenOptions};
use std::io::{ErrorKind as IoErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Result;

/// Linux gives up resolving a path after 40 links (ELOOP); so does a save.
const MAX_LINK_HOPS: usize = 40;

/// Where the bytes of a save go.
enum Destination {
    /// A regular file, or no file yet: replaced through a temporary file and a rename.
    Replace(PathBuf),
    /// A device, FIFO or socket: written into directly.
    InPlace(PathBuf),
}

/// Follow `path` through symbolic links to what a write would reach.
fn resolve(path: &Path) -> Result<Destination> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        let meta = match fs::symlink_metadata(&current) {
            Ok(meta) => meta,
            // A dangling link is followed to the file it names, which the save creates.
            Err(e) if e.kind() == IoErrorKind::NotFound => return Ok(Destination::Replace(current)),
            Err(e) => crate::bail!(Io, "cannot inspect '{}': {e}", current.display()),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            let target = fs::read_link(&current).map_err(|e| crate::err!(Io, "cannot read the link '{}': {e}", current.display()))?;
            // A relative target is relative to the link's own directory; `join` keeps an
            // absolute one as it is.
            current = current.parent().map_or_else(|| target.clone(), |dir| dir.join(&target));
        } else if kind.is_file() {
            return Ok(Destination::Replace(current));
        } else if kind.is_dir() {
            crate::bail!(Io, "'{}' is a directory, expected a file path", current.display());
        } else {
            return Ok(Destination::InPlace(current));
        }
    }
    crate::bail!(Io, "'{}': more than {MAX_LINK_HOPS} symbolic links to follow (a link loop?)", path.display())
}

/// Write `bytes` as the whole contents of the file at `path` (see the module documentation).
/// Errors name `path`, and the file a link led to when it differs.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let described = |target: &Path| {
        if target == path {
            format!("'{}'", path.display())
        } else {
            format!("'{}' (a link to '{}')", path.display(), target.display())
        }
    };
    match resolve(path).map_err(|e| e.context(format!("cannot write '{}'", path.display())))? {
        Destination::Replace(target) => replace(&target, bytes).map_err(|e| crate::err!(Io, "cannot write {}: {e}", described(&target))),
        Destination::InPlace(target) => write_in_place(&target, bytes).map_err(|e| crate::err!(Io, "cannot write {}: {e}", described(&target))),
    }
}

fn write_in_place(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // No create (it exists) and no truncate (devices and FIFOs have nothing to truncate).
    let mut file = OpenOptions::new().write(true).open(target)?;
    file.write_all(bytes)?;
    file.flush()
}

fn replace(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // Several threads may save the same path at once: the counter gives each its own temporary.
    static NEXT_TEMP: AtomicU64 = AtomicU64::new(0);
    let dir = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let file_name = target.file_name().ok_or_else(|| std::io::Error::new(IoErrorKind::InvalidInput, "the path does not name a file"))?;
    let temp = dir.join(format!(".{}.{}-{}.tmp", file_name.to_string_lossy(), std::process::id(), NEXT_TEMP.fetch_add(1, Ordering::Relaxed)));
    let existing_permissions = fs::metadata(target).ok().map(|m| m.permissions());
    let write = || -> std::io::Result<()> {
        // create_new: never write into a file someone else made under that name.
        let mut file = OpenOptions::new().write(true).create_new(true).open(&temp)?;
        file.write_all(bytes)?;
        // The replaced file keeps its permissions (a 0600 checkpoint stays private).
        if let Some(permissions) = &existing_permissions {
            file.set_permissions(permissions.clone())?;
        }
        file.sync_all()?;
        fs::rename(&temp, target)
    };
    write().inspect_err(|_| {
        // The temporary is ours and incomplete; the destination was never touched.
        let _ = fs::remove_file(&temp);
    })?;
    // Make the rename itself durable; a file system that cannot sync a directory loses nothing
    // a caller could act on, so that failure is not reported.
    if let Ok(dir_handle) = fs::File::open(dir) {
        let _ = dir_handle.sync_all();
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("oxnet-file-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replaces_regular_files_and_writes_through_links() {
        let dir = scratch("links");
        let target = dir.join("real.bin");
        fs::write(&target, b"old").unwrap();
        let link = dir.join("link.bin");
        std::os::unix::fs::symlink("real.bin", &link).unwrap();
        write_file(&link, b"new").unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
        assert_eq!(fs::read(&target).unwrap(), b"new");
        let dangling = dir.join("dangling.bin");
        std::os::unix::fs::symlink("created.bin", &dangling).unwrap();
        write_file(&dangling, b"x").unwrap();
        assert_eq!(fs::read(dir.join("created.bin")).unwrap(), b"x");
        let names: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 4, "no temporary left behind: {names:?}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn devices_are_written_in_place_and_directories_refused() {
        use std::os::unix::fs::FileTypeExt;
        write_file(Path::new("/dev/null"), b"discarded").unwrap();
        assert!(fs::metadata("/dev/null").unwrap().file_type().is_char_device(), "/dev/null is still the device");
        let dir = scratch("dir");
        let err = write_file(&dir, b"x").unwrap_err().to_string();
        assert!(err.contains("is a directory"), "{err}");
        let looped = dir.join("loop");
        std::os::unix::fs::symlink("loop", &looped).unwrap();
        let err = write_file(&looped, b"x").unwrap_err().to_string();
        assert!(err.contains("symbolic links"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
