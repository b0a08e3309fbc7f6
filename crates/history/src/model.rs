//! A brute-force search for a linearization of a small history's acquires and releases against
//! a fenced mutex with leases, to cross-check the direct checks 1–4 (resource accesses are not
//! part of the model).
//!
//! The model: per lock a holder (session and token, either unknown for an acquire of unknown
//! outcome), and one token counter for all locks. An acquire is legal only if the lock is free
//! or its holder's lease has run out, and only with a token above every earlier one; a release
//! only by the holder, with its token. A lease runs out no earlier than the holder's belief
//! ([`History::belief_end_ns`] of its session's latest acknowledged renewal); a holder with no
//! acknowledged renewal may lose it at any time.
//!
//! The search gives each operation a point in time within `[invoke, completion]` (unknown
//! outcomes: any time after the invocation, or never; failed operations: never), points in
//! the order of the linearization, and picks each point as early as it can be, which leaves
//! the most room for what follows. It is exponential: histories of at most
//! [`SEARCH_OPS_MAX`] operations.

use std::collections::{BTreeMap, HashMap, HashSet};

use palisade_core::{SessionId, Token};

use crate::history::{Action, History, OpId, Outcome, Reply};

/// The most acquires and releases [`linearize`] takes.
pub const SEARCH_OPS_MAX: usize = 16;

/// A history too large to search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub ops: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} acquires and releases are more than the search takes ({SEARCH_OPS_MAX})",
            self.ops
        )
    }
}

impl std::error::Error for TooLarge {}

/// An acquire or release the search may place.
#[derive(Debug)]
struct Step {
    id: OpId,
    invoke_ns: u64,
    /// `u64::MAX` for an unknown outcome.
    effect_by_ns: u64,
    /// Must be placed: its outcome is known.
    required: bool,
    lock: String,
    kind: StepKind,
}

#[derive(Debug)]
enum StepKind {
    /// `None`: an acquire of unknown outcome, whose session and token nobody learnt.
    Acquire(Option<(SessionId, Token)>),
    Release(SessionId, Token),
}

/// A holder: `None` where the model does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Holder {
    session: Option<SessionId>,
    token: Option<Token>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    placed: u32,
    time_ns: u64,
    /// The largest token granted so far (a lower bound where one was unknown).
    token: u64,
    holders: BTreeMap<String, Holder>,
}

/// Searches for a linearization of `history`'s acquires and releases against the fenced mutex
/// with leases; returns the operations placed, in order, or `None` if there is none.
pub fn linearize(history: &History) -> Result<Option<Vec<OpId>>, TooLarge> {
    let steps: Vec<Step> = history
        .ops()
        .iter()
        .enumerate()
        .filter_map(|(i, op)| {
            let kind = match (&op.action, op.outcome) {
                (Action::Acquire { .. }, Outcome::Ok(Reply::Granted(g))) => {
                    StepKind::Acquire(Some((g.session, g.token)))
                }
                (Action::Acquire { .. }, Outcome::Unknown) => StepKind::Acquire(None),
                (
                    Action::Release { session, token, .. },
                    Outcome::Ok(Reply::Released) | Outcome::Unknown,
                ) => StepKind::Release(*session, *token),
                _ => return None,
            };
            let lock = match &op.action {
                Action::Acquire { lock, .. } | Action::Release { lock, .. } => lock.clone(),
                _ => unreachable!("only acquires and releases have a kind"),
            };
            Some(Step {
                id: OpId(i),
                invoke_ns: op.invoke_ns,
                effect_by_ns: op.effect_by_ns(),
                required: op.outcome != Outcome::Unknown,
                lock,
                kind,
            })
        })
        .collect();
    if steps.len() > SEARCH_OPS_MAX {
        return Err(TooLarge { ops: steps.len() });
    }
    let mut lease_ends: HashMap<SessionId, u64> = HashMap::new();
    for op in history.ops() {
        if let (Action::Renew { session, ttl_ns }, Outcome::Ok(Reply::Renewed)) =
            (&op.action, op.outcome)
        {
            let end_ns = history.belief_end_ns(op.invoke_ns, *ttl_ns);
            let entry = lease_ends.entry(*session).or_insert(end_ns);
            *entry = (*entry).max(end_ns);
        }
    }
    let search = Search {
        steps,
        lease_ends,
        dead_ends: HashSet::new(),
    };
    let start = State {
        placed: 0,
        time_ns: 0,
        token: 0,
        holders: BTreeMap::new(),
    };
    let mut search = search;
    let mut order = Vec::new();
    Ok(search.place(start, &mut order).then_some(order))
}

struct Search {
    steps: Vec<Step>,
    lease_ends: HashMap<SessionId, u64>,
    /// States from which no linearization exists.
    dead_ends: HashSet<State>,
}

impl Search {
    /// Places the rest of the steps after `state`, pushing their ids on `order`.
    fn place(&mut self, state: State, order: &mut Vec<OpId>) -> bool {
        let unplaced = |i: usize| state.placed & (1 << i) == 0;
        // Every step placed from here on lies at or after the next point, so the next point
        // must not pass the completion of any required step still unplaced.
        let deadline_ns = (0..self.steps.len())
            .filter(|&i| unplaced(i) && self.steps[i].required)
            .map(|i| self.steps[i].effect_by_ns)
            .min();
        let Some(deadline_ns) = deadline_ns else {
            return true;
        };
        if self.dead_ends.contains(&state) {
            return false;
        }
        for i in (0..self.steps.len()).filter(|&i| unplaced(i)) {
            let Some(next) = self.apply(&state, i) else {
                continue;
            };
            if next.time_ns > deadline_ns || next.time_ns > self.steps[i].effect_by_ns {
                continue;
            }
            order.push(self.steps[i].id);
            if self.place(next, order) {
                return true;
            }
            order.pop();
        }
        self.dead_ends.insert(state);
        false
    }

    /// The state after step `i`, placed as early as it can be after `state`, if it is legal.
    fn apply(&self, state: &State, i: usize) -> Option<State> {
        let step = &self.steps[i];
        let mut next = state.clone();
        next.placed |= 1 << i;
        next.time_ns = state.time_ns.max(step.invoke_ns);
        let holder = state.holders.get(&step.lock).copied();
        match step.kind {
            StepKind::Acquire(granted) => {
                if let Some(holder) = holder {
                    // Taken over only once the holder's lease can have run out.
                    let lease_end_ns = holder
                        .session
                        .and_then(|s| self.lease_ends.get(&s).copied())
                        .unwrap_or(0);
                    next.time_ns = next.time_ns.max(lease_end_ns);
                }
                let holder = match granted {
                    Some((session, token)) => {
                        if token.get() <= state.token {
                            return None;
                        }
                        next.token = token.get();
                        Holder {
                            session: Some(session),
                            token: Some(token),
                        }
                    }
                    None => {
                        // The smallest token it could have had leaves the most room.
                        next.token = state.token.checked_add(1)?;
                        Holder {
                            session: None,
                            token: None,
                        }
                    }
                };
                next.holders.insert(step.lock.clone(), holder);
            }
            StepKind::Release(session, token) => {
                let holder = holder?;
                let is_holder = holder.session.is_none_or(|s| s == session)
                    && holder.token.is_none_or(|t| t == token);
                if !is_holder {
                    return None;
                }
                next.holders.remove(&step.lock);
            }
        }
        Some(next)
    }
}
