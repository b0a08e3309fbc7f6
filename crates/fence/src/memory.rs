//! An in-memory fenced resource: a value behind a mutex, for tests, demos and in-process state.
//!
//! Atomicity: the fence check, the caller's mutation and the advance of the accepted maximum all
//! happen while one `Mutex` is held, so no other write can interleave. Not durable: the state
//! dies with the process (invariant 3's "survives restarts" needs a durable backend).

use std::sync::{Mutex, MutexGuard};

use palisade_sequencer::VerifiedSequencer;

use crate::FenceError;
use crate::fence::{FenceState, Intent, LockBinding, assert_advance, check};

/// A value of type `T` that only the current holder of its lock may change.
#[derive(Debug)]
pub struct MemoryResource<T> {
    expected_lock: Option<String>,
    guarded: Mutex<Guarded<T>>,
}

#[derive(Debug)]
struct Guarded<T> {
    fence: Option<FenceState>,
    value: T,
}

impl<T> MemoryResource<T> {
    /// A resource bound to the lock of its first accepted writer.
    pub fn new(value: T) -> MemoryResource<T> {
        MemoryResource {
            expected_lock: None,
            guarded: Mutex::new(Guarded { fence: None, value }),
        }
    }

    /// A resource that accepts sequencers of `lock` only.
    pub fn bound_to(lock: impl Into<String>, value: T) -> MemoryResource<T> {
        MemoryResource {
            expected_lock: Some(lock.into()),
            guarded: Mutex::new(Guarded { fence: None, value }),
        }
    }

    /// Runs `write` on the value if `sequencer` is not stale and is for this resource's lock.
    /// A shared grant (a reader) is refused as [`FenceError::SharedWrite`].
    ///
    /// The check, `write` and the advance of the accepted token happen under one mutex. If
    /// `write` panics, the token is not advanced and the resource refuses all later writes (its
    /// value may be half-changed).
    pub fn write<R>(
        &self,
        sequencer: &VerifiedSequencer,
        write: impl FnOnce(&mut T) -> R,
    ) -> Result<R, FenceError> {
        self.access(sequencer, Intent::Write, write)
    }

    /// Claims the resource for `sequencer` and runs `read` on the value, under the same mutex:
    /// the fenced read of any grant, a shared one (a reader) included.
    pub fn claim<R>(
        &self,
        sequencer: &VerifiedSequencer,
        read: impl FnOnce(&T) -> R,
    ) -> Result<R, FenceError> {
        self.access(sequencer, Intent::Read, |value| read(value))
    }

    fn access<R>(
        &self,
        sequencer: &VerifiedSequencer,
        intent: Intent,
        apply: impl FnOnce(&mut T) -> R,
    ) -> Result<R, FenceError> {
        let mut guarded = self.lock()?;
        let binding = match &self.expected_lock {
            Some(lock) => LockBinding::Expect(lock),
            None => LockBinding::BindOnFirstWrite,
        };
        let next = check(guarded.fence.as_ref(), binding, sequencer, intent)?;
        let outcome = apply(&mut guarded.value);
        assert_advance(guarded.fence.as_ref(), &next);
        guarded.fence = Some(next);
        Ok(outcome)
    }

    /// Reads the value (no sequencer needed).
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> Result<R, FenceError> {
        Ok(read(&self.lock()?.value))
    }

    /// The accepted state, if any write was accepted yet.
    pub fn fence_state(&self) -> Result<Option<FenceState>, FenceError> {
        Ok(self.lock()?.fence.clone())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Guarded<T>>, FenceError> {
        self.guarded.lock().map_err(|_| FenceError::Storage {
            message: "a write to this resource panicked; its value may be inconsistent".into(),
        })
    }
}
