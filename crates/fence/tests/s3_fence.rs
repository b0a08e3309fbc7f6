//! The S3 fence against a real S3-compatible server (`PALISADE_TEST_S3`: "endpoint bucket
//! access-key secret-key", as `scripts/test-services.sh` starts versitygw): the conformance
//! suite, and what only an object-store fence has: the claim changes the ETag, tombstones,
//! objects written without the fence, bounds, and the server's refusals.

mod common;

use common::{grant, stale, unique};
use palisade_core::{SessionId, Token};
use palisade_fence::s3::{PutCondition, PutOutcome, S3_OBJECT_BYTES_MAX_DEFAULT, envelope};
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState, S3Config, S3Fence};
use palisade_sequencer::VerifiedSequencer;

fn s3_config() -> Option<S3Config> {
    let text = common::server("PALISADE_TEST_S3", "the S3 fence tests")?;
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

/// One object, its data the suite's [`Data`] as text: `value` then the log, `7 1,2,3`.
struct Object {
    fence: S3Fence,
    key: String,
}

fn encode(data: &Data) -> Vec<u8> {
    let log: Vec<String> = data.log.iter().map(u64::to_string).collect();
    format!("{} {}", data.value, log.join(",")).into_bytes()
}

fn decode(bytes: Option<&[u8]>) -> Data {
    let Some(bytes) = bytes else {
        return Data::default();
    };
    let text = std::str::from_utf8(bytes).unwrap();
    let (value, log) = text.split_once(' ').unwrap();
    Data {
        value: value.parse().unwrap(),
        log: log
            .split(',')
            .filter(|token| !token.is_empty())
            .map(|token| token.parse().unwrap())
            .collect(),
    }
}

impl Object {
    async fn change(
        &self,
        sequencer: &VerifiedSequencer,
        value: impl Fn(i64) -> i64 + Send,
    ) -> Result<i64, FenceError> {
        let (_, written) = self
            .fence
            .update(&self.key, sequencer, |current| {
                let mut data = decode(current);
                data.apply(sequencer, value(data.value));
                encode(&data)
            })
            .await?;
        Ok(decode(Some(&written)).value)
    }
}

impl FenceHarness for Object {
    async fn connect_another(&self) -> Self {
        Object {
            fence: S3Fence::new(self.fence.config().clone()),
            key: self.key.clone(),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        self.fence.read(&self.key, sequencer).await.map(drop)
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        self.change(sequencer, move |_| value).await.map(drop)
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        self.change(sequencer, |value| value + 1).await
    }

    async fn write_and_roll_back(
        &self,
        _: &VerifiedSequencer,
        _: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        Err(Unsupported(
            "an S3 PUT is one request: it lands whole or not at all, there is nothing to roll back",
        ))
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        // A new client: new connections, nothing kept from the old one.
        self.fence = S3Fence::new(self.fence.config().clone());
        Ok(())
    }

    async fn read(&self) -> Data {
        let object = self.fence.get(&self.key).await.unwrap();
        decode(object.as_ref().and_then(|object| object.data.as_deref()))
    }

    async fn state(&self) -> Option<FenceState> {
        self.fence.fence_state(&self.key).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_passes_the_fence_conformance_suite() {
    let Some(config) = s3_config() else { return };
    testing::run_all(|| {
        let config = config.clone();
        async move {
            Object {
                fence: S3Fence::new(config),
                key: unique("s3conformance"),
            }
        }
    })
    .await;
}

async fn data(fence: &S3Fence, key: &str) -> Option<Vec<u8>> {
    fence.get(key).await.unwrap().and_then(|object| object.data)
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
