//! The redb fence: the conformance suite, a fence expecting one lock, and scope names checked.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::grant;
use palisade_fence::testing::{self, Data, FenceHarness, Unsupported};
use palisade_fence::{FenceError, FenceState, RedbFence};
use palisade_sequencer::VerifiedSequencer;
use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};

const DATA: TableDefinition<&str, i64> = TableDefinition::new("data");
const LOG: TableDefinition<u64, u64> = TableDefinition::new("applied_tokens");
const SCOPE: &str = "reports";

/// One redb file; a database file is open once per process, so handles share it.
struct Redb {
    dir: Arc<tempfile::TempDir>,
    fence: Option<Arc<RedbFence>>,
}

impl Redb {
    async fn fresh() -> Redb {
        let dir = Arc::new(tempfile::tempdir().unwrap());
        let fence = RedbFence::open(Self::path(&dir)).unwrap();
        Redb {
            dir,
            fence: Some(Arc::new(fence)),
        }
    }

    fn path(dir: &tempfile::TempDir) -> PathBuf {
        dir.path().join("fenced.redb")
    }

    fn fence(&self) -> &RedbFence {
        self.fence.as_ref().expect("open")
    }

    /// Claims, lets `change` compute the new value from the stored one, writes it and the log.
    fn write_with(
        &self,
        sequencer: &VerifiedSequencer,
        change: impl FnOnce(i64) -> i64,
    ) -> Result<(i64, palisade_fence::FencedTxn), FenceError> {
        let fenced = self.fence().begin(sequencer, SCOPE)?;
        let value = {
            let mut data = fenced.txn().open_table(DATA).unwrap();
            let value = change(data.get("value").unwrap().map_or(0, |v| v.value()));
            data.insert("value", value).unwrap();
            let mut log = fenced.txn().open_table(LOG).unwrap();
            let next = log.len().unwrap();
            log.insert(next, sequencer.token().get()).unwrap();
            value
        };
        Ok((value, fenced))
    }
}

impl FenceHarness for Redb {
    async fn connect_another(&self) -> Self {
        Redb {
            dir: Arc::clone(&self.dir),
            fence: self.fence.clone(),
        }
    }

    async fn claim(&self, sequencer: &VerifiedSequencer) -> Result<(), FenceError> {
        self.fence().begin_read(sequencer, SCOPE)?.commit()
    }

    async fn write(&self, sequencer: &VerifiedSequencer, value: i64) -> Result<(), FenceError> {
        self.write_with(sequencer, |_| value)?.1.commit()
    }

    async fn increment(&self, sequencer: &VerifiedSequencer) -> Result<i64, FenceError> {
        let (value, fenced) = self.write_with(sequencer, |value| value + 1)?;
        fenced.commit().map(|()| value)
    }

    async fn write_and_roll_back(
        &self,
        sequencer: &VerifiedSequencer,
        value: i64,
    ) -> Result<Result<(), FenceError>, Unsupported> {
        Ok(self
            .write_with(sequencer, |_| value)
            .map(|(_, fenced)| fenced.abort().unwrap()))
    }

    async fn reopen(&mut self) -> Result<(), Unsupported> {
        let fence = self.fence.take().expect("open");
        drop(Arc::into_inner(fence).expect("no other handle is open while reopening"));
        self.fence = Some(Arc::new(RedbFence::open(Self::path(&self.dir)).unwrap()));
        Ok(())
    }

    async fn read(&self) -> Data {
        let txn = self.fence().database().begin_read().unwrap();
        let Ok(data) = txn.open_table(DATA) else {
            return Data::default();
        };
        let value = data.get("value").unwrap().map_or(0, |v| v.value());
        let log = txn.open_table(LOG).unwrap();
        let log = log.iter().unwrap().map(|entry| entry.unwrap().1.value());
        Data {
            value,
            log: log.collect(),
        }
    }

    async fn state(&self) -> Option<FenceState> {
        self.fence().fence_state(SCOPE).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_passes_the_fence_conformance_suite() {
    testing::run_all(Redb::fresh).await;
}

#[test]
fn a_fence_expecting_one_lock_refuses_others_in_a_fresh_scope_and_scopes_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let strict = RedbFence::open(dir.path().join("strict.redb"))
        .unwrap()
        .expecting_lock("x");
    assert!(
        strict
            .begin(&grant("report", 1, 1), "fresh")
            .unwrap_err()
            .is_wrong_lock()
    );
    assert_eq!(strict.fence_state("fresh").unwrap(), None);
    assert_eq!(
        strict.begin(&grant("x", 6, 2), "").unwrap_err().kind(),
        "invalid_scope"
    );
}
