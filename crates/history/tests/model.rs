//! The direct checks 1–4 cross-checked with the brute-force search against the fenced mutex with
//! leases, on small histories of a simulated lock service, correct or with a bug put in:
//!
//! - a correct service's history passes both;
//! - a history the checks reject has no linearization (the checks are sound);
//! - the buggy services are caught often enough that the cross-check means something.

mod common;

use std::collections::BTreeMap;

use common::*;
use palisade_history::model::{SEARCH_OPS_MAX, linearize};
use palisade_history::{Check, History, OpId, Outcome, Reply};

/// What the simulated service gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bug {
    None,
    /// Grants a lock that is still held.
    GrantWhileHeld,
    /// Hands out the last token again.
    ReuseToken,
    /// Keeps one token counter per lock.
    TokenPerLock,
    /// Lets a lease end a little before its ttl.
    ShortLease,
}

const BUGS: [Bug; 5] = [
    Bug::None,
    Bug::GrantWhileHeld,
    Bug::ReuseToken,
    Bug::TokenPerLock,
    Bug::ShortLease,
];

/// The leases of the simulated service: a few steps long.
const GEN_TTL_NS: u64 = 60;

/// One answer in six is lost.
fn outcome(rng: &mut Rng, ok: Outcome) -> Outcome {
    match rng.below(6) {
        0 => Outcome::Unknown,
        _ => ok,
    }
}

/// Acquires and releases per simulated history: small enough for the search.
const GEN_OPS: usize = 10;
/// Steps of the simulated service, at most.
const GEN_STEPS_MAX: u64 = 400;

/// A lock service with three clients and two locks, acting at 10, 20, 30, … ns; each operation
/// recorded with an interval of up to 15 ns around that point, some of unknown outcome. A
/// client whose session's lease ran out opens a new session at its next renewal.
fn simulate(seed: u64, bug: Bug) -> History {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut h = History::new(0).unwrap();
    let mut sessions: BTreeMap<u64, u64> = BTreeMap::new();
    let mut lease_end: BTreeMap<u64, u64> = BTreeMap::new();
    let mut holders: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut tokens: BTreeMap<&str, u64> = BTreeMap::new();
    let mut placed = 0;
    for step in 1..=GEN_STEPS_MAX {
        if placed == GEN_OPS {
            break;
        }
        let t = step * 10;
        let client = 1 + rng.below(3);
        let lock = ["a", "b"][rng.below(2) as usize];
        let span = (t - rng.below(16).min(t), t + rng.below(16));
        let session = sessions.get(&client).copied();
        let alive = session.is_some_and(|s| lease_end[&s] > t);
        // Leases that ran out free their locks.
        holders.retain(|_, (holder, _)| lease_end[holder] > t);
        match rng.below(4) {
            0 => {
                let session = match session {
                    Some(s) if alive => s,
                    _ => {
                        let fresh = lease_end.len() as u64 + 1;
                        sessions.insert(client, fresh);
                        fresh
                    }
                };
                let server_ttl = match bug {
                    Bug::ShortLease => GEN_TTL_NS / 2,
                    _ => GEN_TTL_NS,
                };
                lease_end.insert(session, t + server_ttl);
                renew(&mut h, client, session, GEN_TTL_NS, span);
            }
            1 | 2 => {
                let free = !holders.contains_key(lock) || bug == Bug::GrantWhileHeld;
                let Some(session) = session.filter(|_| alive && free) else {
                    continue;
                };
                let key = if bug == Bug::TokenPerLock { lock } else { "" };
                let last = tokens.entry(key).or_insert(0);
                if !(bug == Bug::ReuseToken && *last > 0 && rng.below(2) == 0) {
                    *last += 1;
                }
                holders.insert(lock, (session, *last));
                let outcome = outcome(&mut rng, granted(session, *last));
                acquire(&mut h, client, lock, span, outcome);
                placed += 1;
            }
            _ => {
                let Some(&(holder, token)) = holders.get(lock) else {
                    continue;
                };
                if Some(holder) != session {
                    continue;
                }
                holders.remove(lock);
                let outcome = outcome(&mut rng, Outcome::Ok(Reply::Released));
                release(&mut h, client, lock, grant(holder, token), span, outcome);
                placed += 1;
            }
        }
    }
    h
}

fn rejected_by_checks_1_to_4(h: &History) -> bool {
    h.check().violations.iter().any(|v| {
        matches!(
            v.check(),
            Check::TokensGrowPerLock
                | Check::TokensUnique
                | Check::TokensGrowAcrossLocks
                | Check::LeaseBelief
        )
    })
}

#[test]
fn the_checks_never_reject_what_the_model_explains() {
    let mut caught: BTreeMap<String, usize> = BTreeMap::new();
    for bug in BUGS {
        for seed in 0..300 {
            let h = simulate(seed, bug);
            let linearization = linearize(&h).unwrap();
            if bug == Bug::None {
                assert!(
                    h.check().is_clean() && linearization.is_some(),
                    "a correct service's history is rejected (seed {seed}): {}\n{h:#?}",
                    h.check()
                );
            }
            if rejected_by_checks_1_to_4(&h) {
                assert_eq!(
                    linearization,
                    None,
                    "the checks reject a history the model explains (bug {bug:?}, seed {seed}): \
                     {}\n{h:#?}",
                    h.check()
                );
                *caught.entry(format!("{bug:?}")).or_default() += 1;
            }
        }
    }
    eprintln!("histories the checks caught, per bug: {caught:?}");
    for bug in &BUGS[1..] {
        let count = caught
            .get(format!("{bug:?}").as_str())
            .copied()
            .unwrap_or(0);
        assert!(
            count >= 10,
            "{bug:?} caught in only {count} of 300 histories"
        );
    }
}

#[test]
fn the_search_places_unknown_operations_or_leaves_them_out() {
    // A release whose acquire's answer was lost: the acquire must have happened.
    let mut h = History::new(0).unwrap();
    acquire(&mut h, 1, "a", (0, 10), Outcome::Unknown);
    release(
        &mut h,
        1,
        "a",
        grant(1, 1),
        (20, 30),
        Outcome::Ok(Reply::Released),
    );
    acquire(&mut h, 2, "a", (40, 50), granted(2, 2));
    assert_eq!(
        linearize(&h).unwrap(),
        Some(vec![OpId(0), OpId(1), OpId(2)])
    );

    // An acquire of unknown outcome left out: had it happened, it would have taken token 1.
    let mut h = History::new(0).unwrap();
    acquire(&mut h, 1, "a", (0, 10), Outcome::Unknown);
    acquire(&mut h, 2, "a", (20, 30), granted(2, 1));
    assert_eq!(linearize(&h).unwrap(), Some(vec![OpId(1)]));
}

#[test]
fn the_search_waits_out_a_lease_and_refuses_a_grant_inside_it() {
    let mut h = History::new(0).unwrap();
    renew(&mut h, 1, 1, TTL_NS, (0, 2));
    acquire(&mut h, 1, "a", (3, 5), granted(1, 1));
    let other = acquire(&mut h, 2, "a", (100, 1200), granted(2, 2));
    assert!(
        linearize(&h).unwrap().is_some(),
        "granted once the lease ran out"
    );

    let mut inside = History::new(0).unwrap();
    for op in &h.ops()[..other.0] {
        inside.push(op.clone()).unwrap();
    }
    acquire(&mut inside, 2, "a", (100, 900), granted(2, 2));
    assert_eq!(linearize(&inside).unwrap(), None);
    assert!(rejected_by_checks_1_to_4(&inside));
}

#[test]
fn a_history_too_large_to_search_is_refused() {
    let mut h = History::new(0).unwrap();
    for i in 0..=SEARCH_OPS_MAX as u64 {
        acquire(&mut h, i, "a", (i * 10, i * 10 + 5), granted(i, i + 1));
    }
    let error = linearize(&h).unwrap_err();
    assert_eq!(error.ops, SEARCH_OPS_MAX + 1);
}
