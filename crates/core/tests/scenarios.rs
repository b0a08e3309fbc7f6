//! Scenario tests of the lock table, written in phases and asserting what a client would see.
//!
//! Each test drives a [`LockTable`] through a short story with explicit times, the way the
//! server would, and checks the replies and events a client would observe.

use palisade_core::{
    Access, Command, CoreError, DurationMs, Event, Limits, LockTable, Mode, Output, ReleaseCause,
    Reply, RequestId, SessionId, TimeMs, Token, Wait, WaitEndCause,
};

const TTL_MS: u64 = 1_000;

mod story;

use story::Story;

/// The steps these scenarios add to the shared [`Story`].
impl Story {
    fn acquire_with(
        &mut self,
        now_ms: u64,
        session: SessionId,
        lock: &str,
        request_id: RequestId,
        wait: Wait,
    ) -> Output {
        self.apply(
            now_ms,
            Command::Acquire {
                session,
                lock: lock.to_string(),
                request_id,
                wait,
                value: None,
                mode: palisade_core::Mode::Exclusive,
            },
        )
    }

    /// Acquires `lock` in `mode` without waiting.
    fn try_mode(&mut self, now_ms: u64, session: SessionId, lock: &str, mode: Mode) -> Output {
        let request_id = self.request_id();
        let command = Command::Acquire {
            session,
            lock: lock.to_string(),
            request_id,
            wait: Wait::Try,
            value: None,
            mode,
        };
        self.apply(now_ms, command)
    }

    fn acquire(&mut self, now_ms: u64, session: SessionId, lock: &str, wait: Wait) -> Output {
        let request_id = self.request_id();
        self.acquire_with(now_ms, session, lock, request_id, wait)
    }

    /// Acquires a free lock and returns its token.
    fn take(&mut self, now_ms: u64, session: SessionId, lock: &str) -> Token {
        match self.acquire(now_ms, session, lock, Wait::Try).result {
            Ok(Reply::Granted { token, .. }) => token,
            other => panic!("acquire of {lock:?} failed: {other:?}"),
        }
    }

    fn release_with(
        &mut self,
        now_ms: u64,
        session: SessionId,
        lock: &str,
        request_id: RequestId,
    ) -> Output {
        self.apply(
            now_ms,
            Command::Release {
                session,
                lock: lock.to_string(),
                request_id,
            },
        )
    }

    fn tick(&mut self, now_ms: u64) -> Output {
        self.apply(now_ms, Command::Tick)
    }

    fn restart(&mut self) {
        let json = serde_json::to_string(&self.table).expect("table serialises");
        let restored: LockTable = serde_json::from_str(&json).expect("table deserialises");
        assert_eq!(
            restored, self.table,
            "snapshot round trip changed the table"
        );
        self.table = restored;
    }
}

fn granted_events(events: &[Event]) -> Vec<(SessionId, Token)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Granted { session, token, .. } => Some((*session, *token)),
            _ => None,
        })
        .collect()
}

fn holder(story: &Story, lock: &str) -> Option<(SessionId, Token)> {
    story
        .table
        .lock_status(lock)
        .and_then(|s| s.holder)
        .map(|g| (g.session, g.token))
}

#[test]
fn a_waiter_whose_session_expires_is_never_granted() {
    let mut story = Story::new();

    // Phase 1: a holds the lock, b queues behind it; b's lease is shorter than a's.
    let a = story.open_at(0, 3 * TTL_MS);
    let b = story.open_at(0, TTL_MS);
    let c = story.open_at(0, 10 * TTL_MS);
    let token_a = story.take(0, a, "jobs/nightly");
    let queued = story
        .acquire_with(0, b, "jobs/nightly", RequestId::new(60), Wait::Forever)
        .result;
    assert!(matches!(queued, Ok(Reply::Queued { position: 0, .. })));
    let queued = story.acquire(0, c, "jobs/nightly", Wait::Forever).result;
    assert!(matches!(queued, Ok(Reply::Queued { position: 1, .. })));

    // Phase 2: b's lease ends while it waits; its wait ends, nothing is granted.
    let out = story.tick(TTL_MS);
    assert!(out.events.contains(&Event::WaitEnded {
        lock: "jobs/nightly".into(),
        session: b,
        request_id: RequestId::new(60),
        cause: WaitEndCause::SessionEnded,
    }));
    assert!(granted_events(&out.events).is_empty());
    assert_eq!(holder(&story, "jobs/nightly"), Some((a, token_a)));

    // Phase 3: a releases; the grant skips b and goes to c.
    let request_id = story.request_id();
    let out = story.release_with(TTL_MS + 1, a, "jobs/nightly", request_id);
    let grants = granted_events(&out.events);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].0, c);
    assert!(grants[0].1 > token_a);
}

#[test]
fn a_waiter_that_expires_in_the_same_instant_as_the_holder_is_never_granted() {
    // The server may apply no input for a while (a pause, a change of leader); when time jumps
    // past both the holder's and the waiter's lease, the waiter must not get the lock (etcd#11456).
    let mut story = Story::new();

    // Phase 1: a holds, b waits, c waits behind b; a expires first, then b, c lives on.
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, 2 * TTL_MS);
    let c = story.open_at(0, 10 * TTL_MS);
    let token_a = story.take(0, a, "l");
    story.acquire(0, b, "l", Wait::Forever);
    story.acquire(0, c, "l", Wait::Forever);

    // Phase 2: time jumps past both leases in one input.
    let out = story.tick(3 * TTL_MS);

    // Then: b is never granted; c, still alive, gets the lock with a newer token.
    let grants = granted_events(&out.events);
    assert!(
        grants.iter().all(|(s, _)| *s != b),
        "expired waiter was granted: {:?}",
        out.events
    );
    assert_eq!(grants.len(), 1, "{:?}", out.events);
    assert_eq!(grants[0].0, c);
    assert!(grants[0].1 > token_a);
    assert_eq!(holder(&story, "l"), Some(grants[0]));
}

#[test]
fn a_waiter_past_its_deadline_is_not_granted_when_time_jumps() {
    let mut story = Story::new();

    // Phase 1: a holds with a long lease; b waits for at most 100 ms; c waits for ever.
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, 10 * TTL_MS);
    let c = story.open_at(0, 10 * TTL_MS);
    story.take(0, a, "l");
    story.acquire(0, b, "l", Wait::ForMs(DurationMs::from_millis(100)));
    story.acquire(0, c, "l", Wait::Forever);

    // Phase 2: time jumps past b's deadline and then past a's lease.
    let out = story.tick(5 * TTL_MS);

    // Then: b's wait timed out, c holds the lock.
    assert!(out.events.iter().any(|e| matches!(
        e,
        Event::WaitEnded { session, cause: WaitEndCause::TimedOut, .. } if *session == b
    )));
    let grants = granted_events(&out.events);
    assert_eq!(grants.len(), 1, "{:?}", out.events);
    assert_eq!(grants[0].0, c);
}

#[test]
fn tokens_keep_growing_after_a_lock_is_forgotten_and_re_created() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, TTL_MS);

    // Phase 1: a takes and releases the lock; nobody waits, so the table forgets it.
    let first = story.take(0, a, "orders");
    let request_id = story.request_id();
    story.release_with(1, a, "orders", request_id);
    assert_eq!(story.table.lock_status("orders"), None);
    assert_eq!(story.table.lock_count(), 0);

    // Phase 2: another lock is used in between.
    story.take(2, b, "invoices");

    // Phase 3: the lock is created again; its token is above the forgotten one.
    let second = story.take(3, a, "orders");
    assert!(second > first, "{second} is not above {first}");
}

#[test]
fn a_retried_release_does_not_release_the_next_grant() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);

    // Phase 1: a takes the lock and releases it with request id 100.
    let first = story.take(0, a, "l");
    let released = story.release_with(1, a, "l", RequestId::new(100)).result;
    assert_eq!(
        released,
        Ok(Reply::Released {
            lock: "l".into(),
            session: a,
            token: Some(first),
        })
    );

    // Phase 2: a takes the lock again.
    let second = story.take(2, a, "l");
    assert!(second > first);

    // Phase 3: the release is retried (its reply was lost); it returns the first outcome.
    let retried = story.release_with(3, a, "l", RequestId::new(100));
    assert_eq!(retried.result, released);
    assert!(retried.events.is_empty());
    assert_eq!(holder(&story, "l"), Some((a, second)));
}

#[test]
fn a_retried_acquire_sees_the_grant_it_queued_for() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, TTL_MS);

    // Phase 1: a holds, b queues with request id 7.
    story.take(0, a, "l");
    let queued = story
        .acquire_with(0, b, "l", RequestId::new(7), Wait::Forever)
        .result;
    assert!(matches!(queued, Ok(Reply::Queued { .. })));

    // Phase 2: a releases; b is granted from the queue.
    let request_id = story.request_id();
    let out = story.release_with(1, a, "l", request_id);
    let grants = granted_events(&out.events);
    assert_eq!(grants.len(), 1);
    let (_, token_b) = grants[0];

    // Phase 3: b retries request 7 and sees the grant, not the stale "queued".
    let retried = story.acquire_with(2, b, "l", RequestId::new(7), Wait::Forever);
    assert_eq!(
        retried.result,
        Ok(Reply::Granted {
            lock: "l".into(),
            session: b,
            token: token_b,
        })
    );
    assert!(retried.events.is_empty());

    // And a re-acquire by the holder with a new request id returns the same token.
    let again = story.acquire(3, b, "l", Wait::Try).result;
    assert!(matches!(again, Ok(Reply::Granted { token, .. }) if token == token_b));
}

#[test]
fn lock_delay_holds_the_lock_after_the_holder_expires_but_not_after_a_clean_release() {
    let lock_delay_ms = 500;
    let mut story = Story::with_limits(Limits {
        lock_delay_ms: DurationMs::from_millis(lock_delay_ms),
        ..Limits::default()
    });

    // Phase 1: a holds "x" and lets its lease run out; b waits.
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, 100 * TTL_MS);
    let c = story.open_at(0, 100 * TTL_MS);
    let token_a = story.take(0, a, "x");
    story.acquire(0, b, "x", Wait::Forever);
    let out = story.tick(TTL_MS);
    assert!(out.events.contains(&Event::Released {
        lock: "x".into(),
        session: a,
        token: token_a,
        cause: ReleaseCause::SessionExpired,
    }));
    assert!(granted_events(&out.events).is_empty());

    // Phase 2: during the lock-delay nobody gets it, not even with a fresh try.
    let busy = story
        .acquire(TTL_MS + lock_delay_ms - 1, c, "x", Wait::Try)
        .result;
    assert!(matches!(
        busy,
        Err(CoreError::Busy { holder_session: None, available_at_ms: Some(at), .. })
            if at == TimeMs::from_millis(TTL_MS + lock_delay_ms)
    ));

    // Phase 3: when the delay ends, the waiter is granted.
    let out = story.tick(TTL_MS + lock_delay_ms);
    let grants = granted_events(&out.events);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].0, b);
    assert!(grants[0].1 > token_a);

    // Phase 4: a clean release hands the lock over at once.
    let now = TTL_MS + lock_delay_ms + 1;
    story.acquire(now, c, "x", Wait::Forever);
    let request_id = story.request_id();
    let out = story.release_with(now, b, "x", request_id);
    let grants = granted_events(&out.events);
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].0, c);

    // Phase 5: closing a session is also clean: no delay.
    let d = story.open_at(now, TTL_MS);
    story.acquire(now, d, "x", Wait::Forever);
    let out = story.apply(now, Command::CloseSession { session: c });
    assert_eq!(granted_events(&out.events).first().map(|g| g.0), Some(d));
}

#[test]
fn restart_modelled_as_snapshot_and_restore_keeps_tokens_growing() {
    let mut story = Story::new();
    let a = story.open_at(0, 10 * TTL_MS);
    let b = story.open_at(0, 10 * TTL_MS);

    // Phase 1: some grants, the lock forgotten after the last release.
    let t1 = story.take(0, a, "l");
    let request_id = story.request_id();
    story.release_with(1, a, "l", request_id);
    let t2 = story.take(2, b, "other");
    assert!(t2 > t1);

    // Phase 2: the server restarts from a snapshot, then a new leader starts.
    story.restart();
    story.apply(3, Command::LeaderStart);

    // Phase 3: the forgotten lock gets a token above every earlier one.
    let t3 = story.take(4, a, "l");
    assert!(t3 > t2 && t3 > t1);
    assert_eq!(story.table.last_token(), t3);
}

#[test]
fn leader_start_extends_every_lease_and_never_shortens_one() {
    let mut story = Story::new();

    // Phase 1: two sessions with different TTLs, one renewed late.
    let short = story.open_at(0, TTL_MS);
    let long = story.open_at(0, 5 * TTL_MS);
    story.apply(900, Command::KeepAlive { session: short });

    // Phase 2: a new leader starts at 1_500.
    let out = story.apply(1_500, Command::LeaderStart);
    assert_eq!(
        out.result,
        Ok(Reply::LeaderStarted {
            sessions_extended: 2
        })
    );

    // Then: every lease runs a full TTL from the leader's start.
    let expiry = |story: &Story, s| {
        let status = story.table.session_status(s).unwrap();
        status.expires_at_ms.as_millis()
    };
    assert_eq!(expiry(&story, short), 1_500 + TTL_MS);
    assert_eq!(expiry(&story, long), 1_500 + 5 * TTL_MS);

    // Phase 3: a leader start soon after extends the short lease but never shortens the long one.
    story.apply(1_600, Command::LeaderStart);
    assert_eq!(expiry(&story, short), 1_600 + TTL_MS);
    assert_eq!(expiry(&story, long), 1_600 + 5 * TTL_MS);
    story.apply(1_600, Command::LeaderStart);
    assert_eq!(expiry(&story, long), 1_600 + 5 * TTL_MS);
}

#[test]
fn at_the_token_limit_grants_are_refused_never_wrapped() {
    let mut story = Story::with_limits(Limits {
        token_max: Token::new(3),
        ..Limits::default()
    });
    let a = story.open_at(0, TTL_MS);

    // Phase 1: use up every token.
    let tokens: Vec<Token> = (0..3)
        .map(|i| {
            let lock = format!("l{i}");
            story.take(0, a, &lock)
        })
        .collect();
    assert_eq!(tokens, [1, 2, 3].map(Token::new));

    // Phase 2: the next grant is refused, and the lock is not left behind.
    let refused = story.acquire(0, a, "l9", Wait::Try).result;
    assert_eq!(
        refused,
        Err(CoreError::TokensExhausted { lock: "l9".into() })
    );
    assert_eq!(story.table.lock_status("l9"), None);

    // A holder re-acquiring still sees its own token.
    let again = story.acquire(0, a, "l2", Wait::Try).result;
    assert!(matches!(again, Ok(Reply::Granted { token, .. }) if token == Token::new(3)));
}

#[test]
fn a_repeated_acquire_while_queued_sees_how_the_wait_ended() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);
    let b = story.open_at(0, 10 * TTL_MS);

    // Phase 1: a holds; b queues (request 7), then repeats its acquire with request 8.
    story.take(0, a, "l");
    story.acquire_with(0, b, "l", RequestId::new(7), Wait::Forever);
    let repeated = story
        .acquire_with(0, b, "l", RequestId::new(8), Wait::Forever)
        .result;
    assert!(matches!(repeated, Ok(Reply::Queued { position: 0, .. })));

    // Phase 2: a releases; b is granted from the queue.
    let out = story.release_with(1, a, "l", RequestId::new(100));
    let (_, token_b) = granted_events(&out.events)[0];

    // Then: retrying either request answers the grant, not a stale "queued".
    let granted = Ok(Reply::Granted {
        lock: "l".into(),
        session: b,
        token: token_b,
    });
    assert_eq!(
        story
            .acquire_with(2, b, "l", RequestId::new(7), Wait::Forever)
            .result,
        granted
    );
    assert_eq!(
        story
            .acquire_with(2, b, "l", RequestId::new(8), Wait::Forever)
            .result,
        granted
    );
}

#[test]
fn a_freed_lock_still_reports_its_last_token_and_its_next_grant_is_higher() {
    let mut story = Story::new();
    let session = story.open_at(0, TTL_MS);

    // Phase 1: a grant and a clean release; the lock is free and forgotten by the table.
    let first = story.take(10, session, "jobs/a");
    story.release_with(20, session, "jobs/a", RequestId::new(500));
    assert_eq!(
        story.table.lock_status("jobs/a"),
        None,
        "a free lock is not kept"
    );
    assert_eq!(
        story.table.last_token_of("jobs/a"),
        Some(first),
        "but its last token is"
    );
    assert_eq!(story.table.last_token_of("never/used"), None);

    // Phase 2: the memory survives a restart and gives way to the next grant's token.
    story.restart();
    assert_eq!(story.table.last_token_of("jobs/a"), Some(first));
    let second = story.take(30, session, "jobs/a");
    assert!(second > first);
    assert_eq!(story.table.last_token_of("jobs/a"), Some(second));
}

#[test]
fn a_raised_token_floor_places_the_next_grant_above_it_and_never_lowers_the_counter() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);
    let before = story.take(1, a, "jobs/a");
    assert_eq!(
        story
            .apply(
                2,
                Command::RaiseTokenFloor {
                    floor: Token::new(1_000),
                    session_floor: None,
                }
            )
            .result,
        Ok(Reply::TokenFloorRaised {
            last_token: Token::new(1_000)
        })
    );
    let after = story.take(3, a, "jobs/b");
    assert!(after > Token::new(1_000), "{after:?} after a floor of 1000");
    // A lower floor (another node's older cut, say) changes nothing.
    assert_eq!(
        story
            .apply(
                4,
                Command::RaiseTokenFloor {
                    floor: before,
                    session_floor: None
                }
            )
            .result,
        Ok(Reply::TokenFloorRaised { last_token: after })
    );
    assert!(story.take(5, a, "jobs/c") > after);
}

/// A floor with a session floor raises the session counter too (a recovery of the counters):
/// the next session opened is above it, and a lower one changes nothing.
#[test]
fn a_raised_session_floor_places_the_next_session_above_it_and_never_lowers_the_counter() {
    let mut story = Story::new();
    let a = story.open_at(0, TTL_MS);
    let raise = |story: &mut Story, now, session| {
        story.apply(
            now,
            Command::RaiseTokenFloor {
                floor: Token::new(1),
                session_floor: Some(SessionId::new(session)),
            },
        )
    };
    assert!(raise(&mut story, 1, 500).result.is_ok());
    let b = story.open_at(2, TTL_MS);
    assert!(
        b > SessionId::new(500) && b > a,
        "{b:?} after a session floor of 500"
    );
    assert!(raise(&mut story, 3, 7).result.is_ok());
    let c = story.open_at(4, TTL_MS);
    assert!(c > b, "{c:?} after {b:?}");
}

/// A leader election's story: each candidate brings its address to its acquire, a waiter's
/// address becomes visible only when it is granted, only the holding may replace its value, and
/// nothing of a former holder's value outlives its grant, across a restart too.
#[test]
fn a_grant_carries_its_holders_value_and_only_the_holding_replaces_it() {
    use palisade_core::GrantValue;
    let value = |v: &str| Some(GrantValue::new(v).expect("a valid value"));
    let mut story = Story::new();
    let a = story.open_at(0, 10_000);
    let b = story.open_at(0, 10_000);
    let campaign = |story: &mut Story, session, address: &str| {
        let request_id = story.request_id();
        story.apply(
            10,
            Command::Acquire {
                session,
                lock: "election/db".into(),
                request_id,
                wait: Wait::Forever,
                value: value(address),
                mode: palisade_core::Mode::Exclusive,
            },
        )
    };
    let token_a = match campaign(&mut story, a, "10.0.0.1:5432").result {
        Ok(Reply::Granted { token, .. }) => token,
        other => panic!("a is not granted: {other:?}"),
    };
    assert!(matches!(
        campaign(&mut story, b, "10.0.0.2:5432").result,
        Ok(Reply::Queued { .. })
    ));
    let holder_value = |story: &Story| story.table.holder("election/db").and_then(|g| g.value);
    assert_eq!(holder_value(&story), value("10.0.0.1:5432"));

    // Another session, or the holder with a token that is not its holding's, changes nothing.
    let set = |story: &mut Story, session, token, v: &str| {
        story.apply(
            20,
            Command::SetValue {
                session,
                lock: "election/db".into(),
                token,
                value: value(v),
            },
        )
    };
    let refused = set(&mut story, b, token_a, "10.0.0.2:5432");
    assert!(matches!(refused.result, Err(CoreError::NotHolder { .. })));
    assert!(refused.events.is_empty());
    let stale = set(&mut story, a, Token::new(token_a.get() - 1), "x");
    assert!(matches!(stale.result, Err(CoreError::NotHolder { .. })));
    assert_eq!(holder_value(&story), value("10.0.0.1:5432"));

    // The holding proclaims a new value; watchers hear of it.
    let proclaimed = set(&mut story, a, token_a, "10.0.0.1:6432");
    assert_eq!(
        proclaimed.events,
        vec![Event::ValueSet {
            lock: "election/db".into(),
            session: a,
            token: token_a,
            value: value("10.0.0.1:6432"),
        }]
    );
    story.restart();
    assert_eq!(holder_value(&story), value("10.0.0.1:6432"));

    // A resigns: b is granted with the value it queued with, not a's.
    let request_id = story.request_id();
    let released = story.release_with(30, a, "election/db", request_id);
    let granted_b = released.events.iter().find_map(|e| match e {
        Event::Granted { session, value, .. } if *session == b => Some(value.clone()),
        _ => None,
    });
    assert_eq!(granted_b, Some(value("10.0.0.2:5432")));
    assert_eq!(holder_value(&story), value("10.0.0.2:5432"));
}

#[test]
fn a_value_is_refused_when_empty_too_long_or_with_a_control_character() {
    use palisade_core::GrantValue;
    use palisade_core::limits::{GRANT_VALUE_BYTES_MAX, GrantValueError};
    assert_eq!(GrantValue::new(""), Err(GrantValueError::Empty));
    assert_eq!(
        GrantValue::new("é".repeat(GRANT_VALUE_BYTES_MAX / 2 + 1)),
        Err(GrantValueError::TooLong {
            bytes: (GRANT_VALUE_BYTES_MAX + 2) as u64,
            bytes_max: GRANT_VALUE_BYTES_MAX as u64,
        })
    );
    assert_eq!(
        GrantValue::new("a\u{1b}[2J"),
        Err(GrantValueError::ControlCharacter)
    );
    assert!(GrantValue::new("x".repeat(GRANT_VALUE_BYTES_MAX)).is_ok());
    // Nor can a stored form smuggle one in.
    assert!(serde_json::from_str::<GrantValue>("\"a\\u0007\"").is_err());
    assert_eq!(GrantValue::from_wire(""), Ok(None));
}

/// Two holders of one name expire at different times (two permits of a semaphore; two readers
/// likewise): the lock-delay the second expiry starts must run to its own end. The table kept
/// the first expiry's deadline too, and when it came it ended the lock-delay early, 1 ms past
/// the first delay, while the second had 250 ms left. Found by the reference model
/// (tests/model.rs) once it drove permits.
#[test]
fn a_later_expiry_keeps_its_whole_lock_delay_when_an_earlier_one_ends() {
    let mut story = Story::with_limits(Limits {
        lock_delay_ms: DurationMs::from_millis(500),
        ..Limits::default()
    });
    let early = story.open_at(0, TTL_MS);
    let late = story.open_at(250, TTL_MS);
    for (at, session) in [(250, early), (250, late)] {
        let output = story.try_mode(at, session, "pool", Mode::Permit(3));
        assert!(
            matches!(output.result, Ok(Reply::GrantedAs { .. })),
            "{output:?}"
        );
    }
    // `early` expires at 1000 (delay to 1500), `late` at 1250 (delay to 1750).
    story.tick(1_000);
    story.tick(1_250);
    let status = story
        .table
        .lock_status("pool")
        .expect("the semaphore is in lock-delay");
    assert_eq!(status.available_at_ms, Some(TimeMs::from_millis(1_750)));
    story.tick(1_501);
    let newcomer = story.open_at(1_501, TTL_MS);
    let output = story.try_mode(1_501, newcomer, "pool", Mode::Permit(3));
    assert!(
        matches!(
            output.result,
            Err(CoreError::Busy { available_at_ms: Some(at), .. }) if at == TimeMs::from_millis(1_750)
        ),
        "granted in the lock-delay of the later expiry: {output:?}"
    );
    let output = story.try_mode(1_750, newcomer, "pool", Mode::Permit(3));
    let granted = output.result.as_ref().ok().and_then(Reply::grant);
    assert_eq!(
        granted.map(|g| g.3),
        Some(Access::Slot(0)),
        "granted when the delay ended: {output:?}"
    );
}

/// A reader joining an open phase takes the phase's token and draws none, so it is admitted
/// when the counter is at its limit; only a grant that draws a token (a new phase, a writer, a
/// permit) is refused. The table refused the join with `TokensExhausted`. Found by the
/// reference model (tests/model.rs) once it drove shared acquires.
#[test]
fn a_reader_joins_an_open_phase_when_the_tokens_are_used_up() {
    let mut story = Story::with_limits(Limits {
        token_max: Token::new(8),
        ..Limits::default()
    });
    let first = story.open_at(0, TTL_MS);
    let second = story.open_at(0, TTL_MS);
    let phase = story.try_mode(0, first, "doc", Mode::Shared);
    assert!(matches!(phase.result, Ok(Reply::GrantedAs { token, .. }) if token == Token::new(1)));
    story.apply(
        0,
        Command::RaiseTokenFloor {
            floor: Token::new(8),
            session_floor: None,
        },
    );
    let joined = story.try_mode(1, second, "doc", Mode::Shared);
    assert!(
        matches!(joined.result, Ok(Reply::GrantedAs { token, access: Access::Shared, .. }) if token == Token::new(1)),
        "{joined:?}"
    );
    let writer = story.open_at(2, TTL_MS);
    let refused = story.acquire(2, writer, "other", Wait::Try);
    assert!(
        matches!(refused.result, Err(CoreError::TokensExhausted { .. })),
        "{refused:?}"
    );
}
