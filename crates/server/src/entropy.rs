//! The server's random draws (a data directory's incarnation, new signing keys, the session
//! secrets a leader draws), through the randomness seam ([`palisade_clock::entropy`]), so a
//! deterministic simulation that seeded its thread replays them.
//!
//! **Architecture Invariant:** nothing else in the server calls the operating system's random
//! number generator.

use std::io;

pub(crate) use palisade_clock::entropy::fill;

/// A fresh signing key.
pub(crate) fn signing_key() -> io::Result<palisade_sequencer::SigningKey> {
    let mut secret = [0u8; 32];
    fill(&mut secret)?;
    Ok(palisade_sequencer::SigningKey::from_bytes(secret))
}
