//! Scenarios for the S3 fence against a real S3-compatible server (`PALISADE_TEST_S3`:
//! "endpoint bucket access-key secret-key", as `scripts/test-services.sh` starts versitygw).

mod common;

use common::{grant, reissued, shuffled, unique};
use palisade_core::{SessionId, Token};
use palisade_fence::s3::{PutCondition, PutOutcome, S3_OBJECT_BYTES_MAX_DEFAULT, envelope};
use palisade_fence::{FenceError, FenceState, S3Config, S3Fence};

fn s3_config() -> Option<S3Config> {
    let Some(text) = std::env::var("PALISADE_TEST_S3")
        .ok()
        .filter(|text| !text.trim().is_empty())
    else {
        common::skip("SKIP: PALISADE_TEST_S3 not set; S3 fence tests did not run");
        return None;
    };
    let parts: Vec<&str> = text.split_whitespace().collect();
    let [endpoint, bucket, access_key, secret_key] = parts[..] else {
        panic!("PALISADE_TEST_S3 is \"endpoint bucket access-key secret-key\", not {text:?}");
    };
    Some(S3Config {
        endpoint: endpoint.into(),
        region: "us-east-1".into(),
        bucket: bucket.into(),
        access_key: access_key.into(),
        secret_key: secret_key.into(),
    })
}

fn fence() -> Option<(S3Fence, String)> {
    Some((S3Fence::new(s3_config()?), unique("s3test")))
}

fn stale(lock: &str, presented: u64, accepted: u64, session: u64) -> FenceError {
    FenceError::Stale {
        lock: lock.into(),
        presented: Token::new(presented),
        accepted: Token::new(accepted),
        holder_session: Some(SessionId::new(session)),
    }
}

async fn data(fence: &S3Fence, key: &str) -> Option<Vec<u8>> {
    fence.get(key).await.unwrap().and_then(|object| object.data)
}

#[tokio::test]
async fn a_superseded_holder_cannot_overwrite_and_learns_the_accepted_token() {
    let Some((fence, key)) = fence() else { return };
    let old = grant("report", 4, 1);
    fence.put(&key, &old, b"by 4").await.unwrap();
    let state = fence
        .put(&key, &grant("report", 9, 2), b"by 9")
        .await
        .unwrap();
    assert_eq!(
        state,
        FenceState {
            lock: "report".into(),
            token_max: Token::new(9),
            holder_session: SessionId::new(2)
        }
    );
    assert_eq!(
        fence.put(&key, &old, b"lost").await.unwrap_err(),
        stale("report", 4, 9, 2)
    );
    assert_eq!(
        fence.delete(&key, &old).await.unwrap_err(),
        stale("report", 4, 9, 2)
    );
    assert_eq!(data(&fence, &key).await.as_deref(), Some(&b"by 9"[..]));
    assert_eq!(fence.fence_state(&key).await.unwrap(), Some(state));
}

#[tokio::test]
async fn a_claim_before_the_read_shuts_the_older_holder_out() {
    let Some((fence, key)) = fence() else { return };
    let (old, new) = (grant("counter", 10, 1), grant("counter", 11, 2));
    fence.put(&key, &old, b"5").await.unwrap();
    // The old holder read 5 before the new one claimed.
    let read_by_old = fence.read(&key, &old).await.unwrap();
    assert_eq!(read_by_old.data.as_deref(), Some(&b"5"[..]));
    let read_by_new = fence.read(&key, &new).await.unwrap();
    assert_eq!(read_by_new.data.as_deref(), Some(&b"5"[..]));
    assert_eq!(read_by_new.state.token_max, Token::new(11));
    // The claim changed the bytes (the envelope), so the old holder's ETag is gone too.
    assert_ne!(read_by_old.etag, read_by_new.etag);
    assert_eq!(
        fence.put(&key, &old, b"6").await.unwrap_err(),
        stale("counter", 10, 11, 2)
    );
    fence.put(&key, &new, b"6").await.unwrap();
    assert_eq!(data(&fence, &key).await.as_deref(), Some(&b"6"[..]));
    // A second read by the same grant has nothing to advance and rewrites nothing.
    let again = fence.read(&key, &new).await.unwrap();
    assert_eq!(again.data.as_deref(), Some(&b"6"[..]));
}

#[tokio::test]
async fn a_conditional_put_on_an_etag_read_before_a_claim_is_refused() {
    // The step the fence stands on: a claim rewrites the object, so an ETag read before it no
    // longer matches, even though the data bytes are the same.
    let Some((fence, key)) = fence() else { return };
    let old_state = fence
        .put(&key, &grant("pointer", 3, 1), b"v1")
        .await
        .unwrap();
    let before = fence.get(&key).await.unwrap().unwrap();
    fence.read(&key, &grant("pointer", 4, 2)).await.unwrap();
    let outcome = fence
        .put_raw(
            &key,
            &old_state,
            envelope(&old_state, Some(b"v2")),
            PutCondition::Matches(&before.etag),
        )
        .await
        .unwrap();
    assert_eq!(outcome, PutOutcome::ConditionFailed);
    let create = fence
        .put_raw(
            &key,
            &old_state,
            envelope(&old_state, Some(b"v2")),
            PutCondition::Absent,
        )
        .await
        .unwrap();
    assert_eq!(create, PutOutcome::ConditionFailed);
    assert_eq!(data(&fence, &key).await.as_deref(), Some(&b"v1"[..]));
}

#[tokio::test]
async fn a_claim_of_a_new_key_and_a_delete_keep_the_token() {
    let Some((fence, key)) = fence() else { return };
    let claimed = fence.read(&key, &grant("jobs", 5, 1)).await.unwrap();
    assert_eq!(claimed.data, None);
    assert_eq!(
        fence
            .put(&key, &grant("jobs", 4, 9), b"late")
            .await
            .unwrap_err(),
        stale("jobs", 4, 5, 1)
    );
    fence.put(&key, &grant("jobs", 6, 2), b"x").await.unwrap();
    fence.delete(&key, &grant("jobs", 6, 2)).await.unwrap();
    let tombstone = fence.get(&key).await.unwrap().unwrap();
    assert_eq!(tombstone.data, None);
    assert_eq!(tombstone.state.token_max, Token::new(6));
    // A superseded holder cannot bring the object back after the delete.
    assert_eq!(
        fence
            .put(&key, &grant("jobs", 5, 1), b"zombie")
            .await
            .unwrap_err(),
        stale("jobs", 5, 6, 2)
    );
    assert_eq!(
        fence.read(&key, &grant("jobs", 7, 3)).await.unwrap().data,
        None
    );
}

#[tokio::test]
async fn a_token_issued_twice_and_a_foreign_lock_are_refused() {
    let Some((fence, key)) = fence() else { return };
    fence.put(&key, &grant("jobs", 8, 1), b"a").await.unwrap();
    assert_eq!(
        fence
            .put(&key, &grant("jobs", 8, 2), b"b")
            .await
            .unwrap_err(),
        reissued("jobs", 8, 1, 2)
    );
    // The first session writes on with its token.
    fence.put(&key, &grant("jobs", 8, 1), b"c").await.unwrap();
    let foreign = fence.put(&key, &grant("other", 99, 3), b"d").await;
    assert!(
        matches!(foreign, Err(FenceError::WrongLock { .. })),
        "{foreign:?}"
    );
    let expecting = S3Fence::new(fence.config().clone()).expecting_lock("jobs");
    let refused = expecting
        .put(&unique("s3new"), &grant("other", 1, 1), b"e")
        .await;
    assert!(
        matches!(refused, Err(FenceError::WrongLock { .. })),
        "{refused:?}"
    );
    assert_eq!(data(&fence, &key).await.as_deref(), Some(&b"c"[..]));
}

#[tokio::test]
async fn racing_writers_leave_the_newest_accepted_write() {
    let Some((fence, key)) = fence() else { return };
    let tokens = shuffled((1..=12).collect(), 0x53);
    let mut writers = tokio::task::JoinSet::new();
    for token in tokens {
        let (fence, key) = (fence.clone(), key.clone());
        writers.spawn(async move {
            let result = fence
                .put(
                    &key,
                    &grant("race", token, token),
                    token.to_string().as_bytes(),
                )
                .await;
            (token, result)
        });
    }
    let mut accepted = Vec::new();
    while let Some(joined) = writers.join_next().await {
        let (token, result) = joined.unwrap();
        match result {
            Ok(state) => accepted.push(state.token_max.get()),
            Err(FenceError::Stale { presented, .. }) => assert_eq!(presented.get(), token),
            Err(error) if error.is_retryable() => {}
            Err(error) => panic!("token {token}: {error}"),
        }
    }
    let newest = *accepted.iter().max().expect("some writer succeeds");
    let stored = fence.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.state.token_max.get(), newest);
    assert_eq!(stored.data, Some(newest.to_string().into_bytes()));
}

#[tokio::test]
async fn foreign_objects_oversized_data_and_bad_keys_are_refused_clearly() {
    let Some((fence, key)) = fence() else { return };
    // An object written without the fence: the fence will not guess its token.
    let state = FenceState {
        lock: "x".into(),
        token_max: Token::new(1),
        holder_session: SessionId::new(1),
    };
    let written = fence
        .put_raw(&key, &state, b"plain bytes".to_vec(), PutCondition::Absent)
        .await
        .unwrap();
    assert!(matches!(written, PutOutcome::Written(_)));
    let corrupt = fence.put(&key, &grant("x", 2, 1), b"y").await.unwrap_err();
    assert!(
        matches!(&corrupt, FenceError::Corrupt { message, .. } if message.contains("not written through the fence")),
        "{corrupt:?}"
    );
    let big = vec![0; S3_OBJECT_BYTES_MAX_DEFAULT + 1];
    let error = fence.put(&unique("s3big"), &grant("x", 1, 1), &big).await;
    assert!(
        matches!(error, Err(FenceError::InvalidRequest { .. })),
        "{error:?}"
    );
    let small = S3Fence::new(fence.config().clone()).with_object_bytes_max(4);
    let error = small
        .put(&unique("s3small"), &grant("x", 1, 1), b"12345")
        .await;
    assert!(
        matches!(error, Err(FenceError::InvalidRequest { .. })),
        "{error:?}"
    );
    for bad in [String::new(), "k".repeat(1025), "a\nb".into()] {
        let error = fence.put(&bad, &grant("x", 1, 1), b"z").await;
        assert!(
            matches!(error, Err(FenceError::InvalidScope { .. })),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_storage_error() {
    let Some(mut config) = s3_config() else {
        return;
    };
    // A port nothing listens on: bind one, then close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    config.endpoint = format!("http://127.0.0.1:{port}");
    let error = S3Fence::new(config)
        .put("k", &grant("x", 1, 1), b"z")
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
}

#[tokio::test]
async fn wrong_credentials_are_refused_with_the_servers_reason() {
    let Some(mut config) = s3_config() else {
        return;
    };
    config.secret_key = "not-the-secret".into();
    let error = S3Fence::new(config)
        .put(&unique("s3auth"), &grant("x", 1, 1), b"z")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, FenceError::Storage { message } if message.contains("403")),
        "{error:?}"
    );
}
