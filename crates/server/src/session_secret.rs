//! Session secrets: the credential of whoever opened a session (invariant 12, only the
//! session's owner acts for it).
//!
//! Opening a session hands the opener a 32-byte secret; every call that acts for the session
//! (a keepalive renewal, `Renew`, `Acquire`, `Release`, `CloseSession`) must present it, and the
//! leader checks it against the session's digest before it proposes anything. Session ids are
//! sequential and shown to everyone (`Status`, `ListLocks`, `Watch`): they name a session, they
//! do not prove ownership of one.
//!
//! - **Where it comes from.** An open without an open key gets a secret drawn by the leader
//!   from [`crate::entropy`]. An open with an open key gets `HMAC-SHA256(k, open key)`, where
//!   `k` is derived from the cluster's founding key, which every member holds: a retry of the
//!   open (the same key, at the same or another member, after a failover too) gets the session
//!   the key opened *and the same secret*, although nothing but the digest was stored. This
//!   hands out nothing new: whoever presents a live session's open key is handed the session
//!   already. An open key reused after its session ended opens a new session with the same
//!   secret, which again only its holder can present.
//! - **What is stored.** Only the SHA-256 digest ([`SecretDigest`]), in the `OpenSession`
//!   entry and from there in the table and its snapshots, so every member and every later
//!   leader can check a secret; and of the open key only a keyed hash ([`open_key_index`]), so
//!   the log holds nothing that acts for a session (N12: it held the open key itself, which
//!   anyone could present to be handed the session and its secret).
//! - **How it is checked.** The presented secret is hashed and the digests are compared in
//!   constant time ([`check`]).
//! - **Sessions from before secrets** (an old log or snapshot, no digest) are acted for by their
//!   id alone until they end, as they were when opened: refusing them would take every lock
//!   from its holder across an upgrade. They end when their owner stops renewing them (a
//!   lease is at most a day).

use palisade_core::{CoreError, OpenKey, SecretDigest, SessionId};
use palisade_sequencer::SigningKey;
use sha2::{Digest, Sha256};

use crate::entropy;

/// The length of a session secret, in bytes (256 bits).
pub const SESSION_SECRET_BYTES: usize = 32;

/// What separates this use of the founding key from every other.
const DERIVATION_LABEL: &[u8] = b"palisade session secrets v1\0";

/// The label of the key that turns an open key into what the table indexes sessions by.
const INDEX_DERIVATION_LABEL: &[u8] = b"palisade open key index v1\0";

/// A session's secret, as the opener receives it. `Debug` does not show it.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionSecret([u8; SESSION_SECRET_BYTES]);

impl SessionSecret {
    /// A fresh secret for an open without an open key.
    pub(crate) fn draw() -> std::io::Result<SessionSecret> {
        let mut bytes = [0u8; SESSION_SECRET_BYTES];
        entropy::fill(&mut bytes)?;
        Ok(SessionSecret(bytes))
    }

    /// The secret of the session `open_key` opens, the same at every member of the cluster
    /// whose founding key is `founding`.
    pub(crate) fn for_open_key(founding: &SigningKey, open_key: &OpenKey) -> SessionSecret {
        let key = derived_key(founding, DERIVATION_LABEL);
        SessionSecret(hmac_sha256(&key, open_key.as_bytes()))
    }

    /// What the table keeps of it.
    pub fn digest(&self) -> SecretDigest {
        digest_of(&self.0)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// What the table keeps of `open_key`, and what the `OpenSession` entry carries:
/// `HMAC-SHA256(k', open key)`, with `k'` derived from the founding key under a label of its
/// own (N12). The same at every member, so a retried open finds its session anywhere; and
/// neither the index nor the log, a snapshot or a backup that holds it acts for the session: an
/// open presenting the index gets the index of the index, another session.
///
/// An index of 32 equal bytes (a chance of 2⁻²⁴⁸) is no valid key; the open is refused.
pub(crate) fn open_key_index(
    founding: &SigningKey,
    open_key: &OpenKey,
) -> Result<OpenKey, CoreError> {
    let key = derived_key(founding, INDEX_DERIVATION_LABEL);
    OpenKey::new(&hmac_sha256(&key, open_key.as_bytes())).map_err(CoreError::InvalidOpenKey)
}

/// `SHA-256(label, founding key)`: a key for one use of the founding key, which gives away
/// neither the founding key nor the key of another use.
fn derived_key(founding: &SigningKey, label: &[u8]) -> [u8; 32] {
    let mut derivation = Sha256::new();
    derivation.update(label);
    derivation.update(founding.to_bytes());
    derivation.finalize().into()
}

/// Whether `presented` may act for `session`, whose digest is `stored` (`None`: a session from
/// before secrets, acted for by its id alone).
pub(crate) fn check(
    session: SessionId,
    presented: &[u8],
    stored: Option<SecretDigest>,
) -> Result<(), CoreError> {
    let Some(stored) = stored else {
        return Ok(());
    };
    if presented.is_empty() {
        return Err(CoreError::SessionSecretMissing { session });
    }
    // Hashing first makes the comparison independent of the presented length, and comparing
    // every byte without an early exit leaks nothing of the stored digest through timing.
    let presented = digest_of(presented);
    let difference = presented
        .as_bytes()
        .iter()
        .zip(stored.as_bytes())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if std::hint::black_box(difference) == 0 {
        Ok(())
    } else {
        Err(CoreError::SessionSecretWrong { session })
    }
}

fn digest_of(bytes: &[u8]) -> SecretDigest {
    SecretDigest::new(Sha256::digest(bytes).into())
}

/// HMAC-SHA256 (RFC 2104) with a 32-byte key.
fn hmac_sha256(key: &[u8; 32], message: &[u8]) -> [u8; 32] {
    const BLOCK_BYTES: usize = 64;
    let mut padded = [0u8; BLOCK_BYTES];
    padded[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| padded.map(|k| k ^ byte);
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2_construction() {
        // RFC 4231 test case 2 has a 4-byte key ("Jefe"), zero-padded like any short key.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        let mac = hmac_sha256(&key, b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn only_the_secret_itself_passes() {
        let session = SessionId::new(4);
        let secret = SessionSecret::draw().unwrap();
        let stored = Some(secret.digest());
        assert_eq!(check(session, secret.as_bytes(), stored), Ok(()));
        assert_eq!(
            check(session, b"", stored),
            Err(CoreError::SessionSecretMissing { session })
        );
        let other = SessionSecret::draw().unwrap();
        assert_ne!(other, secret, "two draws differ");
        assert_eq!(
            check(session, other.as_bytes(), stored),
            Err(CoreError::SessionSecretWrong { session })
        );
        assert_eq!(
            check(session, &secret.as_bytes()[..31], stored),
            Err(CoreError::SessionSecretWrong { session })
        );
        assert_eq!(
            check(session, b"", None),
            Ok(()),
            "a session from before secrets"
        );
    }

    #[test]
    fn an_open_key_gives_the_same_secret_under_the_same_founding_key_only() {
        let founding = SigningKey::generate();
        let key = OpenKey::new(&[7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap();
        let other_key =
            OpenKey::new(&[8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap();
        let secret = SessionSecret::for_open_key(&founding, &key);
        assert_eq!(SessionSecret::for_open_key(&founding, &key), secret);
        assert_ne!(SessionSecret::for_open_key(&founding, &other_key), secret);
        assert_ne!(
            SessionSecret::for_open_key(&SigningKey::generate(), &key),
            secret
        );
        assert_ne!(secret.as_bytes(), key.as_bytes());
    }

    /// N12: the table's index of an open key is the same at every member (one founding key),
    /// and is neither the key, nor the secret, nor anything that opens the key's session.
    #[test]
    fn an_open_keys_index_is_stable_and_gives_away_neither_the_key_nor_the_secret() {
        let founding = SigningKey::generate();
        let key = OpenKey::new(&[7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]).unwrap();
        let index = open_key_index(&founding, &key).unwrap();
        assert_eq!(open_key_index(&founding, &key).unwrap(), index);
        assert_eq!(index.as_bytes().len(), 32);
        assert_ne!(index.as_bytes(), key.as_bytes());
        assert_ne!(
            index.as_bytes(),
            SessionSecret::for_open_key(&founding, &key).as_bytes()
        );
        // Presented as an open key, the index is indexed again: another session.
        assert_ne!(open_key_index(&founding, &index).unwrap(), index);
        assert_ne!(
            open_key_index(&SigningKey::generate(), &key).unwrap(),
            index
        );
    }
}
