//! A history checker for locks with fencing tokens.
//!
//! A [`History`] holds operations as a client saw them: when it invoked each one and when it
//! learnt the outcome, in nanoseconds on one observer's clock (simulated time in a simulation,
//! the test process's monotonic clock in a run with real processes), which client issued it, and
//! how it ended: [`Outcome::Ok`] with the reply, [`Outcome::Failed`] (known not applied) or
//! [`Outcome::Unknown`] (possibly applied, at any time after the invocation).
//!
//! The operations ([`Action`]):
//!
//! - `Acquire { lock, ttl_ns }`, answered by `Granted(Grant { session, token })`;
//! - `AcquireAs { lock, ttl_ns, mode }` (issue 32): exclusive, shared or a permit of a semaphore
//!   of `N`, answered by `Granted` (exclusive) or `GrantedAs { grant, held }` (shared, or a
//!   slot). The readers of one phase share its token; permits in different slots hold at once;
//!   checks 1, 2, 4 and 5 allow exactly that;
//! - `AcquirePart { lock, ttl_ns, mode, request, parts }`: one lock of a multi-acquire of
//!   `parts` locks (`AcquireAll`), one record per lock with the same `request`, each answered
//!   as `AcquireAs` is (a lock the reply did not grant is `Failed`);
//! - `Release { lock, session, token }`;
//! - `Renew { session, ttl_ns }`: a lease renewal (or the session's opening) sent at its
//!   invocation time. Once acknowledged, the client believes its session, and every lock it
//!   holds, lives until `sent + ttl·(1 − ρ)`, where ρ is the history's drift bound (in parts
//!   per million) between the clocks that measure leases and the observer's;
//! - `Status { lock }`: a linearizable read of a lock's state, answered by
//!   `Status { holder, last_token }` (a stale read promises nothing and is not recorded);
//! - `Resource { resource, scope, grant, access }`: a claim, read or write of a scope (bound to
//!   one lock) at a fenced resource, presenting a grant (or none, for an observer's unfenced
//!   read); answered `Accepted { value, position }` (the value read, and the place in the
//!   resource's apply order if the resource reports it) or `Stale`.
//!
//! [`check()`] (or [`History::check`]) runs ten checks and returns a [`Report`] whose
//! [`Violation`]s name the operations, with their times, that prove each one:
//!
//! 1. [`Check::TokensGrowPerLock`]: per lock, a grant that follows another has a larger token.
//!    Two grants are ordered only when one completed before the other was invoked: the order in
//!    which acknowledgements arrive says nothing, and equal times order nothing.
//! 2. [`Check::TokensUnique`]: no two acknowledged grants share a token, across all locks (the
//!    same grant acknowledged twice to one client, as a retried request is, is one grant; the
//!    same lock, session and token acknowledged to two clients is a sequencer issued twice).
//! 3. [`Check::TokensGrowAcrossLocks`]: a grant's token is above every token acknowledged before
//!    it was invoked on any other lock: Palisade's tokens come from one counter.
//! 4. [`Check::LeaseBelief`]: no later grant of a lock is acknowledged while the holder still
//!    believes in its lease and has not begun to release it. A release of unknown outcome counts
//!    as begun at its invocation.
//! 5. [`Check::FenceOrder`]: a fenced resource never accepts a lower token after a higher one
//!    for a scope (in its apply order where recorded, else in real time), never accepts one
//!    token from two sessions, and refuses a grant as stale only if a larger token (or the same
//!    token of another session) may have reached it before.
//! 6. [`Check::NoLostUpdate`]: a scope is read as a counter from 0 that each holder increments
//!    by one (reads `v`, writes `v + 1`): no value is written twice by accepted writes, no read
//!    returns less than a write acknowledged before it, and no read returns a value that the
//!    writes invoked before it (accepted or of unknown outcome) cannot have built.
//! 7. [`Check::ReadsReflectAcknowledged`]: a read of a lock invoked after a grant of it was
//!    acknowledged shows that token or a larger one (as holder or last token; a read showing
//!    no token at all says nothing), and never shows as holder a grant whose release was
//!    acknowledged before the read was invoked.
//! 8. [`Check::PermitsWithinSize`]: a permit's slot is below the size its acquire named; with
//!    check 4 per slot, at most `N` holders of a semaphore are live.
//! 9. [`Check::WritesNeedExclusive`]: a fenced resource accepts no write presenting a reader's
//!    grant, and no writer's write after it accepted an access of a later shared phase.
//!    A writer's write after a later writer's access is check 5's ([`Violation::FenceWentBack`]).
//! 10. [`Check::MultiAllOrNone`]: a multi-acquire is granted every lock it named or none, and
//!     at one point: no other grant of a lock it took exclusive has a token between two of the
//!     tokens its parts drew.
//!
//! An operator's recovery that rewinds the service's state (a restore, a lost or rolled-back
//! log whose counters were recovered) is recorded with [`History::recovered`]: checks 4 and 7
//! do not compare operations it may lie between; the others hold across it, since no token or
//! session id is ever issued twice (a session's operations are recorded under one client, so a
//! client per session opening lets check 2 see a re-issued session id's grants apart).
//!
//! Every check is sound: it reports only what no execution consistent with the history avoids.
//! Checks 5 and 6 need every access to the resource in the history. A session closed by its
//! client gives up its locks: record the close as a release of each lock it held, or check 4
//! counts on a lease the client gave up.
//!
//! [`model::linearize`] is a brute-force search of small histories against a fenced mutex with
//! leases (exclusive acquires only: it leaves `AcquireAs` out); the tests cross-check checks 1–4 with it (a history they reject has no
//! linearization).
//!
//! **Architecture Invariant:** pure: no I/O, no clock, no async runtime, no randomness. The
//! deterministic simulation and the nemesis run with real processes feed it alike.

mod check;
mod history;
pub mod model;

pub use check::{Check, OpRef, Report, VIOLATIONS_PER_CHECK_MAX, Violation, check};
pub use history::{
    Access, Action, ClientId, DRIFT_BOUND_PPM_MAX, Grant, History, HistoryError, Op, OpId, Outcome,
    Reply,
};

impl History {
    /// Runs every check; see [`check()`].
    pub fn check(&self) -> Report {
        check::check(self)
    }
}
