//! The direct checks of a history: each looks for one kind of [`Violation`] and reports it with
//! the operations, and their times, that prove it.
//!
//! Every check is sound: it reports only what no execution consistent with the history could
//! avoid. Where the history leaves an order open (overlapping operations, equal times, unknown
//! outcomes), the check assumes the order that explains the history.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use palisade_core::{Access as Held, Mode, SessionId, Token};

use crate::history::{Access, Action, ClientId, Grant, History, Op, OpId, Outcome, Reply};

/// At most this many violations of one check are reported; the rest are counted.
pub const VIOLATIONS_PER_CHECK_MAX: usize = 20;

/// The checks, named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Check {
    /// 1: per lock, a grant that follows another in real time has a larger token.
    TokensGrowPerLock,
    /// 2: no two acknowledged grants share a token, across all locks.
    TokensUnique,
    /// 3: a grant's token is above every token acknowledged, for any lock, before it was
    /// invoked (Palisade's tokens come from one counter).
    TokensGrowAcrossLocks,
    /// 4: no other grant of a lock completes while its holder still believes in its lease.
    LeaseBelief,
    /// 5: a fenced resource accepts tokens in order and refuses only superseded ones.
    FenceOrder,
    /// 6: read-modify-write sections at a fenced resource lose no acknowledged increment.
    NoLostUpdate,
    /// 7: a linearizable read of a lock's state reflects every grant and release of it
    /// acknowledged before the read was invoked.
    ReadsReflectAcknowledged,
    /// 8: a semaphore's permits are in slots below its size (and check 4 holds per slot, so at
    /// most `N` holders are live).
    PermitsWithinSize,
    /// 9: a fenced resource accepts no write from a reader, nor from a writer after an access
    /// of a later shared phase.
    WritesNeedExclusive,
    /// 10: a multi-acquire is granted all its locks at one point, or none of them.
    MultiAllOrNone,
}

/// One operation of a violation, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpRef {
    pub id: OpId,
    pub op: Op,
}

impl fmt::Display for OpRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{} {}", self.id.0, self.op)
    }
}

/// Something the history proves went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Check 1: `later` was invoked after `earlier` completed, on the same lock, and its token
    /// is not larger.
    TokenNotAboveEarlierGrant { earlier: OpRef, later: OpRef },
    /// Check 2: two different grants (lock or session differ) with one token.
    DuplicateToken { first: OpRef, second: OpRef },
    /// Check 3: `later` was invoked after `earlier` completed, on another lock, and its token
    /// is not larger.
    TokenNotAboveEarlierLock { earlier: OpRef, later: OpRef },
    /// Check 4: `other` was granted (larger token) and acknowledged at a time when `holder`'s
    /// client, told by `renewal`, still believed its lease ran until `belief_end_ns`, and had
    /// not begun to release.
    LeaseOutlasted {
        holder: OpRef,
        renewal: OpRef,
        belief_end_ns: u64,
        other: OpRef,
    },
    /// Check 5: the resource accepted `lower` after it had accepted the larger token of
    /// `higher`.
    FenceWentBack { higher: OpRef, lower: OpRef },
    /// Check 5: the resource accepted one token from two sessions.
    EqualTokenOtherSession { first: OpRef, second: OpRef },
    /// Check 5: the resource refused a grant as stale though no larger token (nor the same
    /// token of another session) can have reached it before.
    RefusedWithoutCause { refused: OpRef },
    /// Check 6: two accepted writes of one counter value: both read the value below it, and one
    /// increment was lost.
    IncrementWrittenTwice { first: OpRef, second: OpRef },
    /// Check 6: a read returned less than a write acknowledged before it was invoked.
    StaleRead { write: OpRef, read: OpRef },
    /// Check 6: a read returned a value the counter cannot have reached: `missing` (at most the
    /// value read) was written by no write invoked before the read completed.
    UnwrittenValue { read: OpRef, missing: i64 },
    /// Check 7: a read of the lock showed neither a holder nor a last token as large as the
    /// token of `grant`, acknowledged before the read was invoked.
    ReadMissedGrant { grant: OpRef, read: OpRef },
    /// Check 7: a read showed as holder a grant whose release was acknowledged before the read
    /// was invoked.
    ReadShowedReleased { release: OpRef, read: OpRef },
    /// Check 8: a permit granted in a slot at or above its semaphore's size.
    SlotOutOfRange { grant: OpRef },
    /// Check 9: the resource accepted a write presenting a reader's grant.
    WriteFromReader { write: OpRef },
    /// Check 9: the resource accepted a writer's write after it had accepted an access of a
    /// later shared phase (a larger token): the writer's phase was superseded.
    WriteAfterLaterPhase { phase: OpRef, write: OpRef },
    /// Check 10: a multi-acquire of `parts` locks was answered with `granted` of them (`part`
    /// one of those): a partial hold.
    MultiGrantPartial {
        part: OpRef,
        granted: u32,
        parts: u32,
    },
    /// Check 10: `other`, a grant of a lock that the multi-acquire of `part` took exclusive,
    /// has a token between two of that multi-acquire's tokens: its locks were not all granted
    /// at one point (the lock went to someone else between two of its grants).
    MultiGrantSplit { part: OpRef, other: OpRef },
}

impl Violation {
    pub fn check(&self) -> Check {
        match self {
            Violation::TokenNotAboveEarlierGrant { .. } => Check::TokensGrowPerLock,
            Violation::DuplicateToken { .. } => Check::TokensUnique,
            Violation::TokenNotAboveEarlierLock { .. } => Check::TokensGrowAcrossLocks,
            Violation::LeaseOutlasted { .. } => Check::LeaseBelief,
            Violation::FenceWentBack { .. }
            | Violation::EqualTokenOtherSession { .. }
            | Violation::RefusedWithoutCause { .. } => Check::FenceOrder,
            Violation::IncrementWrittenTwice { .. }
            | Violation::StaleRead { .. }
            | Violation::UnwrittenValue { .. } => Check::NoLostUpdate,
            Violation::ReadMissedGrant { .. } | Violation::ReadShowedReleased { .. } => {
                Check::ReadsReflectAcknowledged
            }
            Violation::SlotOutOfRange { .. } => Check::PermitsWithinSize,
            Violation::WriteFromReader { .. } | Violation::WriteAfterLaterPhase { .. } => {
                Check::WritesNeedExclusive
            }
            Violation::MultiGrantPartial { .. } | Violation::MultiGrantSplit { .. } => {
                Check::MultiAllOrNone
            }
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::TokenNotAboveEarlierGrant { earlier, later } => write!(
                f,
                "a later grant of the lock has no larger token:\n  earlier {earlier}\n  later   {later}"
            ),
            Violation::DuplicateToken { first, second } => {
                write!(f, "two grants share a token:\n  {first}\n  {second}")
            }
            Violation::TokenNotAboveEarlierLock { earlier, later } => write!(
                f,
                "a grant's token is not above one acknowledged before it was invoked:\n  \
                 earlier {earlier}\n  later   {later}"
            ),
            Violation::LeaseOutlasted {
                holder,
                renewal,
                belief_end_ns,
                other,
            } => write!(
                f,
                "another grant completed while the holder believed in its lease (until \
                 {belief_end_ns} ns) and had not released:\n  holder  {holder}\n  renewal \
                 {renewal}\n  other   {other}"
            ),
            Violation::FenceWentBack { higher, lower } => write!(
                f,
                "the resource accepted a lower token after a higher one:\n  higher {higher}\n  \
                 lower  {lower}"
            ),
            Violation::EqualTokenOtherSession { first, second } => write!(
                f,
                "the resource accepted one token from two sessions:\n  {first}\n  {second}"
            ),
            Violation::RefusedWithoutCause { refused } => write!(
                f,
                "the resource refused a grant as stale with no larger token before it:\n  \
                 {refused}"
            ),
            Violation::IncrementWrittenTwice { first, second } => write!(
                f,
                "one counter value was written twice, an increment was lost:\n  {first}\n  \
                 {second}"
            ),
            Violation::StaleRead { write, read } => write!(
                f,
                "a read returned less than a write acknowledged before it:\n  write {write}\n  \
                 read  {read}"
            ),
            Violation::UnwrittenValue { read, missing } => write!(
                f,
                "a read returned a value the counter cannot have reached ({missing} was never \
                 written before it):\n  {read}"
            ),
            Violation::ReadMissedGrant { grant, read } => write!(
                f,
                "a read of the lock missed a grant acknowledged before it began:\n  grant {grant}\n  \
                 read  {read}"
            ),
            Violation::ReadShowedReleased { release, read } => write!(
                f,
                "a read of the lock showed a holder whose release was acknowledged before it \
                 began:\n  release {release}\n  read    {read}"
            ),
            Violation::SlotOutOfRange { grant } => write!(
                f,
                "a permit was granted in a slot beyond its semaphore's size:\n  {grant}"
            ),
            Violation::WriteFromReader { write } => write!(
                f,
                "the resource accepted a write from a reader's grant:\n  {write}"
            ),
            Violation::WriteAfterLaterPhase { phase, write } => write!(
                f,
                "the resource accepted a writer's write after an access of a later shared \
                 phase:\n  phase {phase}\n  write {write}"
            ),
            Violation::MultiGrantPartial {
                part,
                granted,
                parts,
            } => write!(
                f,
                "a multi-acquire of {parts} locks was granted {granted} of them:\n  {part}"
            ),
            Violation::MultiGrantSplit { part, other } => write!(
                f,
                "a multi-acquire's locks were not granted at one point: another grant of one of \
                 them has a token between two of its tokens:\n  part  {part}\n  other {other}"
            ),
        }
    }
}

/// The verdict on a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// How many operations the history holds.
    pub ops: usize,
    /// The violations found, at most [`VIOLATIONS_PER_CHECK_MAX`] per check.
    pub violations: Vec<Violation>,
    /// Violations found beyond that limit, not reported.
    pub violations_unreported: usize,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one check.
    pub fn of(&self, check: Check) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.check() == check)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(f, "{} operations, no violation", self.ops);
        }
        write!(
            f,
            "{} operations, {} violations",
            self.ops,
            self.violations.len() + self.violations_unreported
        )?;
        if self.violations_unreported > 0 {
            write!(f, " ({} not shown)", self.violations_unreported)?;
        }
        for violation in &self.violations {
            write!(f, "\n{:?}: {violation}", violation.check())?;
        }
        Ok(())
    }
}

/// Collects violations, at most [`VIOLATIONS_PER_CHECK_MAX`] per check.
struct Found<'h> {
    history: &'h History,
    violations: Vec<Violation>,
    per_check: BTreeMap<Check, usize>,
    unreported: usize,
}

impl Found<'_> {
    fn op(&self, id: OpId) -> OpRef {
        OpRef {
            id,
            op: self.history.ops()[id.0].clone(),
        }
    }

    fn report(&mut self, violation: Violation) {
        let count = self.per_check.entry(violation.check()).or_default();
        if *count < VIOLATIONS_PER_CHECK_MAX {
            *count += 1;
            self.violations.push(violation);
        } else {
            self.unreported += 1;
        }
    }
}

/// An acknowledged grant.
struct Granted<'h> {
    id: OpId,
    op: &'h Op,
    lock: &'h str,
    grant: Grant,
    /// How it holds the lock.
    held: Held,
    /// The semaphore's size its acquire named, for a permit.
    permits: Option<u32>,
    /// For a part of a multi-acquire: its client, request and how many locks it named.
    multi: Option<(ClientId, u64, u32)>,
}

impl Granted<'_> {
    /// Whether the two grants of one lock may hold it at once: readers of one phase (one
    /// token), or permits in different slots.
    fn may_coexist(&self, other: &Granted<'_>) -> bool {
        self.lock == other.lock
            && match (self.held, other.held) {
                (Held::Shared, Held::Shared) => self.grant.token == other.grant.token,
                (Held::Slot(a), Held::Slot(b)) => a != b,
                _ => false,
            }
    }

    /// Whether both are readers of one phase of one lock (who share its token).
    fn same_phase(&self, other: &Granted<'_>) -> bool {
        self.held == Held::Shared && other.held == Held::Shared && self.may_coexist(other)
    }
}

/// Runs every check on `history`.
pub fn check(history: &History) -> Report {
    let mut found = Found {
        history,
        violations: Vec::new(),
        per_check: BTreeMap::new(),
        unreported: 0,
    };
    let grants: Vec<Granted<'_>> = history
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| {
            let (lock, mode, multi) = match &op.action {
                Action::Acquire { lock, .. } => (lock, Mode::Exclusive, None),
                Action::AcquireAs { lock, mode, .. } => (lock, *mode, None),
                Action::AcquirePart {
                    lock,
                    mode,
                    request,
                    parts,
                    ..
                } => (lock, *mode, Some((op.client, *request, *parts))),
                _ => return None,
            };
            let (grant, held) = op.granted_as()?;
            Some(Granted {
                id: OpId(i),
                op,
                lock,
                grant,
                held,
                permits: mode.permits(),
                multi,
            })
        })
        .collect();
    tokens_grow(&grants, &mut found);
    tokens_unique(&grants, &mut found);
    lease_belief(history, &grants, &mut found);
    reads_reflect_acknowledged(history, &grants, &mut found);
    permits_within_size(&grants, &mut found);
    multi_all_or_none(history, &grants, &mut found);
    let held: HashMap<Grant, Held> = grants.iter().map(|g| (g.grant, g.held)).collect();
    for accesses in resource_scopes(history).values() {
        fence_order(accesses, &held, &mut found);
        writes_need_exclusive(accesses, &held, &mut found);
        no_lost_update(accesses, &mut found);
    }
    Report {
        ops: history.ops().len(),
        violations: found.violations,
        violations_unreported: found.unreported,
    }
}

/// Checks 1 and 3. For each grant, the earlier grant with the largest token among those that
/// completed before it was invoked, on its lock (check 1) and on any other (check 3).
fn tokens_grow(grants: &[Granted<'_>], found: &mut Found<'_>) {
    let mut by_completion: Vec<&Granted<'_>> = grants.iter().collect();
    by_completion.sort_by_key(|g| g.op.effect_by_ns());
    let mut by_invocation: Vec<&Granted<'_>> = grants.iter().collect();
    by_invocation.sort_by_key(|g| g.op.invoke_ns);
    // The completed grant with the largest token so far, per lock.
    let mut largest: HashMap<&str, &Granted<'_>> = HashMap::new();
    let mut completed = by_completion.iter().peekable();
    for later in by_invocation {
        while let Some(earlier) = completed.next_if(|e| e.op.precedes(later.op)) {
            let entry = largest.entry(earlier.lock).or_insert(earlier);
            if earlier.grant.token > entry.grant.token {
                *entry = earlier;
            }
        }
        // The same grant acknowledged twice (a retried request) is one grant; the readers of
        // one phase share its token.
        if let Some(earlier) = largest.get(later.lock)
            && (earlier.grant.token > later.grant.token
                || (earlier.grant.token == later.grant.token
                    && earlier.grant != later.grant
                    && !earlier.same_phase(later)))
        {
            found.report(Violation::TokenNotAboveEarlierGrant {
                earlier: found.op(earlier.id),
                later: found.op(later.id),
            });
        }
        // A reader may join a phase opened before: its token was drawn then.
        let other_lock = largest
            .values()
            .filter(|e| e.lock != later.lock)
            .max_by_key(|e| e.grant.token);
        if let Some(earlier) = other_lock
            && later.held != Held::Shared
            && earlier.grant.token >= later.grant.token
        {
            found.report(Violation::TokenNotAboveEarlierLock {
                earlier: found.op(earlier.id),
                later: found.op(later.id),
            });
        }
    }
}

/// Check 2. The same grant acknowledged twice (one lock, session and token: a retried request
/// answered with its first outcome) is one grant, if one client was answered both times: a
/// session is its client's, so the same (lock, session, token) acknowledged to two clients is
/// one sequencer issued twice (a session id and a token re-issued after a recovery).
fn tokens_unique(grants: &[Granted<'_>], found: &mut Found<'_>) {
    let mut first: HashMap<Token, &Granted<'_>> = HashMap::new();
    for grant in grants {
        match first.get(&grant.grant.token) {
            None => {
                first.insert(grant.grant.token, grant);
            }
            Some(earlier)
                if earlier.lock == grant.lock
                    && earlier.grant == grant.grant
                    && earlier.op.client == grant.op.client => {}
            Some(earlier) if earlier.same_phase(grant) => {}
            Some(earlier) => found.report(Violation::DuplicateToken {
                first: found.op(earlier.id),
                second: found.op(grant.id),
            }),
        }
    }
}

/// Check 4. The holder of grant `g` believes its session lives until the latest
/// `sent + ttl·(1 − ρ)` of its acknowledged renewals; the service may end it no earlier. So a
/// later grant of the lock (larger token) acknowledged before that time is a violation, unless
/// the holder had begun to release `g` by then (a release acknowledged or of unknown outcome,
/// invoked before the other grant completed).
fn lease_belief(history: &History, grants: &[Granted<'_>], found: &mut Found<'_>) {
    let mut belief: HashMap<SessionId, (u64, OpId)> = HashMap::new();
    let mut release_from: HashMap<(&str, Grant), u64> = HashMap::new();
    for (i, op) in history.ops().iter().enumerate() {
        match (&op.action, op.outcome) {
            (Action::Renew { session, ttl_ns }, Outcome::Ok(Reply::Renewed)) => {
                let end_ns = history.belief_end_ns(op.invoke_ns, *ttl_ns);
                let entry = belief.entry(*session).or_insert((end_ns, OpId(i)));
                if end_ns > entry.0 {
                    *entry = (end_ns, OpId(i));
                }
            }
            (
                Action::Release {
                    lock,
                    session,
                    token,
                },
                Outcome::Ok(_) | Outcome::Unknown,
            ) => {
                let grant = Grant {
                    session: *session,
                    token: *token,
                };
                let entry = release_from
                    .entry((lock.as_str(), grant))
                    .or_insert(op.invoke_ns);
                *entry = (*entry).min(op.invoke_ns);
            }
            _ => {}
        }
    }
    for holder in grants {
        let Some(&(belief_end_ns, renewal)) = belief.get(&holder.grant.session) else {
            continue;
        };
        let released_ns = release_from
            .get(&(holder.lock, holder.grant))
            .copied()
            .unwrap_or(u64::MAX);
        let first = grants.iter().find(|other| {
            other.lock == holder.lock
                && other.grant.token > holder.grant.token
                && !holder.may_coexist(other)
                && other.op.effect_by_ns() < belief_end_ns
                && other.op.effect_by_ns() < released_ns
                && !history.recovery_between(holder.op, other.op)
        });
        if let Some(other) = first {
            found.report(Violation::LeaseOutlasted {
                holder: found.op(holder.id),
                renewal: found.op(renewal),
                belief_end_ns,
                other: found.op(other.id),
            });
        }
    }
}

/// Check 7. A read of a lock invoked after a grant of it was acknowledged shows that grant's
/// token or a larger one, as its holder's or as the lock's last token (tokens only grow, so
/// this holds whatever happened in between). A read that shows no token at all (no holder,
/// last token 0: the service forgot an idle lock's last token) says nothing about grants. A
/// read invoked after the release of a grant was acknowledged does not show that grant as the
/// holder (a grant never comes back). Unknown outcomes and operations overlapping the read
/// order nothing.
fn reads_reflect_acknowledged(history: &History, grants: &[Granted<'_>], found: &mut Found<'_>) {
    let releases: Vec<(OpId, &Op, &str, Grant)> = history
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| match (&op.action, op.outcome) {
            (
                Action::Release {
                    lock,
                    session,
                    token,
                },
                Outcome::Ok(Reply::Released),
            ) => Some((
                OpId(i),
                op,
                lock.as_str(),
                Grant {
                    session: *session,
                    token: *token,
                },
            )),
            _ => None,
        })
        .collect();
    for (i, read) in history.ops().iter().enumerate() {
        let (Action::Status { lock }, Outcome::Ok(Reply::Status { holder, last_token })) =
            (&read.action, read.outcome)
        else {
            continue;
        };
        let shown = holder.map_or(last_token, |g| g.token.max(last_token));
        let missed = grants
            .iter()
            .filter(|g| g.lock == lock && g.op.precedes(read) && g.grant.token > shown)
            .filter(|g| !history.recovery_between(g.op, read))
            .max_by_key(|g| g.grant.token);
        if let Some(grant) = missed
            && shown != Token::ZERO
        {
            found.report(Violation::ReadMissedGrant {
                grant: found.op(grant.id),
                read: found.op(OpId(i)),
            });
        }
        let released = releases.iter().find(|(_, op, l, g)| {
            *l == lock
                && Some(*g) == holder
                && op.precedes(read)
                && !history.recovery_between(op, read)
        });
        if let Some(&(release, ..)) = released {
            found.report(Violation::ReadShowedReleased {
                release: found.op(release),
                read: found.op(OpId(i)),
            });
        }
    }
}

/// Accesses to one scope of one resource.
type Accesses<'h> = Vec<(OpId, &'h Op)>;

fn resource_scopes(history: &History) -> BTreeMap<(&str, &str), Accesses<'_>> {
    let mut scopes: BTreeMap<(&str, &str), Accesses<'_>> = BTreeMap::new();
    for (i, op) in history.ops().iter().enumerate() {
        if let Action::Resource {
            resource, scope, ..
        } = &op.action
        {
            scopes
                .entry((resource.as_str(), scope.as_str()))
                .or_default()
                .push((OpId(i), op));
        }
    }
    scopes
}

fn grant_of(op: &Op) -> Option<Grant> {
    match &op.action {
        Action::Resource { grant, .. } => *grant,
        _ => None,
    }
}

fn accepted_position(op: &Op) -> Option<Option<u64>> {
    match op.outcome {
        Outcome::Ok(Reply::Accepted { position, .. }) => Some(position),
        _ => None,
    }
}

/// Whether the resource certainly applied `a` before `b`: by their positions in its apply order
/// if both have one, else by real time.
fn applied_before(a: &Op, b: &Op) -> bool {
    match (
        accepted_position(a).flatten(),
        accepted_position(b).flatten(),
    ) {
        (Some(pa), Some(pb)) => pa < pb,
        _ => a.precedes(b),
    }
}

/// Whether both grants are readers' (of one phase, if their tokens are equal).
fn both_shared(held: &HashMap<Grant, Held>, a: Grant, b: Grant) -> bool {
    let shared = |g: Grant| held.get(&g) == Some(&Held::Shared);
    shared(a) && shared(b)
}

/// Check 5, on one scope. The readers of one phase present one token from several sessions.
fn fence_order(accesses: &Accesses<'_>, held: &HashMap<Grant, Held>, found: &mut Found<'_>) {
    let accepted: Vec<(OpId, &Op, Grant)> = accesses
        .iter()
        .filter(|(_, op)| accepted_position(op).is_some())
        .filter_map(|&(id, op)| grant_of(op).map(|g| (id, op, g)))
        .collect();
    for &(a_id, a, a_grant) in &accepted {
        for &(b_id, b, b_grant) in &accepted {
            if b_grant.token < a_grant.token
                && applied_before(a, b)
                && !superseded_writer(held, a_grant, b)
            {
                found.report(Violation::FenceWentBack {
                    higher: found.op(a_id),
                    lower: found.op(b_id),
                });
            }
            if a_id < b_id
                && a_grant.token == b_grant.token
                && a_grant.session != b_grant.session
                && !both_shared(held, a_grant, b_grant)
            {
                found.report(Violation::EqualTokenOtherSession {
                    first: found.op(a_id),
                    second: found.op(b_id),
                });
            }
        }
    }
    for &(refused_id, refused) in accesses {
        if refused.outcome != Outcome::Ok(Reply::Stale) {
            continue;
        }
        let presented = grant_of(refused).expect("a stale reply answers a fenced access");
        // A cause invoked no later than the refusal completed may have come first (equal
        // times order nothing).
        let caused = accesses.iter().any(|&(_, cause)| {
            let Some(g) = grant_of(cause) else {
                return false;
            };
            let supersedes = g.token > presented.token
                || (g.token == presented.token
                    && g.session != presented.session
                    && !both_shared(held, g, presented));
            let may_have_applied = matches!(cause.outcome, Outcome::Ok(Reply::Accepted { .. }))
                || cause.outcome == Outcome::Unknown;
            supersedes && may_have_applied && cause.invoke_ns <= refused.effect_by_ns()
        });
        if !caused {
            found.report(Violation::RefusedWithoutCause {
                refused: found.op(refused_id),
            });
        }
    }
}

/// Whether `lower` is a writer's write and `higher` the grant of a reader (of a later phase):
/// check 9 reports that, more precisely than check 5.
fn superseded_writer(held: &HashMap<Grant, Held>, higher: Grant, lower: &Op) -> bool {
    held.get(&higher) == Some(&Held::Shared)
        && matches!(
            lower.action,
            Action::Resource {
                access: Access::Write { .. },
                ..
            }
        )
}

/// Check 8: every permit's slot is below the size its acquire named.
fn permits_within_size(grants: &[Granted<'_>], found: &mut Found<'_>) {
    for g in grants {
        if let (Held::Slot(slot), Some(permits)) = (g.held, g.permits)
            && slot >= permits
        {
            found.report(Violation::SlotOutOfRange {
                grant: found.op(g.id),
            });
        }
    }
}

/// Check 10. A multi-acquire's parts (one [`Action::AcquirePart`] per lock, grouped by client
/// and request) are granted all or none: a reply granting some parts and not others is a
/// partial hold. And all at one point: each part that draws a token (held exclusive or in a
/// slot; a reader may join a phase opened before) draws it in the same step, so no other grant
/// of a lock the multi-acquire took exclusive has a token between the smallest and the largest
/// of those tokens (it would have taken the lock while the multi-acquire held some of its
/// locks and waited for the rest).
fn multi_all_or_none(history: &History, grants: &[Granted<'_>], found: &mut Found<'_>) {
    let mut groups: BTreeMap<(ClientId, u64), (u32, Vec<OpId>)> = BTreeMap::new();
    for (i, op) in history.ops().iter().enumerate() {
        if let Action::AcquirePart { request, parts, .. } = &op.action {
            let group = groups
                .entry((op.client, *request))
                .or_insert((*parts, Vec::new()));
            group.0 = group.0.max(*parts);
            group.1.push(OpId(i));
        }
    }
    for ((client, request), (parts, ops)) in &groups {
        let granted: Vec<&Granted<'_>> = grants
            .iter()
            .filter(|g| {
                g.multi
                    .is_some_and(|(c, r, _)| (c, r) == (*client, *request))
            })
            .collect();
        let Some(first) = granted.first() else {
            continue;
        };
        let answered = u32::try_from(granted.len()).unwrap_or(u32::MAX);
        if answered < *parts || ops.len() > granted.len() {
            found.report(Violation::MultiGrantPartial {
                part: found.op(first.id),
                granted: answered.min(*parts),
                parts: *parts,
            });
            continue;
        }
        let drawn = granted.iter().filter(|g| g.held != Held::Shared);
        let (Some(low), Some(high)) = (
            drawn.clone().map(|g| g.grant.token).min(),
            drawn.map(|g| g.grant.token).max(),
        ) else {
            continue;
        };
        let split = granted
            .iter()
            .filter(|part| part.held == Held::Exclusive)
            .find_map(|part| {
                grants
                    .iter()
                    .find(|other| {
                        other.lock == part.lock
                            && other.grant.token > low
                            && other.grant.token < high
                            && other
                                .multi
                                .is_none_or(|(c, r, _)| (c, r) != (*client, *request))
                    })
                    .map(|other| (part, other))
            });
        if let Some((part, other)) = split {
            found.report(Violation::MultiGrantSplit {
                part: found.op(part.id),
                other: found.op(other.id),
            });
        }
    }
}

/// Check 9, on one scope: an accepted write presents a writer's grant (a reader's is refused
/// whatever its token), applied after no accepted access of a later shared phase.
fn writes_need_exclusive(
    accesses: &Accesses<'_>,
    held: &HashMap<Grant, Held>,
    found: &mut Found<'_>,
) {
    let accepted = || {
        accesses
            .iter()
            .filter(|(_, op)| accepted_position(op).is_some())
            .filter_map(|&(id, op)| grant_of(op).map(|g| (id, op, g)))
    };
    for (write_id, write, grant) in accepted() {
        if !matches!(
            write.action,
            Action::Resource {
                access: Access::Write { .. },
                ..
            }
        ) {
            continue;
        }
        if held.get(&grant) == Some(&Held::Shared) {
            found.report(Violation::WriteFromReader {
                write: found.op(write_id),
            });
            continue;
        }
        let phase = accepted().find(|&(_, op, g)| {
            g.token > grant.token
                && held.get(&g) == Some(&Held::Shared)
                && applied_before(op, write)
        });
        if let Some((phase_id, ..)) = phase {
            found.report(Violation::WriteAfterLaterPhase {
                phase: found.op(phase_id),
                write: found.op(write_id),
            });
        }
    }
}

/// Check 6, on one scope read as a counter from 0 (see [`Access`]).
fn no_lost_update(accesses: &Accesses<'_>, found: &mut Found<'_>) {
    let writes: Vec<(OpId, &Op, i64)> = accesses
        .iter()
        .filter_map(|&(id, op)| match op.action {
            Action::Resource {
                access: Access::Write { value },
                ..
            } => Some((id, op, value)),
            _ => None,
        })
        .collect();
    let is_accepted = |op: &Op| accepted_position(op).is_some();
    let may_have_applied = |op: &Op| is_accepted(op) || op.outcome == Outcome::Unknown;

    let mut first_of_value: HashMap<i64, OpId> = HashMap::new();
    for &(id, _, value) in writes.iter().filter(|(_, op, _)| is_accepted(op)) {
        match first_of_value.get(&value) {
            Some(&first) => found.report(Violation::IncrementWrittenTwice {
                first: found.op(first),
                second: found.op(id),
            }),
            None => {
                first_of_value.insert(value, id);
            }
        }
    }

    for &(read_id, read) in accesses {
        let Outcome::Ok(Reply::Accepted { value, .. }) = read.outcome else {
            continue;
        };
        if !matches!(
            read.action,
            Action::Resource {
                access: Access::Read,
                ..
            }
        ) {
            continue;
        }
        let value = value.unwrap_or(0);
        let newest_before = writes
            .iter()
            .filter(|(_, w, _)| is_accepted(w) && w.precedes(read))
            .max_by_key(|(_, _, v)| *v);
        if let Some(&(write_id, _, written)) = newest_before
            && written > value
        {
            found.report(Violation::StaleRead {
                write: found.op(write_id),
                read: found.op(read_id),
            });
        }
        let reachable = |v: i64| {
            writes.iter().any(|(_, w, wv)| {
                *wv == v && may_have_applied(w) && w.invoke_ns <= read.effect_by_ns()
            })
        };
        // Bounded by the number of writes: a value above it cannot be reached.
        let limit = i64::try_from(writes.len()).unwrap_or(i64::MAX);
        let missing = if value < 0 {
            (!reachable(value)).then_some(value)
        } else {
            (1..=value.min(limit.saturating_add(1))).find(|&v| !reachable(v))
        };
        if let Some(missing) = missing {
            found.report(Violation::UnwrittenValue {
                read: found.op(read_id),
                missing,
            });
        }
    }
}
