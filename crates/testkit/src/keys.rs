//! A lock service's key pair without a lock service: sequencers signed with it (or with an
//! impostor's key), and a store that trusts it, for the tests of resources.

use palisade_core::{SessionId, Token};
use palisade_sequencer::SigningKey;
use palisade_store::Store;

/// The lock service's key, as far as a resource's tests are concerned.
#[derive(Debug)]
pub struct ServiceKey {
    pub key: SigningKey,
}

impl Default for ServiceKey {
    fn default() -> ServiceKey {
        ServiceKey::new()
    }
}

impl ServiceKey {
    /// A fresh random key.
    pub fn new() -> ServiceKey {
        ServiceKey {
            key: SigningKey::generate(),
        }
    }

    /// The sequencer of the grant of `lock` with `token`, held by `session`.
    pub fn grant(&self, lock: &str, token: u64, session: u64) -> String {
        self.key
            .sign(lock, Token::new(token), SessionId::new(session))
            .expect("test grants are valid")
            .as_str()
            .to_owned()
    }

    /// A store in a fresh temporary directory (kept alive by the returned guard).
    pub fn store(&self) -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = Store::open(dir.path(), self.key.public_key()).expect("store opens");
        (store, dir)
    }
}

/// A sequencer signed by a key the store was not given.
pub fn impostor_grant(lock: &str, token: u64, session: u64) -> String {
    SigningKey::generate()
        .sign(lock, Token::new(token), SessionId::new(session))
        .expect("test grants are valid")
        .as_str()
        .to_owned()
}
