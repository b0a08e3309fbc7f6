//! The checks a run's record must pass: the record is fed to the history checker
//! (`palisade-history`), which every test of Palisade's histories shares, plus this
//! simulation's liveness check.

use std::collections::BTreeMap;
use std::time::Duration;

use palisade_core::{Access as Held, Mode, SessionId, Token};
use palisade_history::{Access, Action, ClientId, Grant, History, Op, Outcome, Reply};

use crate::record::{self, Event, What};

/// The resource's name in the history.
const RESOURCE: &str = "counter";

/// The record of a run as a history: acquires, releases and linearizable reads of the lock as
/// invoked and completed, each belief of a client in its lease as an acknowledged renewal
/// (already in simulated time, with the client's margins taken off, so the drift bound is 0),
/// the resource's decisions as fenced reads and writes in its apply order (a reader's write,
/// refused whatever its token, as failed), and a final unfenced read of each counter of
/// `finals` (by scope). Each session opening is a client of its own
/// ([`session_client`]), so that a session id the cluster issued twice shows as two clients,
/// and the operator's recoveries are marked ([`History::recovered`]).
pub fn history(events: &[Event], finals: &BTreeMap<String, u64>) -> History {
    let mut history = History::new(0).expect("0 is a valid drift bound");
    let mut ids = BTreeMap::new();
    let mut openings = Openings::default();
    let ns = |at: Duration| at.as_nanos() as u64;
    let mut position = 0;
    let push = |history: &mut History, op: Op| {
        history
            .push(op)
            .expect("the simulation records well-formed operations");
    };
    for (index, event) in events.iter().enumerate() {
        let at = ns(event.at);
        match &event.what {
            What::AcquireInvoked {
                client,
                session,
                lock,
                mode,
                multi,
            } => {
                let ttl_ns = ns(crate::workload::TTL);
                let action = match (mode, multi) {
                    (mode, Some((request, parts))) => Action::AcquirePart {
                        lock: lock.clone(),
                        ttl_ns,
                        mode: *mode,
                        request: *request,
                        parts: *parts,
                    },
                    (Mode::Exclusive, None) => Action::Acquire {
                        lock: lock.clone(),
                        ttl_ns,
                    },
                    (mode, None) => Action::AcquireAs {
                        lock: lock.clone(),
                        ttl_ns,
                        mode: *mode,
                    },
                };
                let by = openings.client(*client, *session);
                ids.insert(index, history.invoke(by, at, action));
            }
            What::ReleaseInvoked {
                client,
                session,
                lock,
                token,
            } => {
                let action = Action::Release {
                    lock: lock.clone(),
                    session: SessionId::new(*session),
                    token: Token::new(*token),
                };
                let by = openings.client(*client, *session);
                ids.insert(index, history.invoke(by, at, action));
            }
            What::ReadInvoked { client, lock } => {
                let action = Action::Status { lock: lock.clone() };
                ids.insert(
                    index,
                    history.invoke(session_client(*client, 0), at, action),
                );
            }
            What::AcquireCompleted { op, outcome }
            | What::ReleaseCompleted { op, outcome }
            | What::ReadCompleted { op, outcome } => {
                let Some(id) = ids.get(op) else { continue };
                let session = match &events[*op].what {
                    What::AcquireInvoked { session, .. } => *session,
                    _ => 0,
                };
                let outcome = match outcome {
                    record::Outcome::Released => Outcome::Ok(Reply::Released),
                    record::Outcome::Granted { token, held } => {
                        let grant = Grant {
                            session: SessionId::new(session),
                            token: Token::new(*token),
                        };
                        Outcome::Ok(match held {
                            Held::Exclusive => Reply::Granted(grant),
                            held => Reply::GrantedAs { grant, held: *held },
                        })
                    }
                    record::Outcome::Status { holder, last_token } => Outcome::Ok(Reply::Status {
                        holder: holder.map(|(session, token)| Grant {
                            session: SessionId::new(session),
                            token: Token::new(token),
                        }),
                        last_token: Token::new(*last_token),
                    }),
                    record::Outcome::Failed(_) => Outcome::Failed,
                    // Never completed: the history counts it as possibly applied at any time.
                    record::Outcome::Unknown(_) => continue,
                };
                history
                    .complete(*id, at, outcome)
                    .expect("an operation completes once, after its invocation");
            }
            What::Belief {
                client,
                session,
                until,
                ..
            } => push(
                &mut history,
                Op {
                    client: openings.client(*client, *session),
                    action: Action::Renew {
                        session: SessionId::new(*session),
                        ttl_ns: ns(*until).saturating_sub(at),
                    },
                    invoke_ns: at,
                    complete_ns: Some(at),
                    outcome: Outcome::Ok(Reply::Renewed),
                },
            ),
            What::Resource {
                client,
                session,
                scope,
                token,
                read,
                wrote,
                verdict,
            } => {
                let access = match wrote {
                    Some(value) => Access::Write {
                        value: *value as i64,
                    },
                    None => Access::Read,
                };
                let outcome = match verdict {
                    record::Verdict::Accepted => Outcome::Ok(Reply::Accepted {
                        value: if wrote.is_none() {
                            read.map(|v| v as i64)
                        } else {
                            None
                        },
                        position: Some(position),
                    }),
                    record::Verdict::Refused => Outcome::Ok(Reply::Stale),
                    record::Verdict::SharedWrite => Outcome::Failed,
                };
                position += 1;
                push(
                    &mut history,
                    Op {
                        client: openings.client(*client, *session),
                        action: Action::Resource {
                            resource: RESOURCE.to_string(),
                            scope: scope.clone(),
                            grant: Some(Grant {
                                session: SessionId::new(*session),
                                token: Token::new(*token),
                            }),
                            access,
                        },
                        invoke_ns: at,
                        complete_ns: Some(at),
                        outcome,
                    },
                );
            }
            What::SessionOpened { client, session } => openings.open(*client, *session),
            What::Recovered { from, .. } => history.recovered(ns(*from), at),
            What::Fault(_) | What::Unverifiable { .. } | What::RecoveryFailed { .. } => {}
        }
    }
    let end = events.last().map_or(0, |e| ns(e.at)) + 1;
    for (scope, value) in finals {
        push(
            &mut history,
            Op {
                client: ClientId(0),
                action: Action::Resource {
                    resource: RESOURCE.to_string(),
                    scope: scope.clone(),
                    grant: None,
                    access: Access::Read,
                },
                invoke_ns: end,
                complete_ns: Some(end),
                outcome: Outcome::Ok(Reply::Accepted {
                    value: Some(*value as i64),
                    position: Some(position),
                }),
            },
        );
    }
    history
}

/// Every violation the history checker finds in the record, one per entry, and every grant
/// whose sequencer a resource trusting the cluster's published keys could not verify.
pub fn check(events: &[Event], finals: &BTreeMap<String, u64>) -> Vec<String> {
    let unverifiable = events.iter().filter_map(|e| match &e.what {
        What::Unverifiable { client, token, why } => Some(format!(
            "c{client} was granted token {token} with a sequencer the cluster's published keys \
             do not verify: {why}"
        )),
        _ => None,
    });
    history(events, finals)
        .check()
        .violations
        .iter()
        .map(ToString::to_string)
        .chain(unverifiable)
        .collect()
}

/// The history's client for the `opening`th session client `client` opened (0: its reads, and
/// anything before its first session): client × 1,000,000 + opening.
pub fn session_client(client: usize, opening: u64) -> ClientId {
    ClientId(client as u64 * 1_000_000 + opening)
}

/// Which opening of each client each of its sessions is.
#[derive(Default)]
struct Openings {
    count: BTreeMap<usize, u64>,
    current: BTreeMap<(usize, u64), u64>,
}

impl Openings {
    fn open(&mut self, client: usize, session: u64) {
        let count = self.count.entry(client).or_default();
        *count += 1;
        self.current.insert((client, session), *count);
    }

    fn client(&self, client: usize, session: u64) -> ClientId {
        session_client(
            client,
            self.current.get(&(client, session)).copied().unwrap_or(0),
        )
    }
}

/// Invariant 13 in the record: no session id is opened twice (the cluster issued it twice,
/// after a recovery that placed the session counter below it), and every recovery the
/// operator carried out as documented brought its node back.
pub fn sequencers(events: &[Event]) -> Vec<String> {
    let mut opened: BTreeMap<u64, (usize, Duration)> = BTreeMap::new();
    let mut violations = Vec::new();
    for event in events {
        match &event.what {
            What::SessionOpened { client, session } => {
                if let Some((first, at)) = opened.get(session) {
                    violations.push(format!(
                        "session id {session} was issued twice: to c{first} at {:.3}s and to \
                         c{client} at {:.3}s",
                        at.as_secs_f64(),
                        event.at.as_secs_f64()
                    ));
                } else {
                    opened.insert(*session, (*client, event.at));
                }
            }
            What::RecoveryFailed { node, why } => violations.push(format!(
                "the documented recovery of n{node} did not bring it back: {why}"
            )),
            _ => {}
        }
    }
    violations
}

/// Every client wrote at least once in the liveness phase.
pub fn liveness(
    last_write: &BTreeMap<usize, Duration>,
    clients: usize,
    safety_end: Duration,
) -> Vec<String> {
    (1..=clients)
        .filter(|c| last_write.get(c).is_none_or(|at| *at < safety_end))
        .map(|c| format!("c{c} wrote nothing after every fault was healed at {safety_end:?}"))
        .collect()
}

/// How long a client may take to learn that its session was granted the lock, counted from a
/// read that shows the session holding it, while the leader is cut off from the other nodes
/// (and nothing else is in effect). With the cut-off leader stepping back within its quorum's
/// silence bound (0.7 s), a waiter queued there asks the next leader with the same request id
/// and is answered at once; a leader that keeps serving while cut off holds it until its wait
/// runs out or the heal.
pub const LEARNS_GRANT_WITHIN: Duration = Duration::from_secs(2);

/// During every cut of the leader from the other nodes: a session a read shows holding the lock
/// with a token is told of that grant by its client library within [`LEARNS_GRANT_WITHIN`] of
/// the read. A lock must not stay held, unknown to its holder, while its acquire waits at a
/// leader that can no longer answer it. Excused: a client whose answers were lost on purpose
/// (`answers_lost`: client, from, until) at any time between the read and its learning.
pub fn waiters_learn_during_leader_cuts(
    events: &[Event],
    cuts: &[(Duration, Option<Duration>)],
    answers_lost: &[(usize, Duration, Duration)],
    safety_end: Duration,
) -> Vec<String> {
    // When and by which client each grant was learned: (session, token) -> (client, when).
    let mut learned = BTreeMap::new();
    for event in events {
        if let What::AcquireCompleted {
            op,
            outcome: record::Outcome::Granted { token, .. },
        } = &event.what
            && let What::AcquireInvoked {
                client, session, ..
            } = &events[*op].what
        {
            learned
                .entry((*session, *token))
                .or_insert((*client, event.at));
        }
    }
    let cut_at = |at: Duration| {
        cuts.iter().find_map(|&(cut, healed)| {
            let until = healed.unwrap_or(safety_end).min(safety_end);
            (cut..until).contains(&at).then_some((cut, until))
        })
    };
    let mut violations = Vec::new();
    let mut reported = std::collections::BTreeSet::new();
    for event in events {
        let What::ReadCompleted {
            outcome:
                record::Outcome::Status {
                    holder: Some((session, token)),
                    ..
                },
            ..
        } = &event.what
        else {
            continue;
        };
        let Some((cut, until)) = cut_at(event.at) else {
            continue;
        };
        let Some(&(client, at)) = learned.get(&(*session, *token)) else {
            continue;
        };
        let excused = answers_lost
            .iter()
            .any(|&(c, from, until)| c == client && from < at && until > event.at);
        let late = at.saturating_sub(event.at);
        if late > LEARNS_GRANT_WITHIN && !excused && reported.insert((*session, *token)) {
            violations.push(format!(
                "the leader was cut off from the other nodes from {cut:?} to {until:?}; a read at \
                 {:?} showed s{session} holding token {token}, but its client learned of the \
                 grant only at {at:?}, {late:?} later",
                event.at
            ));
        }
    }
    violations
}
