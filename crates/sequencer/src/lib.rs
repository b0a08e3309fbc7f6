//! Sequencers: the signed, lock-scoped fencing tokens a lock holder presents to a resource.
//!
//! The lock service signs every grant with its Ed25519 [`SigningKey`]; a resource checks the
//! signature offline with the service's public keys alone, a [`KeySet`] (invariant 5), and learns
//! which lock the token belongs to (invariant 4). The text form is fixed, because other languages
//! and shell scripts produce and pass it around:
//!
//! ```text
//! pal2.<key id>.<lock>.<token>.<session>.<signature>
//! ```
//!
//! - `key id`: the [`KeyId`] of the key that signed it, 16 lowercase hex digits (the first 8
//!   bytes of the SHA-256 of the 32-byte public key), so that a resource trusting several keys
//!   (during a key rotation) checks the signature with the right one;
//! - `lock`: the UTF-8 lock name, base64url without padding (so names may contain `.`, `/`, or
//!   any other printable character);
//! - `token`: the fencing token, decimal, `1..=TOKEN_MAX`, no sign, no leading zeros;
//! - `session`: the id of the session holding the grant, decimal, no leading zeros; it is carried
//!   only so that a rejection can name the holder that superseded a writer (invariant 9);
//! - `signature`: base64url without padding of the 64-byte Ed25519 signature over the ASCII bytes
//!   of everything before the last `.`.
//!
//! That is the form of an *exclusive* grant (a mutex, a read-write lock's writer). A *shared*
//! grant (a reader of a shared phase) and a semaphore's *permit* carry how they hold the lock
//! ([`palisade_core::Access`]) in a field of its own:
//!
//! ```text
//! pal3.<key id>.<lock>.<access>.<token>.<session>.<signature>
//! ```
//!
//! with `access` either `s` (shared) or `p<slot>` (the permit in slot `slot`, decimal, no leading
//! zero, below `PERMITS_MAX`), and a session of at least 1. An exclusive grant has no `pal3`
//! form, and the prefix is signed, so no signature verifies under the other format. A resource
//! keeps a scope's accepted maximum per [`binding`]: the lock, or for a permit the lock and its
//! slot.
//!
//! Every encoding is canonical: each lock name, token and session has exactly one text form, and a
//! parser that accepts a string accepts it only in that form. Together with the signature covering
//! the exact bytes, that means no altered string verifies.
//!
//! **API Boundary:** a resource never looks at a [`Sequencer`] it has not verified. The fence takes
//! a [`VerifiedSequencer`], which only [`Sequencer::verify`] can build, so "forgot to check the
//! signature" does not compile.
//!
//! ```
//! use palisade_core::{SessionId, Token};
//! use palisade_sequencer::{KeySet, SigningKey, VerifiedSequencer};
//!
//! let service_key = SigningKey::generate();
//! let trusted = KeySet::from(service_key.public_key());
//! let (token, session) = (Token::new(42), SessionId::new(7));
//! let sequencer = service_key.sign("jobs/nightly", token, session).unwrap();
//!
//! // At the resource: only the text and the service's public keys.
//! let verified = VerifiedSequencer::from_str_verified(sequencer.as_str(), &trusted).unwrap();
//! assert_eq!((verified.lock(), verified.token(), verified.session()), ("jobs/nightly", token, session));
//! ```
//!
//! The token and the session are types of their own, so a swapped pair does not compile:
//!
//! ```compile_fail
//! # use palisade_core::{SessionId, Token};
//! # let service_key = palisade_sequencer::SigningKey::generate();
//! let sequencer = service_key.sign("jobs/nightly", SessionId::new(7), Token::new(42));
//! ```

/// `FromStr` and serde for a type whose text form is its `Display` and its `parse`: every key
/// type travels in flags, environment variables and JSON as the text `palisade pubkey` prints.
macro_rules! text_form {
    ($type:ty, $error:ty) => {
        impl std::str::FromStr for $type {
            type Err = $error;

            fn from_str(text: &str) -> Result<$type, $error> {
                <$type>::parse(text)
            }
        }

        impl serde::Serialize for $type {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $type {
            fn deserialize<D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<$type, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                <$type>::parse(&text).map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use text_form;

mod error;
mod key;
mod keyset;
mod sequencer;

pub use error::{KeyIdError, KeySetError, ParseError, PublicKeyError, SequencerError, SignError};
pub use key::{KeyId, PublicKey, SigningKey};
pub use keyset::{KEY_SET_KEYS_MAX, KEY_SET_TEXT_BYTES_MAX, KeySet};
pub use sequencer::{Sequencer, VerifiedSequencer};

use std::borrow::Cow;

use palisade_core::limits::{LOCK_NAME_BYTES_MAX, TOKEN_MAX};
use palisade_core::{Access, PERMITS_MAX};

/// The first field of an exclusive grant's sequencer: format name and version.
pub const SEQUENCER_PREFIX: &str = "pal2";

/// The first field of a shared grant's or a permit's sequencer, which has an access field.
pub const SEQUENCER_PREFIX_ACCESS: &str = "pal3";

/// Separates a lock name from a slot in a permit's [`binding`]. No lock name contains a control
/// character, so no lock's binding equals a slot's.
pub const BINDING_SLOT_SEPARATOR: char = '\u{1f}';

/// Longest [`binding`], in bytes: the longest lock name, the separator and the highest slot.
pub const BINDING_BYTES_MAX: usize =
    LOCK_NAME_BYTES_MAX + 1 + decimal_digits(PERMITS_MAX as u64 - 1);

/// The fence binding of a grant of `lock` held with `access`: what a resource stores as the
/// scope's lock and compares every later sequencer with. Exclusive and shared grants of `L` bind
/// to `L` (one token order for writers and readers); the permit in slot `k` binds to `L`, U+001F
/// and `k` in decimal, so each slot keeps its own accepted maximum.
pub fn binding(lock: &str, access: Access) -> Cow<'_, str> {
    match access {
        Access::Exclusive | Access::Shared => Cow::Borrowed(lock),
        Access::Slot(slot) => Cow::Owned(format!("{lock}{BINDING_SLOT_SEPARATOR}{slot}")),
    }
}

/// A binding as messages show it: the lock name, or `L (slot k)` for a permit's binding.
pub fn display_binding(binding: &str) -> Cow<'_, str> {
    match binding.split_once(BINDING_SLOT_SEPARATOR) {
        Some((lock, slot)) => Cow::Owned(format!("{lock} (slot {slot})")),
        None => Cow::Borrowed(binding),
    }
}

/// Length of a [`KeyId`]'s text form: 16 hex digits.
pub const KEY_ID_HEX_DIGITS: usize = 16;

/// Longest sequencer text, in bytes. Parsers refuse anything longer before looking inside.
pub const SEQUENCER_BYTES_MAX: usize = 512;

/// Prefix of the text form of a public key.
pub const PUBLIC_KEY_PREFIX: &str = "ed25519:";

/// Length of an Ed25519 signature, in bytes.
pub const SIGNATURE_BYTES: usize = 64;

/// Length of base64 text without padding for `bytes` bytes of input.
const fn base64_unpadded_len(bytes: usize) -> usize {
    (bytes * 4).div_ceil(3)
}

/// Number of decimal digits of `n`.
const fn decimal_digits(mut n: u64) -> usize {
    let mut digits = 1;
    while n >= 10 {
        n /= 10;
        digits += 1;
    }
    digits
}

/// The longest sequencer the service can produce: key id, longest lock name, largest token,
/// largest session id, and five separators.
pub const SEQUENCER_BYTES_LONGEST: usize = SEQUENCER_PREFIX.len()
    + KEY_ID_HEX_DIGITS
    + base64_unpadded_len(LOCK_NAME_BYTES_MAX)
    + decimal_digits(TOKEN_MAX.get())
    + decimal_digits(u64::MAX)
    + base64_unpadded_len(SIGNATURE_BYTES)
    + 5;

/// The longest `pal3` sequencer: the longest `pal2` one with the access field of the highest slot
/// (`p4095`) and its separator.
pub const SEQUENCER_BYTES_LONGEST_ACCESS: usize =
    SEQUENCER_BYTES_LONGEST + 1 + 1 + decimal_digits(PERMITS_MAX as u64 - 1);

// Every sequencer the service signs must be accepted by every parser.
const _: () = assert!(SEQUENCER_BYTES_LONGEST <= SEQUENCER_BYTES_MAX);
const _: () = assert!(SEQUENCER_BYTES_LONGEST_ACCESS <= SEQUENCER_BYTES_MAX);
const _: () = assert!(SEQUENCER_PREFIX.len() == SEQUENCER_PREFIX_ACCESS.len());
const _: () = assert!(base64_unpadded_len(SIGNATURE_BYTES) == 86);
const _: () = assert!(decimal_digits(TOKEN_MAX.get()) == 19 && decimal_digits(u64::MAX) == 20);
