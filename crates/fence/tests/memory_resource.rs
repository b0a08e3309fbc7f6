//! Scenarios for the in-memory fenced resource, including writers racing with interleaved
//! tokens.

mod common;

use std::sync::Arc;

use common::{assert_nondecreasing, forged_text, grant, public_keys, reissued, shuffled};
use palisade_core::{SessionId, Token};
use palisade_fence::{FenceError, MemoryResource, verify_presented};

#[test]
fn a_holder_paused_past_its_lease_cannot_overwrite_the_next_holders_data() {
    let resource = MemoryResource::new(String::new());
    let paused = grant("report", 1, 10);
    let next_holder = grant("report", 2, 11);

    resource
        .write(&paused, |value| *value = "draft by 1".into())
        .unwrap();
    resource
        .write(&next_holder, |value| *value = "final by 2".into())
        .unwrap();

    // The first holder wakes up and writes with its old grant.
    let err = resource
        .write(&paused, |value| *value = "late write by 1".into())
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "report".into(),
            presented: Token::new(1),
            accepted: Token::new(2),
            holder_session: Some(SessionId::new(11))
        }
    );
    assert_eq!(resource.read(|value| value.clone()).unwrap(), "final by 2");
}

#[test]
fn a_token_issued_twice_is_refused_from_the_second_session_and_the_first_writes_on() {
    let resource = MemoryResource::new(String::new());
    resource
        .write(&grant("report", 7, 1), |value| {
            *value = "by session 1".into()
        })
        .unwrap();
    let before = resource.fence_state().unwrap();

    // A restored lock service grants token 7 again, to session 2: validly signed, refused.
    let err = resource
        .write(&grant("report", 7, 2), |value| {
            *value = "by session 2".into()
        })
        .unwrap_err();
    assert_eq!(err, reissued("report", 7, 1, 2));
    assert_eq!(resource.fence_state().unwrap(), before);
    assert_eq!(
        resource.read(|value| value.clone()).unwrap(),
        "by session 1"
    );

    // The session that presented token 7 first still writes with it.
    resource
        .write(&grant("report", 7, 1), |value| *value = "again by 1".into())
        .unwrap();
    assert_eq!(resource.read(|value| value.clone()).unwrap(), "again by 1");
    assert_eq!(resource.fence_state().unwrap(), before);
}

#[test]
fn a_resource_bound_to_a_lock_refuses_other_locks_from_the_first_write() {
    let resource = MemoryResource::bound_to("report", 0u64);
    let err = resource
        .write(&grant("other", 1, 1), |value| *value = 1)
        .unwrap_err();
    assert!(err.is_wrong_lock());
    assert_eq!(resource.fence_state().unwrap(), None);
    resource
        .write(&grant("report", 1, 1), |value| *value = 2)
        .unwrap();
    assert_eq!(resource.read(|value| *value).unwrap(), 2);
}

#[test]
fn a_forged_huge_token_cannot_lock_honest_writers_out() {
    let resource = MemoryResource::new(0u64);
    resource
        .write(&grant("report", 5, 1), |value| *value = 5)
        .unwrap();

    let forged = forged_text("report", 1 << 62);
    let err = verify_presented(Some(&forged), &public_keys()).unwrap_err();
    assert_eq!(err.kind(), "forged");

    // The forgery never reached the resource: the honest next grant still writes.
    resource
        .write(&grant("report", 6, 2), |value| *value = 6)
        .unwrap();
    assert_eq!(
        resource.fence_state().unwrap().unwrap().token_max,
        Token::new(6)
    );
}

#[test]
fn racing_writers_apply_tokens_in_nondecreasing_order_and_the_highest_wins() {
    const WRITERS: usize = 8;
    const TOKENS: u64 = 400;
    let resource = Arc::new(MemoryResource::new((0u64, Vec::<u64>::new())));
    let tokens = shuffled((1..=TOKENS).collect(), 0x5eed);

    let handles: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let resource = Arc::clone(&resource);
            let mine: Vec<u64> = tokens
                .iter()
                .copied()
                .skip(writer)
                .step_by(WRITERS)
                .collect();
            std::thread::spawn(move || {
                let mut stale = 0;
                for token in mine {
                    let sequencer = grant("counter", token, writer as u64);
                    match resource.write(&sequencer, |(value, applied)| {
                        *value = token;
                        applied.push(token);
                    }) {
                        Ok(()) => {}
                        Err(FenceError::Stale {
                            presented,
                            accepted,
                            ..
                        }) => {
                            assert_eq!(presented, Token::new(token));
                            assert!(accepted > Token::new(token));
                            stale += 1;
                        }
                        Err(other) => panic!("unexpected error {other}"),
                    }
                }
                stale
            })
        })
        .collect();
    let stale: usize = handles
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum();

    let (value, applied) = resource.read(|state| state.clone()).unwrap();
    assert_nondecreasing(&applied);
    assert_eq!(
        value, TOKENS,
        "the highest token's write must be the final value"
    );
    assert_eq!(applied.len() + stale, TOKENS as usize);
    assert_eq!(
        resource.fence_state().unwrap().unwrap().token_max,
        Token::new(TOKENS)
    );
}
