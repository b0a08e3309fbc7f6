//! The checks a run's record must pass.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::record::{Event, Outcome, What};

/// An acknowledged grant.
#[derive(Debug, Clone, Copy)]
struct Grant {
    client: usize,
    session: u64,
    token: u64,
    invoked: Duration,
    completed: Duration,
}

/// Checks the record of a run whose counter ended at `counter`. Each violation is one line.
pub fn check(events: &[Event], counter: u64) -> Vec<String> {
    let mut violations = Vec::new();
    let grants = grants(events);
    // No two acknowledged grants share a token.
    let mut by_token: BTreeMap<u64, &Grant> = BTreeMap::new();
    for grant in &grants {
        if let Some(other) = by_token.insert(grant.token, grant) {
            violations.push(format!(
                "token {} granted twice: to c{} (session {}) and c{} (session {})",
                grant.token, other.client, other.session, grant.client, grant.session
            ));
        }
    }
    // A grant acknowledged before another was asked for has the smaller token.
    for a in &grants {
        for b in &grants {
            if a.completed < b.invoked && a.token >= b.token {
                violations.push(format!(
                    "token {} granted at {:?} to c{}, then token {} asked for at {:?} by c{}: tokens must grow",
                    a.token, a.completed, a.client, b.token, b.invoked, b.client
                ));
            }
        }
    }
    // The lease a client believes in never outlasts the server's: no other session is
    // granted the lock before it ends, unless the believer had begun releasing.
    for event in events {
        let What::Belief {
            client,
            session,
            token,
            until,
        } = &event.what
        else {
            continue;
        };
        let released = release_invoked(events, *session, *token);
        for other in &grants {
            if other.session != *session
                && other.token > *token
                && other.completed < *until
                && released.is_none_or(|at| at > other.completed)
            {
                violations.push(format!(
                    "c{client} believed at {:?} that it held token {token} until {until:?}, but c{} was granted token {} by {:?}",
                    event.at, other.client, other.token, other.completed
                ));
            }
        }
    }
    // The resource accepts no token below one it accepted, nor an equal one from another
    // session, and no read-modify-write loses an update.
    let mut highest: Option<(u64, u64)> = None;
    let mut value = 0;
    let mut writes = 0;
    for event in events {
        let What::Resource {
            client,
            session,
            token,
            read,
            wrote,
            accepted: true,
        } = &event.what
        else {
            continue;
        };
        if let Some((top, top_session)) = highest
            && (*token < top || (*token == top && *session != top_session))
        {
            violations.push(format!(
                "the resource accepted token {token} of c{client} (session {session}) at {:?} after token {top} (session {top_session})",
                event.at
            ));
        }
        highest = Some((*token, *session));
        if let Some(wrote) = wrote {
            if *read != Some(value) {
                violations.push(format!(
                    "lost update: c{client} wrote {wrote} at {:?} from a read of {read:?}, but the counter was {value}",
                    event.at
                ));
            }
            value = *wrote;
            writes += 1;
        }
    }
    if counter != writes {
        violations.push(format!(
            "the counter ended at {counter}, but {writes} read-modify-writes were accepted"
        ));
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

fn grants(events: &[Event]) -> Vec<Grant> {
    events
        .iter()
        .filter_map(|event| match &event.what {
            What::AcquireCompleted {
                op,
                outcome: Outcome::Ok { token },
            } => match &events[*op].what {
                What::AcquireInvoked {
                    client, session, ..
                } => Some(Grant {
                    client: *client,
                    session: *session,
                    token: *token,
                    invoked: events[*op].at,
                    completed: event.at,
                }),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// When `session` began releasing the grant with `token`, if it did.
fn release_invoked(events: &[Event], session: u64, token: u64) -> Option<Duration> {
    events.iter().find_map(|event| match &event.what {
        What::ReleaseInvoked {
            session: s,
            token: t,
            ..
        } if *s == session && *t == token => Some(event.at),
        _ => None,
    })
}
