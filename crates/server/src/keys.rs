//! The service's Ed25519 signing key, created on first start and kept in the data directory.

use std::io::{self, Write as _};
use std::path::Path;

use palisade_sequencer::SigningKey;

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
            let key = SigningKey::generate();
            let temporary = dir.join(format!("{KEY_FILE}.tmp"));
            {
                let mut options = std::fs::OpenOptions::new();
                options.write(true).create(true).truncate(true);
                #[cfg(unix)]
                std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
                let mut file = options.open(&temporary)?;
                file.write_all(&key.to_bytes())?;
                file.sync_all()?;
            }
            std::fs::rename(&temporary, &path)?;
            std::fs::File::open(dir)?.sync_all()?;
            tracing::info!(path = %path.display(), "created the sequencer signing key");
            Ok(key)
        }
        Err(e) => Err(e),
    }
}
