//! Each check against a small history that breaks it and one that does not, and the traps:
//! unknown outcomes, concurrent operations, equal times.

mod common;

use common::*;
use palisade_history::{
    Access, Action, Check, ClientId, History, HistoryError, Op, OpId, Outcome, Reply, Violation,
};

fn history() -> History {
    History::new(0).unwrap()
}

fn checks(h: &History) -> Vec<Check> {
    violations(h).iter().map(Violation::check).collect()
}

// ----- 1: per lock, tokens grow in grant order -----

#[test]
fn a_grant_invoked_after_another_completed_with_a_smaller_token_is_caught() {
    let mut h = history();
    let first = acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    let second = acquire(&mut h, 2, "a", (20, 30), granted(2, 3));

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::TokenNotAboveEarlierGrant { earlier, later }]
            if earlier.id == first && later.id == second),
        "{found:?}"
    );
}

#[test]
fn overlapping_grants_may_be_acknowledged_in_either_order() {
    // The second grant's answer arrives first, but the grants overlap: the service may have
    // made the smaller token first.
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 30), granted(1, 5));
    acquire(&mut h, 2, "a", (10, 20), granted(2, 3));

    assert_eq!(checks(&h), []);
}

#[test]
fn equal_times_order_nothing() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    acquire(&mut h, 2, "a", (10, 20), granted(2, 3));

    assert_eq!(checks(&h), []);
}

#[test]
fn an_acquire_of_unknown_outcome_orders_nothing() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), Outcome::Unknown);
    acquire(&mut h, 2, "a", (20, 30), granted(2, 3));
    // Never completed at all: recorded with `invoke` only.
    h.invoke(
        ClientId(3),
        5,
        Action::Acquire {
            lock: "a".into(),
            ttl_ns: TTL_NS,
        },
    );

    assert_eq!(checks(&h), []);
}

// ----- 2: tokens are unique -----

#[test]
fn two_grants_of_different_locks_with_one_token_are_caught() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    acquire(&mut h, 2, "b", (0, 10), granted(2, 5));

    assert_eq!(checks(&h), [Check::TokensUnique]);
}

#[test]
fn one_grant_acknowledged_twice_is_one_grant() {
    // A retried acquire answered with its first outcome.
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    acquire(&mut h, 1, "a", (20, 30), granted(1, 5));

    assert_eq!(checks(&h), []);
}

#[test]
fn the_same_token_for_another_session_of_the_same_lock_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    acquire(&mut h, 2, "a", (5, 15), granted(2, 5));

    assert_eq!(checks(&h), [Check::TokensUnique]);
}

// ----- 3: tokens grow across locks in real time -----

#[test]
fn a_grant_below_a_token_another_lock_got_before_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 7));
    acquire(&mut h, 2, "b", (20, 30), granted(2, 4));

    assert_eq!(checks(&h), [Check::TokensGrowAcrossLocks]);
}

#[test]
fn concurrent_grants_of_two_locks_take_tokens_in_any_order() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 25), granted(1, 7));
    acquire(&mut h, 2, "b", (20, 30), granted(2, 4));
    acquire(&mut h, 3, "c", (40, 50), granted(3, 8));

    assert_eq!(checks(&h), []);
}

// ----- 4: the lease a client believes in never outlasts the service's -----

/// Session 1 renewed at 0 for 1000 ns and was granted `a`; session 2 is granted `a` at
/// 100..=`other_done`.
fn handover(other_done: u64) -> History {
    let mut h = history();
    renew(&mut h, 1, 1, TTL_NS, (0, 2));
    acquire(&mut h, 1, "a", (3, 5), granted(1, 1));
    acquire(&mut h, 2, "a", (100, other_done), granted(2, 2));
    h
}

#[test]
fn a_grant_while_the_holder_still_believes_in_its_lease_is_caught() {
    let h = handover(200);

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::LeaseOutlasted { belief_end_ns: 1000, other, .. }]
            if other.id == OpId(2)),
        "{found:?}"
    );
}

#[test]
fn a_grant_acknowledged_after_the_belief_ended_is_no_violation() {
    assert_eq!(checks(&handover(1000)), []);
    assert_eq!(checks(&handover(1500)), []);
}

#[test]
fn a_release_begun_before_the_other_grant_ends_the_belief() {
    let mut h = handover(200);
    release(
        &mut h,
        1,
        "a",
        grant(1, 1),
        (50, 60),
        Outcome::Ok(Reply::Released),
    );
    assert_eq!(checks(&h), []);
}

#[test]
fn a_release_of_unknown_outcome_may_have_ended_the_belief() {
    let mut h = handover(200);
    release(&mut h, 1, "a", grant(1, 1), (150, 400), Outcome::Unknown);
    assert_eq!(checks(&h), []);
}

#[test]
fn a_failed_release_or_one_begun_too_late_ends_nothing() {
    let mut h = handover(200);
    release(&mut h, 1, "a", grant(1, 1), (50, 60), Outcome::Failed);
    release(
        &mut h,
        1,
        "a",
        grant(1, 1),
        (201, 210),
        Outcome::Ok(Reply::Released),
    );
    assert_eq!(checks(&h), [Check::LeaseBelief]);
}

#[test]
fn a_release_begun_the_instant_the_other_grant_completed_may_have_come_first() {
    let mut h = handover(200);
    let released = Outcome::Ok(Reply::Released);
    release(&mut h, 1, "a", grant(1, 1), (200, 210), released);
    assert_eq!(checks(&h), []);
}

#[test]
fn a_later_renewal_extends_the_belief() {
    let mut h = handover(1500);
    renew(&mut h, 1, 1, TTL_NS, (800, 810));
    assert_eq!(checks(&h), [Check::LeaseBelief]);
}

#[test]
fn the_drift_bound_shortens_the_belief() {
    // ρ = 10 %: the holder believes in 900 ns of its 1000.
    let mut h = History::new(100_000).unwrap();
    renew(&mut h, 1, 1, TTL_NS, (0, 2));
    acquire(&mut h, 1, "a", (3, 5), granted(1, 1));
    acquire(&mut h, 2, "a", (100, 950), granted(2, 2));
    assert_eq!(checks(&h), []);

    let mut strict = History::new(0).unwrap();
    for op in h.ops() {
        strict.push(op.clone()).unwrap();
    }
    assert_eq!(checks(&strict), [Check::LeaseBelief]);
}

// ----- 5: fenced resources accept tokens in order -----

#[test]
fn a_lower_token_accepted_after_a_higher_one_is_caught() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), write(1), (0, 10), accepted());
    access(&mut h, 2, Some(grant(2, 3)), write(2), (20, 30), accepted());

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::FenceWentBack { higher, lower }, ..]
            if higher.id == OpId(0) && lower.id == OpId(1)),
        "{found:?}"
    );
}

#[test]
fn overlapping_accesses_may_have_applied_in_token_order() {
    let mut h = history();
    access(
        &mut h,
        1,
        Some(grant(1, 5)),
        Access::Claim,
        (0, 30),
        accepted(),
    );
    access(
        &mut h,
        2,
        Some(grant(2, 3)),
        Access::Claim,
        (10, 20),
        accepted(),
    );
    assert_eq!(checks(&h), []);
}

#[test]
fn the_resources_apply_order_orders_overlapping_accesses() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), Access::Claim, (0, 30), at(1));
    access(&mut h, 2, Some(grant(2, 3)), Access::Claim, (10, 20), at(2));
    assert_eq!(checks(&h), [Check::FenceOrder]);
}

#[test]
fn one_token_accepted_from_two_sessions_is_caught() {
    let mut h = history();
    access(
        &mut h,
        1,
        Some(grant(1, 5)),
        Access::Claim,
        (0, 10),
        accepted(),
    );
    access(
        &mut h,
        2,
        Some(grant(2, 5)),
        Access::Claim,
        (20, 30),
        accepted(),
    );
    assert_eq!(checks(&h), [Check::FenceOrder]);
}

#[test]
fn a_holder_refused_with_no_larger_token_before_it_is_caught() {
    let mut h = history();
    access(
        &mut h,
        1,
        Some(grant(1, 5)),
        Access::Claim,
        (0, 10),
        accepted(),
    );
    access(&mut h, 1, Some(grant(1, 5)), write(1), (20, 30), STALE);

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::RefusedWithoutCause { refused }] if refused.id == OpId(1)),
        "{found:?}"
    );
}

#[test]
fn a_refusal_after_a_larger_token_is_justified() {
    let mut h = history();
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Claim,
        (0, 10),
        accepted(),
    );
    access(&mut h, 1, Some(grant(1, 5)), write(1), (20, 30), STALE);
    assert_eq!(checks(&h), []);
}

#[test]
fn a_larger_token_of_unknown_outcome_may_justify_a_refusal() {
    let mut h = history();
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Claim,
        (25, 26),
        Outcome::Unknown,
    );
    access(&mut h, 1, Some(grant(1, 5)), write(1), (20, 30), STALE);
    assert_eq!(checks(&h), []);

    // Nor one invoked the instant the refusal came back,
    let mut tie = history();
    access(&mut tie, 1, Some(grant(1, 5)), write(1), (20, 30), STALE);
    access(
        &mut tie,
        2,
        Some(grant(2, 6)),
        Access::Claim,
        (30, 40),
        Outcome::Unknown,
    );
    assert_eq!(checks(&tie), []);

    // but not one invoked only after the refusal came back.
    let mut late = history();
    access(&mut late, 1, Some(grant(1, 5)), write(1), (20, 30), STALE);
    access(
        &mut late,
        2,
        Some(grant(2, 6)),
        Access::Claim,
        (31, 40),
        Outcome::Unknown,
    );
    assert_eq!(checks(&late), [Check::FenceOrder]);
}

// ----- 6: no lost update -----

#[test]
fn two_holders_incrementing_the_same_value_lose_an_update() {
    // Both read 0 (the first read unfenced, so nothing refuses the second holder's write back).
    let mut h = history();
    access(&mut h, 1, None, Access::Read, (0, 10), read(0));
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Read,
        (20, 30),
        read(0),
    );
    access(&mut h, 2, Some(grant(2, 6)), write(1), (40, 50), accepted());
    access(&mut h, 1, Some(grant(1, 5)), write(1), (35, 60), accepted());

    let found: Vec<Check> = checks(&h);
    assert!(found.contains(&Check::NoLostUpdate), "{found:?}");
}

#[test]
fn a_read_below_an_acknowledged_write_is_caught() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), Access::Read, (0, 5), read(0));
    access(&mut h, 1, Some(grant(1, 5)), write(1), (6, 8), accepted());
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Read,
        (10, 15),
        read(1),
    );
    access(&mut h, 2, Some(grant(2, 6)), write(2), (16, 18), accepted());
    access(&mut h, 3, None, Access::Read, (20, 30), read(1));

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::StaleRead { write, read }]
            if write.id == OpId(3) && read.id == OpId(4)),
        "{found:?}"
    );
}

#[test]
fn a_read_of_a_value_no_write_built_is_caught() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), write(1), (0, 10), accepted());
    access(&mut h, 1, None, Access::Read, (20, 30), read(2));

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::UnwrittenValue { missing: 2, .. }]),
        "{found:?}"
    );
}

#[test]
fn a_write_of_unknown_outcome_may_have_applied() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), Access::Read, (0, 5), read(0));
    access(&mut h, 1, Some(grant(1, 5)), write(1), (6, 8), accepted());
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Read,
        (10, 15),
        read(1),
    );
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        write(2),
        (16, 18),
        Outcome::Unknown,
    );
    // The final value says whether it did; either is consistent.
    access(&mut h, 3, None, Access::Read, (30, 40), read(2));
    assert_eq!(checks(&h), []);
    access(&mut h, 3, None, Access::Read, (50, 60), read(1));
    assert_eq!(checks(&h), []);
}

#[test]
fn a_superseded_holder_refused_loses_nothing() {
    let mut h = history();
    access(&mut h, 1, Some(grant(1, 5)), Access::Read, (0, 5), read(0));
    access(
        &mut h,
        2,
        Some(grant(2, 6)),
        Access::Read,
        (10, 15),
        read(0),
    );
    access(&mut h, 1, Some(grant(1, 5)), write(1), (20, 25), STALE);
    access(&mut h, 2, Some(grant(2, 6)), write(1), (30, 35), accepted());
    access(&mut h, 3, None, Access::Read, (40, 45), read(1));
    assert_eq!(checks(&h), []);
}

// ----- 7: linearizable reads reflect what was acknowledged before them -----

#[test]
fn a_read_that_misses_a_grant_acknowledged_before_it_began_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    let grant = acquire(&mut h, 2, "a", (20, 30), granted(2, 7));
    let read = status(&mut h, 3, "a", (40, 50), Some(common::grant(1, 5)), 5);

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::ReadMissedGrant { grant: g, read: r }]
            if g.id == grant && r.id == read),
        "{found:?}"
    );
}

#[test]
fn a_read_showing_a_released_holder_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    let release = release(
        &mut h,
        1,
        "a",
        common::grant(1, 5),
        (20, 30),
        Outcome::Ok(Reply::Released),
    );
    let read = status(&mut h, 2, "a", (40, 50), Some(common::grant(1, 5)), 5);

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::ReadShowedReleased { release: rel, read: r }]
            if rel.id == release && r.id == read),
        "{found:?}"
    );
    assert_eq!(checks(&h), [Check::ReadsReflectAcknowledged]);
}

#[test]
fn reads_overlapping_or_after_unknown_outcomes_may_show_the_older_state() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    // The grant of 7 completes after the read began; the release's outcome is unknown.
    acquire(&mut h, 2, "a", (20, 45), granted(2, 7));
    release(
        &mut h,
        1,
        "a",
        common::grant(1, 5),
        (15, 18),
        Outcome::Unknown,
    );
    status(&mut h, 3, "a", (40, 50), Some(common::grant(1, 5)), 5);
    // Equal times order nothing.
    status(&mut h, 3, "a", (45, 60), Some(common::grant(1, 5)), 5);
    // A later read shows the grant of 7, or a larger token, or nothing it knows of.
    status(&mut h, 3, "a", (60, 70), None, 7);
    status(&mut h, 3, "a", (60, 70), None, 9);
    status(&mut h, 3, "a", (60, 70), None, 0);
    // Another lock's grants say nothing about this one.
    acquire(&mut h, 4, "b", (50, 55), granted(4, 11));

    assert_eq!(checks(&h), []);
}

// ----- bad input -----

#[test]
fn bad_records_are_refused_with_the_reason() {
    assert_eq!(
        History::new(1_000_000).unwrap_err(),
        HistoryError::DriftBound {
            drift_bound_ppm: 1_000_000
        }
    );
    let mut h = history();
    let acquire = Action::Acquire {
        lock: "a".into(),
        ttl_ns: TTL_NS,
    };
    let op = h.invoke(ClientId(1), 10, acquire.clone());
    let error = h.complete(op, 5, granted(1, 1)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "operation #0 completes at 5 ns, before its invocation at 10 ns"
    );
    assert!(matches!(
        h.complete(op, 20, Outcome::Ok(Reply::Released)),
        Err(HistoryError::ReplyDoesNotMatch { .. })
    ));
    h.complete(op, 20, granted(1, 1)).unwrap();
    assert_eq!(
        h.complete(op, 30, granted(1, 1)),
        Err(HistoryError::AlreadyComplete(op))
    );
    assert_eq!(
        h.push(Op {
            client: ClientId(1),
            action: acquire,
            invoke_ns: 0,
            complete_ns: None,
            outcome: Outcome::Failed,
        }),
        Err(HistoryError::NoCompletionTime(OpId(1)))
    );
    assert_eq!(
        h.ops().len(),
        1,
        "refused records leave the history as it was"
    );
}

// ----- across an operator's recovery (a restore, a lost or rolled-back log) -----

#[test]
fn the_same_sequencer_acknowledged_to_two_clients_is_issued_twice() {
    // A session id and a token re-issued after a recovery: byte for byte the same sequencer,
    // answered to a client that never opened that session before.
    let mut h = history();
    let first = acquire(&mut h, 1, "a", (0, 10), granted(3, 5));
    h.recovered(20, 30);
    let second = acquire(&mut h, 2, "a", (40, 50), granted(3, 5));

    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::DuplicateToken { first: f, second: s }]
            if f.id == first && s.id == second),
        "{found:?}"
    );
}

#[test]
fn a_recovery_between_a_grant_and_another_excuses_the_lease_but_never_a_token_not_above() {
    // The restore dropped session 1 while its client still believed in its lease.
    let mut h = handover(200);
    h.recovered(50, 90);
    assert_eq!(checks(&h), []);

    // A recovery that ended before the holder's grant excuses nothing.
    let mut h = handover(200);
    h.recovered(0, 2);
    assert_eq!(checks(&h), [Check::LeaseBelief]);

    // Tokens never go back, recovery or not.
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    h.recovered(20, 30);
    acquire(&mut h, 2, "a", (40, 50), granted(2, 4));
    assert_eq!(checks(&h), [Check::TokensGrowPerLock]);
}

#[test]
fn a_recovery_between_a_grant_or_release_and_a_read_excuses_the_read() {
    // A rolled-back log shows a released holder again, and the lock's older last token.
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 10), granted(1, 5));
    release(
        &mut h,
        1,
        "a",
        common::grant(1, 5),
        (20, 30),
        Outcome::Ok(Reply::Released),
    );
    acquire(&mut h, 2, "a", (31, 35), granted(2, 7));
    h.recovered(36, 38);
    status(&mut h, 3, "a", (40, 50), Some(common::grant(1, 5)), 5);
    assert_eq!(checks(&h), []);
}
