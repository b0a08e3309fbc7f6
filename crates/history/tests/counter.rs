//! Checks 5 and 6 on histories of a simulated fenced counter: holders with growing tokens each
//! read the counter and write it plus one, their steps interleaved at random (a holder paused
//! between its read and its write is overtaken), some answers lost.
//!
//! - With fenced reads, every history is clean and the counter holds every acknowledged
//!   increment.
//! - With unfenced reads, updates get lost, and whenever the counter ends below the
//!   acknowledged increments the checker says so.

mod common;

use common::*;
use palisade_history::{Access, Check, History, Outcome, Reply};

const HOLDERS: u64 = 5;

/// The resource: the accepted token and the counter.
#[derive(Default)]
struct Counter {
    token_max: u64,
    value: i64,
}

/// Runs one history; returns it with the final value and the acknowledged increments.
fn run(seed: u64, fenced_reads: bool) -> (History, i64, i64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut h = History::new(0).unwrap();
    let mut counter = Counter::default();
    // Per holder (token = session = index + 1): the value it read, once it has.
    let mut read: Vec<Option<Option<i64>>> = vec![None; HOLDERS as usize];
    let mut done = vec![false; HOLDERS as usize];
    let mut started = 0;
    let mut acknowledged = 0;
    for step in 1..=200u64 {
        // A holder starts only after the one before it was granted (and so started).
        let candidates: Vec<u64> = (0..HOLDERS)
            .filter(|&k| !done[k as usize] && k <= started)
            .collect();
        let Some(&k) = candidates.get(rng.below(candidates.len().max(1) as u64) as usize) else {
            break;
        };
        started = started.max(k + 1);
        let g = grant(k + 1, k + 1);
        let token = k + 1;
        let t = 20 + step * 10;
        let span = (t - rng.below(16), t + rng.below(16));
        let lost = rng.below(8) == 0;
        let applied = !lost || rng.below(2) == 0;
        match read[k as usize] {
            None => {
                let stale = fenced_reads && token < counter.token_max;
                let outcome = if stale {
                    STALE
                } else {
                    if fenced_reads && applied {
                        counter.token_max = token;
                    }
                    read_outcome(counter.value)
                };
                let recorded = if lost { Outcome::Unknown } else { outcome };
                let presented = fenced_reads.then_some(g);
                access(&mut h, k, presented, Access::Read, span, recorded);
                // A holder that did not learn the value, or was refused, stops.
                match outcome {
                    Outcome::Ok(Reply::Accepted { value, .. }) if !lost => {
                        read[k as usize] = Some(value);
                    }
                    _ => done[k as usize] = true,
                }
            }
            Some(value) => {
                let value = value.unwrap_or(0) + 1;
                let outcome = if token < counter.token_max {
                    STALE
                } else {
                    if applied {
                        counter.token_max = token;
                        counter.value = value;
                    }
                    accepted()
                };
                if outcome == accepted() && !lost {
                    acknowledged += 1;
                }
                let recorded = if lost { Outcome::Unknown } else { outcome };
                access(&mut h, k, Some(g), write(value), span, recorded);
                done[k as usize] = true;
            }
        }
    }
    let end = 10_000;
    access(
        &mut h,
        99,
        None,
        Access::Read,
        (end, end + 5),
        read_outcome(counter.value),
    );
    (h, counter.value, acknowledged)
}

fn read_outcome(value: i64) -> Outcome {
    Outcome::Ok(Reply::Accepted {
        value: (value > 0).then_some(value),
        position: None,
    })
}

#[test]
fn fenced_reads_give_clean_histories_and_every_increment() {
    for seed in 0..500 {
        let (h, value, acknowledged) = run(seed, true);
        let report = h.check();
        assert!(report.is_clean(), "seed {seed}: {report}");
        assert!(
            value >= acknowledged,
            "seed {seed}: {value} < {acknowledged}"
        );
    }
}

#[test]
fn every_lost_acknowledged_increment_of_unfenced_reads_is_caught() {
    let mut lost = 0;
    for seed in 0..500 {
        let (h, value, acknowledged) = run(seed, false);
        let report = h.check();
        if value < acknowledged {
            lost += 1;
            assert!(
                report.of(Check::NoLostUpdate).next().is_some(),
                "seed {seed}: the counter is {value} after {acknowledged} acknowledged \
                 increments, and the checker says {report}"
            );
        }
    }
    assert!(lost >= 20, "only {lost} of 500 histories lost an update");
}
