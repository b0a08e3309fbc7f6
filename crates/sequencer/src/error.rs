//! One error enum per operation: signing, parsing a sequencer, verifying it, parsing a key.
//!
//! Callers map [`SequencerError::Malformed`] (the client sent garbage: HTTP 400) and
//! [`SequencerError::BadSignature`] (forged, altered, or signed by another service: HTTP 403)
//! differently, so they are separate variants.

use palisade_core::Token;
use palisade_core::limits::LockNameError;

use crate::key::KeyId;

/// Why [`crate::SigningKey::sign`] refused to produce a sequencer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    #[error("cannot sign a sequencer for an invalid lock name: {0}")]
    LockName(#[source] LockNameError),
    #[error("cannot sign a sequencer with token 0: tokens start at 1")]
    TokenZero,
    #[error("cannot sign a sequencer with token {token}: the largest token is {token_max}")]
    TokenAboveMax { token: Token, token_max: Token },
    #[error("cannot sign a permit of slot {slot}: the largest slot is {slot_max}")]
    SlotAboveMax { slot: u32, slot_max: u32 },
    #[error("cannot sign a shared grant or permit for session 0: sessions start at 1")]
    SessionZero,
}

/// Why a string is not a well-formed sequencer (syntax only; the signature is not checked).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    #[error("sequencer is empty: pass the PALISADE_SEQUENCER value of the lock holder")]
    Empty,
    #[error("sequencer is {bytes} bytes, the limit is {bytes_max}")]
    TooLong { bytes: usize, bytes_max: usize },
    #[error(
        "sequencer byte {position} is not printable ASCII: sequencers contain only letters, digits, '-', '_' and '.'"
    )]
    NotPrintableAscii { position: usize },
    #[error(
        "sequencer has {found} '.'-separated fields, expected 6 (pal2.<key id>.<lock>.<token>.<session>.<signature>) or 7 (pal3.<key id>.<lock>.<access>.<token>.<session>.<signature>)"
    )]
    FieldCount { found: usize },
    #[error(
        "sequencer starts with {found:?}, expected \"pal2\" or \"pal3\": unknown format or version"
    )]
    Version { found: String },
    #[error(
        "sequencer access field {found:?} is neither \"s\" (shared) nor \"p<slot>\" (a permit)"
    )]
    Access { found: String },
    #[error("sequencer slot field is not a decimal number after \"p\"")]
    SlotNotANumber,
    #[error("sequencer slot field has a leading zero")]
    SlotLeadingZero,
    #[error("sequencer slot is above the largest slot {slot_max}")]
    SlotAboveMax { slot_max: u32 },
    #[error("sequencer key id is malformed: {0}")]
    KeyId(#[source] KeyIdError),
    #[error("sequencer lock field is not canonical unpadded base64url")]
    LockEncoding,
    #[error("sequencer lock field does not decode to UTF-8")]
    LockNotUtf8,
    #[error("sequencer lock name is invalid: {0}")]
    LockName(#[source] LockNameError),
    #[error("sequencer token field is not a decimal number")]
    TokenNotANumber,
    #[error("sequencer token field has a leading zero")]
    TokenLeadingZero,
    #[error("sequencer token is 0: tokens start at 1")]
    TokenZero,
    #[error("sequencer token is above the largest token {token_max}")]
    TokenAboveMax { token_max: Token },
    #[error("sequencer session field is not a decimal number")]
    SessionNotANumber,
    #[error("sequencer session field has a leading zero")]
    SessionLeadingZero,
    #[error("sequencer session id does not fit in 64 bits")]
    SessionAboveMax,
    #[error(
        "sequencer of a shared grant or permit has session 0: the service issues sessions from 1"
    )]
    SessionZero,
    #[error("sequencer signature field is not canonical unpadded base64url")]
    SignatureEncoding,
    #[error("sequencer signature is {bytes} bytes, expected 64")]
    SignatureLength { bytes: usize },
}

/// Why a sequencer was not accepted as signed by the lock service.
///
/// Exhaustive on purpose: every resource maps each variant to its own refusal, so a new variant
/// must not compile until each mapping classifies it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SequencerError {
    /// The text is not a sequencer at all; the caller sent something wrong.
    #[error("malformed sequencer: {0}")]
    Malformed(#[from] ParseError),
    /// Well-formed, but the signature does not match: forged, altered, or signed by a lock
    /// service whose public key this resource was not given.
    #[error(
        "sequencer signature does not verify with this public key: it was altered, forged, or issued by a different lock service (check the resource's --public-key against `palisade pubkey`)"
    )]
    BadSignature,
    /// Well-formed, but signed with a key this resource does not trust: a key the service
    /// started using after the resource's key set was configured, a retired key, or another
    /// service's key.
    #[error(
        "sequencer is signed with key {key_id}, which this resource does not trust (it trusts {trusted}): give the resource the keys `palisade pubkey` prints now"
    )]
    UnknownKey { key_id: KeyId, trusted: String },
}

impl SequencerError {
    /// The text could not be parsed (a client error).
    pub fn is_malformed(&self) -> bool {
        matches!(self, SequencerError::Malformed(_))
    }

    /// The text parsed but no trusted key signed it (forged, altered, foreign, or signed with a
    /// key this resource was not given).
    pub fn is_bad_signature(&self) -> bool {
        match self {
            SequencerError::Malformed(_) => false,
            SequencerError::BadSignature | SequencerError::UnknownKey { .. } => true,
        }
    }
}

/// Why a string is not a public key in the form `ed25519:<64 hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublicKeyError {
    #[error("public key must start with \"ed25519:\" (as printed by `palisade pubkey`)")]
    Prefix,
    #[error("public key has {found} hex digits after \"ed25519:\", expected 64")]
    Length { found: usize },
    #[error("public key character {position} after \"ed25519:\" is not a hex digit")]
    NotHex { position: usize },
    #[error("public key is not a valid Ed25519 point: it was corrupted or is not an Ed25519 key")]
    InvalidPoint,
}

/// Why a string is not a key id (16 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyIdError {
    #[error("a key id has 16 hex digits, not {found}")]
    Length { found: usize },
    #[error("a key id is lowercase hex digits only")]
    NotLowercaseHex,
}

/// Why a list of public keys is not a usable [`crate::KeySet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeySetError {
    #[error("no public key given: pass the keys `palisade pubkey` prints")]
    Empty,
    #[error("more than {keys_max} public keys given")]
    TooMany { keys_max: usize },
    #[error("the list of public keys is {bytes} bytes, the limit is {bytes_max}")]
    TooLong { bytes: usize, bytes_max: usize },
    #[error("public key {item} on line {line}: {error}")]
    Key {
        line: usize,
        item: usize,
        #[source]
        error: PublicKeyError,
    },
    #[error("public keys {first} and {second} share the key id {id}; give only one of them")]
    IdCollision {
        id: KeyId,
        /// The two keys, in their text form.
        first: String,
        second: String,
    },
}
