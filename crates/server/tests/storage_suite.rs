//! openraft's storage conformance suite, run against our write-ahead log store and the lock-table
//! state machine, each on a fresh temporary directory.

use openraft::StorageError;
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use palisade_server::log_store::{DurableIndex, LogStore};
use palisade_server::raft_types::TypeConfig;
use palisade_server::state_machine::StateMachine;

struct OnDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for OnDisk {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir =
            tempfile::tempdir().map_err(|e| StorageError::write(TypeConfig::err_from_error(&e)))?;
        let log = LogStore::open(&dir.path().join("raft.wal"))
            .map_err(|e| StorageError::write(TypeConfig::err_from_error(&e)))?;
        // The suite applies entries it never appended to the log, so the durability check of
        // the state machine (invariant 2) cannot hold here; the server always wires it.
        let state_machine = StateMachine::open(dir.path(), DurableIndex::untracked())
            .map_err(|e| StorageError::write(TypeConfig::err_from_error(&e)))?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn wal_log_store_and_lock_table_pass_the_openraft_storage_suite() {
    TypeConfig::run(async {
        Suite::test_all(OnDisk)
            .await
            .expect("openraft storage suite");
    });
}
