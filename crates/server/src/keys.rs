//! The service's Ed25519 signing key, created on first start and kept in the data directory.

use std::io;
use std::path::Path;

use palisade_sequencer::SigningKey;

use crate::files::{SECRET_FILE_MODE, write_file_atomically};

const KEY_FILE: &str = "signing.key";

/// Loads the signing key from `dir`, creating it (owner-only permissions) on first start.
///
/// The file is opened without following a symbolic link (a link planted in its place is
/// refused rather than read), must be a regular file, and is left owner-only: a key file
/// found readable by others (copied in with a loose umask, say) is tightened, with a warning,
/// since whoever read it can sign sequencers.
pub fn load_or_create(dir: &Path) -> io::Result<SigningKey> {
    let path = dir.join(KEY_FILE);
    match read_key_file(&path) {
        Ok(bytes) => {
            let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} is not a 32-byte Ed25519 key", path.display()),
                )
            })?;
            Ok(SigningKey::from_bytes(bytes))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let key = crate::entropy::signing_key()?;
            store(dir, &key)?;
            tracing::info!(path = %path.display(), "created the sequencer signing key");
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

/// The key file's bytes: no symbolic link followed, a regular file, at most a little more
/// than a key, left with [`SECRET_FILE_MODE`].
fn read_key_file(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, nix::libc::O_NOFOLLOW);
    let file = options.open(path).map_err(|error| {
        if error.raw_os_error() == Some(nix::libc::ELOOP) {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is a symbolic link; the signing key must be a file of its own",
                    path.display()
                ),
            )
        } else {
            error
        }
    })?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & !SECRET_FILE_MODE != 0 {
            file.set_permissions(std::fs::Permissions::from_mode(SECRET_FILE_MODE))?;
            tracing::warn!(
                path = %path.display(),
                "the signing key was readable by others (mode {mode:o}); made owner-only. Whoever read it can sign sequencers: rotate the key (palisade keys) if that may have happened"
            );
        }
    }
    let mut bytes = Vec::new();
    // One byte more than a key is enough to tell a key from something longer.
    file.take(33).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Replaces the key in `dir` with `key` (owner-only permissions), atomically and durably.
pub fn store(dir: &Path, key: &SigningKey) -> io::Result<()> {
    write_file_atomically(dir, KEY_FILE, &key.to_bytes(), Some(SECRET_FILE_MODE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_key_file_found_readable_by_others_is_made_owner_only() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let key = load_or_create(dir.path()).unwrap();
        let path = dir.path().join(KEY_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loaded = load_or_create(dir.path()).unwrap();
        assert_eq!(loaded.to_bytes(), key.to_bytes());
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SECRET_FILE_MODE);
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_that_is_a_symbolic_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let planted = load_or_create(elsewhere.path()).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join(KEY_FILE), dir.path().join(KEY_FILE))
            .unwrap();
        let error = match load_or_create(dir.path()) {
            Ok(key) => panic!(
                "a linked key was used (the planted one: {})",
                key.to_bytes() == planted.to_bytes()
            ),
            Err(error) => error,
        };
        assert!(error.to_string().contains("symbolic link"), "{error}");
    }
}
