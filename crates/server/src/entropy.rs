//! The one source of randomness of the lock service: the data directory's incarnation and the
//! session secrets a leader draws are read here and nowhere else.
//!
//! **Architecture Invariant:** nothing else in the server calls the operating system's random
//! number generator, so a deterministic simulation can substitute a seeded source in this one
//! function and replay a run.

/// The operating system's random number generator failed: the server refuses to make up a
/// secret from anything weaker.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the operating system's random number generator failed: {0}")]
pub struct NoEntropy(String);

/// Fills `buf` with bytes from the operating system's cryptographically secure generator.
pub(crate) fn fill(buf: &mut [u8]) -> Result<(), NoEntropy> {
    getrandom::fill(buf).map_err(|e| NoEntropy(e.to_string()))
}
