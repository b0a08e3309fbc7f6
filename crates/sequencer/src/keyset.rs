//! The keys a resource trusts: a [`KeySet`].
//!
//! A lock service signs with one key at a time, but a resource must keep accepting the
//! sequencers of the key being replaced while the new one takes over. So a resource is given a
//! set: every key the service currently publishes (`palisade pubkey` prints it). A sequencer
//! names its key by [`KeyId`]; the set picks that key and checks the signature with it alone.

use std::fmt;

use crate::error::{KeySetError, SequencerError};
use crate::key::{KeyId, PublicKey};
use crate::sequencer::{Sequencer, VerifiedSequencer};

/// Most keys a [`KeySet`] holds. A service publishes its signing key, at most one key on its
/// way in and a few on their way out; more than this is a mistake in the resource's setup.
pub const KEY_SET_KEYS_MAX: usize = 16;

/// Longest text [`KeySet::parse`] reads, in bytes: the largest set, one key per line, with room
/// for comments.
pub const KEY_SET_TEXT_BYTES_MAX: usize = 16 * 1024;

/// One to [`KEY_SET_KEYS_MAX`] public keys, each with a distinct [`KeyId`], in the order given.
///
/// Text form ([`KeySet::parse`]): public keys (`ed25519:<64 hex digits>`) separated by commas
/// or white space, so `--public-key "$(palisade pubkey)"` and a file with one key per line both
/// work; in a file, a line whose first non-blank character is `#` is a comment. It prints
/// ([`fmt::Display`]) as the keys joined by commas.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySet {
    keys: Vec<PublicKey>,
}

impl KeySet {
    /// The set of `keys`. A key given twice counts once.
    pub fn new(keys: impl IntoIterator<Item = PublicKey>) -> Result<KeySet, KeySetError> {
        let mut set: Vec<PublicKey> = Vec::new();
        for key in keys {
            if set.contains(&key) {
                continue;
            }
            if set.len() == KEY_SET_KEYS_MAX {
                return Err(KeySetError::TooMany {
                    keys_max: KEY_SET_KEYS_MAX,
                });
            }
            if let Some(other) = set.iter().find(|other| other.id() == key.id()) {
                return Err(KeySetError::IdCollision {
                    id: key.id(),
                    first: other.to_string(),
                    second: key.to_string(),
                });
            }
            set.push(key);
        }
        if set.is_empty() {
            return Err(KeySetError::Empty);
        }
        Ok(KeySet { keys: set })
    }

    /// Parses the text form (see [`KeySet`]).
    pub fn parse(text: &str) -> Result<KeySet, KeySetError> {
        if text.len() > KEY_SET_TEXT_BYTES_MAX {
            return Err(KeySetError::TooLong {
                bytes: text.len(),
                bytes_max: KEY_SET_TEXT_BYTES_MAX,
            });
        }
        let mut keys = Vec::new();
        for (line_index, line) in text.lines().enumerate() {
            if line.trim_start().starts_with('#') {
                continue;
            }
            for (item_index, item) in line
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|item| !item.is_empty())
                .enumerate()
            {
                if keys.len() == KEY_SET_KEYS_MAX {
                    return Err(KeySetError::TooMany {
                        keys_max: KEY_SET_KEYS_MAX,
                    });
                }
                let key = PublicKey::parse(item).map_err(|error| KeySetError::Key {
                    line: line_index + 1,
                    item: item_index + 1,
                    error,
                })?;
                keys.push(key);
            }
        }
        KeySet::new(keys)
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    /// The key whose id is `id`, if the set has it.
    pub fn get(&self, id: KeyId) -> Option<&PublicKey> {
        self.keys.iter().find(|key| key.id() == id)
    }

    /// Parses `text` and verifies it with the key it names: the one call a resource needs.
    pub fn verify(&self, text: &str) -> Result<VerifiedSequencer, SequencerError> {
        Sequencer::parse(text)?.verify(self)
    }
}

impl From<PublicKey> for KeySet {
    fn from(key: PublicKey) -> KeySet {
        KeySet { keys: vec![key] }
    }
}

impl fmt::Display for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, key) in self.keys.iter().enumerate() {
            if index > 0 {
                f.write_str(",")?;
            }
            write!(f, "{key}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|key| key.id()))
            .finish()
    }
}

crate::text_form!(KeySet, KeySetError);
