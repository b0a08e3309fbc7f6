//! The store's fence passes the fence conformance suite of `palisade-fence`.
//!
//! The store's scope is a lock, and each key is bound to the lock of its first writer, so the
//! suite's resource is one key (`data`) holding the value and the log (`"<value>;<token>,…"`).
//! A claim is a fenced read of that key (the store's claim names a lock, not a key, so a claim
//! of another lock would be accepted), a write is a fenced compare-and-write of what that read
//! returned, retried while other writers win, and a rolled-back write is a transaction whose
//! compare fails, which changes nothing, not even the token.

use std::path::PathBuf;
use std::sync::Arc;

use palisade_core::{SessionId, Token};
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState};
use palisade_sequencer::VerifiedSequencer;
use palisade_store::{BatchOp, BatchRequest, Compare, Store, StoreError};

const KEY: &str = "data";

/// One store directory; a store is open once per process, so handles share it.
struct StoreHarness {
    dir: Arc<tempfile::TempDir>,
    store: Option<Arc<Store>>,
}

impl StoreHarness {
    async fn fresh() -> StoreHarness {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let store = Store::open(Self::path(&dir), testing::public_keys()).unwrap();
        StoreHarness {
            dir,
            store: Some(Arc::new(store)),
        }
    }

    fn path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("store")
    }

    fn store(&self) -> &Store {
        self.store.as_ref().expect("open")
    }

    /// Claims and reads the data: its bytes as stored (`None`: no value yet) and decoded.
    async fn claim_and_read(
        &self,
        sequencer: &VerifiedSequencer,
    ) -> Result<(Option<Vec<u8>>, Data), FenceError> {
        let entry = self
            .store()
            .read_async(Some(sequencer.as_str()), KEY)
            .await
            .map_err(fence_error)?;
        let bytes = entry.map(|entry| entry.value);
        let data = bytes.as_deref().map(decode).unwrap_or_default();
        Ok((bytes, data))
    }

    /// Writes `change` of the stored value and appends the token, compare-and-write, retried
    /// (bounded) while another writer changed the data between the read and the write.
    async fn write_with(
        &self,
        sequencer: &VerifiedSequencer,
        change: impl Fn(i64) -> i64,
    ) -> Result<i64, FenceError> {
        for _ in 0..1_000 {
            let (seen, mut data) = self.claim_and_read(sequencer).await?;
            let value = data.apply(sequencer, change(data.value));
            let compare = match seen {
                Some(value) => Compare::Value {
                    key: KEY.into(),
                    value,
                },
                None => Compare::Exists {
                    key: KEY.into(),
                    exists: false,
                },
            };
            let request = BatchRequest {
                compare: vec![compare],
                ops: vec![BatchOp::Put {
                    key: KEY.into(),
                    value: encode(&data),
                }],
            };
            match self
                .store()
                .txn_async(Some(sequencer.as_str()), &request, None)
                .await
            {
                Ok(_) => return Ok(value),
                Err(StoreError::CompareFailed { .. }) => continue,
                Err(refused) => return Err(fence_error(refused)),
            }
        }
        panic!("a write lost its compare 1000 times in a row");
    }
}

fn encode(data: &Data) -> Vec<u8> {
    let log: Vec<String> = data.log.iter().map(u64::to_string).collect();
    format!("{};{}", data.value, log.join(",")).into_bytes()
}

fn decode(bytes: &[u8]) -> Data {
    let text = std::str::from_utf8(bytes).unwrap();
    let (value, log) = text.split_once(';').unwrap();
    Data {
        value: value.parse().unwrap(),
        log: log
            .split(',')
            .filter(|token| !token.is_empty())
            .map(|token| token.parse().unwrap())
            .collect(),
    }
}

/// The store's refusal as the fence's: the same fields, named for a store.
fn fence_error(error: StoreError) -> FenceError {
    error
        .fence_refusal()
        .unwrap_or_else(|| panic!("the store answered {error}"))
}

impl FenceHarness for StoreHarness {
    async fn connect_another(&self) -> Self {
        StoreHarness {
            dir: Arc::clone(&self.dir),
            store: self.store.clone(),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        self.claim_and_read(sequencer).await.map(drop)
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        self.write_with(sequencer, |_| value).await.map(drop)
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        self.write_with(sequencer, |seen| seen + 1).await
    }

    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        let request = BatchRequest {
            compare: vec![Compare::Exists {
                key: "never-written".into(),
                exists: true,
            }],
            ops: vec![BatchOp::Put {
                key: KEY.into(),
                value: encode(&Data {
                    value,
                    log: vec![sequencer.token().get()],
                }),
            }],
        };
        let answer = self
            .store()
            .txn_async(Some(sequencer.as_str()), &request, None)
            .await;
        Ok(match answer {
            Err(StoreError::CompareFailed { .. }) => Ok(()),
            Ok(ack) => panic!("a transaction whose compare fails was applied: {ack:?}"),
            Err(refused) => Err(fence_error(refused)),
        })
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        let store = self.store.take().expect("open");
        drop(Arc::into_inner(store).expect("no other handle is open while reopening"));
        let store = Store::open(Self::path(&self.dir), testing::public_keys()).unwrap();
        self.store = Some(Arc::new(store));
        Ok(())
    }

    async fn read(&self) -> Data {
        let entry = self.store().get(KEY).unwrap();
        entry.map(|entry| decode(&entry.value)).unwrap_or_default()
    }

    /// The state of the lock the data key is bound to.
    async fn state(&self) -> Option<FenceState> {
        let lock = self.store().get(KEY).unwrap()?.lock;
        let view = self.store().fence_state(&lock).unwrap();
        Some(FenceState {
            lock,
            token_max: Token::new(view.token_max?),
            holder_session: SessionId::new(view.holder_session?),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_passes_the_fence_conformance_suite() {
    testing::run_all(StoreHarness::fresh).await;
}
