//! Replacing a file so that a crash leaves either the old contents or the new, never a mix: the
//! snapshot, the signing key and the compacted log all go through [`write_file_atomically`].

use std::fs::File;
use std::io::{self, Write as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Permissions of every file that holds a signing key: the key file, and the log and snapshots,
/// which carry the keys of a rotation. Owner only.
pub const SECRET_FILE_MODE: u32 = 0o600;

/// Permissions of the data directory: owner only, so no other user can list it, read a file
/// created in it before its mode was set, or swap a file for a link to one of theirs.
pub const DATA_DIR_MODE: u32 = 0o700;

/// Creates the data directory `dir` if needed, and leaves it (new or not) with
/// [`DATA_DIR_MODE`].
pub fn create_data_dir(dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
        if mode != DATA_DIR_MODE {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(DATA_DIR_MODE))?;
            tracing::info!(dir = %dir.display(), "data directory made owner-only (was {mode:o})");
        }
    }
    Ok(())
}

/// Writes `bytes` to `dir/name` through a temporary file in the same directory: written,
/// fsynced, renamed over the old file, then the directory fsynced so the rename is durable.
/// `mode` sets the permissions of the new file on Unix ([`SECRET_FILE_MODE`] for secrets).
pub fn write_file_atomically(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: Option<u32>,
) -> io::Result<()> {
    // A name of its own per call: a snapshot being built and one being installed may overlap.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let write = WRITES.fetch_add(1, Ordering::Relaxed);
    let temporary = dir.join(format!("{name}.{write}.tmp"));
    // A temporary left by a crashed earlier run is removed rather than reused: its permissions
    // may be wider than `mode`.
    match std::fs::remove_file(&temporary) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let written = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        if let Some(mode) = mode {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
        }
        #[cfg(not(unix))]
        let _ = mode;
        let mut file = options.open(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temporary, dir.join(name))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// The first `limit` bytes of the small file at `path`, and one more (so that a caller can tell
/// a file longer than its limit), or `None` if there is no such file.
pub(crate) fn read_small_file(path: &Path, limit: u64) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(file) => file.take(limit + 1).read_to_end(&mut bytes)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn the_data_directory_is_owner_only_whether_new_or_found_open() {
        use std::os::unix::fs::PermissionsExt as _;
        let parent = tempfile::tempdir().unwrap();
        let mode = |dir: &Path| std::fs::metadata(dir).unwrap().permissions().mode() & 0o777;
        let new = parent.path().join("new/data");
        create_data_dir(&new).unwrap();
        assert_eq!(mode(&new), DATA_DIR_MODE);
        let open = parent.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        create_data_dir(&open).unwrap();
        assert_eq!(mode(&open), DATA_DIR_MODE);
    }

    #[test]
    fn a_replaced_file_holds_the_new_bytes_with_the_mode_asked_for_and_no_temporary_is_left() {
        let dir = tempfile::tempdir().unwrap();
        write_file_atomically(dir.path(), "key", b"old", None).unwrap();
        write_file_atomically(dir.path(), "key", b"new", Some(0o600)).unwrap();
        assert_eq!(std::fs::read(dir.path().join("key")).unwrap(), b"new");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.path().join("key"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        assert_eq!(names, ["key"]);
    }
}
