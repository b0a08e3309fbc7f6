//! The cluster's signing keys, replicated: which key signs sequencers and which keys are
//! published for resources to trust.
//!
//! A cluster starts with one key, its founding key (`signing.key`, handed to every member when
//! it is admitted). As long as nobody rotates, the ring stays empty and that key signs: data
//! directories from before rotation load unchanged. A rotation is three steps, each one Raft
//! entry ([`KeyChange`]), so every member, and every later leader, agrees on them:
//!
//! 1. **add**: a new key is published, and does not sign yet. The founding key is recorded as
//!    the signing key in the same entry if the ring was empty. Operators give resources the new
//!    published set (`palisade pubkey`).
//! 2. **rotate**: the newest published key signs from now on; the previous one stays published,
//!    so the sequencers of current holders keep verifying.
//! 3. **retire**: a key that no longer signs is dropped from the published set; resources stop
//!    trusting it.
//!
//! Every change is checked by the leader before it is proposed and again, identically, when it
//! is applied, so a change that lost a race to another becomes a no-op on every member alike.
//!
//! The secrets travel in the log and rest in snapshots, as the founding key rests in
//! `signing.key`: a data directory, and a backup of one, is as secret as the keys themselves.

use std::fmt;

use palisade_sequencer::{KEY_SET_KEYS_MAX, KeyId, KeySet, PublicKey, SigningKey};
use serde::{Deserialize, Serialize};

/// A 32-byte Ed25519 secret as the log and snapshots carry it: 64 hex digits. Its `Debug` shows
/// only the key id.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl Secret {
    pub fn of(key: &SigningKey) -> Secret {
        Secret(key.to_bytes())
    }

    pub fn key(&self) -> SigningKey {
        SigningKey::from_bytes(self.0)
    }

    pub fn id(&self) -> KeyId {
        self.key().key_id()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret(key {})", self.id())
    }
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let hex: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        serializer.serialize_str(&hex)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let bad = || serde::de::Error::custom("a signing key secret is 64 lowercase hex digits");
        if text.len() != 64 {
            return Err(bad());
        }
        let mut bytes = [0u8; 32];
        for (index, pair) in text.as_bytes().chunks_exact(2).enumerate() {
            let pair = std::str::from_utf8(pair).map_err(|_| bad())?;
            bytes[index] = u8::from_str_radix(pair, 16).map_err(|_| bad())?;
        }
        Ok(Secret(bytes))
    }
}

/// One change to the ring, as a Raft entry carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyChange {
    /// Publishes `key`. If the ring is empty, `founding` (the key that has signed so far) is
    /// recorded first, as the signing key.
    Add { founding: Secret, key: Secret },
    /// `key` signs from now on; the key that signed until now stays published.
    Rotate { key: KeyId },
    /// Drops `key`, which must not be the signing key, from the published set.
    Retire { key: KeyId },
}

/// Why a [`KeyChange`] does not apply to the ring as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyRefusal {
    #[error("the cluster already publishes {KEY_SET_KEYS_MAX} keys: retire one first")]
    Full,
    #[error("key {0} is already published")]
    AlreadyPublished(KeyId),
    #[error("key {0} is not published (see `palisade keys list`)")]
    Unknown(KeyId),
    #[error("key {0} already signs")]
    AlreadySigning(KeyId),
    #[error("key {0} signs sequencers now: rotate to another key before retiring it")]
    Signing(KeyId),
    #[error(
        "no key to rotate to: every published key has signed already; publish one with `palisade keys add` and give resources the new `palisade pubkey` first"
    )]
    NothingToRotateTo,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct RingKey {
    secret: Secret,
    /// Whether this key signs sequencers now. Exactly one key of a non-empty ring does.
    signing: bool,
}

/// The published keys, oldest first, and which of them signs. Empty until the first `add`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyRing {
    keys: Vec<RingKey>,
}

/// One published key as operators see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyView {
    pub public_key: PublicKey,
    pub signing: bool,
}

impl KeyRing {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key that signs, if the ring has any (else the founding key signs).
    pub fn signing(&self) -> Option<SigningKey> {
        self.keys.iter().find(|k| k.signing).map(|k| k.secret.key())
    }

    /// Every published key, oldest first; with an empty ring, `founding` alone.
    pub fn view(&self, founding: &SigningKey) -> Vec<KeyView> {
        if self.keys.is_empty() {
            return vec![KeyView {
                public_key: founding.public_key(),
                signing: true,
            }];
        }
        self.keys
            .iter()
            .map(|k| KeyView {
                public_key: k.secret.key().public_key(),
                signing: k.signing,
            })
            .collect()
    }

    /// What resources must trust: every published key.
    pub fn published(&self, founding: &SigningKey) -> KeySet {
        KeySet::new(self.view(founding).into_iter().map(|k| k.public_key))
            .expect("the ring holds 1..=KEY_SET_KEYS_MAX keys with distinct ids")
    }

    /// The key a `rotate` moves to: the newest published key that is not signing and was
    /// published after the signing key.
    pub fn next(&self) -> Option<KeyId> {
        let signing = self.keys.iter().position(|k| k.signing)?;
        self.keys[signing + 1..].last().map(|k| k.secret.id())
    }

    /// Applies `change`, or leaves the ring as it was and says why not. Deterministic: the
    /// leader's check and every member's apply give the same answer for the same ring.
    pub fn apply(&mut self, change: &KeyChange) -> Result<(), KeyRefusal> {
        match change {
            KeyChange::Add { founding, key } => {
                let founding_present = !self.keys.is_empty();
                let room = KEY_SET_KEYS_MAX - usize::from(!founding_present);
                if self.keys.len() >= room {
                    return Err(KeyRefusal::Full);
                }
                if self.position(key.id()).is_some()
                    || (!founding_present && founding.id() == key.id())
                {
                    return Err(KeyRefusal::AlreadyPublished(key.id()));
                }
                if !founding_present {
                    self.keys.push(RingKey {
                        secret: founding.clone(),
                        signing: true,
                    });
                }
                self.keys.push(RingKey {
                    secret: key.clone(),
                    signing: false,
                });
            }
            KeyChange::Rotate { key } => {
                let to = self.position(*key).ok_or(KeyRefusal::Unknown(*key))?;
                if self.keys[to].signing {
                    return Err(KeyRefusal::AlreadySigning(*key));
                }
                for k in &mut self.keys {
                    k.signing = false;
                }
                self.keys[to].signing = true;
            }
            KeyChange::Retire { key } => {
                let at = self.position(*key).ok_or(KeyRefusal::Unknown(*key))?;
                if self.keys[at].signing {
                    return Err(KeyRefusal::Signing(*key));
                }
                self.keys.remove(at);
            }
        }
        debug_assert_eq!(self.keys.iter().filter(|k| k.signing).count(), 1);
        Ok(())
    }

    /// Whether the ring holds the key `id` (an empty ring holds none: the founding key then
    /// signs without being in it).
    pub fn publishes(&self, id: KeyId) -> bool {
        self.position(id).is_some()
    }

    fn position(&self, id: KeyId) -> Option<usize> {
        self.keys.iter().position(|k| k.secret.id() == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(seed: u8) -> Secret {
        Secret::of(&SigningKey::from_bytes([seed; 32]))
    }

    #[test]
    fn add_rotate_retire_moves_signing_and_publishing_as_documented() {
        let founding = secret(1);
        let mut ring = KeyRing::default();
        assert_eq!(
            ring.published(&founding.key()),
            KeySet::from(founding.key().public_key())
        );
        assert_eq!(ring.next(), None);

        ring.apply(&KeyChange::Add {
            founding: founding.clone(),
            key: secret(2),
        })
        .unwrap();
        assert_eq!(ring.signing().unwrap().key_id(), founding.id());
        assert_eq!(ring.published(&founding.key()).keys().len(), 2);
        assert_eq!(ring.next(), Some(secret(2).id()));

        ring.apply(&KeyChange::Rotate {
            key: secret(2).id(),
        })
        .unwrap();
        assert_eq!(ring.signing().unwrap().key_id(), secret(2).id());
        assert_eq!(ring.next(), None, "nothing newer than the signing key");
        assert_eq!(
            ring.apply(&KeyChange::Retire {
                key: secret(2).id()
            }),
            Err(KeyRefusal::Signing(secret(2).id()))
        );
        ring.apply(&KeyChange::Retire { key: founding.id() })
            .unwrap();
        assert_eq!(
            ring.published(&founding.key()),
            KeySet::from(secret(2).key().public_key()),
            "the founding key is no longer published once retired"
        );
    }

    #[test]
    fn refused_changes_leave_the_ring_as_it_was() {
        let founding = secret(1);
        let mut ring = KeyRing::default();
        ring.apply(&KeyChange::Add {
            founding: founding.clone(),
            key: secret(2),
        })
        .unwrap();
        let before = ring.clone();
        for (change, refusal) in [
            (
                KeyChange::Add {
                    founding: founding.clone(),
                    key: secret(2),
                },
                KeyRefusal::AlreadyPublished(secret(2).id()),
            ),
            (
                KeyChange::Rotate {
                    key: secret(9).id(),
                },
                KeyRefusal::Unknown(secret(9).id()),
            ),
            (
                KeyChange::Rotate { key: founding.id() },
                KeyRefusal::AlreadySigning(founding.id()),
            ),
            (
                KeyChange::Retire { key: founding.id() },
                KeyRefusal::Signing(founding.id()),
            ),
        ] {
            assert_eq!(ring.apply(&change), Err(refusal));
            assert_eq!(ring, before);
        }
        for seed in 3..=KEY_SET_KEYS_MAX as u8 {
            ring.apply(&KeyChange::Add {
                founding: founding.clone(),
                key: secret(seed),
            })
            .unwrap();
        }
        assert_eq!(
            ring.apply(&KeyChange::Add {
                founding,
                key: secret(100),
            }),
            Err(KeyRefusal::Full)
        );
    }

    #[test]
    fn the_log_carries_secrets_as_hex_and_debug_hides_them() {
        let change = KeyChange::Add {
            founding: secret(1),
            key: secret(2),
        };
        let json = serde_json::to_string(&change).unwrap();
        assert!(json.contains(&"02".repeat(32)), "{json}");
        assert_eq!(serde_json::from_str::<KeyChange>(&json).unwrap(), change);
        let debug = format!("{change:?}");
        assert!(!debug.contains(&"02".repeat(32)), "{debug}");
        assert!(debug.contains(&secret(2).id().to_string()), "{debug}");
    }
}
