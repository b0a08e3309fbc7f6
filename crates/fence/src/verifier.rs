//! Verifying presented sequencers, with a memory of recent successes.
//!
//! An Ed25519 verification costs about a tenth of a millisecond here, as much as a small
//! database write, and a holder usually presents the same sequencer for many writes. A
//! [`Verifier`] remembers the texts that verified under its key, so each sequencer pays for one
//! check. The cache holds only strings that verified with this key; a forged or altered string
//! never matches an entry, because entries are looked up by the exact text.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use palisade_sequencer::{PublicKey, VerifiedSequencer};

use crate::{FenceError, verify_presented};

/// How many verified sequencer texts a [`Verifier`] remembers before it starts over.
pub const VERIFIED_SEQUENCERS_CACHED_MAX: usize = 4096;

/// Verifies sequencers with the lock service's public key; remembers recent successes.
#[derive(Debug)]
pub struct Verifier {
    public_key: PublicKey,
    verified: Mutex<HashMap<String, VerifiedSequencer>>,
}

impl Verifier {
    pub fn new(public_key: PublicKey) -> Verifier {
        Verifier {
            public_key,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// The key sequencers are verified with.
    pub fn public_key(&self) -> &PublicKey {
        &self.public_key
    }

    /// [`verify_presented`], answered from memory when this exact text verified before.
    pub fn verify(&self, presented: Option<&str>) -> Result<VerifiedSequencer, FenceError> {
        let text = presented.map(str::trim).unwrap_or("");
        if let Some(verified) = self.cache().get(text) {
            return Ok(verified.clone());
        }
        let verified = verify_presented(Some(text), &self.public_key)?;
        let mut cache = self.cache();
        if cache.len() >= VERIFIED_SEQUENCERS_CACHED_MAX {
            cache.clear();
        }
        cache.insert(text.to_owned(), verified.clone());
        Ok(verified)
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<String, VerifiedSequencer>> {
        // The cache holds only verified texts; a panic elsewhere cannot leave it wrong.
        self.verified
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use palisade_sequencer::SigningKey;

    use super::*;

    #[test]
    fn a_remembered_sequencer_does_not_let_an_altered_one_through() {
        let service = SigningKey::generate();
        let verifier = Verifier::new(service.public_key());
        let honest = service.sign("jobs/a", 5, 1).unwrap();
        assert_eq!(verifier.verify(Some(honest.as_str())).unwrap().token(), 5);
        assert_eq!(
            verifier.verify(Some(honest.as_str())).unwrap().token(),
            5,
            "from memory"
        );
        let altered = honest.as_str().replacen(".5.", ".6.", 1);
        assert!(matches!(
            verifier.verify(Some(&altered)),
            Err(FenceError::Forged { .. })
        ));
        let foreign = SigningKey::generate().sign("jobs/a", 9, 1).unwrap();
        assert!(matches!(
            verifier.verify(Some(foreign.as_str())),
            Err(FenceError::Forged { .. })
        ));
        assert!(matches!(verifier.verify(None), Err(FenceError::Missing)));
    }
}
