//! The randomness seam: where Palisade's random draws come from. The operating system's
//! generator, unless a deterministic simulation has seeded the current thread.
//!
//! The server draws a data directory's incarnation, new signing keys and openraft's election
//! timeouts here; the client its request ids, open keys and retry jitter. A simulation runs a
//! whole cluster and its clients on one thread and calls [`seed_thread`] first, so that one
//! seed decides every draw and a run can be replayed. Nothing in production calls it.

use std::cell::RefCell;
use std::io;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

thread_local! {
    static SEEDED: RefCell<Option<SmallRng>> = const { RefCell::new(None) };
}

/// From now on, every random draw made on this thread comes from a generator seeded with
/// `seed` (`None` goes back to the operating system). For deterministic simulations only: the
/// draws are then predictable, so no key, id or secret drawn this way may protect anything
/// real.
pub fn seed_thread(seed: Option<u64>) {
    SEEDED.with(|seeded| *seeded.borrow_mut() = seed.map(SmallRng::seed_from_u64));
}

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    let seeded = SEEDED.with(|seeded| {
        seeded
            .borrow_mut()
            .as_mut()
            .map(|rng| rng.fill_bytes(buf))
            .is_some()
    });
    if seeded {
        return Ok(());
    }
    getrandom::fill(buf).map_err(|e| io::Error::other(format!("no randomness: {e}")))
}

/// A random `u64`.
pub fn u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    fill(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

/// A small, fast, non-cryptographic generator seeded from [`fill`]'s source.
pub fn small_rng() -> SmallRng {
    SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
        Some(rng) => SmallRng::from_rng(rng),
        None => rand::make_rng(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_thread_draws_the_same_bytes_again_and_other_threads_draw_others() {
        let draw = || {
            let mut bytes = [0u8; 16];
            fill(&mut bytes).unwrap();
            bytes
        };
        seed_thread(Some(7));
        let first = draw();
        seed_thread(Some(7));
        assert_eq!(draw(), first);
        seed_thread(None);
        assert_ne!(draw(), first);
        let elsewhere = std::thread::spawn(draw).join().unwrap();
        assert_ne!(elsewhere, first);
    }
}
