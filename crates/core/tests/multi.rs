//! Scenario tests of atomic multi-locks ([`Command::AcquireAll`], issue 32): stories with
//! explicit times, asserting the replies and events a client would see. All of a multi-lock's
//! locks are granted in one step or none is; a group waits in every queue at once, so two
//! sessions taking the same locks in opposite orders never deadlock.

use palisade_core::{
    Access, AcquirePart, Command, CoreError, DurationMs, Event, GrantedPart, Limits,
    MULTI_LOCKS_MAX, Mode, Output, ReleaseCause, Reply, RequestId, SessionId, Token, Wait,
    WaitEndCause,
};

const TTL_MS: u64 = 1_000;

mod story;

use story::Story;

impl Story {
    fn open(&mut self, now_ms: u64) -> SessionId {
        self.open_at(now_ms, TTL_MS)
    }

    fn acquire_all_as(
        &mut self,
        now_ms: u64,
        session: SessionId,
        parts: &[(&str, Mode)],
        request_id: RequestId,
        wait: Wait,
    ) -> Output {
        let parts = parts
            .iter()
            .map(|(lock, mode)| AcquirePart {
                lock: lock.to_string(),
                mode: *mode,
            })
            .collect();
        self.apply(
            now_ms,
            Command::AcquireAll {
                session,
                parts,
                request_id,
                wait,
            },
        )
    }

    /// A multi-lock of exclusive parts.
    fn acquire_all(
        &mut self,
        now_ms: u64,
        session: SessionId,
        locks: &[&str],
        wait: Wait,
    ) -> Output {
        let parts: Vec<(&str, Mode)> = locks.iter().map(|l| (*l, Mode::Exclusive)).collect();
        let request_id = self.request_id();
        self.acquire_all_as(now_ms, session, &parts, request_id, wait)
    }

    fn acquire(&mut self, now_ms: u64, session: SessionId, lock: &str, wait: Wait) -> Output {
        let request_id = self.request_id();
        self.apply(
            now_ms,
            Command::Acquire {
                session,
                lock: lock.into(),
                request_id,
                wait,
                value: None,
                mode: Mode::Exclusive,
            },
        )
    }

    fn release(&mut self, now_ms: u64, session: SessionId, lock: &str) -> Output {
        let request_id = self.request_id();
        self.apply(
            now_ms,
            Command::Release {
                session,
                lock: lock.into(),
                request_id,
            },
        )
    }

    fn holder(&self, lock: &str) -> Option<SessionId> {
        self.table.holder(lock).map(|g| g.session)
    }
}

/// The locks each `Granted` event of `output` grants to `session`, in event order.
fn granted_to(output: &Output, session: SessionId) -> Vec<String> {
    output
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Granted {
                lock, session: s, ..
            } if *s == session => Some(lock.clone()),
            _ => None,
        })
        .collect()
}

fn ended_waits(output: &Output, session: SessionId, cause: WaitEndCause) -> Vec<String> {
    output
        .events
        .iter()
        .filter_map(|e| match e {
            Event::WaitEnded {
                lock,
                session: s,
                cause: c,
                ..
            } if *s == session && *c == cause => Some(lock.clone()),
            _ => None,
        })
        .collect()
}

fn grant_locks(reply: &Result<Reply, CoreError>) -> Vec<String> {
    match reply {
        Ok(Reply::GrantedAll { grants, .. }) => grants.iter().map(|g| g.lock.clone()).collect(),
        other => panic!("expected every lock granted, got {other:?}"),
    }
}

const EVERY_LOCK: [&str; 2] = ["a", "b"];

#[test]
fn free_locks_are_granted_at_once_each_with_its_own_token_in_the_order_named() {
    let mut story = Story::new();
    let s = story.open(0);
    let out = story.acquire_all(1, s, &["b", "a"], Wait::Try);
    assert_eq!(
        out.result,
        Ok(Reply::GrantedAll {
            session: s,
            grants: vec![
                GrantedPart {
                    lock: "b".into(),
                    token: Token::new(1),
                    access: Access::Exclusive,
                },
                GrantedPart {
                    lock: "a".into(),
                    token: Token::new(2),
                    access: Access::Exclusive,
                },
            ],
        })
    );
    assert_eq!(granted_to(&out, s), ["b", "a"]);
    assert_eq!((story.holder("a"), story.holder("b")), (Some(s), Some(s)));
}

#[test]
fn opposite_orders_from_two_sessions_never_deadlock_and_never_hold_a_part() {
    for release_order in [["a", "b"], ["b", "a"]] {
        let mut story = Story::new();
        let (h1, h2, s, t) = (story.open(0), story.open(0), story.open(0), story.open(0));
        story.acquire(1, h1, "a", Wait::Try).result.unwrap();
        story.acquire(1, h2, "b", Wait::Try).result.unwrap();
        let queued = story.acquire_all(2, s, &["a", "b"], Wait::Forever);
        assert_eq!(queued.result, Ok(Reply::QueuedAll { session: s }));
        let queued = story.acquire_all(2, t, &["b", "a"], Wait::Forever);
        assert_eq!(queued.result, Ok(Reply::QueuedAll { session: t }));

        // The first holder leaves: one lock is free, but nobody gets a part of a multi-lock.
        let holders = [("a", h1), ("b", h2)];
        let first = holders.iter().find(|h| h.0 == release_order[0]).unwrap();
        let out = story.release(3, first.1, first.0);
        assert!(granted_to(&out, s).is_empty() && granted_to(&out, t).is_empty());
        assert_eq!(story.holder(first.0), None, "a free lock left to its group");

        // The second leaves: the earlier group gets both in one step, the later none.
        let second = holders.iter().find(|h| h.0 == release_order[1]).unwrap();
        let out = story.release(4, second.1, second.0);
        assert_eq!(granted_to(&out, s).len(), 2);
        assert!(granted_to(&out, t).is_empty());
        assert_eq!((story.holder("a"), story.holder("b")), (Some(s), Some(s)));

        // Session s releases its locks in either order; t gets both only when both are free.
        let out = story.release(5, s, release_order[1]);
        assert!(granted_to(&out, t).is_empty(), "a part granted alone");
        let out = story.release(6, s, release_order[0]);
        let mut got = granted_to(&out, t);
        got.sort();
        assert_eq!(got, EVERY_LOCK);
    }
}

#[test]
fn a_try_is_refused_busy_while_one_lock_is_held_and_changes_nothing() {
    let mut story = Story::new();
    let (h, s) = (story.open(0), story.open(0));
    story.acquire(1, h, "b", Wait::Try).result.unwrap();
    let before = story.table.clone();
    let out = story.acquire_all(2, s, &["a", "b"], Wait::Try);
    assert_eq!(
        out.result,
        Err(CoreError::Busy {
            lock: "b".into(),
            holder_session: Some(h),
            holder_token: Some(Token::new(1)),
            available_at_ms: None,
        })
    );
    assert!(out.events.is_empty());
    assert_eq!(story.holder("a"), None, "a part was taken");
    assert_eq!(story.table.lock_count(), before.lock_count());
}

#[test]
fn a_deadline_ends_the_whole_group_and_frees_its_queues() {
    let mut story = Story::new();
    let (h, s, w) = (story.open(0), story.open(0), story.open(0));
    story.acquire(1, h, "b", Wait::Try).result.unwrap();
    let wait = Wait::ForMs(DurationMs::from_millis(200));
    let queued = story.acquire_all(2, s, &["a", "b"], wait);
    assert_eq!(queued.result, Ok(Reply::QueuedAll { session: s }));
    // A single waiter for "a" queues behind the group, although "a" is free.
    let out = story.acquire(3, w, "a", Wait::Forever);
    assert!(matches!(out.result, Ok(Reply::Queued { position: 1, .. })));
    // The deadline ends the group in every queue; "a" goes to the single waiter.
    let out = story.apply(202, Command::Tick);
    let mut ended = ended_waits(&out, s, WaitEndCause::TimedOut);
    ended.sort();
    assert_eq!(ended, EVERY_LOCK);
    assert_eq!(granted_to(&out, w), ["a"]);
    assert_eq!(story.table.session_status(s).unwrap().waiting.len(), 0);
}

#[test]
fn a_waiting_group_ends_with_its_session_and_lets_the_next_one_in() {
    let mut story = Story::new();
    let (h, s, t) = (story.open(0), story.open(0), story.open(500));
    story.acquire(1, h, "a", Wait::Try).result.unwrap();
    story.acquire_all(2, s, &["a", "b"], Wait::Forever);
    story.acquire_all(3, t, &["b"], Wait::Forever);
    story.apply(600, Command::KeepAlive { session: h });
    // s's lease runs out at 1000: its group leaves both queues, and t gets "b".
    let out = story.apply(1_000, Command::Tick);
    let mut ended = ended_waits(&out, s, WaitEndCause::SessionEnded);
    ended.sort();
    assert_eq!(ended, EVERY_LOCK);
    assert_eq!(granted_to(&out, t), ["b"]);
    assert_eq!(story.holder("a"), Some(h));
}

#[test]
fn releasing_one_lock_of_a_granted_group_releases_that_lock_alone() {
    let mut story = Story::new();
    let (s, w) = (story.open(0), story.open(0));
    story
        .acquire_all(1, s, &["a", "b"], Wait::Try)
        .result
        .unwrap();
    story.acquire(2, w, "a", Wait::Forever);
    let out = story.release(3, s, "a");
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::Released { lock, cause: ReleaseCause::Released, .. } if lock == "a"
    )));
    assert_eq!((story.holder("a"), story.holder("b")), (Some(w), Some(s)));
}

#[test]
fn releasing_one_lock_of_a_waiting_group_withdraws_the_whole_group() {
    let mut story = Story::new();
    let (h, s) = (story.open(0), story.open(0));
    story.acquire(1, h, "a", Wait::Try).result.unwrap();
    story.acquire_all(2, s, &["a", "b"], Wait::Forever);
    let out = story.release(3, s, "b");
    assert_eq!(
        out.result,
        Ok(Reply::Released {
            lock: "b".into(),
            session: s,
            token: None
        })
    );
    let mut ended = ended_waits(&out, s, WaitEndCause::Withdrawn);
    ended.sort();
    assert_eq!(ended, EVERY_LOCK);
    assert_eq!(story.table.lock_status("a").unwrap().waiters, []);
    assert_eq!(story.table.lock_status("b"), None, "b is forgotten");
}

#[test]
fn a_retry_answers_queued_while_waiting_and_every_grant_once_granted() {
    let mut story = Story::new();
    let (h, s) = (story.open(0), story.open(0));
    story.acquire(1, h, "a", Wait::Try).result.unwrap();
    let parts = [("a", Mode::Exclusive), ("b", Mode::Shared)];
    let id = story.request_id();
    let first = story.acquire_all_as(2, s, &parts, id, Wait::Forever);
    assert_eq!(first.result, Ok(Reply::QueuedAll { session: s }));
    let retry = story.acquire_all_as(3, s, &parts, id, Wait::Forever);
    assert_eq!(retry.result, first.result);
    assert!(retry.events.is_empty());
    let granted = story.release(4, h, "a");
    assert_eq!(granted_to(&granted, s), ["a", "b"]);
    let retry = story.acquire_all_as(5, s, &parts, id, Wait::Forever);
    assert!(retry.events.is_empty(), "a retry acts again");
    assert_eq!(grant_locks(&retry.result), ["a", "b"]);
    let Ok(Reply::GrantedAll { grants, .. }) = retry.result else {
        unreachable!()
    };
    assert_eq!(grants[1].access, Access::Shared);
    // The same id for another command is still a conflict.
    let other = story.acquire_all_as(6, s, &[("c", Mode::Exclusive)], id, Wait::Try);
    assert_eq!(
        other.result,
        Err(CoreError::RequestIdConflict { request_id: id })
    );
}

#[test]
fn a_shared_part_joins_the_open_phase_with_its_token() {
    let mut story = Story::new();
    let (r, s) = (story.open(0), story.open(0));
    let id = story.request_id();
    let reader = Command::Acquire {
        session: r,
        lock: "a".into(),
        request_id: id,
        wait: Wait::Try,
        value: None,
        mode: Mode::Shared,
    };
    story.apply(1, reader).result.unwrap();
    let id = story.request_id();
    let parts = [("a", Mode::Shared), ("c", Mode::Permit(2))];
    let out = story.acquire_all_as(2, s, &parts, id, Wait::Try);
    assert_eq!(
        out.result,
        Ok(Reply::GrantedAll {
            session: s,
            grants: vec![
                GrantedPart {
                    lock: "a".into(),
                    token: Token::new(1),
                    access: Access::Shared,
                },
                GrantedPart {
                    lock: "c".into(),
                    token: Token::new(2),
                    access: Access::Slot(0),
                },
            ],
        })
    );
}

#[test]
fn refusals_change_nothing() {
    let mut story = Story::new();
    let (h, s) = (story.open(0), story.open(0));
    story.acquire(1, h, "held", Wait::Try).result.unwrap();
    story.acquire(1, s, "mine", Wait::Try).result.unwrap();
    story.acquire(1, s, "held", Wait::Forever);
    let before = story.table.clone();
    let too_many: Vec<String> = (0..=MULTI_LOCKS_MAX).map(|i| format!("l{i}")).collect();
    let too_many: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let cases: Vec<(Vec<(&str, Mode)>, CoreError)> = vec![
        (
            vec![],
            CoreError::MultiLockSize {
                locks: 0,
                locks_max: MULTI_LOCKS_MAX,
            },
        ),
        (
            too_many.iter().map(|l| (*l, Mode::Exclusive)).collect(),
            CoreError::MultiLockSize {
                locks: MULTI_LOCKS_MAX + 1,
                locks_max: MULTI_LOCKS_MAX,
            },
        ),
        (
            vec![
                ("x", Mode::Exclusive),
                ("y", Mode::Shared),
                ("x", Mode::Shared),
            ],
            CoreError::MultiLockRepeated { lock: "x".into() },
        ),
        (
            vec![("x", Mode::Exclusive), ("mine", Mode::Exclusive)],
            CoreError::MultiLockHeld {
                lock: "mine".into(),
                session: s,
            },
        ),
        (
            vec![("x", Mode::Exclusive), ("held", Mode::Exclusive)],
            CoreError::MultiLockHeld {
                lock: "held".into(),
                session: s,
            },
        ),
        (
            vec![("x", Mode::Permit(0))],
            CoreError::PermitsOutOfRange {
                permits: 0,
                permits_max: palisade_core::PERMITS_MAX,
            },
        ),
    ];
    for (parts, refusal) in cases {
        let id = story.request_id();
        let out = story.acquire_all_as(2, s, &parts, id, Wait::Forever);
        assert_eq!(out.result, Err(refusal));
        assert!(out.events.is_empty());
    }
    let t = story.open(3);
    let id = story.request_id();
    let out = story.acquire_all_as(
        3,
        t,
        &[("x", Mode::Exclusive), ("held", Mode::Permit(2))],
        id,
        Wait::Forever,
    );
    assert_eq!(
        out.result,
        Err(CoreError::PermitsMismatch {
            lock: "held".into(),
            permits: 0,
            requested: 2,
        })
    );
    let id = story.request_id();
    let out = story.acquire_all_as(
        3,
        t,
        &[("x", Mode::Exclusive), ("", Mode::Shared)],
        id,
        Wait::Try,
    );
    assert!(matches!(out.result, Err(CoreError::InvalidLockName(_))));
    assert_eq!(story.table.lock_count(), before.lock_count());
    assert_eq!(story.table.lock_status("x"), None);
}

#[test]
fn a_group_waits_behind_earlier_waiters_and_blocks_later_ones() {
    let mut story = Story::new();
    let (h, w, s, late) = (story.open(0), story.open(0), story.open(0), story.open(0));
    story.acquire(1, h, "a", Wait::Try).result.unwrap();
    story.acquire(1, w, "a", Wait::Forever);
    story.acquire_all(2, s, &["a", "b"], Wait::Forever);
    // "b" is free, but its queue's front is the group: a later single waiter queues.
    let out = story.acquire(3, late, "b", Wait::Try);
    assert!(matches!(out.result, Err(CoreError::Busy { .. })));
    // "a" goes to w first (FIFO), then to the group when w leaves.
    let out = story.release(4, h, "a");
    assert_eq!(granted_to(&out, w), ["a"]);
    assert!(granted_to(&out, s).is_empty());
    let out = story.release(5, w, "a");
    assert_eq!(granted_to(&out, s), ["a", "b"]);
}

#[test]
fn too_many_waiters_on_any_queue_refuses_the_group() {
    let limits = Limits {
        waiters_per_lock_max: 1,
        ..Limits::default()
    };
    let mut story = Story::with_limits(limits);
    let (h, w, s) = (story.open(0), story.open(0), story.open(0));
    story.acquire(1, h, "b", Wait::Try).result.unwrap();
    story.acquire(1, w, "b", Wait::Forever).result.unwrap();
    let out = story.acquire_all(2, s, &["a", "b"], Wait::Forever);
    assert_eq!(
        out.result,
        Err(CoreError::TooManyWaiters {
            lock: "b".into(),
            waiters_max: 1
        })
    );
    assert_eq!(story.table.lock_status("a"), None);
}
