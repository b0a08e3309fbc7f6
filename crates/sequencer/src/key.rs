//! The lock service's Ed25519 key pair: the signing half stays in the service, the public half is
//! given to every resource (`palisade pubkey`, `--public-key`). Every key has a [`KeyId`], the
//! first 8 bytes of the SHA-256 of its public half, which each sequencer names so that a resource
//! trusting several keys (a [`crate::KeySet`]) knows which one to check it with.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::Signer as _;
use palisade_core::limits::TOKEN_MAX;
use palisade_core::{Access, LockName, PERMITS_MAX, SessionId, Token};

use crate::error::{KeyIdError, PublicKeyError, SequencerError, SignError};
use crate::sequencer::{Sequencer, VerifiedSequencer};
use crate::{
    KEY_ID_HEX_DIGITS, PUBLIC_KEY_PREFIX, SEQUENCER_BYTES_MAX, SEQUENCER_PREFIX,
    SEQUENCER_PREFIX_ACCESS,
};

/// The lock service's secret key. Its `Debug` output shows only the public half.
#[derive(Clone)]
pub struct SigningKey {
    inner: ed25519_dalek::SigningKey,
}

impl SigningKey {
    /// A fresh key from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system cannot provide randomness; use [`SigningKey::try_generate`] to
    /// handle that.
    pub fn generate() -> SigningKey {
        SigningKey::try_generate().expect("the operating system random number generator failed")
    }

    /// A fresh key, or the error of the operating system's random number generator.
    pub fn try_generate() -> Result<SigningKey, getrandom::Error> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)?;
        let key = SigningKey::from_bytes(secret);
        // Do not leave a copy of the secret on the stack longer than needed.
        secret.fill(0);
        Ok(key)
    }

    /// The key whose 32-byte secret is `secret` (as stored by the service).
    pub fn from_bytes(secret: [u8; 32]) -> SigningKey {
        SigningKey {
            inner: ed25519_dalek::SigningKey::from_bytes(&secret),
        }
    }

    /// The 32-byte secret, for the service to persist. Handle with care.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.inner.to_bytes()
    }

    /// The public half, for resources.
    pub fn public_key(&self) -> PublicKey {
        PublicKey {
            inner: self.inner.verifying_key(),
        }
    }

    /// The id of this key (of its public half).
    pub fn key_id(&self) -> KeyId {
        self.public_key().id()
    }

    /// Signs the exclusive grant of `token` on `lock` to `session` (a `pal2` sequencer).
    ///
    /// Refuses a lock name the lock table would refuse and a token outside `1..=TOKEN_MAX`; the
    /// service never issues such a grant, so an error here is a bug in the caller.
    pub fn sign(
        &self,
        lock: &str,
        token: Token,
        session: SessionId,
    ) -> Result<Sequencer, SignError> {
        self.sign_access(lock, Access::Exclusive, token, session)
    }

    /// Signs the grant of `token` on `lock` to `session`, held with `access`: `pal2` for
    /// [`Access::Exclusive`], `pal3` (with `s` or `p<slot>`) for a shared grant or a permit.
    ///
    /// Refuses what [`SigningKey::sign`] refuses, and for `pal3` a slot at or above
    /// `PERMITS_MAX` and session 0 (a fence reads a stored holder 0 as a shared phase).
    pub fn sign_access(
        &self,
        lock: &str,
        access: Access,
        token: Token,
        session: SessionId,
    ) -> Result<Sequencer, SignError> {
        LockName::new(lock).map_err(SignError::LockName)?;
        if token == Token::ZERO {
            return Err(SignError::TokenZero);
        }
        if token > TOKEN_MAX {
            return Err(SignError::TokenAboveMax {
                token,
                token_max: TOKEN_MAX,
            });
        }
        if let Access::Slot(slot) = access
            && slot >= PERMITS_MAX
        {
            return Err(SignError::SlotAboveMax {
                slot,
                slot_max: PERMITS_MAX - 1,
            });
        }
        if !access.is_exclusive() && session == SessionId::new(0) {
            return Err(SignError::SessionZero);
        }
        let lock_field = URL_SAFE_NO_PAD.encode(lock.as_bytes());
        let key_id = self.key_id();
        let mut text = match access {
            Access::Exclusive => {
                format!("{SEQUENCER_PREFIX}.{key_id}.{lock_field}.{token}.{session}")
            }
            Access::Shared => {
                format!("{SEQUENCER_PREFIX_ACCESS}.{key_id}.{lock_field}.s.{token}.{session}")
            }
            Access::Slot(slot) => {
                format!("{SEQUENCER_PREFIX_ACCESS}.{key_id}.{lock_field}.p{slot}.{token}.{session}")
            }
        };
        let signature = self.inner.sign(text.as_bytes());
        text.push('.');
        text.push_str(&URL_SAFE_NO_PAD.encode(signature.to_bytes()));
        // Pair of the compile-time bound in lib.rs: what we issue, every parser accepts.
        assert!(
            text.len() <= SEQUENCER_BYTES_MAX,
            "signed sequencer exceeds its byte limit"
        );
        let sequencer = Sequencer::parse(&text).expect("a freshly signed sequencer must parse");
        assert_eq!(
            (
                sequencer.key_id(),
                sequencer.lock(),
                sequencer.access(),
                sequencer.token(),
                sequencer.session()
            ),
            (key_id, lock, access, token, session),
            "a freshly signed sequencer must parse back to what was signed"
        );
        Ok(sequencer)
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("public_key", &self.public_key().to_string())
            .finish_non_exhaustive()
    }
}

/// The lock service's public key: all a resource needs to verify sequencers offline.
///
/// Text form: `ed25519:` and 64 hex digits (printed lowercase, parsed in either case).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey {
    inner: ed25519_dalek::VerifyingKey,
}

impl PublicKey {
    /// The key whose 32-byte compressed point is `bytes`; refuses invalid and weak points.
    pub fn from_bytes(bytes: [u8; 32]) -> Result<PublicKey, PublicKeyError> {
        let inner = ed25519_dalek::VerifyingKey::from_bytes(&bytes)
            .map_err(|_| PublicKeyError::InvalidPoint)?;
        // A small-order key would let anyone forge signatures that `verify_strict` rejects
        // anyway; refuse it at configuration time with a clearer message.
        if inner.is_weak() {
            return Err(PublicKeyError::InvalidPoint);
        }
        Ok(PublicKey { inner })
    }

    /// The 32-byte compressed point.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.inner.to_bytes()
    }

    /// This key's id: the first 8 bytes of the SHA-256 of [`PublicKey::to_bytes`].
    pub fn id(&self) -> KeyId {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.to_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        KeyId(id)
    }

    /// This key's fingerprint, `SHA256:` and the 64 hex digits of the SHA-256 of
    /// [`PublicKey::to_bytes`] (so it begins with the key id), for an operator to compare over a
    /// channel other than the one the key came by.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.to_bytes());
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        format!("SHA256:{hex}")
    }

    /// Parses `ed25519:<64 hex digits>`.
    pub fn parse(text: &str) -> Result<PublicKey, PublicKeyError> {
        let hex = text
            .strip_prefix(PUBLIC_KEY_PREFIX)
            .ok_or(PublicKeyError::Prefix)?;
        let found = hex.chars().count();
        if found != 64 || hex.len() != 64 {
            return Err(PublicKeyError::Length { found });
        }
        let mut bytes = [0u8; 32];
        for (index, pair) in hex.as_bytes().chunks_exact(2).enumerate() {
            let high = hex_value(pair[0]).ok_or(PublicKeyError::NotHex {
                position: index * 2,
            })?;
            let low = hex_value(pair[1]).ok_or(PublicKeyError::NotHex {
                position: index * 2 + 1,
            })?;
            bytes[index] = (high << 4) | low;
        }
        PublicKey::from_bytes(bytes)
    }

    /// Parses and verifies sequencer text signed with this key: the one call a resource that
    /// trusts one key needs. A resource that trusts several uses [`crate::KeySet::verify`].
    pub fn verify(&self, text: &str) -> Result<VerifiedSequencer, SequencerError> {
        crate::Sequencer::parse(text)?.verify(&crate::KeySet::from(*self))
    }

    pub(crate) fn verify_signature(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        let signature = ed25519_dalek::Signature::from_bytes(signature);
        // Strict: rejects non-canonical and small-order encodings, so no second string
        // verifies for the same grant.
        self.inner.verify_strict(message, &signature).is_ok()
    }
}

/// Which key signed a sequencer: the first 8 bytes of the SHA-256 of the key's public half.
///
/// Text form: 16 lowercase hex digits (the form in sequencers, `palisade pubkey` and `palisade
/// keys`). Not secret, and not a substitute for the key: a resource trusts keys, and uses the id
/// only to find which of them to check a signature with.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId([u8; 8]);

impl KeyId {
    /// Parses 16 lowercase hex digits, the only form a sequencer may carry.
    pub fn parse(text: &str) -> Result<KeyId, KeyIdError> {
        if text.len() != KEY_ID_HEX_DIGITS {
            return Err(KeyIdError::Length {
                found: text.chars().count(),
            });
        }
        let mut id = [0u8; 8];
        for (index, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            let digit = |byte: u8| match byte {
                b'0'..=b'9' | b'a'..=b'f' => hex_value(byte),
                _ => None,
            };
            match (digit(pair[0]), digit(pair[1])) {
                (Some(high), Some(low)) => id[index] = (high << 4) | low,
                _ => return Err(KeyIdError::NotLowercaseHex),
            }
        }
        Ok(KeyId(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

crate::text_form!(KeyId, KeyIdError);

fn hex_value(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        b'A'..=b'F' => Some(digit - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PUBLIC_KEY_PREFIX)?;
        for byte in self.to_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

crate::text_form!(PublicKey, PublicKeyError);
