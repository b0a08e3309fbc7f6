//! Helpers shared by the fence scenarios: a lock service key, grants, a seeded shuffle.
#![allow(dead_code)]

use palisade_core::{SessionId, Token};
use palisade_fence::FenceError;
use palisade_sequencer::{KeySet, PublicKey, SigningKey, VerifiedSequencer};

/// The lock service whose public key the resources under test trust.
pub fn service_key() -> SigningKey {
    SigningKey::from_bytes([42; 32])
}

pub fn public_key() -> PublicKey {
    service_key().public_key()
}

/// The keys the resources under test trust: the service's one key.
pub fn public_keys() -> KeySet {
    public_key().into()
}

/// A grant of `lock` with `token` to `session`, as the resource receives and verifies it.
pub fn grant(lock: &str, token: u64, session: u64) -> VerifiedSequencer {
    let sequencer = service_key()
        .sign(lock, Token::new(token), SessionId::new(session))
        .unwrap();
    public_key().verify(sequencer.as_str()).unwrap()
}

/// The refusal of token `token` of `lock` presented by session `presented` where session
/// `first` presented it first: the lock service issued that token twice.
pub fn reissued(lock: &str, token: u64, first: u64, presented: u64) -> FenceError {
    FenceError::TokenReissued {
        lock: lock.into(),
        token: Token::new(token),
        first_session: SessionId::new(first),
        presented_session: SessionId::new(presented),
    }
}

/// A sequencer for a huge token signed by someone else's key but naming the service's key id,
/// and the text of it: only the signature check can refuse it.
pub fn forged_text(lock: &str, token: u64) -> String {
    let attacker = SigningKey::from_bytes([13; 32]);
    attacker
        .sign(lock, Token::new(token), SessionId::new(666))
        .unwrap()
        .to_string()
        .replacen(
            &attacker.key_id().to_string(),
            &service_key().key_id().to_string(),
            1,
        )
}

/// A deterministic shuffle (xorshift), so a failing race replays with the same interleaving
/// of tokens across writers.
pub fn shuffled(mut items: Vec<u64>, seed: u64) -> Vec<u64> {
    let mut state = seed | 1;
    for index in (1..items.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        items.swap(index, (state % (index as u64 + 1)) as usize);
    }
    items
}

/// A name no other test run uses, for scopes and tables in shared servers.
pub fn unique(prefix: &str) -> String {
    // The clock alone is not enough: tests on two threads can read the same instant.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{}_{nanos}_{count}", std::process::id())
}

/// Asserts the tokens, in the order their writes were applied, never go down.
pub fn assert_nondecreasing(applied: &[u64]) {
    for pair in applied.windows(2) {
        assert!(
            pair[0] <= pair[1],
            "token {} applied after token {}",
            pair[1],
            pair[0]
        );
    }
}

/// Says loudly that a test did not run: written to the real stderr, past the test harness's
/// output capture, so it shows in every `cargo test` run.
pub fn skip(message: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "{message}");
}
