//! Verifying presented sequencers, with a memory of recent successes.
//!
//! An Ed25519 verification costs about a tenth of a millisecond here, as much as a small
//! database write, and a holder usually presents the same sequencer for many writes. A
//! [`Verifier`] remembers the texts that verified under its keys, so each sequencer pays for one
//! check. The cache holds only strings that verified with the keys trusted now; a forged or
//! altered string never matches an entry, because entries are looked up by the exact text, and
//! replacing the keys ([`Verifier::set_keys`]) forgets every entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use palisade_sequencer::{KeySet, VerifiedSequencer};

use crate::{FenceError, verify_presented};

/// How many verified sequencer texts a [`Verifier`] remembers before it starts over.
pub const VERIFIED_SEQUENCERS_CACHED_MAX: usize = 4096;

/// Verifies sequencers with the lock service's public keys; remembers recent successes.
#[derive(Debug)]
pub struct Verifier {
    state: Mutex<Trusted>,
}

/// The keys trusted now and the texts that verified with them, changed together.
#[derive(Debug)]
struct Trusted {
    keys: KeySet,
    verified: HashMap<String, Arc<VerifiedSequencer>>,
}

impl Verifier {
    /// Verifies with `keys`: a [`KeySet`], or one [`palisade_sequencer::PublicKey`].
    pub fn new(keys: impl Into<KeySet>) -> Verifier {
        Verifier {
            state: Mutex::new(Trusted {
                keys: keys.into(),
                verified: HashMap::new(),
            }),
        }
    }

    /// The keys sequencers are verified with.
    pub fn keys(&self) -> KeySet {
        self.state().keys.clone()
    }

    /// Trusts `keys` from now on, instead of the keys trusted before, and forgets every
    /// sequencer that verified with those: a sequencer of a key dropped here is refused from the
    /// next call on.
    pub fn set_keys(&self, keys: KeySet) {
        let mut state = self.state();
        state.keys = keys;
        state.verified.clear();
    }

    /// [`verify_presented`], answered from memory when this exact text verified before.
    pub fn verify(&self, presented: Option<&str>) -> Result<VerifiedSequencer, FenceError> {
        self.verify_shared(presented)
            .map(|verified| VerifiedSequencer::clone(&verified))
    }

    /// [`Verifier::verify`], sharing the remembered sequencer instead of copying it: a
    /// holder's every write then costs a map lookup and a reference count, not two string
    /// copies (the store's write path).
    pub fn verify_shared(
        &self,
        presented: Option<&str>,
    ) -> Result<Arc<VerifiedSequencer>, FenceError> {
        let text = presented.map(str::trim).unwrap_or("");
        let keys = {
            let state = self.state();
            if let Some(verified) = state.verified.get(text) {
                return Ok(Arc::clone(verified));
            }
            state.keys.clone()
        };
        // The signature check runs unlocked; its result is remembered only if the keys it was
        // checked with are still the trusted ones.
        let verified = Arc::new(verify_presented(Some(text), &keys)?);
        let mut state = self.state();
        if state.keys == keys {
            if state.verified.len() >= VERIFIED_SEQUENCERS_CACHED_MAX {
                state.verified.clear();
            }
            state
                .verified
                .insert(text.to_owned(), Arc::clone(&verified));
        }
        Ok(verified)
    }

    fn state(&self) -> MutexGuard<'_, Trusted> {
        // The cache holds only verified texts; a panic elsewhere cannot leave it wrong.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use palisade_core::{SessionId, Token};
    use palisade_sequencer::SigningKey;

    use super::*;

    #[test]
    fn a_remembered_sequencer_does_not_let_an_altered_one_through() {
        let service = SigningKey::generate();
        let verifier = Verifier::new(service.public_key());
        let honest = service
            .sign("jobs/a", Token::new(5), SessionId::new(1))
            .unwrap();
        assert_eq!(
            verifier.verify(Some(honest.as_str())).unwrap().token(),
            Token::new(5)
        );
        assert_eq!(
            verifier.verify(Some(honest.as_str())).unwrap().token(),
            Token::new(5),
            "from memory"
        );
        let altered = honest.as_str().replacen(".5.", ".6.", 1);
        assert!(matches!(
            verifier.verify(Some(&altered)),
            Err(FenceError::Forged { .. })
        ));
        let foreign = SigningKey::generate()
            .sign("jobs/a", Token::new(9), SessionId::new(1))
            .unwrap();
        assert!(matches!(
            verifier.verify(Some(foreign.as_str())),
            Err(FenceError::Forged { .. })
        ));
        assert!(matches!(verifier.verify(None), Err(FenceError::Missing)));
    }
}
