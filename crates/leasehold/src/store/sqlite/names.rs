//! One database file, one name.
//!
//! SQLite finds a database's `-wal` and `-shm`, and leasehold its
//! `-notify`, by the path the database was opened by. A file reached by two
//! names — a hard link, or one file bind-mounted by itself into two
//! folders (`docker -v /host/lease.db:/app/lease.db` for two containers) —
//! has two sets of them: processes using one name never see what those
//! using the other wrote, and both are granted the same election with the
//! same token. (A symbolic link is followed to its file's folder, and a
//! bind-mounted folder keeps its device and inode: both are one name.)
//!
//! So a file's identity is its inode, and a name is the folder's device and
//! inode with the file name in it. Every handle holds, for its life, a read
//! lock (an open file description lock, which the kernel keeps per inode,
//! in every mount namespace and container of the host) on one byte of the
//! database file itself, chosen by its name, far past SQLite's own lock
//! bytes. Before it reads or writes anything, a handle takes its byte and
//! then asks the kernel whether any other name's byte is held: if so, it
//! refuses to open. Each takes before it looks, so of two names opened at
//! once at least one sees the other. Two names could share a byte only if
//! their 32-bit hashes collide.
//!
//! A writer that opened also records its name in an extended attribute of
//! the file (`user.leasehold.name`), so that a refused name can be told
//! which name uses the file; where the filesystem keeps no such attribute,
//! the refusal says "another name". The last handle of a name to close
//! removes the record once SQLite has emptied that name's `-wal` into the
//! file. A record of another name that is still there when a name is
//! opened means that name's processes died: its `-wal` may hold grants not
//! yet in the file, which every other name would miss (and which a later
//! opening of that name would replay over theirs). So the name is refused,
//! unless that `-wal` can be seen to be empty or gone.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::fcntl::FcntlArg;
use nix::libc;

use crate::error::{Error, Result};

/// The first of the bytes names lock: far past SQLite's lock bytes (at
/// 1 GiB) and any database leasehold writes.
const FIRST_NAME_BYTE: i64 = 1 << 40;
/// How many bytes names are spread over.
const NAME_BYTES: i64 = 1 << 32;
/// The extended attribute that records the name a writer uses.
const ATTRIBUTE: &str = "user.leasehold.name";

/// A name of the database file: its folder's device and inode, and its
/// file name there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Name {
    dev: u64,
    ino: u64,
    file: Vec<u8>,
}

impl Name {
    fn of(path: &Path) -> std::io::Result<Self> {
        let folder = match path.parent() {
            Some(folder) if !folder.as_os_str().is_empty() => folder,
            _ => Path::new("."),
        };
        let meta = std::fs::metadata(folder)?;
        Ok(Name {
            dev: meta.dev(),
            ino: meta.ino(),
            file: path
                .file_name()
                .map(|f| f.as_bytes().to_vec())
                .unwrap_or_default(),
        })
    }

    /// The byte this name locks: FNV-1a of the name, a hash that stays the
    /// same in every build.
    fn byte(&self) -> i64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let bytes = self.dev.to_le_bytes().into_iter();
        let bytes = bytes
            .chain(self.ino.to_le_bytes())
            .chain(self.file.iter().copied());
        for b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        FIRST_NAME_BYTE + i64::try_from(hash % NAME_BYTES.unsigned_abs()).unwrap_or(0)
    }
}

fn lock_arg(kind: libc::c_int, start: i64, len: i64) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        // Must be 0 for OFD locks.
        l_pid: 0,
    }
}

/// The byte of another name held on `file` within `start..start + len`.
fn other_name_in(file: &File, start: i64, len: i64) -> nix::Result<Option<i64>> {
    if len <= 0 {
        return Ok(None);
    }
    let mut arg = lock_arg(libc::F_WRLCK, start, len);
    nix::fcntl::fcntl(file, FcntlArg::F_OFD_GETLK(&mut arg))?;
    Ok((libc::c_int::from(arg.l_type) != libc::F_UNLCK).then_some(arg.l_start))
}

/// Takes `path`'s name on the database `file` (held by the open file
/// description for as long as `file` is open) and refuses, with
/// [`Error::Conflict`], a file that another name uses now. Where the
/// kernel cannot lock the file (a filesystem without such locks), nothing
/// is checked.
pub(super) fn claim(file: &File, path: &Path, read_only: bool) -> Result<()> {
    let name = match Name::of(path) {
        Ok(name) => name,
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "cannot identify the database's folder; its names are not checked");
            return Ok(());
        }
    };
    let byte = name.byte();
    let mine = lock_arg(libc::F_RDLCK, byte, 1);
    if let Err(error) = nix::fcntl::fcntl(file, FcntlArg::F_OFD_SETLK(&mine)) {
        tracing::debug!(path = %path.display(), %error, "cannot lock the database file; its names are not checked");
        return Ok(());
    }
    let end = FIRST_NAME_BYTE + NAME_BYTES;
    let other = other_name_in(file, FIRST_NAME_BYTE, byte - FIRST_NAME_BYTE)
        .and_then(|o| match o {
            Some(o) => Ok(Some(o)),
            None => other_name_in(file, byte + 1, end - byte - 1),
        })
        .unwrap_or_else(|error| {
            tracing::debug!(path = %path.display(), %error, "cannot test the database file's locks; its names are not checked");
            None
        });
    if let Some(other) = other {
        return Err(Error::Conflict(refusal(file, path, other)));
    }
    if let Some(left) = left_by_another(file, &name) {
        return Err(Error::Conflict(left_behind(path, &left)));
    }
    if !read_only {
        record(file, path, &name);
    }
    Ok(())
}

/// A name's record, as [`record`] writes it.
#[derive(Debug)]
struct Recorded {
    name: Name,
    byte: i64,
    path: std::path::PathBuf,
}

fn recorded(file: &File) -> Option<Recorded> {
    let text = xattr::FileExt::get_xattr(file, ATTRIBUTE).ok().flatten()?;
    let at = text.iter().position(|&b| b == b' ')?;
    let mut head = std::str::from_utf8(&text[..at]).ok()?.split(':');
    let (dev, ino, byte) = (head.next()?, head.next()?, head.next()?);
    let path = Path::new(OsStr::from_bytes(&text[at + 1..])).to_owned();
    Some(Recorded {
        name: Name {
            dev: dev.parse().ok()?,
            ino: ino.parse().ok()?,
            file: path.file_name()?.as_bytes().to_vec(),
        },
        byte: byte.parse().ok()?,
        path,
    })
}

/// Another name's record left on `file`, whose `-wal` cannot be seen to
/// be empty or gone from here (see the module's documentation).
fn left_by_another(file: &File, mine: &Name) -> Option<Recorded> {
    let other = recorded(file)?;
    if other.name == *mine {
        return None;
    }
    // Its folder, if it is the one at its path here: then its -wal tells.
    let seen = Name::of(&other.path).is_ok_and(|here| here == other.name);
    let mut wal = other.path.as_os_str().to_owned();
    wal.push("-wal");
    let empty = || std::fs::symlink_metadata(&wal).map_or(true, |m| m.len() == 0);
    (!seen || !empty()).then_some(other)
}

fn left_behind(path: &Path, other: &Recorded) -> String {
    format!(
        "{} was last used as {}, whose processes did not close it (killed, or their host or \
         container gone): its -wal may hold grants that are not yet in the database, and another \
         name would not see them. Open it once as {} (`leasehold campaign` or `run` there empties \
         that -wal into the file; reading commands write nothing), and use one path for every replica; if those files are gone for \
         good, remove the record with `setfattr -x {ATTRIBUTE} {}` and know that tokens granted \
         there may be granted again. Nothing was written",
        path.display(),
        other.path.display(),
        other.path.display(),
        path.display()
    )
}

/// Removes `path`'s record from `file` once no other handle uses the name
/// and SQLite emptied its `-wal` (it deletes it on the last close): the
/// name's processes closed it, so another name may be used.
pub(super) fn forget(file: &File, path: &Path) {
    let Ok(name) = Name::of(path) else {
        return;
    };
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if std::fs::symlink_metadata(&wal).is_ok_and(|m| m.len() > 0) {
        return;
    }
    let byte = name.byte();
    if !matches!(other_name_in(file, byte, 1), Ok(None)) {
        return;
    }
    if recorded(file).is_some_and(|r| r.name == name && r.byte == byte)
        && let Err(error) = xattr::FileExt::remove_xattr(file, ATTRIBUTE)
    {
        tracing::debug!(path = %path.display(), %error, "cannot remove the database's name record");
    }
}

/// The attribute's text: `{dev}:{ino}:{byte} {path}`.
fn record(file: &File, path: &Path, name: &Name) {
    let mut text = format!("{}:{}:{} ", name.dev, name.ino, name.byte()).into_bytes();
    text.extend_from_slice(path.as_os_str().as_bytes());
    let same = xattr::FileExt::get_xattr(file, ATTRIBUTE)
        .ok()
        .flatten()
        .is_some_and(|kept| kept == text);
    if same {
        return;
    }
    if let Err(error) = xattr::FileExt::set_xattr(file, ATTRIBUTE, &text) {
        tracing::warn!(path = %path.display(), %error,
            "cannot record the database's name in an extended attribute: if every replica using this path is killed, another path to the same file is not kept away; use one path for every replica");
    }
}

/// The refusal of `path`, naming the name that holds `byte` when the
/// file's attribute records it.
fn refusal(file: &File, path: &Path, byte: i64) -> String {
    let shown = path.display();
    let recorded = xattr::FileExt::get_xattr(file, ATTRIBUTE).ok().flatten();
    let first = recorded.as_deref().and_then(|text| {
        let (head, other) = text.split_at(text.iter().position(|&b| b == b' ')?);
        let held: i64 = std::str::from_utf8(head)
            .ok()?
            .rsplit(':')
            .next()?
            .parse()
            .ok()?;
        (held == byte).then(|| Path::new(OsStr::from_bytes(&other[1..])).to_owned())
    });
    let other = match first {
        Some(first) if first == path => format!(
            "under the same path {} in another mount namespace (another container: a bind mount of the file itself)",
            first.display()
        ),
        Some(first) => format!("as {}", first.display()),
        None => "under another name (a hard link, or a bind mount of the file itself)".to_owned(),
    };
    format!(
        "{shown} is a database file that is in use now {other}; SQLite and leasehold keep their \
         -wal, -shm and -notify files next to each name, so two names would give two leaders: \
         use one path for every replica (in containers, mount the folder that holds the database, \
         not the file); nothing was written"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_its_folder_and_file_name() {
        let dir = tempfile::tempdir().expect("dir");
        let a = Name::of(&dir.path().join("db")).expect("name");
        let b = Name::of(&dir.path().join("db")).expect("name");
        let c = Name::of(&dir.path().join("db2")).expect("name");
        assert_eq!(a, b);
        assert_eq!(a.byte(), b.byte());
        assert_ne!(a.byte(), c.byte());
        assert!((FIRST_NAME_BYTE..FIRST_NAME_BYTE + NAME_BYTES).contains(&a.byte()));
    }
}
