//! Parsing sequencer text and verifying its signature.
//!
//! [`Sequencer::parse`] checks syntax only, in the order cheapest-first: length, bytes, fields,
//! version (which fixes the field count: `pal2` 6, `pal3` 7), then each field's canonical
//! encoding, and last the one rule across fields (a `pal3` session is at least 1). [`Sequencer::verify`] adds the signature check and is
//! the only way to obtain a [`VerifiedSequencer`].

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use std::borrow::Cow;

use palisade_core::limits::TOKEN_MAX;
use palisade_core::{Access, LockName, PERMITS_MAX, SessionId, Token};

use crate::error::{ParseError, SequencerError};
use crate::key::KeyId;
use crate::keyset::KeySet;
use crate::{SEQUENCER_BYTES_MAX, SEQUENCER_PREFIX, SEQUENCER_PREFIX_ACCESS, SIGNATURE_BYTES};

/// A syntactically valid sequencer whose signature has not been checked yet.
///
/// Nothing about it is trustworthy until [`Sequencer::verify`] says so.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Sequencer {
    text: String,
    key_id: KeyId,
    lock: String,
    access: Access,
    token: Token,
    session: SessionId,
    signature: [u8; SIGNATURE_BYTES],
    /// Length of the signed part (everything before the last '.').
    signed_bytes: usize,
}

impl Sequencer {
    /// Parses sequencer text without checking the signature.
    pub fn parse(text: &str) -> Result<Sequencer, ParseError> {
        if text.is_empty() {
            return Err(ParseError::Empty);
        }
        if text.len() > SEQUENCER_BYTES_MAX {
            return Err(ParseError::TooLong {
                bytes: text.len(),
                bytes_max: SEQUENCER_BYTES_MAX,
            });
        }
        if let Some(position) = text.bytes().position(|byte| !(0x21..=0x7e).contains(&byte)) {
            return Err(ParseError::NotPrintableAscii { position });
        }
        let fields: Vec<&str> = text.split('.').collect();
        // pal2 (exclusive) has 6 fields, pal3 (shared, permit) 7: the access after the lock.
        let (version, key_id, lock, access, token, session, signature_field) = match fields[..] {
            [version, key_id, lock, token, session, signature] => {
                (version, key_id, lock, None, token, session, signature)
            }
            [version, key_id, lock, access, token, session, signature] => (
                version,
                key_id,
                lock,
                Some(access),
                token,
                session,
                signature,
            ),
            _ => {
                return Err(ParseError::FieldCount {
                    found: fields.len(),
                });
            }
        };
        let expected_fields = match version {
            SEQUENCER_PREFIX => 6,
            SEQUENCER_PREFIX_ACCESS => 7,
            _ => {
                // Printable ASCII by now, so safe to echo; bounded so the error stays small.
                let found = version.chars().take(16).collect();
                return Err(ParseError::Version { found });
            }
        };
        if fields.len() != expected_fields {
            return Err(ParseError::FieldCount {
                found: fields.len(),
            });
        }
        let key_id = KeyId::parse(key_id).map_err(ParseError::KeyId)?;
        let lock = URL_SAFE_NO_PAD
            .decode(lock)
            .map_err(|_| ParseError::LockEncoding)?;
        let lock = String::from_utf8(lock).map_err(|_| ParseError::LockNotUtf8)?;
        let lock = LockName::new(lock)
            .map_err(ParseError::LockName)?
            .into_string();
        let access = access.map_or(Ok(Access::Exclusive), parse_access)?;
        let token = parse_token(token)?;
        let session = parse_session(session)?;
        // The service never issues session 0; a fence reads a stored holder 0 as a shared phase.
        if !access.is_exclusive() && session == SessionId::new(0) {
            return Err(ParseError::SessionZero);
        }
        let signature_bytes = URL_SAFE_NO_PAD
            .decode(signature_field)
            .map_err(|_| ParseError::SignatureEncoding)?;
        let signature: [u8; SIGNATURE_BYTES] =
            signature_bytes
                .as_slice()
                .try_into()
                .map_err(|_| ParseError::SignatureLength {
                    bytes: signature_bytes.len(),
                })?;
        // The signature field cannot contain '.', so the last '.' ends the signed part.
        let signed_bytes = text.len() - signature_field.len() - 1;
        assert!((Token::FIRST..=TOKEN_MAX).contains(&token));
        Ok(Sequencer {
            text: text.to_owned(),
            key_id,
            lock,
            access,
            token,
            session,
            signature,
            signed_bytes,
        })
    }

    /// The id of the key this sequencer claims to be signed with.
    pub fn key_id(&self) -> KeyId {
        self.key_id
    }

    /// The lock this sequencer claims to be a grant of.
    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// How the grant holds its lock: exclusive (`pal2`), shared or a semaphore's slot (`pal3`).
    pub fn access(&self) -> Access {
        self.access
    }

    /// The fence binding of this grant: the scope key a resource stores and compares (see
    /// [`crate::binding`]).
    pub fn binding(&self) -> Cow<'_, str> {
        crate::binding(&self.lock, self.access)
    }

    /// The fencing token, in `1..=TOKEN_MAX`.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The id of the session that holds (held) the grant.
    pub fn session(&self) -> SessionId {
        self.session
    }

    /// The exact text, as presented.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Checks the signature with the key of `keys` it names (a single [`crate::PublicKey`]
    /// converts into a set with `.into()`).
    pub fn verify(&self, keys: &KeySet) -> Result<VerifiedSequencer, SequencerError> {
        let Some(key) = keys.get(self.key_id) else {
            return Err(SequencerError::UnknownKey {
                key_id: self.key_id,
                trusted: keys
                    .keys()
                    .iter()
                    .map(|key| key.id().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let message = &self.text.as_bytes()[..self.signed_bytes];
        if key.verify_signature(message, &self.signature) {
            Ok(VerifiedSequencer {
                sequencer: self.clone(),
            })
        } else {
            Err(SequencerError::BadSignature)
        }
    }
}

/// Parses a canonical decimal: digits only, no leading zero unless the number is 0.
fn parse_decimal(text: &str) -> Result<Option<u64>, DecimalError> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(DecimalError::NotANumber);
    }
    if text.len() > 1 && text.starts_with('0') {
        return Err(DecimalError::LeadingZero);
    }
    // Only digits, so the one possible failure is overflow.
    Ok(text.parse::<u64>().ok())
}

enum DecimalError {
    NotANumber,
    LeadingZero,
}

fn parse_token(text: &str) -> Result<Token, ParseError> {
    match parse_decimal(text) {
        Err(DecimalError::NotANumber) => Err(ParseError::TokenNotANumber),
        Err(DecimalError::LeadingZero) => Err(ParseError::TokenLeadingZero),
        Ok(Some(0)) => Err(ParseError::TokenZero),
        Ok(token) => token
            .and_then(Token::checked)
            .ok_or(ParseError::TokenAboveMax {
                token_max: TOKEN_MAX,
            }),
    }
}

/// Parses the access field of `pal3`: `s` (shared) or `p<slot>` (a permit), canonical only.
fn parse_access(text: &str) -> Result<Access, ParseError> {
    if text == "s" {
        return Ok(Access::Shared);
    }
    let Some(slot) = text.strip_prefix('p') else {
        // Printable ASCII by now, so safe to echo; bounded so the error stays small.
        let found = text.chars().take(16).collect();
        return Err(ParseError::Access { found });
    };
    match parse_decimal(slot) {
        Err(DecimalError::NotANumber) => Err(ParseError::SlotNotANumber),
        Err(DecimalError::LeadingZero) => Err(ParseError::SlotLeadingZero),
        Ok(Some(slot)) if slot < u64::from(PERMITS_MAX) => Ok(Access::Slot(
            u32::try_from(slot).expect("below PERMITS_MAX, a u32"),
        )),
        Ok(_) => Err(ParseError::SlotAboveMax {
            slot_max: PERMITS_MAX - 1,
        }),
    }
}

fn parse_session(text: &str) -> Result<SessionId, ParseError> {
    match parse_decimal(text) {
        Err(DecimalError::NotANumber) => Err(ParseError::SessionNotANumber),
        Err(DecimalError::LeadingZero) => Err(ParseError::SessionLeadingZero),
        Ok(Some(session)) => Ok(SessionId::new(session)),
        Ok(None) => Err(ParseError::SessionAboveMax),
    }
}

impl FromStr for Sequencer {
    type Err = ParseError;

    fn from_str(text: &str) -> Result<Sequencer, ParseError> {
        Sequencer::parse(text)
    }
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sequencer")
            .field("key_id", &self.key_id)
            .field("lock", &self.lock)
            .field("access", &self.access)
            .field("token", &self.token)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A sequencer whose signature was checked against the lock service's public key.
///
/// Only [`Sequencer::verify`] (and the helpers that call it) can build one, so an API that takes
/// `&VerifiedSequencer` cannot be handed a forged token by mistake.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct VerifiedSequencer {
    sequencer: Sequencer,
}

impl VerifiedSequencer {
    /// Parses `text` and verifies its signature with the key of `keys` it names.
    pub fn from_str_verified(
        text: &str,
        keys: &KeySet,
    ) -> Result<VerifiedSequencer, SequencerError> {
        Sequencer::parse(text)?.verify(keys)
    }

    /// The id of the key that signed this grant.
    pub fn key_id(&self) -> KeyId {
        self.sequencer.key_id()
    }

    /// The lock this grant is of.
    pub fn lock(&self) -> &str {
        self.sequencer.lock()
    }

    /// How the grant holds its lock: exclusive, shared, or a semaphore's slot.
    pub fn access(&self) -> Access {
        self.sequencer.access()
    }

    /// The fence binding of this grant: the lock, or for a permit the lock and its slot (see
    /// [`crate::binding`]). A scope accepts only the grants of the binding it is bound to.
    pub fn binding(&self) -> Cow<'_, str> {
        self.sequencer.binding()
    }

    /// The fencing token, in `1..=TOKEN_MAX`.
    pub fn token(&self) -> Token {
        self.sequencer.token()
    }

    /// The session holding the grant.
    pub fn session(&self) -> SessionId {
        self.sequencer.session()
    }

    /// The exact text, as presented.
    pub fn as_str(&self) -> &str {
        self.sequencer.as_str()
    }

    /// The underlying sequencer.
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }
}

impl fmt::Display for VerifiedSequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for VerifiedSequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifiedSequencer")
            .field("lock", &self.lock())
            .field("access", &self.access())
            .field("token", &self.token())
            .field("session", &self.session())
            .finish_non_exhaustive()
    }
}
