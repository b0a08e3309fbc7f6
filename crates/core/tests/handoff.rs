//! Scenario tests of a release and an acquire in one command ([`Command::ReleaseThenAcquire`],
//! issue 34): stories with explicit times, asserting the replies and the holders a client would
//! see. The release is decided first and stands; the acquire follows in the same step.

use palisade_core::{Command, CoreError, Mode, Reply, RequestId, SessionId, Token, Wait};

const TTL_MS: u64 = 10_000;

mod story;

use story::Story;

impl Story {
    fn open(&mut self) -> SessionId {
        self.open_at(0, TTL_MS)
    }

    fn acquire(&mut self, session: SessionId, lock: &str, wait: Wait) -> Result<Reply, CoreError> {
        let request_id = self.request_id();
        self.apply(
            1,
            Command::Acquire {
                session,
                lock: lock.to_string(),
                request_id,
                wait,
                value: None,
                mode: Mode::Exclusive,
            },
        )
        .result
    }

    fn token(&mut self, session: SessionId, lock: &str) -> Token {
        match self.acquire(session, lock, Wait::Try) {
            Ok(Reply::Granted { token, .. }) => token,
            other => panic!("acquire of {lock} failed: {other:?}"),
        }
    }

    fn handoff_with(
        &mut self,
        session: SessionId,
        release: &str,
        lock: &str,
        wait: Wait,
        ids: (RequestId, RequestId),
    ) -> Result<Reply, CoreError> {
        self.apply(
            2,
            Command::ReleaseThenAcquire {
                session,
                release: release.to_string(),
                release_request_id: ids.0,
                lock: lock.to_string(),
                request_id: ids.1,
                wait,
                value: None,
                mode: Mode::Exclusive,
            },
        )
        .result
    }

    fn handoff(
        &mut self,
        session: SessionId,
        release: &str,
        lock: &str,
        wait: Wait,
    ) -> Result<Reply, CoreError> {
        let ids = (self.request_id(), self.request_id());
        self.handoff_with(session, release, lock, wait, ids)
    }

    fn holder(&self, lock: &str) -> Option<(SessionId, Token)> {
        self.table.holder(lock).map(|g| (g.session, g.token))
    }
}

fn granted(released: Token, session: SessionId, lock: &str, token: Token) -> Reply {
    Reply::ReleasedThenAcquired {
        released: Some(released),
        acquired: Box::new(Reply::Granted {
            lock: lock.to_string(),
            session,
            token,
        }),
    }
}

#[test]
fn a_handoff_to_itself_with_nobody_waiting_is_a_new_grant_with_a_higher_token() {
    let mut story = Story::new();
    let s = story.open();
    let first = story.token(s, "a");
    let reply = story.handoff(s, "a", "a", Wait::Try);
    let second = Token::new(first.get() + 1);
    assert_eq!(reply, Ok(granted(first, s, "a", second)));
    assert_eq!(story.holder("a"), Some((s, second)));
}

#[test]
fn a_handoff_to_itself_lets_the_waiter_go_first() {
    let mut story = Story::new();
    let s = story.open();
    let w = story.open();
    let first = story.token(s, "a");
    assert!(matches!(
        story.acquire(w, "a", Wait::Forever),
        Ok(Reply::Queued { .. })
    ));
    // As a try: the waiter has the lock now, so the acquire is busy; the release stands.
    let reply = story.handoff(s, "a", "a", Wait::Try);
    assert!(
        matches!(reply, Err(CoreError::Busy { .. })),
        "a try behind the waiter it let in: {reply:?}"
    );
    let waiter_token = Token::new(first.get() + 1);
    assert_eq!(story.holder("a"), Some((w, waiter_token)));

    // As a wait: queued behind the waiter it let in, granted when that one releases.
    let mut story = Story::new();
    let s = story.open();
    let w = story.open();
    let first = story.token(s, "a");
    story.acquire(w, "a", Wait::Forever).unwrap();
    let reply = story.handoff(s, "a", "a", Wait::Forever);
    assert_eq!(
        reply,
        Ok(Reply::ReleasedThenAcquired {
            released: Some(first),
            acquired: Box::new(Reply::Queued {
                lock: "a".to_string(),
                session: s,
                position: 0,
            }),
        })
    );
    assert_eq!(story.holder("a"), Some((w, Token::new(first.get() + 1))));
    let request_id = story.request_id();
    story
        .apply(
            3,
            Command::Release {
                session: w,
                lock: "a".to_string(),
                request_id,
            },
        )
        .result
        .unwrap();
    assert_eq!(story.holder("a"), Some((s, Token::new(first.get() + 2))));
}

#[test]
fn a_handoff_to_the_next_lock_frees_the_first() {
    let mut story = Story::new();
    let s = story.open();
    let first = story.token(s, "a");
    let reply = story.handoff(s, "a", "b", Wait::Try);
    assert_eq!(
        reply,
        Ok(granted(first, s, "b", Token::new(first.get() + 1)))
    );
    assert_eq!(story.holder("a"), None);
    assert_eq!(story.holder("b"), Some((s, Token::new(first.get() + 1))));
}

#[test]
fn a_refused_release_changes_nothing_and_the_acquire_is_not_tried() {
    let mut story = Story::new();
    let s = story.open();
    let other = story.open();
    let held = story.token(other, "a");
    let reply = story.handoff(s, "a", "b", Wait::Try);
    assert!(
        matches!(reply, Err(CoreError::NotHolder { .. })),
        "a release of a lock another session holds: {reply:?}"
    );
    assert_eq!(story.holder("a"), Some((other, held)));
    assert_eq!(story.holder("b"), None, "the acquire was not tried");
    assert_eq!(story.table.lock_count(), 1);
}

#[test]
fn a_busy_acquire_after_the_release_leaves_the_release_standing() {
    let mut story = Story::new();
    let s = story.open();
    let other = story.open();
    story.token(s, "a");
    let held = story.token(other, "b");
    let reply = story.handoff(s, "a", "b", Wait::Try);
    assert!(
        matches!(reply, Err(CoreError::Busy { .. })),
        "a try of a held lock: {reply:?}"
    );
    assert_eq!(story.holder("a"), None, "the release took effect");
    assert_eq!(story.holder("b"), Some((other, held)));
}

#[test]
fn a_retry_answers_the_first_outcome_and_keeps_the_grant_it_took() {
    let mut story = Story::new();
    let s = story.open();
    let first = story.token(s, "a");
    let ids = (story.request_id(), story.request_id());
    let reply = story.handoff_with(s, "a", "a", Wait::Try, ids);
    let second = Token::new(first.get() + 1);
    assert_eq!(reply, Ok(granted(first, s, "a", second)));
    // The same two ids again, as a client retries after a lost answer: the same grant, and the
    // lock still held with it (not released again and granted a third token).
    let retried = story.handoff_with(s, "a", "a", Wait::Try, ids);
    assert_eq!(retried, reply);
    assert_eq!(story.holder("a"), Some((s, second)));
    assert_eq!(story.table.last_token(), second);
}

#[test]
fn one_request_id_for_both_halves_is_refused_before_anything_changes() {
    let mut story = Story::new();
    let s = story.open();
    let first = story.token(s, "a");
    let id = story.request_id();
    let reply = story.handoff_with(s, "a", "a", Wait::Try, (id, id));
    assert_eq!(reply, Err(CoreError::RequestIdConflict { request_id: id }));
    assert_eq!(story.holder("a"), Some((s, first)));
}

#[test]
fn a_retry_after_its_release_was_forgotten_still_keeps_the_grant() {
    let mut story = Story::new();
    let s = story.open();
    let first = story.token(s, "a");
    let ids = (story.request_id(), story.request_id());
    let second = Token::new(first.get() + 1);
    assert_eq!(
        story.handoff_with(s, "a", "a", Wait::Try, ids),
        Ok(granted(first, s, "a", second))
    );
    // Enough later requests that the session forgets the release's id (remembered just before
    // the acquire's) but still remembers the acquire's.
    let later = palisade_core::limits::REQUEST_IDS_PER_SESSION_MAX - 1;
    for i in 0..later {
        story.token(s, &format!("other/{i}"));
    }
    let retried = story.handoff_with(s, "a", "a", Wait::Try, ids);
    assert_eq!(
        retried,
        Ok(Reply::ReleasedThenAcquired {
            released: None,
            acquired: Box::new(Reply::Granted {
                lock: "a".to_string(),
                session: s,
                token: second,
            }),
        }),
        "the acquire's first answer; the release's is forgotten"
    );
    assert_eq!(
        story.holder("a"),
        Some((s, second)),
        "the retry did not release the grant its first attempt took"
    );
}
