//! The checks of read-write locks and semaphores (issue 32) against small hand-written histories,
//! each one that breaks a check and one that does not: readers of one phase share a token,
//! permits of different slots hold at once, a slot holds one holder, writes need a writer.

mod common;

use common::*;
use palisade_core::Access::{Shared, Slot};
use palisade_core::Mode;
use palisade_history::{Check, History, HistoryError, OpId, Outcome, Violation};

fn history() -> History {
    History::new(0).unwrap()
}

fn checks(h: &History) -> Vec<Check> {
    violations(h).iter().map(Violation::check).collect()
}

#[test]
fn readers_of_one_phase_share_its_token_and_hold_at_once() {
    let mut h = history();
    renew(&mut h, 1, 1, TTL_NS, (0, 1));
    renew(&mut h, 2, 2, TTL_NS, (0, 1));
    acquire_as(
        &mut h,
        1,
        "doc",
        Mode::Shared,
        (2, 4),
        granted_as(1, 7, Shared),
    );
    acquire_as(
        &mut h,
        2,
        "doc",
        Mode::Shared,
        (10, 12),
        granted_as(2, 7, Shared),
    );
    // Both read with the phase's token.
    access(
        &mut h,
        1,
        Some(grant(1, 7)),
        common::read_access(),
        (20, 22),
        read(0),
    );
    access(
        &mut h,
        2,
        Some(grant(2, 7)),
        common::read_access(),
        (20, 22),
        read(0),
    );
    assert_eq!(checks(&h), []);
}

#[test]
fn a_writer_granted_with_the_phase_token_or_while_a_reader_believes_is_caught() {
    let mut h = history();
    renew(&mut h, 1, 1, TTL_NS, (0, 1));
    acquire_as(
        &mut h,
        1,
        "doc",
        Mode::Shared,
        (2, 4),
        granted_as(1, 7, Shared),
    );
    acquire(&mut h, 2, "doc", (10, 12), granted(2, 7));
    acquire(&mut h, 3, "doc", (20, 22), granted(3, 8));
    let found = checks(&h);
    assert!(found.contains(&Check::TokensGrowPerLock), "{found:?}");
    assert!(found.contains(&Check::TokensUnique), "{found:?}");
    assert!(found.contains(&Check::LeaseBelief), "{found:?}");
}

#[test]
fn permits_of_different_slots_hold_at_once_but_one_slot_holds_one() {
    let mut h = history();
    renew(&mut h, 1, 1, TTL_NS, (0, 1));
    renew(&mut h, 2, 2, TTL_NS, (0, 1));
    acquire_as(
        &mut h,
        1,
        "pool",
        Mode::Permit(2),
        (2, 4),
        granted_as(1, 3, Slot(0)),
    );
    acquire_as(
        &mut h,
        2,
        "pool",
        Mode::Permit(2),
        (5, 6),
        granted_as(2, 4, Slot(1)),
    );
    assert_eq!(checks(&h), []);

    // A third holder in slot 0 while its holder believes in its lease: three live permits.
    let third = acquire_as(
        &mut h,
        3,
        "pool",
        Mode::Permit(2),
        (7, 8),
        granted_as(3, 5, Slot(0)),
    );
    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::LeaseOutlasted { holder, other, .. }]
            if holder.id == OpId(2) && other.id == third),
        "{found:?}"
    );
}

#[test]
fn a_permit_in_a_slot_beyond_the_size_is_caught() {
    let mut h = history();
    acquire_as(
        &mut h,
        1,
        "pool",
        Mode::Permit(2),
        (0, 1),
        granted_as(1, 3, Slot(1)),
    );
    assert_eq!(checks(&h), []);
    let beyond = acquire_as(
        &mut h,
        2,
        "pool",
        Mode::Permit(2),
        (2, 3),
        granted_as(2, 4, Slot(2)),
    );
    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::SlotOutOfRange { grant }] if grant.id == beyond),
        "{found:?}"
    );
}

#[test]
fn a_grant_of_another_kind_than_the_mode_asked_is_refused_as_a_record() {
    let mut h = history();
    let op = palisade_history::Op {
        client: palisade_history::ClientId(1),
        action: palisade_history::Action::AcquireAs {
            lock: "doc".into(),
            ttl_ns: TTL_NS,
            mode: Mode::Shared,
        },
        invoke_ns: 0,
        complete_ns: Some(1),
        outcome: granted_as(1, 3, Slot(0)),
    };
    assert!(matches!(
        h.push(op),
        Err(HistoryError::ReplyDoesNotMatch { .. })
    ));
}

#[test]
fn a_write_accepted_from_a_reader_is_caught() {
    let mut h = history();
    acquire_as(
        &mut h,
        1,
        "doc",
        Mode::Shared,
        (0, 1),
        granted_as(1, 3, Shared),
    );
    access(
        &mut h,
        1,
        Some(grant(1, 3)),
        common::read_access(),
        (2, 3),
        read(0),
    );
    assert_eq!(checks(&h), []);
    let write = access(&mut h, 1, Some(grant(1, 3)), write(1), (4, 5), accepted());
    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::WriteFromReader { write: w }] if w.id == write),
        "{found:?}"
    );
}

#[test]
fn a_writers_write_after_a_later_phase_read_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "doc", (0, 1), granted(1, 3));
    access(&mut h, 1, Some(grant(1, 3)), write(1), (2, 3), accepted());
    acquire_as(
        &mut h,
        2,
        "doc",
        Mode::Shared,
        (4, 5),
        granted_as(2, 4, Shared),
    );
    let phase = access(
        &mut h,
        2,
        Some(grant(2, 4)),
        common::read_access(),
        (6, 7),
        read(1),
    );
    assert_eq!(checks(&h), []);
    // The paused writer's late write: the fence must refuse it.
    let late = access(&mut h, 1, Some(grant(1, 3)), write(2), (8, 9), accepted());
    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::WriteAfterLaterPhase { phase: p, write }]
            if p.id == phase && write.id == late),
        "{found:?}"
    );
    // Refused, as it should be: no violation.
    let mut refused = history();
    acquire(&mut refused, 1, "doc", (0, 1), granted(1, 3));
    acquire_as(
        &mut refused,
        2,
        "doc",
        Mode::Shared,
        (4, 5),
        granted_as(2, 4, Shared),
    );
    access(
        &mut refused,
        2,
        Some(grant(2, 4)),
        common::read_access(),
        (6, 7),
        read(0),
    );
    access(&mut refused, 1, Some(grant(1, 3)), write(1), (8, 9), STALE);
    assert_eq!(checks(&refused), []);
}

#[test]
fn readers_of_one_phase_at_the_fence_are_not_two_sessions_with_one_token() {
    let mut h = history();
    acquire_as(
        &mut h,
        1,
        "doc",
        Mode::Shared,
        (0, 1),
        granted_as(1, 3, Shared),
    );
    acquire_as(
        &mut h,
        2,
        "doc",
        Mode::Shared,
        (0, 1),
        granted_as(2, 3, Shared),
    );
    access(
        &mut h,
        1,
        Some(grant(1, 3)),
        common::read_access(),
        (2, 3),
        read(0),
    );
    access(
        &mut h,
        2,
        Some(grant(2, 3)),
        common::read_access(),
        (4, 5),
        read(0),
    );
    assert_eq!(checks(&h), []);
    // Two writers with one token are still caught.
    let mut two = history();
    acquire(&mut two, 1, "doc", (0, 1), granted(1, 3));
    access(&mut two, 1, Some(grant(1, 3)), write(1), (2, 3), accepted());
    access(&mut two, 2, Some(grant(2, 3)), write(2), (4, 5), accepted());
    assert!(checks(&two).contains(&Check::FenceOrder));
}

#[test]
fn a_reader_joining_a_phase_opened_before_a_grant_of_another_lock_is_not_a_token_going_back() {
    let mut h = history();
    acquire_as(
        &mut h,
        1,
        "doc",
        Mode::Shared,
        (0, 1),
        granted_as(1, 3, Shared),
    );
    acquire(&mut h, 2, "other", (2, 3), granted(2, 4));
    // Joins the open phase: its token was drawn when the phase opened.
    acquire_as(
        &mut h,
        3,
        "doc",
        Mode::Shared,
        (5, 6),
        granted_as(3, 3, Shared),
    );
    assert_eq!(checks(&h), []);
    // A writer (or a reader opening a phase) draws a token: below another lock's is caught.
    acquire(&mut h, 4, "doc2", (7, 8), granted(4, 2));
    assert_eq!(checks(&h), [Check::TokensGrowAcrossLocks]);
}

/// "No write accepted from a writer whose phase was superseded": by a later shared phase it is
/// check 9's, by a later writer check 5's (the fence went back to a lower token).
#[test]
fn a_superseded_writers_write_after_a_later_writer_is_caught() {
    let mut h = history();
    acquire(&mut h, 1, "doc", (0, 1), granted(1, 3));
    access(
        &mut h,
        1,
        Some(grant(1, 3)),
        common::read_access(),
        (2, 3),
        at(0),
    );
    acquire(&mut h, 2, "doc", (4, 5), granted(2, 4));
    let later = access(&mut h, 2, Some(grant(2, 4)), write(1), (6, 7), at(1));
    assert_eq!(checks(&h), []);
    // The first writer, paused since its claim, writes with its superseded grant.
    let late = access(&mut h, 1, Some(grant(1, 3)), write(1), (8, 9), at(2));
    let found = violations(&h);
    assert!(
        found
            .iter()
            .any(|v| matches!(v, Violation::FenceWentBack { higher, lower }
            if higher.id == later && lower.id == late)),
        "{found:?}"
    );
}

#[test]
fn a_multi_acquire_granted_every_lock_at_one_point_is_clean() {
    let mut h = history();
    acquire(&mut h, 1, "a", (0, 1), granted(1, 3));
    for (lock, token) in [("a", 5), ("b", 7)] {
        acquire_part(
            &mut h,
            2,
            (1, 2),
            lock,
            Mode::Exclusive,
            (0, 10),
            granted(2, token),
        );
    }
    // A shared part joins a phase opened before, with its older token.
    acquire_as(
        &mut h,
        3,
        "doc",
        Mode::Shared,
        (0, 1),
        granted_as(3, 4, Shared),
    );
    for (lock, mode, outcome) in [
        ("c", Mode::Exclusive, granted(4, 8)),
        ("doc", Mode::Shared, granted_as(4, 4, Shared)),
        ("pool", Mode::Permit(2), granted_as(4, 9, Slot(0))),
    ] {
        acquire_part(&mut h, 4, (1, 3), lock, mode, (11, 12), outcome);
    }
    // Another lock's grant between its tokens is no split (one step may grant several
    // waiters); a multi-acquire that failed as a whole is none.
    acquire(&mut h, 5, "z", (0, 10), granted(5, 6));
    for lock in ["a", "b"] {
        acquire_part(
            &mut h,
            5,
            (2, 2),
            lock,
            Mode::Exclusive,
            (13, 14),
            Outcome::Failed,
        );
    }
    assert_eq!(checks(&h), []);
}

#[test]
fn a_multi_acquire_granted_some_of_its_locks_is_caught() {
    let mut h = history();
    let part = acquire_part(
        &mut h,
        1,
        (7, 2),
        "a",
        Mode::Exclusive,
        (0, 5),
        granted(1, 3),
    );
    acquire_part(
        &mut h,
        1,
        (7, 2),
        "b",
        Mode::Exclusive,
        (0, 5),
        Outcome::Failed,
    );
    let found = violations(&h);
    assert!(
        matches!(&found[..], [Violation::MultiGrantPartial { part: p, granted: 1, parts: 2 }]
            if p.id == part),
        "{found:?}"
    );
}

#[test]
fn a_multi_acquire_whose_lock_went_to_another_between_its_grants_is_caught() {
    let mut h = history();
    // Taken one lock after the other, as a client-side multi-lock does: holding "a", it waited
    // while "b" was granted to another session, then took "b".
    acquire_part(
        &mut h,
        1,
        (1, 2),
        "a",
        Mode::Exclusive,
        (0, 20),
        granted(1, 3),
    );
    let other = acquire(&mut h, 2, "b", (0, 20), granted(2, 4));
    let part = acquire_part(
        &mut h,
        1,
        (1, 2),
        "b",
        Mode::Exclusive,
        (0, 20),
        granted(1, 5),
    );
    let found = violations(&h);
    assert!(
        found.iter().any(
            |v| matches!(v, Violation::MultiGrantSplit { part: p, other: o }
            if p.id == part && o.id == other)
        ),
        "{found:?}"
    );
    assert!(
        found.iter().all(|v| v.check() == Check::MultiAllOrNone),
        "{found:?}"
    );
}
