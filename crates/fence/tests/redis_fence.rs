//! The Redis fence against a real server (`PALISADE_TEST_REDIS`): the conformance suite, and
//! what only a script-based fence has: tokens compared as decimal strings, ops validated before
//! the first write, fence keys out of reach of ops, fenced read-modify-writes and
//! compare-and-set, a lost answer, and a user that may not write the fence.

mod common;

use common::{grant, unique};
use palisade_core::Token;
use palisade_fence::redis::{
    REDIS_OPS_MAX, RedisCondition, RedisFence, RedisOp, RedisOutcome, RedisReply,
};
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState};
use palisade_sequencer::VerifiedSequencer;
use redis::aio::MultiplexedConnection;

fn redis_url() -> Option<String> {
    common::server("PALISADE_TEST_REDIS", "the Redis fence tests")
}

/// One scope and its keys (`<prefix>:value`, a string, and `<prefix>:log`, a list), through
/// one connection.
struct Redis {
    url: String,
    prefix: String,
    fence: RedisFence,
    conn: MultiplexedConnection,
}

const SCOPE: &str = "s";

impl Redis {
    async fn fresh(url: String) -> Redis {
        let (fence, prefix) = fixture();
        Redis {
            conn: connect(&url).await,
            url,
            prefix,
            fence,
        }
    }

    fn keys(&self) -> (String, String) {
        (
            format!("{}:value", self.prefix),
            format!("{}:log", self.prefix),
        )
    }

    async fn apply(
        &self,
        sequencer: &VerifiedSequencer,
        value: RedisOp,
    ) -> Result<Vec<RedisReply>, FenceError> {
        let (_, log) = self.keys();
        let ops = [value, RedisOp::rpush(log, sequencer.token().to_string())];
        let mut conn = self.conn.clone();
        self.fence.write(&mut conn, SCOPE, sequencer, &ops).await
    }
}

impl FenceHarness for Redis {
    async fn connect_another(&self) -> Self {
        Redis {
            url: self.url.clone(),
            prefix: self.prefix.clone(),
            fence: RedisFence::new().with_key_prefix(format!("{}:fence:", self.prefix)),
            conn: connect(&self.url).await,
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        let mut conn = self.conn.clone();
        let no_keys: [&str; 0] = [];
        self.fence
            .read(&mut conn, SCOPE, sequencer, &no_keys)
            .await
            .map(drop)
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        let (key, _) = self.keys();
        self.apply(sequencer, RedisOp::set(key, value.to_string()))
            .await
            .map(drop)
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        let (key, _) = self.keys();
        let replies = self.apply(sequencer, RedisOp::incr_by(key, 1)).await?;
        Ok(replies[0].integer().expect("INCRBY replies an integer"))
    }

    /// Redis has no rollback: the script refuses a request that cannot apply in full before its
    /// first write (here an `INCRBY` of the log, a list), and that is the step rolled back.
    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        let (key, log) = self.keys();
        let ops = [
            RedisOp::set(key, value.to_string()),
            RedisOp::rpush(&log, sequencer.token().to_string()),
            RedisOp::incr_by(log, 1),
        ];
        let mut conn = self.conn.clone();
        Ok(
            match self.fence.write(&mut conn, SCOPE, sequencer, &ops).await {
                Err(FenceError::InvalidRequest { .. }) => Ok(()),
                Ok(replies) => panic!("an INCRBY of a list was applied: {replies:?}"),
                Err(refused) => Err(refused),
            },
        )
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        *self = self.connect_another().await;
        Ok(())
    }

    async fn read(&self) -> Data {
        let (key, log) = self.keys();
        let mut conn = self.conn.clone();
        let value = get(&mut conn, &key)
            .await
            .map_or(0, |value| value.parse().unwrap());
        let log: Vec<u64> = redis::cmd("LRANGE")
            .arg(log)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        Data { value, log }
    }

    async fn state(&self) -> Option<FenceState> {
        let mut conn = self.conn.clone();
        self.fence.fence_state(&mut conn, SCOPE).await.unwrap()
    }

    async fn clean_up(mut self) {
        let (key, log) = self.keys();
        cleanup(&mut self.conn, &[key, log, self.fence.fence_key(SCOPE)]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passes_the_fence_conformance_suite() {
    let Some(url) = redis_url() else { return };
    testing::run_all(|| Redis::fresh(url.clone())).await;
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
async fn tokens_compare_as_numbers_up_to_the_largest_token() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, _) = fixture();
    let max = palisade_core::limits::TOKEN_MAX.get();
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
    assert!(matches!(err, FenceError::Stale { accepted, .. } if accepted == Token::new(max - 1)));
    fence
        .write(&mut conn, "s", &grant("big", max, 1), &[])
        .await
        .unwrap();
    cleanup(&mut conn, &[fence.fence_key("s")]).await;
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
    assert!(
        matches!(refused, FenceError::InvalidRequest { .. }) && refused.is_final(),
        "{refused:?}"
    );
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

async fn set(conn: &mut MultiplexedConnection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_batch_that_sets_a_key_and_then_pushes_to_it_is_refused_before_its_first_write() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let key = format!("{prefix}:k");

    // The key does not exist, so RPUSH alone would apply; after the SET it holds a string.
    let refused = fence
        .write(
            &mut conn,
            "s",
            &grant("report", 5, 1),
            &[RedisOp::set(&key, "v"), RedisOp::rpush(&key, "entry")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, FenceError::InvalidRequest { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("op 1"), "{refused}");
    assert_eq!(get(&mut conn, &key).await, None, "the SET was not applied");
    assert_eq!(fence.fence_state(&mut conn, "s").await.unwrap(), None);

    // The types follow the ops both ways: a DEL makes a string key free for RPUSH.
    set(&mut conn, &key, "a string").await;
    let replies = fence
        .write(
            &mut conn,
            "s",
            &grant("report", 5, 1),
            &[RedisOp::del(&key), RedisOp::rpush(&key, "entry")],
        )
        .await
        .unwrap();
    assert_eq!(
        replies,
        vec![RedisReply::Integer(1), RedisReply::Integer(1)]
    );
    cleanup(&mut conn, &[key, fence.fence_key("s")]).await;
}

#[tokio::test]
async fn no_op_may_touch_a_fence_key_so_another_scopes_fence_cannot_be_reset() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, _) = fixture();
    fence
        .write(&mut conn, "b", &grant("jobs/b", 9, 2), &[])
        .await
        .unwrap();

    // The holder of scope "a" tries to reset scope "b"'s fence, in every way an op allows.
    let other_fence = fence.fence_key("b");
    for op in [
        RedisOp::del(&other_fence),
        RedisOp::set(&other_fence, "x"),
        RedisOp::rpush(&other_fence, "x"),
        RedisOp::incr_by(&other_fence, 1),
        RedisOp::get(fence.fence_key("a")),
    ] {
        let refused = fence
            .write(
                &mut conn,
                "a",
                &grant("jobs/a", 1, 1),
                std::slice::from_ref(&op),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(refused, FenceError::InvalidRequest { .. }),
            "{op:?}: {refused:?}"
        );
    }
    let refused = fence
        .write_if(
            &mut conn,
            "a",
            &grant("jobs/a", 1, 1),
            &[RedisCondition::absent(&other_fence)],
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(refused, FenceError::InvalidRequest { .. }));

    // Scope "b" still refuses its superseded holder; scope "a" was never claimed.
    let stale = fence
        .write(&mut conn, "b", &grant("jobs/b", 3, 1), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(stale, FenceError::Stale { accepted, .. } if accepted == Token::new(9)),
        "{stale:?}"
    );
    assert_eq!(fence.fence_state(&mut conn, "a").await.unwrap(), None);
    cleanup(&mut conn, &[fence.fence_key("a"), other_fence]).await;
}

#[tokio::test]
async fn a_fence_hash_that_is_not_canonical_is_reported_corrupt_without_panicking() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let key = format!("{prefix}:value");
    let hset = |scope: &str, fields: &[(&str, &str)]| {
        let mut command = redis::cmd("HSET");
        command.arg(fence.fence_key(scope));
        for (field, value) in fields {
            command.arg(*field).arg(*value);
        }
        command
    };

    // "007" sorts as a longer, so larger, number than "10": it must not be parsed as 7.
    let _: () = hset(
        "padded",
        &[("lock", "report"), ("token", "007"), ("session", "1")],
    )
    .query_async(&mut conn)
    .await
    .unwrap();
    let err = fence
        .write(
            &mut conn,
            "padded",
            &grant("report", 10, 2),
            &[RedisOp::set(&key, "by 10")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FenceError::Corrupt { scope, .. } if scope == "padded"),
        "{err:?}"
    );
    assert!(matches!(
        fence.fence_state(&mut conn, "padded").await,
        Err(FenceError::Corrupt { .. })
    ));

    // A hash with a token but no lock is not an unbound scope.
    let _: () = hset("lockless", &[("token", "50"), ("session", "1")])
        .query_async(&mut conn)
        .await
        .unwrap();
    let err = fence
        .write(
            &mut conn,
            "lockless",
            &grant("report", 10, 2),
            &[RedisOp::set(&key, "by 10")],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Corrupt { .. }), "{err:?}");
    assert!(matches!(
        fence.fence_state(&mut conn, "lockless").await,
        Err(FenceError::Corrupt { .. })
    ));
    assert_eq!(get(&mut conn, &key).await, None, "nothing was written");
    cleanup(
        &mut conn,
        &[fence.fence_key("padded"), fence.fence_key("lockless")],
    )
    .await;
}

#[tokio::test]
async fn a_read_modify_write_in_one_request_returns_every_ops_reply() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let (counter, log, missing) = (
        format!("{prefix}:counter"),
        format!("{prefix}:log"),
        format!("{prefix}:missing"),
    );
    let holder = grant("report", 3, 1);

    let replies = fence
        .write(
            &mut conn,
            "s",
            &holder,
            &[
                RedisOp::incr_by(&counter, 41),
                RedisOp::incr_by(&counter, 1),
                RedisOp::get(&counter),
                RedisOp::get(&missing),
                RedisOp::rpush(&log, "a"),
                RedisOp::rpush(&log, "b"),
                RedisOp::del(&missing),
                RedisOp::set(&counter, "-9223372036854775800"),
                RedisOp::incr_by(&counter, -8),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        replies,
        vec![
            RedisReply::Integer(41),
            RedisReply::Integer(42),
            RedisReply::Value(Some(b"42".to_vec())),
            RedisReply::Value(None),
            RedisReply::Integer(1),
            RedisReply::Integer(2),
            RedisReply::Integer(0),
            RedisReply::Done,
            // Exact at the end of the range, where a Lua double would round.
            RedisReply::Integer(i64::MIN),
        ]
    );
    assert_eq!(replies[1].integer(), Some(42));
    assert_eq!(replies[3].value(), Some(None));
    assert_eq!(
        get(&mut conn, &counter).await.as_deref(),
        Some("-9223372036854775808")
    );

    // Beyond the range, or on a value that is not an integer: refused before any write.
    for (start, delta) in [("-9223372036854775808", -1), ("007", 1), ("1.5", 1)] {
        set(&mut conn, &counter, start).await;
        let refused = fence
            .write(
                &mut conn,
                "s",
                &holder,
                &[RedisOp::rpush(&log, "c"), RedisOp::incr_by(&counter, delta)],
            )
            .await
            .unwrap_err();
        assert!(
            matches!(refused, FenceError::InvalidRequest { .. }),
            "{start} + {delta}: {refused:?}"
        );
        assert_eq!(get(&mut conn, &counter).await.as_deref(), Some(start));
    }
    let length: u64 = redis::cmd("LLEN")
        .arg(&log)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(length, 2, "no refused request pushed");

    let too_many = vec![RedisOp::get(&counter); REDIS_OPS_MAX + 1];
    let refused = fence
        .write(&mut conn, "s", &holder, &too_many)
        .await
        .unwrap_err();
    assert!(
        matches!(refused, FenceError::InvalidRequest { .. }) && refused.is_final(),
        "{refused:?}"
    );
    cleanup(&mut conn, &[counter, log, fence.fence_key("s")]).await;
}

#[tokio::test]
async fn a_compare_and_set_applies_all_or_nothing_under_the_fence() {
    let Some(url) = redis_url() else { return };
    let mut conn = connect(&url).await;
    let (fence, prefix) = fixture();
    let (config, log) = (format!("{prefix}:config"), format!("{prefix}:log"));

    // Create if absent.
    let created = fence
        .write_if(
            &mut conn,
            "s",
            &grant("cfg", 11, 1),
            &[RedisCondition::absent(&config)],
            &[RedisOp::set(&config, "v1"), RedisOp::rpush(&log, "v1")],
        )
        .await
        .unwrap();
    assert_eq!(
        created,
        RedisOutcome::Applied(vec![RedisReply::Done, RedisReply::Integer(1)])
    );

    // A compare that fails writes nothing, reports the current value and does not advance.
    let failed = fence
        .write_if(
            &mut conn,
            "s",
            &grant("cfg", 12, 2),
            &[
                RedisCondition::absent(format!("{prefix}:nothing")),
                RedisCondition::equals(&config, "v0"),
            ],
            &[RedisOp::set(&config, "v2"), RedisOp::rpush(&log, "v2")],
        )
        .await
        .unwrap();
    assert_eq!(
        failed,
        RedisOutcome::CompareFailed {
            condition: 1,
            current: Some(b"v1".to_vec())
        }
    );
    assert_eq!(get(&mut conn, &config).await.as_deref(), Some("v1"));
    let state = fence.fence_state(&mut conn, "s").await.unwrap().unwrap();
    assert_eq!(state.token_max, Token::new(11));

    // Retried with the value it was told: applied.
    let swapped = fence
        .write_if(
            &mut conn,
            "s",
            &grant("cfg", 12, 2),
            &[RedisCondition::equals(&config, "v1")],
            &[RedisOp::set(&config, "v2"), RedisOp::rpush(&log, "v2")],
        )
        .await
        .unwrap();
    assert_eq!(
        swapped,
        RedisOutcome::Applied(vec![RedisReply::Done, RedisReply::Integer(2)])
    );

    // A superseded holder is refused as stale even when its condition holds.
    let stale = fence
        .write_if(
            &mut conn,
            "s",
            &grant("cfg", 11, 1),
            &[RedisCondition::equals(&config, "v2")],
            &[RedisOp::set(&config, "v3")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(stale, FenceError::Stale { accepted, .. } if accepted == Token::new(12)),
        "{stale:?}"
    );
    assert_eq!(get(&mut conn, &config).await.as_deref(), Some("v2"));
    cleanup(&mut conn, &[config, log, fence.fence_key("s")]).await;
}

/// A TCP proxy to `upstream` that forwards everything until a client sends `EVALSHA`, then
/// forwards that request, withholds the answer and closes the connection: the network failing
/// after the request left.
async fn proxy_cutting_after_evalsha(upstream: String) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&upstream).await.unwrap();
            let (mut client_read, mut client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let cut_up = cut.clone();
            let up = tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                loop {
                    let read = match client_read.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => read,
                    };
                    let chunk = &buffer[..read];
                    let evalsha = chunk.windows(7).any(|window| window == b"EVALSHA");
                    if evalsha {
                        cut_up.store(true, std::sync::atomic::Ordering::SeqCst);
                    }
                    if server_write.write_all(chunk).await.is_err() {
                        return;
                    }
                    if evalsha {
                        // Let Redis run the script, then drop the connection unanswered.
                        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                        return;
                    }
                }
            });
            tokio::spawn(async move {
                let mut buffer = vec![0u8; 64 * 1024];
                loop {
                    let read = match server_read.read(&mut buffer).await {
                        Ok(0) | Err(_) => break,
                        Ok(read) => read,
                    };
                    if cut.load(std::sync::atomic::Ordering::SeqCst) {
                        break;
                    }
                    if client_write.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                }
                let _ = up.await;
                let _ = client_write.shutdown().await;
            });
        }
    });
    address
}

#[tokio::test]
async fn a_connection_lost_after_the_script_was_sent_is_an_unknown_outcome_not_a_failure() {
    let Some(url) = redis_url() else { return };
    let mut direct = connect(&url).await;
    let (fence, prefix) = fixture();
    let key = format!("{prefix}:value");
    // The script is cached on the server, so the next call is a single EVALSHA.
    fence
        .write(&mut direct, "s", &grant("report", 1, 1), &[])
        .await
        .unwrap();

    let upstream = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let proxy = proxy_cutting_after_evalsha(upstream).await;
    let mut cut = connect(&format!("redis://{proxy}/")).await;
    let lost = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        fence.write(
            &mut cut,
            "s",
            &grant("report", 2, 2),
            &[RedisOp::set(&key, "by 2")],
        ),
    )
    .await
    .expect("the cut connection fails the call within 10 s")
    .unwrap_err();
    assert!(lost.is_outcome_unknown(), "{lost:?}");
    assert!(!lost.is_retryable() && !lost.is_final());

    // It was in fact applied: which is why it must not be reported as failed.
    assert_eq!(get(&mut direct, &key).await.as_deref(), Some("by 2"));
    let state = fence.fence_state(&mut direct, "s").await.unwrap().unwrap();
    assert_eq!(state.token_max, Token::new(2));
    cleanup(&mut direct, &[key, fence.fence_key("s")]).await;
}

#[tokio::test]
async fn a_user_that_may_not_advance_the_fence_writes_nothing_at_all() {
    let Some(url) = redis_url() else { return };
    let mut admin = connect(&url).await;
    let (fence, prefix) = fixture();
    let counter = format!("{prefix}:counter");
    // A user that may run INCRBY but not HSET. Redis checks a command's permission when a script
    // calls it, so without a check up front the INCRBY would apply and the token advance (an
    // HSET) after it would fail.
    let user = unique("paltest_user");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(">paltest-password")
        .arg("+@all")
        .arg("-hset")
        .arg(format!("~{prefix}:*"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let Some(server) = url.strip_prefix("redis://") else {
        panic!("PALISADE_TEST_REDIS {url:?} is not a redis:// URL");
    };
    let mut limited = connect(&format!("redis://{user}:paltest-password@{server}")).await;
    let whoami: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut limited)
        .await
        .unwrap();
    assert_eq!(whoami, user, "the test runs as the limited user");

    let refused = fence
        .write(
            &mut limited,
            "s",
            &grant("report", 4, 1),
            &[RedisOp::incr_by(&counter, 1)],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(refused, FenceError::InvalidRequest { .. }),
        "{refused:?}"
    );
    assert!(refused.is_final(), "{refused:?}");
    assert_eq!(get(&mut admin, &counter).await, None, "nothing was applied");
    assert_eq!(fence.fence_state(&mut admin, "s").await.unwrap(), None);

    let _: () = redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query_async(&mut admin)
        .await
        .unwrap();
    cleanup(&mut admin, &[counter]).await;
}
