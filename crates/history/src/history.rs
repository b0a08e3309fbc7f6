//! What a history holds: operations, each an invocation and (perhaps) a completion on one
//! observer's clock, and how they are recorded.

use std::fmt;

use palisade_core::{Access as Held, Mode, SessionId, Token};

/// The largest drift bound a history takes, in parts per million: a bound of a million would
/// let a lease last no time at all.
pub const DRIFT_BOUND_PPM_MAX: u32 = 999_999;

/// Who issued an operation: a simulated client, a worker of the nemesis run. Operations of one
/// client need not be sequential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClientId(pub u64);

/// An operation's place in its [`History`], in the order of invocation recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub usize);

/// One grant of a lock, as the service acknowledged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Grant {
    pub session: SessionId,
    pub token: Token,
}

/// What a client asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Acquire `lock` on a session whose lease is `ttl_ns`; answered by [`Reply::Granted`].
    Acquire { lock: String, ttl_ns: u64 },
    /// Acquire `lock` in `mode` (issue 32: shared, or a permit of a semaphore of `N`);
    /// answered by [`Reply::Granted`] for [`Mode::Exclusive`], else by [`Reply::GrantedAs`].
    AcquireAs {
        lock: String,
        ttl_ns: u64,
        mode: Mode,
    },
    /// One lock of a multi-acquire (issue 32: `AcquireAll`, every lock granted in one step or
    /// none), answered as [`Action::AcquireAs`] is. A multi-acquire of `parts` locks is recorded
    /// as one `AcquirePart` per lock, all with its invocation and completion, and the same
    /// `request` (unique per client): a part the reply did not grant is [`Outcome::Failed`].
    AcquirePart {
        lock: String,
        ttl_ns: u64,
        mode: Mode,
        request: u64,
        parts: u32,
    },
    /// Release the grant of `lock` with `token` held by `session`; answered by
    /// [`Reply::Released`].
    Release {
        lock: String,
        session: SessionId,
        token: Token,
    },
    /// Renew (or open) `session`'s lease for `ttl_ns`. The invocation time is the renewal's send
    /// time; an acknowledged renewal makes the client believe its session lives until
    /// `invoke + ttl·(1 − ρ)`. Answered by [`Reply::Renewed`].
    Renew { session: SessionId, ttl_ns: u64 },
    /// A linearizable read of `lock`'s state (`Status`, or one lock of `ListLocks`, not marked
    /// stale); answered by [`Reply::Status`]. A stale read promises nothing: do not record it.
    Status { lock: String },
    /// An access to `scope` (bound to one lock) at the fenced resource `resource`; answered by
    /// [`Reply::Accepted`] or [`Reply::Stale`].
    Resource {
        resource: String,
        scope: String,
        /// The grant presented, `None` for an observer's unfenced read.
        grant: Option<Grant>,
        access: Access,
    },
}

/// What an access to a fenced resource does. The checks of lost updates read the scope's
/// value as a counter that starts at 0 and that each holder increments by one (it reads `v`,
/// then writes `v + 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Advance the scope's accepted token without reading or writing.
    Claim,
    /// Read the scope's value.
    Read,
    /// Set the scope's value.
    Write { value: i64 },
}

/// What the system answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Granted(Grant),
    /// A grant held shared (a reader of the phase whose token it has) or a permit's slot.
    GrantedAs {
        grant: Grant,
        held: Held,
    },
    Released,
    Renewed,
    /// What a read of a lock's state showed: its holder, and the largest token the service
    /// says it granted for the lock ([`Token::ZERO`] if it does not know: a service may forget
    /// the last token of a lock idle for long).
    Status {
        holder: Option<Grant>,
        last_token: Token,
    },
    /// The resource applied the access. `value` is what a read returned (`None` if the scope
    /// had no value yet, read as 0). `position` is the access's place in the resource's apply
    /// order if the resource reports one (the simulation's resources do; the fenced store's
    /// revisions give it for writes); accesses without one are ordered by real time only.
    Accepted {
        value: Option<i64>,
        position: Option<u64>,
    },
    /// The resource refused the grant as superseded; nothing was applied.
    Stale,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok(Reply),
    /// Known not to have taken effect (refused, never sent, not acquired in time).
    Failed,
    /// May have taken effect, at any time after its invocation: its completion counts as +∞.
    Unknown,
}

/// One operation of a [`History`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    pub client: ClientId,
    pub action: Action,
    /// When the client invoked it, in nanoseconds on the observer's clock.
    pub invoke_ns: u64,
    /// When the client learnt the outcome; `None` if it never did.
    pub complete_ns: Option<u64>,
    pub outcome: Outcome,
}

impl Op {
    /// The latest time the operation can have taken effect: its completion if the outcome is
    /// known, else +∞ (`u64::MAX`).
    pub fn effect_by_ns(&self) -> u64 {
        match (self.outcome, self.complete_ns) {
            (Outcome::Unknown, _) | (_, None) => u64::MAX,
            (_, Some(complete_ns)) => complete_ns,
        }
    }

    /// Whether this operation certainly took effect before `later` was invoked (real-time
    /// order). Equal times order nothing.
    pub fn precedes(&self, later: &Op) -> bool {
        self.effect_by_ns() < later.invoke_ns
    }

    /// The grant an acknowledged acquire got.
    pub fn granted(&self) -> Option<Grant> {
        self.granted_as().map(|(grant, _)| grant)
    }

    /// The grant an acknowledged acquire got, and how it holds the lock.
    pub fn granted_as(&self) -> Option<(Grant, Held)> {
        match self.outcome {
            Outcome::Ok(Reply::Granted(grant)) => Some((grant, Held::Exclusive)),
            Outcome::Ok(Reply::GrantedAs { grant, held }) => Some((grant, held)),
            _ => None,
        }
    }
}

/// A bad record: the history refuses it and stays as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum HistoryError {
    /// A drift bound of a million parts per million or more.
    DriftBound { drift_bound_ppm: u32 },
    /// No operation has this id.
    NoSuchOp(OpId),
    /// The operation was completed already.
    AlreadyComplete(OpId),
    /// A completion before the invocation.
    CompletedBeforeInvoked {
        op: OpId,
        invoke_ns: u64,
        complete_ns: u64,
    },
    /// A reply that does not answer the action (a grant for a release, …).
    ReplyDoesNotMatch { op: OpId, reply: Reply },
    /// A known outcome without a completion time.
    NoCompletionTime(OpId),
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::DriftBound { drift_bound_ppm } => write!(
                f,
                "drift bound {drift_bound_ppm} ppm is above {DRIFT_BOUND_PPM_MAX} ppm"
            ),
            HistoryError::NoSuchOp(op) => write!(f, "no operation #{}", op.0),
            HistoryError::AlreadyComplete(op) => {
                write!(f, "operation #{} was completed already", op.0)
            }
            HistoryError::CompletedBeforeInvoked {
                op,
                invoke_ns,
                complete_ns,
            } => write!(
                f,
                "operation #{} completes at {complete_ns} ns, before its invocation at \
                 {invoke_ns} ns",
                op.0
            ),
            HistoryError::ReplyDoesNotMatch { op, reply } => {
                write!(f, "operation #{} cannot be answered by {reply:?}", op.0)
            }
            HistoryError::NoCompletionTime(op) => write!(
                f,
                "operation #{} has a known outcome but no completion time",
                op.0
            ),
        }
    }
}

impl std::error::Error for HistoryError {}

/// Operations recorded as invoke/complete on one observer's clock, and the drift bound ρ of the
/// clocks that measured leases.
///
/// Record as things happen with [`History::invoke`] and [`History::complete`] (an operation
/// never completed stays of unknown outcome), or add whole operations with [`History::push`].
/// Every record is checked as it comes, so a history always holds well-formed operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    ops: Vec<Op>,
    drift_bound_ppm: u32,
    /// The operator's recoveries that rewind the service's state, each the span (from, to) in
    /// which it may have taken effect: see [`History::recovered`].
    recoveries: Vec<(u64, u64)>,
}

impl History {
    /// An empty history whose lease clocks drift at most `drift_bound_ppm` parts per million
    /// from the observer's: a lease of `ttl` on a server lasts at least `ttl·(1 − ρ)` on the
    /// observer's clock.
    pub fn new(drift_bound_ppm: u32) -> Result<History, HistoryError> {
        if drift_bound_ppm > DRIFT_BOUND_PPM_MAX {
            return Err(HistoryError::DriftBound { drift_bound_ppm });
        }
        Ok(History {
            ops: Vec::new(),
            drift_bound_ppm,
            recoveries: Vec::new(),
        })
    }

    pub fn drift_bound_ppm(&self) -> u32 {
        self.drift_bound_ppm
    }

    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    pub fn op(&self, id: OpId) -> Option<&Op> {
        self.ops.get(id.0)
    }

    /// Records that `client` invoked `action` at `invoke_ns`; of unknown outcome until
    /// [completed](History::complete).
    pub fn invoke(&mut self, client: ClientId, invoke_ns: u64, action: Action) -> OpId {
        self.ops.push(Op {
            client,
            action,
            invoke_ns,
            complete_ns: None,
            outcome: Outcome::Unknown,
        });
        OpId(self.ops.len() - 1)
    }

    /// Records how operation `id` ended, at `complete_ns`.
    pub fn complete(
        &mut self,
        id: OpId,
        complete_ns: u64,
        outcome: Outcome,
    ) -> Result<(), HistoryError> {
        let op = self.ops.get(id.0).ok_or(HistoryError::NoSuchOp(id))?;
        if op.complete_ns.is_some() {
            return Err(HistoryError::AlreadyComplete(id));
        }
        validate(id, &op.action, op.invoke_ns, Some(complete_ns), outcome)?;
        let op = &mut self.ops[id.0];
        op.complete_ns = Some(complete_ns);
        op.outcome = outcome;
        Ok(())
    }

    /// Adds a whole operation.
    pub fn push(&mut self, op: Op) -> Result<OpId, HistoryError> {
        let id = OpId(self.ops.len());
        validate(id, &op.action, op.invoke_ns, op.complete_ns, op.outcome)?;
        self.ops.push(op);
        Ok(id)
    }

    /// Records an operator's recovery that rewinds the service's state (a restore from a
    /// backup, a log lost or rolled back and its counters recovered), which took effect at
    /// some time between `from_ns` and `to_ns`. Sessions, holders and the locks' last tokens
    /// may go back across it, so the checks of leases (4) and of reads (7) do not compare
    /// operations it may lie between; tokens and session ids never go back (invariant 13),
    /// so every other check holds across it.
    pub fn recovered(&mut self, from_ns: u64, to_ns: u64) {
        self.recoveries.push((from_ns, to_ns.max(from_ns)));
    }

    /// Whether a recovery may have taken effect after `earlier` was invoked and before
    /// `later` took effect.
    pub fn recovery_between(&self, earlier: &Op, later: &Op) -> bool {
        self.recoveries
            .iter()
            .any(|&(from, to)| from <= later.effect_by_ns() && to >= earlier.invoke_ns)
    }

    /// When a client that was told `ttl_ns` at `sent_ns` believes its lease ends:
    /// `sent + ttl·(1 − ρ)`, rounded down.
    pub fn belief_end_ns(&self, sent_ns: u64, ttl_ns: u64) -> u64 {
        let lost = u128::from(ttl_ns) * u128::from(self.drift_bound_ppm);
        let lost_ns = u64::try_from(lost.div_ceil(1_000_000)).expect("at most ttl_ns");
        sent_ns.saturating_add(ttl_ns - lost_ns)
    }
}

fn validate(
    id: OpId,
    action: &Action,
    invoke_ns: u64,
    complete_ns: Option<u64>,
    outcome: Outcome,
) -> Result<(), HistoryError> {
    if let Some(complete_ns) = complete_ns
        && complete_ns < invoke_ns
    {
        return Err(HistoryError::CompletedBeforeInvoked {
            op: id,
            invoke_ns,
            complete_ns,
        });
    }
    if complete_ns.is_none() && outcome != Outcome::Unknown {
        return Err(HistoryError::NoCompletionTime(id));
    }
    if let Outcome::Ok(reply) = outcome {
        let matches = match action {
            Action::Acquire { .. } => matches!(reply, Reply::Granted(_)),
            // The kind of access the mode asks for; a slot out of the semaphore's size is a
            // violation for the checks to report, not a bad record.
            Action::AcquireAs { mode, .. } | Action::AcquirePart { mode, .. } => matches!(
                (mode, reply),
                (Mode::Exclusive, Reply::Granted(_))
                    | (
                        Mode::Shared,
                        Reply::GrantedAs {
                            held: Held::Shared,
                            ..
                        }
                    )
                    | (
                        Mode::Permit(_),
                        Reply::GrantedAs {
                            held: Held::Slot(_),
                            ..
                        }
                    )
            ),
            Action::Release { .. } => reply == Reply::Released,
            Action::Renew { .. } => reply == Reply::Renewed,
            Action::Status { .. } => matches!(reply, Reply::Status { .. }),
            Action::Resource { grant, access, .. } => match reply {
                // Only a read returns a value.
                Reply::Accepted { value, .. } => value.is_none() || *access == Access::Read,
                // An unfenced read cannot be stale.
                Reply::Stale => grant.is_some(),
                _ => false,
            },
        };
        if !matches {
            return Err(HistoryError::ReplyDoesNotMatch { op: id, reply });
        }
    }
    Ok(())
}

fn mode_name(mode: Mode) -> String {
    match mode {
        Mode::Exclusive => "exclusive".to_owned(),
        Mode::Shared => "shared".to_owned(),
        Mode::Permit(n) => format!("permit of {n}"),
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "client {} ", self.client.0)?;
        match &self.action {
            Action::Acquire { lock, ttl_ns } => write!(f, "acquire({lock}, ttl {ttl_ns} ns)")?,
            Action::AcquireAs { lock, ttl_ns, mode } => {
                write!(f, "acquire({lock} {}, ttl {ttl_ns} ns)", mode_name(*mode))?
            }
            Action::AcquirePart {
                lock,
                ttl_ns,
                mode,
                request,
                parts,
            } => write!(
                f,
                "acquire part of multi-acquire {request} of {parts} locks({lock} {}, ttl {ttl_ns} \
                 ns)",
                mode_name(*mode)
            )?,
            Action::Release {
                lock,
                session,
                token,
            } => write!(f, "release({lock}, session {session}, token {token})")?,
            Action::Renew { session, ttl_ns } => {
                write!(f, "renew(session {session}, ttl {ttl_ns} ns)")?
            }
            Action::Status { lock } => write!(f, "status({lock})")?,
            Action::Resource {
                resource,
                scope,
                grant,
                access,
            } => {
                let access = match access {
                    Access::Claim => "claim".to_owned(),
                    Access::Read => "read".to_owned(),
                    Access::Write { value } => format!("write {value}"),
                };
                write!(f, "{access} {resource}/{scope}")?;
                match grant {
                    Some(g) => write!(f, " (session {}, token {})", g.session, g.token)?,
                    None => write!(f, " (unfenced)")?,
                }
            }
        }
        let complete = match self.complete_ns {
            Some(t) => t.to_string(),
            None => "∞".to_owned(),
        };
        write!(f, " [{} ns, {complete} ns] → ", self.invoke_ns)?;
        match self.outcome {
            Outcome::Ok(Reply::Granted(g)) => {
                write!(f, "granted session {} token {}", g.session, g.token)
            }
            Outcome::Ok(Reply::GrantedAs { grant: g, held }) => {
                write!(f, "granted {held} session {} token {}", g.session, g.token)
            }
            Outcome::Ok(Reply::Released) => write!(f, "released"),
            Outcome::Ok(Reply::Renewed) => write!(f, "renewed"),
            Outcome::Ok(Reply::Status { holder, last_token }) => {
                match holder {
                    Some(g) => write!(f, "held by session {} token {}", g.session, g.token)?,
                    None => write!(f, "free")?,
                }
                write!(f, ", last token {last_token}")
            }
            Outcome::Ok(Reply::Accepted { value, position }) => {
                write!(f, "accepted")?;
                if let Some(value) = value {
                    write!(f, ", read {value}")?;
                }
                match position {
                    Some(p) => write!(f, " at position {p}"),
                    None => Ok(()),
                }
            }
            Outcome::Ok(Reply::Stale) => write!(f, "stale"),
            Outcome::Failed => write!(f, "failed"),
            Outcome::Unknown => write!(f, "unknown"),
        }
    }
}
