//! The cluster's admin token: the credential of the `Cluster` service's calls that change or
//! reveal what only operators may (backups, which hold the signing key; membership; keys; the
//! token floor) on a server **without a policy**. With a policy, the admin right decides
//! instead, and this token is not accepted.
//!
//! - **What it is.** `padm_` and 64 hex digits: the SHA-256 of a fixed label and the cluster's
//!   founding signing key, which every member holds. Every member therefore derives the same
//!   token, so a call forwarded to whichever member leads is accepted there too, and nothing
//!   new needs replicating.
//! - **Where it is.** Each member writes it to `admin.token` in its data directory (mode 0600,
//!   in the directory of mode 0700) at every start and when it is admitted to a cluster (its key
//!   is then the cluster's). Whoever can read that file can read `signing.key` beside it: the
//!   token gives no one anything the directory did not.
//! - **How it is sent.** As a bearer token: `palisade --token-file DATA_DIR/admin.token cluster
//!   backup FILE` (or `PALISADE_AUTH_TOKEN_FILE`). It is compared in constant time
//!   ([`crate::auth::Auth::identity`]). Without a policy, every other call takes it too (as an
//!   anonymous caller, which may do everything else there), so it can stay in the environment.
//! - **Rotation.** It changes only with the founding key, that is never within one cluster: a
//!   token copied out of the data directory stays valid. Keep it where the key is, or configure a
//!   policy, whose admin tokens are revoked by editing the token file.

use std::io;
use std::path::Path;

use palisade_sequencer::SigningKey;
use sha2::{Digest, Sha256};

use crate::files::{SECRET_FILE_MODE, write_file_atomically};

/// The admin token's file in a data directory.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

/// What separates this use of the founding key from every other.
const DERIVATION_LABEL: &[u8] = b"palisade admin token v1\0";

/// The prefix of every admin token, so that one is recognised where it is pasted.
const PREFIX: &str = "padm_";

/// The admin token of the cluster whose founding key is `founding`.
pub fn derive(founding: &SigningKey) -> String {
    let digest = Sha256::new()
        .chain_update(DERIVATION_LABEL)
        .chain_update(founding.to_bytes())
        .finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{hex}")
}

/// Writes the admin token of `founding` to `data_dir`'s [`ADMIN_TOKEN_FILE`] (0600), unless it
/// holds it already.
pub(crate) fn write(data_dir: &Path, founding: &SigningKey) -> io::Result<()> {
    let token = derive(founding);
    let line = format!("{token}\n");
    match std::fs::read(data_dir.join(ADMIN_TOKEN_FILE)) {
        Ok(bytes) if bytes == line.as_bytes() => Ok(()),
        _ => write_file_atomically(
            data_dir,
            ADMIN_TOKEN_FILE,
            line.as_bytes(),
            Some(SECRET_FILE_MODE),
        ),
    }
}

/// Whether `presented` is `expected`, compared in constant time: digests of both, compared
/// byte by byte without an early exit, so timing tells nothing whatever the lengths.
pub(crate) fn same(presented: &str, expected: &str) -> bool {
    let expected = Sha256::digest(expected.as_bytes());
    let presented = Sha256::digest(presented.as_bytes());
    let difference = expected
        .iter()
        .zip(presented.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_clusters_own_token_passes() {
        let founding = SigningKey::generate();
        let token = derive(&founding);
        assert!(token.starts_with(PREFIX) && token.len() == PREFIX.len() + 64);
        assert_eq!(derive(&founding), token, "every member derives the same");
        assert!(same(&token, &derive(&founding)));
        assert!(!same(&token[..20], &token));
        assert!(!same("", &token));
        assert!(!same(&derive(&SigningKey::generate()), &token));
    }

    #[test]
    fn the_file_is_written_0600_and_follows_the_key() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let founding = SigningKey::generate();
        write(dir.path(), &founding).unwrap();
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", derive(&founding))
        );
        let admitted = SigningKey::generate();
        write(dir.path(), &admitted).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            format!("{}\n", derive(&admitted))
        );
    }
}
