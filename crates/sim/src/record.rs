//! What happened in a run, in the order it happened: the operations of the clients (invoked and
//! completed, in simulated time), the resource's decisions, and the faults. The trace printed
//! for a failing seed, and compared between two runs of one seed, is made from it.

use std::fmt;
use std::time::Duration;

use palisade_core::{Access, Mode};

/// One line of the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Simulated time since the run began.
    pub at: Duration,
    pub what: What,
}

/// An operation's id: its invocation's place in the record.
pub type OpId = usize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A client asks for `lock` in `mode` (waiting up to its wait), in session `session`;
    /// `multi` is `Some((request, parts))` for one lock of a multi-lock of `parts` locks.
    AcquireInvoked {
        client: usize,
        session: u64,
        lock: String,
        mode: Mode,
        multi: Option<(u64, u32)>,
    },
    /// The acquire `op` ended.
    AcquireCompleted {
        op: OpId,
        outcome: Outcome,
    },
    /// A client believes its session holds the grant with `token` until `until` (simulated
    /// time), from the lease its client library proved.
    Belief {
        client: usize,
        session: u64,
        token: u64,
        until: Duration,
    },
    /// A client releases `lock`, held with `token`.
    ReleaseInvoked {
        client: usize,
        session: u64,
        lock: String,
        token: u64,
    },
    ReleaseCompleted {
        op: OpId,
        outcome: Outcome,
    },
    /// The resource decided on a sequencer: a claim (`wrote: None`, reads the counter of
    /// `scope`) or a write of `wrote` after reading `read` in the claim. `scope` is the
    /// sequencer's fence binding: a lock, or a semaphore's lock and slot.
    Resource {
        client: usize,
        session: u64,
        scope: String,
        token: u64,
        read: Option<u64>,
        wrote: Option<u64>,
        verdict: Verdict,
    },
    /// A client reads `lock`'s state linearizably from one node.
    ReadInvoked {
        client: usize,
        lock: String,
    },
    /// The read `op` ended: [`Outcome::Status`], or failed (a read changes nothing).
    ReadCompleted {
        op: OpId,
        outcome: Outcome,
    },
    /// A grant's sequencer did not verify against the keys the cluster published.
    Unverifiable {
        client: usize,
        token: u64,
        why: String,
    },
    /// A client opened session `session`.
    SessionOpened {
        client: usize,
        session: u64,
    },
    /// An operator's recovery that rewinds the cluster's state (a restore from a backup, a
    /// lost or rolled-back log whose counters were recovered) took effect between `from` and
    /// now: node `node` serves again.
    Recovered {
        node: u64,
        from: Duration,
        what: String,
    },
    /// The documented recovery did not bring node `node` back.
    RecoveryFailed {
        node: u64,
        why: String,
    },
    /// A fault injected or healed.
    Fault(String),
}

/// What the resource decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    /// Refused: a later grant reached the scope first (or the token was issued twice).
    Refused,
    /// Refused: a reader's grant cannot write, whatever its token.
    SharedWrite,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An acquire granted with this token, held this way (exclusive, shared, a slot).
    Granted { token: u64, held: Access },
    /// A release done.
    Released,
    /// Known not to have happened.
    Failed(String),
    /// May or may not have happened.
    Unknown(String),
    /// A read showed the lock held by `holder` (session, token), and its last token.
    Status {
        holder: Option<(u64, u64)>,
        last_token: u64,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9.3}s  ", self.at.as_secs_f64())?;
        match &self.what {
            What::AcquireInvoked {
                client,
                session,
                lock,
                mode,
                multi,
            } => {
                write!(f, "c{client} s{session} acquire {lock}")?;
                if *mode != Mode::Exclusive {
                    write!(f, " {mode}")?;
                }
                match multi {
                    Some((request, parts)) => {
                        write!(f, " (one of {parts} at once, request {request:x})")
                    }
                    None => Ok(()),
                }
            }
            What::AcquireCompleted { op, outcome } => write!(f, "   op {op} acquire: {outcome}"),
            What::Belief {
                client,
                session,
                token,
                until,
            } => write!(
                f,
                "c{client} s{session} believes it holds token {token} until {:.3}s",
                until.as_secs_f64()
            ),
            What::ReleaseInvoked {
                client,
                session,
                lock,
                token,
            } => write!(f, "c{client} s{session} release {lock} (token {token})"),
            What::ReleaseCompleted { op, outcome } => write!(f, "   op {op} release: {outcome}"),
            What::Resource {
                client,
                session,
                scope,
                token,
                read,
                wrote,
                verdict,
            } => {
                let verdict = match verdict {
                    Verdict::Accepted => "accepted",
                    Verdict::Refused => "refused",
                    Verdict::SharedWrite => "refused (a reader's write)",
                };
                // The counter of the mutex keeps the trace's first wording.
                let scope = if scope == crate::LOCK {
                    String::new()
                } else {
                    format!(" {}", palisade_sequencer::display_binding(scope))
                };
                match (read, wrote) {
                    (_, Some(wrote)) => write!(
                        f,
                        "c{client} s{session} resource{scope} write {wrote} (read {}) with token {token}: {verdict}",
                        read.map_or("-".to_string(), |r| r.to_string())
                    ),
                    _ => write!(
                        f,
                        "c{client} s{session} resource{scope} claim with token {token}: {verdict}{}",
                        read.map_or(String::new(), |r| format!(", read {r}"))
                    ),
                }
            }
            What::ReadInvoked { client, lock } => write!(f, "c{client} read {lock}"),
            What::ReadCompleted { op, outcome } => write!(f, "   op {op} read: {outcome}"),
            What::Unverifiable { client, token, why } => write!(
                f,
                "c{client} got a sequencer for token {token} that does not verify: {why}"
            ),
            What::SessionOpened { client, session } => {
                write!(f, "c{client} opened session s{session}")
            }
            What::Recovered { node, from, what } => write!(
                f,
                "operator: n{node} serves again after {what} (begun at {:.3}s)",
                from.as_secs_f64()
            ),
            What::RecoveryFailed { node, why } => {
                write!(f, "operator: the recovery of n{node} failed: {why}")
            }
            What::Fault(fault) => write!(f, "nemesis: {fault}"),
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Released => write!(f, "ok"),
            Outcome::Granted {
                token,
                held: Access::Exclusive,
            } => write!(f, "granted, token {token}"),
            Outcome::Granted { token, held } => write!(f, "granted {held}, token {token}"),
            Outcome::Failed(why) => write!(f, "failed ({why})"),
            Outcome::Unknown(why) => write!(f, "unknown outcome ({why})"),
            Outcome::Status {
                holder: Some((session, token)),
                last_token,
            } => write!(
                f,
                "held by s{session} with token {token}, last token {last_token}"
            ),
            Outcome::Status {
                holder: None,
                last_token,
            } => write!(f, "free, last token {last_token}"),
        }
    }
}
