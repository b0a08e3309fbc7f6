//! A session's credential: its id and the secret the service handed whoever opened it.
//!
//! Every call that acts for a session (renew, acquire, release, close, each keepalive renewal)
//! presents the secret; the service refuses a call with the id alone (`UNAUTHENTICATED`). The
//! ids that `status`, `locks` and `watch` show are no credential.
//!
//! Its text form, `<id>.<secret as 64 lowercase hex digits>`, is one opaque token: what
//! `palisade acquire` prints as `PALISADE_SESSION`, and what `palisade renew` and `release`
//! read back. Treat it as a password: whoever has it can release the session's locks.

use std::fmt;
use std::str::FromStr;

use palisade_core::SessionId;

/// The length of a session secret, in bytes.
pub const SESSION_SECRET_BYTES: usize = 32;

/// A session's secret. `Debug` does not show it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionSecret([u8; SESSION_SECRET_BYTES]);

impl SessionSecret {
    /// The secret in `bytes`, if it has the length of one.
    pub fn from_bytes(bytes: &[u8]) -> Option<SessionSecret> {
        <[u8; SESSION_SECRET_BYTES]>::try_from(bytes)
            .ok()
            .map(SessionSecret)
    }

    pub fn as_bytes(&self) -> &[u8; SESSION_SECRET_BYTES] {
        &self.0
    }
}

impl fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// What acts for a session: its id and its secret.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionCredential {
    id: SessionId,
    secret: SessionSecret,
}

impl SessionCredential {
    pub fn new(id: SessionId, secret: SessionSecret) -> SessionCredential {
        SessionCredential { id, secret }
    }

    /// The session's id, which names it (in errors, in `status`) but proves nothing.
    pub fn id(&self) -> SessionId {
        self.id
    }

    pub fn secret(&self) -> &SessionSecret {
        &self.secret
    }
}

impl fmt::Debug for SessionCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionCredential")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The text form, `<id>.<64 lowercase hex digits>`: a secret, print it only where it is meant
/// to go.
impl fmt::Display for SessionCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.", self.id)?;
        self.secret.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Why a text is not a session credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialError {
    /// A session id without its secret: the form before session secrets.
    #[error(
        "{0} is a bare session id, which no longer acts for a session: pass the whole value `palisade acquire` printed as PALISADE_SESSION (`<id>.<secret>`); acquire again to get one"
    )]
    BareId(u64),
    #[error(
        "not a session credential: expected `<id>.<{digits} lowercase hex digits>`, as `palisade acquire` prints it in PALISADE_SESSION",
        digits = 2 * SESSION_SECRET_BYTES
    )]
    Malformed,
}

impl FromStr for SessionCredential {
    type Err = CredentialError;

    fn from_str(text: &str) -> Result<SessionCredential, CredentialError> {
        let text = text.trim();
        let Some((id, hex)) = text.split_once('.') else {
            return Err(match text.parse::<u64>() {
                Ok(id) => CredentialError::BareId(id),
                Err(_) => CredentialError::Malformed,
            });
        };
        let canonical_number = !id.is_empty()
            && id.bytes().all(|b| b.is_ascii_digit())
            && (id == "0" || !id.starts_with('0'));
        let id: u64 = match canonical_number {
            true => id.parse().map_err(|_| CredentialError::Malformed)?,
            false => return Err(CredentialError::Malformed),
        };
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        if hex.len() != 2 * SESSION_SECRET_BYTES {
            return Err(CredentialError::Malformed);
        }
        let bytes = hex
            .as_bytes()
            .chunks(2)
            .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
            .collect::<Option<Vec<u8>>>()
            .ok_or(CredentialError::Malformed)?;
        let secret = SessionSecret::from_bytes(&bytes).ok_or(CredentialError::Malformed)?;
        Ok(SessionCredential::new(SessionId::new(id), secret))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credential() -> SessionCredential {
        let bytes: Vec<u8> = (0..32).map(|i| i * 7 + 1).collect();
        SessionCredential::new(
            SessionId::new(42),
            SessionSecret::from_bytes(&bytes).unwrap(),
        )
    }

    #[test]
    fn the_text_form_round_trips_and_debug_hides_the_secret() {
        let text = credential().to_string();
        assert!(text.starts_with("42."), "{text}");
        assert_eq!(text.len(), 3 + 64);
        assert_eq!(text.parse::<SessionCredential>(), Ok(credential()));
        let debug = format!("{:?}", credential());
        assert!(!debug.contains(&text[3..9]), "{debug}");
    }

    #[test]
    fn a_bare_id_and_other_text_are_refused_clearly() {
        assert_eq!(
            "7".parse::<SessionCredential>(),
            Err(CredentialError::BareId(7))
        );
        assert!(
            CredentialError::BareId(7)
                .to_string()
                .contains("bare session id")
        );
        let good = credential().to_string();
        for bad in [
            "",
            "x",
            "7.",
            "7.abc",
            &good.to_uppercase(),
            &format!("0{good}"),
            &format!("{good}00"),
            &good.replace("42.", "-42."),
            &good.replace("42.", "."),
        ] {
            assert_eq!(
                bad.parse::<SessionCredential>(),
                Err(CredentialError::Malformed),
                "{bad:?}"
            );
        }
    }
}
