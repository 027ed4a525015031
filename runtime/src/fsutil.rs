//! Writing files so that a reader never sees half of one and nothing a path names is
//! destroyed: the bytes for a regular file go to a temporary file in the same directory,
//! which is then renamed over the target (a rename within one file system replaces the
//! target whole, or not at all); a device or FIFO is written in place, a symbolic link
//! followed ([`write_atomic`]).

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

/// Symbolic links followed before a path is given up as a loop (Linux's own limit).
const MAX_LINK_DEPTH: usize = 40;

/// What an output path names once its symbolic links are followed, and so how it is
/// written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// A regular file, or nothing yet: written through a temporary file renamed over
    /// this path (the link's target, not the link).
    Replace(PathBuf),
    /// A character device (`/dev/null`, a terminal) or a FIFO: opened and written in
    /// place, as a shell's `>` does; renaming over it would destroy it.
    InPlace(PathBuf),
}

/// Follows `path`'s symbolic links and classifies what they end at. A directory, a
/// block device (a disk: writing a text file over one destroys it) and a socket (which
/// cannot be opened) are refused with an error naming what the path is.
fn resolve(path: &Path) -> io::Result<Target> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINK_DEPTH {
        let meta = match fs::symlink_metadata(&current) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Target::Replace(current)),
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            let link = fs::read_link(&current)?;
            current = match current.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if kind.is_file() {
            return Ok(Target::Replace(current));
        }
        if kind.is_dir() {
            return Err(refused(
                io::ErrorKind::IsADirectory,
                "is a directory; give a file name",
            ));
        }
        return special(current, kind);
    }
    Err(refused(
        io::ErrorKind::InvalidInput,
        &format!("more than {MAX_LINK_DEPTH} symbolic links to follow (a loop?)"),
    ))
}

/// Classifies a path that is neither a regular file, a directory nor a link.
#[cfg(unix)]
fn special(path: PathBuf, kind: fs::FileType) -> io::Result<Target> {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_char_device() || kind.is_fifo() {
        return Ok(Target::InPlace(path));
    }
    let what = if kind.is_block_device() {
        "is a block device; refusing to write a file over it"
    } else if kind.is_socket() {
        "is a socket, which cannot be written as a file"
    } else {
        "is not a regular file, device or FIFO"
    };
    Err(refused(io::ErrorKind::InvalidInput, what))
}

/// Classifies a path that is neither a regular file, a directory nor a link.
#[cfg(not(unix))]
fn special(_path: PathBuf, _kind: fs::FileType) -> io::Result<Target> {
    Err(refused(
        io::ErrorKind::InvalidInput,
        "is not a regular file; refusing to replace it",
    ))
}

fn refused(kind: io::ErrorKind, why: &str) -> io::Error {
    io::Error::new(kind, why.to_string())
}

/// Writes `bytes` to `path` so that nothing the path names is destroyed:
/// - a regular file (or a new one) is written through a temporary file beside it,
///   renamed over it once complete: on any failure it keeps its old contents and no
///   temporary is left;
/// - a symbolic link is followed: its target is written, the link stays;
/// - a character device (`/dev/null`) or a FIFO is opened and written in place, as a
///   shell's `>` does (a FIFO's write waits for its reader);
/// - a directory, a block device or a socket is refused with an error saying so.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match resolve(path)? {
        Target::Replace(target) => replace(&target, bytes),
        Target::InPlace(target) => {
            let mut file = OpenOptions::new().write(true).open(&target)?;
            file.write_all(bytes)?;
            file.flush()
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, renamed over it once complete.
fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
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

/// Checks, before any work, that [`write_atomic`] can later write at `path`: for a
/// regular or new file, its directory exists and accepts a new file (one is created and
/// removed again); a character device or FIFO is accepted as it is (opening a FIFO
/// would wait for its reader); what `write_atomic` refuses is refused here. `path`
/// itself is not touched.
pub fn check_writable(path: &Path) -> io::Result<()> {
    let target = match resolve(path)? {
        Target::Replace(target) => target,
        Target::InPlace(_) => return Ok(()),
    };
    let temp = temp_beside(&target);
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

    /// Runs a system command (`mkfifo`, `mknod`); whether it succeeded.
    #[cfg(unix)]
    fn made(program: &str, args: &[&std::ffi::OsStr]) -> bool {
        std::process::Command::new(program)
            .args(args)
            .status()
            .is_ok_and(|s| s.success())
    }

    /// How long a FIFO's reader may wait for what was written: a failure, not a hang.
    #[cfg(unix)]
    const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

    /// Reads `fifo` whole on another thread; its bytes come through the channel.
    #[cfg(unix)]
    fn read_in_background(fifo: &Path) -> std::sync::mpsc::Receiver<Vec<u8>> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let fifo = fifo.to_path_buf();
        std::thread::spawn(move || sender.send(fs::read(&fifo).unwrap()));
        receiver
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("fifo");
        let fifo = dir.join("pipe");
        if !made("mkfifo", &[fifo.as_os_str()]) {
            eprintln!("skipped: mkfifo is not available here");
            return;
        }
        let reader = read_in_background(&fifo);
        check_writable(&fifo).unwrap();
        write_atomic(&fifo, b"through the pipe").unwrap();
        assert_eq!(reader.recv_timeout(READ_WAIT).unwrap(), b"through the pipe");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
        // A link to the FIFO is followed: the link stays, the FIFO gets the bytes.
        let link = dir.join("link");
        std::os::unix::fs::symlink("pipe", &link).unwrap();
        let reader = read_in_background(&fifo);
        write_atomic(&link, b"again").unwrap();
        assert_eq!(reader.recv_timeout(READ_WAIT).unwrap(), b"again");
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2, "no temporary left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_device_node_is_written_in_place_and_a_block_device_refused() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("device");
        // A private null device (major 1, minor 3) and a private loop block device
        // (major 7): creating nodes needs root.
        let null = dir.join("null");
        let disk = dir.join("disk");
        if !made(
            "mknod",
            &[null.as_os_str(), "c".as_ref(), "1".as_ref(), "3".as_ref()],
        ) || !made(
            "mknod",
            &[disk.as_os_str(), "b".as_ref(), "7".as_ref(), "0".as_ref()],
        ) {
            eprintln!("skipped: creating device nodes needs root (mknod failed)");
            fs::remove_dir_all(&dir).unwrap();
            return;
        }
        check_writable(&null).unwrap();
        write_atomic(&null, b"discarded").unwrap();
        assert!(fs::metadata(&null).unwrap().file_type().is_char_device());
        let error = check_writable(&disk).unwrap_err();
        assert!(error.to_string().contains("block device"), "{error}");
        let error = write_atomic(&disk, b"x").unwrap_err();
        assert!(error.to_string().contains("block device"), "{error}");
        assert!(fs::metadata(&disk).unwrap().file_type().is_block_device());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 2, "no temporary left");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_socket_is_refused_and_kept() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("socket");
        let path = dir.join("sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let error = check_writable(&path).unwrap_err();
        assert!(error.to_string().contains("socket"), "{error}");
        assert!(write_atomic(&path, b"x").is_err());
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_socket());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_is_followed_not_replaced() {
        let dir = scratch("symlink");
        let target = dir.join("target.txt");
        write_atomic(&target, b"old").unwrap();
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink("target.txt", &link).unwrap();
        check_writable(&link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read(&target).unwrap(), b"new");
        // A dangling link creates its target.
        let dangling = dir.join("dangling");
        std::os::unix::fs::symlink("created.txt", &dangling).unwrap();
        write_atomic(&dangling, b"made").unwrap();
        assert_eq!(fs::read(dir.join("created.txt")).unwrap(), b"made");
        // A loop is an error, not a hang.
        let a = dir.join("a");
        std::os::unix::fs::symlink("b", &a).unwrap();
        std::os::unix::fs::symlink("a", dir.join("b")).unwrap();
        let error = write_atomic(&a, b"x").unwrap_err();
        assert!(error.to_string().contains("symbolic links"), "{error}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
