//! The sidecar's unix socket (`--socket PATH`): bound in a private folder
//! (mode 0700) and made mode 0600 there, then moved to PATH only if
//! nothing is there, so that it is never reachable by others, even for a
//! moment. A socket of this user's that nobody serves on (left by a
//! sidecar that was killed) is replaced; any other file is refused and
//! left as it is.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};

/// A bound socket at its path, removed when dropped if it is still the one
/// bound there.
pub struct BoundSocket {
    path: PathBuf,
    /// Device and inode of the socket file bound.
    id: (u64, u64),
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && (meta.dev(), meta.ino()) == self.id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the socket at `path` (see the module's documentation).
pub fn bind(path: &Path) -> anyhow::Result<(tokio::net::UnixListener, BoundSocket)> {
    let shown = path.display();
    clear(path)?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let private = nix::unistd::mkdtemp(&parent.join(".leasehold-socket-XXXXXX"))
        .with_context(|| format!("cannot create a folder beside --socket {shown}"))?;
    let staged = private.join("socket");
    let bound = stage(&staged, path);
    let _ = std::fs::remove_file(&staged);
    let _ = std::fs::remove_dir(&private);
    let listener = bound?;
    let meta =
        std::fs::symlink_metadata(path).with_context(|| format!("--socket {shown} is gone"))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    Ok((
        listener,
        BoundSocket {
            path: path.to_owned(),
            id: (meta.dev(), meta.ino()),
        },
    ))
}

/// Binds at `staged`, makes it mode 0600, moves it to `path` unless a file
/// is there by now.
fn stage(staged: &Path, path: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
    let shown = path.display();
    let listener = std::os::unix::net::UnixListener::bind(staged)
        .with_context(|| format!("cannot create --socket {shown}"))?;
    std::fs::set_permissions(staged, std::fs::Permissions::from_mode(0o600))?;
    match renameat2(
        AT_FDCWD,
        staged,
        AT_FDCWD,
        path,
        RenameFlags::RENAME_NOREPLACE,
    ) {
        Ok(()) => Ok(listener),
        Err(nix::errno::Errno::EEXIST) => {
            bail!("--socket {shown}: a file appeared there meanwhile; leasehold leaves it as it is")
        }
        Err(error) => Err(error).with_context(|| format!("cannot create --socket {shown}")),
    }
}

/// Makes room at `path`: nothing there, or a stale socket of this user's
/// (removed). Refuses anything else.
fn clear(path: &Path) -> anyhow::Result<()> {
    let shown = path.display();
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot use --socket {shown}")),
    };
    if !meta.file_type().is_socket() {
        bail!(
            "--socket {shown} is a file that is not a socket; leasehold leaves it as it is: remove it or choose another path"
        );
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        bail!("--socket {shown} is another user's socket; leasehold leaves it as it is");
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => bail!(
            "--socket {shown}: another process serves on it (another sidecar?); choose another path"
        ),
        Err(error) if error.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::info!(socket = %shown, "replacing a socket nobody serves on");
            std::fs::remove_file(path).with_context(|| format!("cannot replace --socket {shown}"))
        }
        Err(error) => Err(error).with_context(|| format!("cannot use --socket {shown}")),
    }
}
