//! Scenarios for the Redis fence against a real server (`PALISADE_TEST_REDIS`).

mod common;

use common::{assert_nondecreasing, forged_text, grant, public_key, shuffled, unique};
use palisade_fence::redis::{RedisFence, RedisOp};
use palisade_fence::{FenceError, verify_presented};
use redis::aio::MultiplexedConnection;

fn redis_url() -> Option<String> {
    let url = std::env::var("PALISADE_TEST_REDIS")
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        common::skip("SKIP: PALISADE_TEST_REDIS not set; Redis fence tests did not run");
    }
    url
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A fence and key names no other test run uses.
fn fixture() -> (RedisFence, String) {
    let prefix = unique("paltest");
    (
        RedisFence::new().with_key_prefix(format!("{prefix}:fence:")),
        prefix,
    )
}

async fn cleanup(conn: &mut MultiplexedConnection, keys: &[String]) {
    let _: () = redis::cmd("DEL").arg(keys).query_async(conn).await.unwrap();
}

async fn get(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(conn).await.unwrap()
}

#[tokio::test]
async fn a_superseded_holder_cannot_overwrite_and_learns_the_accepted_token() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let key = format!("{prefix}:value");

    fence
        .write(
            &mut conn,
            "s",
            &grant("report", 4, 1),
            &[RedisOp::set(&key, "by 4")],
        )
        .await
        .unwrap();
    fence
        .write(
            &mut conn,
            "s",
            &grant("report", 9, 2),
            &[RedisOp::set(&key, "by 9")],
        )
        .await
        .unwrap();
    let err = fence
        .write(
            &mut conn,
            "s",
            &grant("report", 4, 1),
            &[RedisOp::del(&key)],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::Stale {
            lock: "report".into(),
            presented: 4,
            accepted: 9,
            holder_session: Some(2)
        }
    );
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some("by 9"));

    // A fresh connection sees the same fence; the current grant may delete.
    let mut fresh = connect(&url).await;
    let state = fence.fence_state(&mut fresh, "s").await.unwrap().unwrap();
    assert_eq!((state.token_max, state.holder_session), (9, 2));
    fence
        .write(
            &mut fresh,
            "s",
            &grant("report", 9, 2),
            &[RedisOp::del(&key)],
        )
        .await
        .unwrap();
    assert_eq!(get(&mut fresh, &key).await, None);
    cleanup(&mut conn, &[fence.fence_key("s")]).await;
}

#[tokio::test]
async fn tokens_compare_as_numbers_up_to_the_largest_token() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, _) = fixture();
    let max = palisade_core::limits::TOKEN_MAX;
    fence
        .write(&mut conn, "s", &grant("big", 99, 1), &[])
        .await
        .unwrap();
    // "100" sorts before "99" as text; as a number it is newer.
    fence
        .write(&mut conn, "s", &grant("big", 100, 1), &[])
        .await
        .unwrap();
    fence
        .write(&mut conn, "s", &grant("big", max - 1, 1), &[])
        .await
        .unwrap();
    let err = fence
        .write(&mut conn, "s", &grant("big", max - 2, 1), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Stale { accepted, .. } if accepted == max - 1));
    fence
        .write(&mut conn, "s", &grant("big", max, 1), &[])
        .await
        .unwrap();
    cleanup(&mut conn, &[fence.fence_key("s")]).await;
}

#[tokio::test]
async fn foreign_locks_and_forgeries_are_refused_and_honest_writers_continue() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let key = format!("{prefix}:value");
    fence
        .write(
            &mut conn,
            "s",
            &grant("report", 5, 1),
            &[RedisOp::set(&key, "5")],
        )
        .await
        .unwrap();

    let err = fence
        .write(
            &mut conn,
            "s",
            &grant("other", 1000, 9),
            &[RedisOp::set(&key, "evil")],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        FenceError::WrongLock {
            expected: "report".into(),
            presented: "other".into()
        }
    );
    let forged = verify_presented(Some(&forged_text("report", 1 << 62)), &public_key());
    assert_eq!(forged.unwrap_err().kind(), "forged");
    let strict = RedisFence::new()
        .with_key_prefix(format!("{prefix}:strict:"))
        .expecting_lock("x");
    let err = strict
        .write(&mut conn, "s", &grant("report", 1, 1), &[])
        .await
        .unwrap_err();
    assert!(err.is_wrong_lock());

    fence
        .write(
            &mut conn,
            "s",
            &grant("report", 6, 2),
            &[RedisOp::set(&key, "6")],
        )
        .await
        .unwrap();
    assert_eq!(get(&mut conn, &key).await.as_deref(), Some("6"));
    cleanup(&mut conn, &[fence.fence_key("s"), key]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_apply_in_token_order_and_the_highest_token_wins() {
    const WRITERS: usize = 8;
    const TOKENS: u64 = 400;
    let Some(url) = redis_url() else { return };
    let (fence, prefix) = fixture();
    let fence = std::sync::Arc::new(fence);
    let (value_key, log_key) = (format!("{prefix}:value"), format!("{prefix}:log"));
    let tokens = shuffled((1..=TOKENS).collect(), 11);

    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let mine: Vec<u64> = tokens
            .iter()
            .copied()
            .skip(writer)
            .step_by(WRITERS)
            .collect();
        let (url, fence) = (url.clone(), fence.clone());
        let (value_key, log_key) = (value_key.clone(), log_key.clone());
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(&url).await;
            for token in mine {
                let ops = [
                    RedisOp::set(&value_key, token.to_string()),
                    RedisOp::rpush(&log_key, token.to_string()),
                ];
                match fence
                    .write(
                        &mut conn,
                        "race",
                        &grant("race", token, writer as u64),
                        &ops,
                    )
                    .await
                {
                    Ok(()) => {}
                    Err(FenceError::Stale {
                        presented,
                        accepted,
                        ..
                    }) => {
                        assert!(presented == token && accepted > token);
                    }
                    Err(other) => panic!("unexpected error {other}"),
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let mut conn = connect(&url).await;
    let log: Vec<u64> = redis::cmd("LRANGE")
        .arg(&log_key)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_nondecreasing(&log);
    assert_eq!(log.last(), Some(&TOKENS));
    assert_eq!(get(&mut conn, &value_key).await, Some(TOKENS.to_string()));
    cleanup(&mut conn, &[fence.fence_key("race"), value_key, log_key]).await;
}

#[tokio::test]
async fn a_write_that_cannot_apply_every_op_applies_none_and_does_not_advance() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let (plain, list) = (format!("{prefix}:plain"), format!("{prefix}:list"));
    let _: () = redis::cmd("SET")
        .arg(&list)
        .arg("not a list")
        .query_async(&mut conn)
        .await
        .unwrap();

    // Phase 1: the SET would succeed, the RPUSH cannot: neither happens, the token stays put.
    let refused = fence
        .write(
            &mut conn,
            "s",
            &grant("report", 5, 1),
            &[RedisOp::set(&plain, "by 5"), RedisOp::rpush(&list, "entry")],
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, FenceError::Storage { .. }), "{refused:?}");
    assert!(
        refused.to_string().contains("nothing was written"),
        "{refused}"
    );
    assert_eq!(
        get(&mut conn, &plain).await,
        None,
        "no op of the refused write applied"
    );
    assert_eq!(
        fence.fence_state(&mut conn, "s").await.unwrap(),
        None,
        "the token did not advance"
    );

    // Phase 2: an older token is still accepted, since nothing was accepted yet.
    fence
        .write(
            &mut conn,
            "s",
            &grant("report", 3, 1),
            &[RedisOp::set(&plain, "by 3")],
        )
        .await
        .unwrap();
    assert_eq!(get(&mut conn, &plain).await.as_deref(), Some("by 3"));
    cleanup(&mut conn, &[plain, list, fence.fence_key("s")]).await;
}
