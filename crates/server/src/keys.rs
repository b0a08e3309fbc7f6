//! The service's Ed25519 signing key, created on first start and kept in the data directory.

use std::io;
use std::path::Path;

use palisade_sequencer::SigningKey;

use crate::files::{SECRET_FILE_MODE, write_file_atomically};

const KEY_FILE: &str = "signing.key";

/// Loads the signing key from `dir`, creating it (owner-only permissions) on first start.
pub fn load_or_create(dir: &Path) -> io::Result<SigningKey> {
    let path = dir.join(KEY_FILE);
    match std::fs::read(&path) {
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

/// Replaces the key in `dir` with `key` (owner-only permissions), atomically and durably.
pub fn store(dir: &Path, key: &SigningKey) -> io::Result<()> {
    write_file_atomically(dir, KEY_FILE, &key.to_bytes(), Some(SECRET_FILE_MODE))
}
