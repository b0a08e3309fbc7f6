//! Canaries: known bugs that can be switched back on, one at a time, to prove that the
//! simulation's checker catches them (`crates/sim`, `palisade-sim --canary NAME`), or, for the
//! lock table's modes ([`Canary::MODES`]), the reference model of `tests/model.rs`.
//!
//! Compiled only with the `canary` feature, which only the simulation enables (and a test
//! build of the workspace, which unifies it); without it
//! [`active`] is a constant `false` and every canary's code path folds away. With it, nothing
//! is switched on until `set` (compiled with that feature only) is called, so the tests that
//! share a build with the simulation run the real code.

/// A bug class that once broke, or could break, a lock service like this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Canary {
    /// A new leader skips what its takeover does for leases: it neither re-anchors its clock
    /// on the table's latest time nor proposes `LeaderStart`, so it compares its own clock's
    /// absolute readings with deadlines another leader's clock stamped. (Either half alone is
    /// harmless here: `LeaderStart` renews every lease after a jump forward, and the table's
    /// clock never moves back.)
    SkipLeaderStart,
    /// The fence refuses a token equal to the one it accepted (`<` instead of `≤`), so a holder
    /// that claimed a resource cannot write it.
    FenceRefusesEqualToken,
    /// The log acknowledges what it wrote without an `fdatasync`: Raft counts a vote or an
    /// entry that a crash can take back.
    AckBeforeFsync,
    /// The leader answers an acquire or a release from a speculative apply on a copy of its
    /// table as soon as the entry is appended, before it is committed and applied: a leader
    /// that loses its log tail has acknowledged what never happened, and two commands
    /// answered from the same state both see it as it was.
    ReplyBeforeApply,
    /// A linearizable read (`Status`, `ListLocks`) is answered from the node's own copy, with
    /// no ReadIndex round to confirm leadership: a follower or a deposed leader answers with
    /// what it has applied so far.
    LocalRead,
    /// A node's id comes back with a wiped data directory: the peers accept it as the member
    /// that id names (the incarnation checks of the peer transport are skipped), though it has
    /// forgotten its log, its vote and the cluster's key. The simulation's operator wipes a
    /// member under this canary only.
    NodeIdReuse,
    /// The lock table forgets request ids: a retried acquire or release is applied again
    /// instead of answered with its first outcome.
    DropRequestDedup,
    /// A leader that no quorum answers keeps serving its term: an acquire queued there waits
    /// for an answer it cannot give while the next leader grants the lock to that waiter's
    /// session, whose keepalives it renews, so the lock is held by a client that does not know
    /// it until the partition heals.
    LeaderNeverStepsDown,
    /// The counters' recovery floors (a restore, a cut of the log's tail, `recover-counters`)
    /// are absolute again, as before invariant 13: the token floor is the time floor alone
    /// (2^21 per second since 1970) and the session counter is not raised. After
    /// `raise-token-floor` put the counter above the time floor, a restore re-issues the
    /// tokens and session ids granted after its backup: the same sequencers.
    AbsoluteFloors,
    /// A semaphore admits a permit while all `N` are held (`<=` instead of `<`): `N + 1` live
    /// holders, the last in slot `N`.
    SemaphoreAdmitsWhenFull,
    /// A reader joins the open shared phase although a writer waits in line: writers starve,
    /// and the queue is no longer first come, first served.
    ReaderJoinsPastWaitingWriter,
    /// A multi-lock whose first lock is free but another is not takes the first lock alone and
    /// answers as if granted everything: a partial hold, the lock-order deadlock's first half.
    MultiLockPartialGrant,
    /// The fence checks a reader's token but not its access: a shared grant's write is
    /// accepted, beside the phase's other readers.
    FenceAcceptsSharedWrite,
    /// The fence lets an exclusive grant below the accepted maximum through while that maximum
    /// is a shared phase's, as a fence that compared writers with writers only would: a writer
    /// paused while a later phase read writes after it.
    FenceLetsWriterPastPhase,
}

impl Canary {
    /// Every canary the simulation's corpus must catch (the last four with its clients taking
    /// the read-write lock, the semaphore and multi-locks, `palisade-sim --modes`).
    pub const ALL: [Canary; 13] = [
        Canary::SkipLeaderStart,
        Canary::FenceRefusesEqualToken,
        Canary::AckBeforeFsync,
        Canary::ReplyBeforeApply,
        Canary::LocalRead,
        Canary::NodeIdReuse,
        Canary::DropRequestDedup,
        Canary::LeaderNeverStepsDown,
        Canary::AbsoluteFloors,
        Canary::SemaphoreAdmitsWhenFull,
        Canary::MultiLockPartialGrant,
        Canary::FenceAcceptsSharedWrite,
        Canary::FenceLetsWriterPastPhase,
    ];

    /// The canaries of the lock table's modes (issue 32), which the table's reference model
    /// catches (`crates/core/tests/model.rs`), and for which the table skips its own
    /// consistency check. The first and the third (a partial multi-grant) are in
    /// [`Canary::ALL`] too; the second breaks fairness, which no check of a history sees.
    pub const MODES: [Canary; 3] = [
        Canary::SemaphoreAdmitsWhenFull,
        Canary::ReaderJoinsPastWaitingWriter,
        Canary::MultiLockPartialGrant,
    ];

    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Canary::SkipLeaderStart => "skip-leader-start",
            Canary::FenceRefusesEqualToken => "fence-refuses-equal-token",
            Canary::AckBeforeFsync => "ack-before-fsync",
            Canary::ReplyBeforeApply => "reply-before-apply",
            Canary::LocalRead => "local-read",
            Canary::NodeIdReuse => "node-id-reuse",
            Canary::DropRequestDedup => "drop-request-dedup",
            Canary::LeaderNeverStepsDown => "leader-never-steps-down",
            Canary::AbsoluteFloors => "absolute-floors",
            Canary::SemaphoreAdmitsWhenFull => "semaphore-admits-when-full",
            Canary::ReaderJoinsPastWaitingWriter => "reader-joins-past-waiting-writer",
            Canary::MultiLockPartialGrant => "multi-lock-partial-grant",
            Canary::FenceAcceptsSharedWrite => "fence-accepts-shared-write",
            Canary::FenceLetsWriterPastPhase => "fence-lets-writer-past-phase",
        }
    }

    /// The canary of [`Canary::ALL`] named `name` (the simulation's).
    pub fn from_name(name: &str) -> Option<Canary> {
        Canary::ALL.into_iter().find(|c| c.name() == name)
    }
}

#[cfg(feature = "canary")]
thread_local! {
    /// Per thread, so that a simulation (which runs on one thread) switching one on leaves the
    /// tests running beside it on other threads alone.
    static ACTIVE: std::cell::Cell<Option<Canary>> = const { std::cell::Cell::new(None) };
}

/// Switches `canary` on (or every canary off, with `None`) for the current thread.
#[cfg(feature = "canary")]
pub fn set(canary: Option<Canary>) {
    ACTIVE.with(|active| active.set(canary));
}

/// Whether `canary` is switched on.
#[inline]
pub fn active(canary: Canary) -> bool {
    #[cfg(feature = "canary")]
    {
        ACTIVE.with(|active| active.get() == Some(canary))
    }
    #[cfg(not(feature = "canary"))]
    {
        let _ = canary;
        false
    }
}
