//! The fence primitive: a pure decision, with no I/O, that every backend runs under its own
//! atomicity (a mutex, a write transaction, a row lock, a Lua script).
//!
//! A *scope* is a unit of protected state (a key, a table, a whole store) bound to one lock. Its
//! [`FenceState`] — the highest token accepted, the lock it is bound to, and the session that
//! presented that token — is stored with the scope's data. [`check`] compares a verified
//! sequencer with that state and either accepts it, returning the state to store in the same
//! atomic step as the write, or explains the rejection (invariants 3, 4, 9).
//!
//! **Architecture Invariant:** the accepted maximum never decreases, and while it stays the same
//! so does the session that presented it: a scope accepts an equal token only from the session
//! that presented it first. [`check`] asserts it (in release builds too), and backends re-assert
//! it where they persist the state.
//!
//! # Shared grants and permits
//!
//! A read-write lock's readers share one token per *phase*, so a scope stores holder session 0
//! for a maximum accepted from a shared grant: "a shared phase, no single holder". The rule, with
//! the access of the sequencer ([`palisade_core::Access`]) and what the caller does with it
//! ([`Intent`]):
//!
//! 1. another binding than the scope's (or the expected one) is [`FenceError::WrongLock`];
//! 2. a shared grant that writes is [`FenceError::SharedWrite`];
//! 3. a token below the maximum is [`FenceError::Stale`];
//! 4. the maximum again is accepted, unchanged, from a shared grant while the stored holder is 0
//!    and from an exclusive grant or a permit while the stored holder is its session; anything
//!    else is [`FenceError::TokenReissued`];
//! 5. a larger token is accepted and stored, with holder 0 for a shared grant.
//!
//! So readers of one phase all claim, a writer after them refuses any reader of that phase, and
//! no reader's write lands. A semaphore's permit binds to its slot
//! ([`palisade_sequencer::binding`]): each slot keeps an accepted maximum of its own.

use palisade_core::limits::TOKEN_MAX;
use palisade_core::{Access, SessionId, Token};
use palisade_sequencer::{KeySet, VerifiedSequencer, display_binding};
use serde::{Deserialize, Serialize};

use crate::FenceError;

/// Longest scope name, in bytes of UTF-8.
pub const SCOPE_BYTES_MAX: usize = 512;

/// What a scope has accepted so far. Stored with the scope's data, in the same commit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FenceState {
    /// The binding this scope is bound to ([`VerifiedSequencer::binding`]: the lock, or a
    /// permit's lock and slot); sequencers of any other binding are refused.
    pub lock: String,
    /// The highest token accepted, in `1..=TOKEN_MAX`.
    pub token_max: Token,
    /// The session of the grant that presented `token_max` first (the current holder, as far as
    /// this resource knows). Only this session may present `token_max` again. 0 means a shared
    /// phase: `token_max` came from a shared grant, and only shared grants may present it again.
    pub holder_session: SessionId,
}

/// What the caller does with an accepted sequencer: a shared grant may read, never write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// A claim: advancing before a read, or a read alone. Any grant may.
    Read,
    /// A write, or a claim that authorizes the writes that follow it (a transaction that
    /// writes). Exclusive grants and permits only.
    Write,
}

/// The holder session a scope stores when it accepts `sequencer`: its session, or 0 for a
/// shared grant (a phase has no single holder). A scope accepts `sequencer`'s token again exactly
/// when the stored holder equals this, which is how the SQL and Lua backends state rule 4.
pub fn stored_holder(sequencer: &VerifiedSequencer) -> SessionId {
    match sequencer.access() {
        Access::Shared => SessionId::new(0),
        Access::Exclusive | Access::Slot(_) => sequencer.session(),
    }
}

/// The refusal of a shared grant's write (rule 2), for backends that refuse it before their I/O.
fn shared_write(sequencer: &VerifiedSequencer) -> FenceError {
    FenceError::SharedWrite {
        lock: sequencer.lock().to_owned(),
        token: sequencer.token(),
    }
}

/// Which binding a scope must be protected by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockBinding<'a> {
    /// The first accepted sequencer binds the scope to its binding; later sequencers must match.
    #[default]
    BindOnFirstWrite,
    /// Only sequencers of this binding are accepted, even for the first access: a lock name,
    /// or for a semaphore's slot [`palisade_sequencer::binding`] of the lock and the slot.
    Expect(&'a str),
}

/// Decides whether `sequencer` may do what `intent` says to a scope whose stored state is
/// `accepted`, by the rule of the module docs.
///
/// Accepts a token equal to the maximum from the grant that presented it first (one grant may
/// write many times; every reader of a shared phase may claim) and any larger token; returns the
/// state to store with the access. Refuses another binding as [`FenceError::WrongLock`], a
/// shared grant's write as [`FenceError::SharedWrite`], an older token as [`FenceError::Stale`],
/// and the maximum presented by another grant as [`FenceError::TokenReissued`] (the lock service
/// issued it twice).
pub fn check(
    accepted: Option<&FenceState>,
    binding: LockBinding<'_>,
    sequencer: &VerifiedSequencer,
    intent: Intent,
) -> Result<FenceState, FenceError> {
    // A verified sequencer carries a token the service could have issued.
    assert!((Token::FIRST..=TOKEN_MAX).contains(&sequencer.token()));
    let presented = sequencer.binding();
    if let LockBinding::Expect(expected) = binding
        && presented != expected
    {
        return Err(wrong_lock(expected, &presented));
    }
    if let Some(accepted) = accepted {
        assert_state_valid(accepted);
        if presented != accepted.lock {
            return Err(wrong_lock(&accepted.lock, &presented));
        }
    }
    if sequencer.access() == Access::Shared
        && intent == Intent::Write
        && !palisade_core::canary::active(palisade_core::canary::Canary::FenceAcceptsSharedWrite)
    {
        return Err(shared_write(sequencer));
    }
    let holder = stored_holder(sequencer);
    let Some(accepted) = accepted else {
        return Ok(FenceState {
            lock: presented.into_owned(),
            token_max: sequencer.token(),
            holder_session: holder,
        });
    };
    if sequencer.token() < accepted.token_max
        && sequencer.access() != Access::Shared
        && accepted.holder_session == SessionId::new(0)
        && palisade_core::canary::active(palisade_core::canary::Canary::FenceLetsWriterPastPhase)
    {
        return Ok(accepted.clone());
    }
    let refuse_equal =
        palisade_core::canary::active(palisade_core::canary::Canary::FenceRefusesEqualToken);
    if sequencer.token() < accepted.token_max
        || (refuse_equal && sequencer.token() == accepted.token_max)
    {
        return Err(FenceError::Stale {
            lock: display_binding(&accepted.lock).into_owned(),
            presented: sequencer.token(),
            accepted: accepted.token_max,
            holder_session: Some(accepted.holder_session),
        });
    }
    // One grant has one session (one phase, holder 0): the same token from another is a second
    // grant of it, which only a lock service that was restored or lost its log can issue
    // (invariant 13: no sequencer is issued twice; the resource's half of it). A shared grant
    // presenting an exclusive grant's token, or the reverse, is the same contradiction.
    if sequencer.token() == accepted.token_max && holder != accepted.holder_session {
        return Err(FenceError::TokenReissued {
            lock: display_binding(&accepted.lock).into_owned(),
            token: accepted.token_max,
            first_session: accepted.holder_session,
            presented_session: sequencer.session(),
        });
    }
    let advanced = FenceState {
        lock: accepted.lock.clone(),
        token_max: sequencer.token(),
        holder_session: holder,
    };
    assert_advance(Some(accepted), &advanced);
    Ok(advanced)
}

fn wrong_lock(expected: &str, presented: &str) -> FenceError {
    FenceError::WrongLock {
        expected: display_binding(expected).into_owned(),
        presented: display_binding(presented).into_owned(),
    }
}

/// Refuses what [`check`] refuses without looking at stored state: another binding than the
/// expected one, and a shared grant's write. Backends call it before their I/O. A shared write to
/// a scope bound to another binding is reported as [`FenceError::SharedWrite`] here (the stored
/// binding is not read), where [`check`] with the state says [`FenceError::WrongLock`]: both
/// refuse, neither changes anything.
pub fn precheck(
    binding: LockBinding<'_>,
    sequencer: &VerifiedSequencer,
    intent: Intent,
) -> Result<(), FenceError> {
    check(None, binding, sequencer, intent).map(drop)
}

/// Confirms that a database's advance stored the presented token, as its `RETURNING` reported.
///
/// Anything else means the database disagrees with the fence (a trigger, a manual edit, a
/// schema someone changed): [`FenceError::Corrupt`], which needs an operator. Never a panic:
/// the fence runs in the user's process, and what a database returns is not the fence's own
/// invariant. Every SQL backend answers a disagreement this way, in either direction.
pub(crate) fn confirm_advanced(scope: &str, stored: i64, presented: i64) -> Result<(), FenceError> {
    if stored == presented {
        return Ok(());
    }
    Err(FenceError::Corrupt {
        scope: scope.to_owned(),
        message: format!(
            "the fence row holds token {stored} after advancing to {presented}; \
             something other than the fence changed it"
        ),
    })
}

/// Asserts that storing `next` over `previous` keeps the fence monotonic, bound to one binding,
/// and its maximum to the session that presented it first (0 for a shared phase: every reader of
/// the phase stores 0 again, so an equal token keeps its holder in every case).
///
/// Backends call this where they persist, pairing the assertion in [`check`].
pub fn assert_advance(previous: Option<&FenceState>, next: &FenceState) {
    assert_state_valid(next);
    if let Some(previous) = previous {
        assert!(
            next.token_max >= previous.token_max,
            "fence invariant broken: accepted token would go down from {} to {}",
            previous.token_max,
            next.token_max
        );
        assert_eq!(
            next.lock, previous.lock,
            "fence invariant broken: scope changed its lock"
        );
        if next.token_max == previous.token_max {
            assert_eq!(
                next.holder_session, previous.holder_session,
                "fence invariant broken: token {} accepted from a second session",
                next.token_max
            );
        }
    }
}

fn assert_state_valid(state: &FenceState) {
    assert!(
        (Token::FIRST..=TOKEN_MAX).contains(&state.token_max),
        "fence state holds token {} outside 1..=TOKEN_MAX",
        state.token_max
    );
}

/// The state a backend read back from its storage, checked as it is loaded: a token outside
/// `1..=TOKEN_MAX` means someone wrote to the fence's storage behind its back, and is reported as
/// [`FenceError::Corrupt`]. The token is taken wide (`i128`) so a negative SQL `bigint` is shown
/// as it was stored.
pub(crate) fn stored_state(
    scope: &str,
    lock: String,
    token_max: i128,
    holder_session: u64,
) -> Result<FenceState, FenceError> {
    match u64::try_from(token_max).map(Token::new) {
        Ok(token_max) if (Token::FIRST..=TOKEN_MAX).contains(&token_max) => Ok(FenceState {
            lock,
            token_max,
            holder_session: SessionId::new(holder_session),
        }),
        _ => Err(FenceError::Corrupt {
            scope: scope.to_owned(),
            message: format!("stored token {token_max} is outside 1..={TOKEN_MAX}"),
        }),
    }
}

/// Checks a scope name: 1..=[`SCOPE_BYTES_MAX`] bytes.
pub fn validate_scope(scope: &str) -> Result<(), FenceError> {
    if scope.is_empty() {
        return Err(FenceError::InvalidScope {
            message: "scope name is empty".into(),
        });
    }
    if scope.len() > SCOPE_BYTES_MAX {
        return Err(FenceError::InvalidScope {
            message: format!(
                "scope name is {} bytes, the limit is {SCOPE_BYTES_MAX}",
                scope.len()
            ),
        });
    }
    Ok(())
}

/// Verifies the sequencer a client presented (a header, an argument), mapping every failure to
/// the [`FenceError`] a resource returns: `None` or blank is [`FenceError::Missing`]. `keys` are
/// the lock service's published keys (`palisade pubkey`).
pub fn verify_presented(
    presented: Option<&str>,
    keys: &KeySet,
) -> Result<VerifiedSequencer, FenceError> {
    match presented.map(str::trim) {
        None | Some("") => Err(FenceError::Missing),
        Some(text) => Ok(VerifiedSequencer::from_str_verified(text, keys)?),
    }
}

/// Why a database refused `sequencer` for `scope`, given the state it refused it with.
///
/// The SQL backends advance with one conditional statement and, when it refuses, read the
/// (still locked) row to explain the refusal with the same [`check`] every backend uses. If that
/// check would have accepted, the database and this library disagree: that is reported as
/// corruption, never as success.
pub fn explain_refusal(
    scope: &str,
    accepted: &FenceState,
    sequencer: &VerifiedSequencer,
    intent: Intent,
) -> FenceError {
    match check(
        Some(accepted),
        LockBinding::BindOnFirstWrite,
        sequencer,
        intent,
    ) {
        Err(rejection) => rejection,
        Ok(next) => {
            assert_advance(Some(accepted), &next);
            FenceError::Corrupt {
                scope: scope.to_owned(),
                message: format!(
                    "the database refused token {} but the stored state {accepted:?} accepts it",
                    sequencer.token()
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_that_stored_another_token_than_presented_is_corrupt_not_a_panic() {
        assert_eq!(confirm_advanced("orders", 7, 7), Ok(()));
        for stored in [6, 8] {
            let refused = confirm_advanced("orders", stored, 7).unwrap_err();
            assert!(
                matches!(&refused, FenceError::Corrupt { scope, .. } if scope == "orders"),
                "{refused:?}"
            );
            assert!(refused.is_final(), "{refused:?}");
        }
    }

    #[test]
    fn a_stored_token_outside_the_range_is_corrupt_and_shown_as_stored() {
        for bad in [
            -5_i128,
            0,
            i128::from(TOKEN_MAX.get()) + 1,
            i128::from(u64::MAX),
        ] {
            let refused = stored_state("orders", "jobs".into(), bad, 7).unwrap_err();
            let FenceError::Corrupt { scope, message } = &refused else {
                panic!("{refused:?}");
            };
            assert_eq!(scope, "orders");
            assert!(
                message.contains(&format!("stored token {bad} ")),
                "{message}"
            );
        }
        assert_eq!(
            stored_state("orders", "jobs".into(), 9, 7).unwrap(),
            FenceState {
                lock: "jobs".into(),
                token_max: Token::new(9),
                holder_session: SessionId::new(7)
            }
        );
    }
}
