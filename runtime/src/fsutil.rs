//! Writing files so that a reader never sees half of one: the bytes go to a temporary
//! file in the same directory, which is then renamed over the target (a rename within one
//! file system replaces the target whole, or not at all).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Distinguishes temporary files of one process (threads may write beside each other).
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh temporary name beside `path`: `.NAME.PID-N.tmp` in `path`'s directory.
fn temp_beside(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "hetsched".into());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}-{n}.tmp", std::process::id()))
}

/// Writes `bytes` to `path` through a temporary file beside it, renamed over `path` once
/// complete: on any failure `path` keeps its old contents and no temporary is left.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = temp_beside(path);
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&temp, path)
    })();
    if written.is_err() {
        // Best effort: the error that matters is the write's.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Checks, before any work, that a file can later be written at `path`: its directory
/// exists and accepts a new file (one is created and removed again). `path` itself is
/// not touched.
pub fn check_writable(path: &Path) -> io::Result<()> {
    if path.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory; give a file name",
        ));
    }
    let temp = temp_beside(path);
    let dir = match temp.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("directory {} does not exist", dir.display()),
        ));
    }
    File::create_new(&temp)?;
    fs::remove_file(&temp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("hetsched-fsutil-{}-{name}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let dir = scratch("replace");
        let path = dir.join("out.txt");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_directory_fails_the_check_and_the_write() {
        let dir = scratch("missing");
        let path = dir.join("no-such-dir").join("out.txt");
        assert!(check_writable(&path).is_err());
        assert!(write_atomic(&path, b"x").is_err());
        assert!(check_writable(&dir.join("fine.txt")).is_ok());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        assert!(check_writable(&dir).is_err(), "a directory is no file name");
        fs::remove_dir_all(&dir).unwrap();
    }
}
