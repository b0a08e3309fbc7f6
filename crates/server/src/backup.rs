//! Backups of a running cluster, and restoring one as a new cluster whose tokens never go back.
//!
//! A backup (`Backup`, `palisade cluster backup`) is the leader's state machine at a
//! linearizable point, with the cluster's founding key: the lock table, its limits and token
//! counter, and the key ring. It is one JSON document, as secret as the keys in it.
//!
//! A restore ([`restore`], `palisade restore`) writes a new data directory from a backup, for a
//! new one-member cluster (`palisade serve` on it, then `palisade cluster add`). The danger of
//! any restore is the counters: the cluster went on granting after the backup was taken, and
//! resources saw those tokens. A restored counter that re-issued them would hand a new holder a
//! token a resource already accepted from someone else (with the same session id, the very
//! same sequencer), or one below it, which the resource refuses for ever after. So the restored
//! table starts both counters at [`palisade_core::limits::recovery_floors`]: the backup's
//! counter, plus what it can have grown since the backup was taken (2^21 a second), plus a
//! second's margin, and never below the time floor of the restore; and it keeps no session,
//! holder or waiter: clients open new sessions and acquire again (invariant 13). The keys and
//! the limits carry over, so resources keep verifying without being touched.

use std::io;
use std::path::Path;

use palisade_core::limits::recovery_floors;
use palisade_core::{SessionId, Token};
use palisade_sequencer::SigningKey;
use serde::{Deserialize, Serialize};

use crate::applied::Applied;
use crate::keyring::Secret;

/// The format version written in every backup.
pub const BACKUP_FORMAT: u32 = 1;

/// What a backup file holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Backup {
    palisade_backup: u32,
    /// When the leader took it, in milliseconds since 1970 (its wall clock).
    taken_at_unix_ms: u64,
    /// The key that signs while the key ring is empty (see [`crate::keyring`]).
    founding_key: Secret,
    state: Applied,
}

impl Backup {
    pub(crate) fn new(state: Applied, founding_key: &SigningKey, taken_at_unix_ms: u64) -> Backup {
        Backup {
            palisade_backup: BACKUP_FORMAT,
            taken_at_unix_ms,
            founding_key: Secret::of(founding_key),
            state,
        }
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a backup serialises")
    }
}

/// What [`restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// When the backup was taken, in milliseconds since 1970.
    pub taken_at_unix_ms: u64,
    /// The last token the backed-up cluster had granted when the backup was taken.
    pub last_token_in_backup: Token,
    /// The restored cluster grants tokens above this one.
    pub last_token: Token,
    /// The last session id the backed-up cluster had assigned when the backup was taken.
    pub last_session_in_backup: SessionId,
    /// The restored cluster assigns session ids above this one.
    pub last_session: SessionId,
    /// Sessions and locks of the backup that the restored cluster does not carry over.
    pub sessions_dropped: usize,
    pub locks_dropped: usize,
}

/// Why a backup could not be restored. Nothing was written when this is returned, except in the
/// case of [`RestoreError::Io`] while writing (the directory is then incomplete: remove it).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{0}")]
    Backup(String),
    #[error(
        "{dir} is not empty: restore into a new data directory, never over a member's (a restored cluster is a new cluster)"
    )]
    NotEmpty { dir: String },
    #[error(
        "this machine's clock reads {now_unix_secs} s since 1970, before the backup was taken ({taken_unix_secs} s): fix the clock first, the restored tokens are placed by it"
    )]
    ClockBehind {
        now_unix_secs: u64,
        taken_unix_secs: u64,
    },
    #[error(
        "the backup's token counter ({last_token}) plus what it can have grown since the backup was taken passes the largest token: the restored cluster could grant nothing"
    )]
    Exhausted { last_token: Token },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Writes into `dir` (absent or empty) a data directory that starts a one-member cluster
/// holding `backup`'s limits, keys and counters, the counters raised to their recovery floors
/// at `now_unix_ms` (see the module documentation).
pub fn restore(backup: &[u8], dir: &Path, now_unix_ms: u64) -> Result<Restored, RestoreError> {
    let now_unix_secs = now_unix_ms / 1000;
    if backup.len() > crate::limits::SNAPSHOT_BYTES_MAX {
        return Err(RestoreError::Backup(format!(
            "the backup is {} bytes, more than any lock table ({} bytes)",
            backup.len(),
            crate::limits::SNAPSHOT_BYTES_MAX
        )));
    }
    let backup: Backup = serde_json::from_slice(backup)
        .map_err(|e| RestoreError::Backup(format!("not a palisade backup: {e}")))?;
    if backup.palisade_backup != BACKUP_FORMAT {
        return Err(RestoreError::Backup(format!(
            "backup format {} is not {BACKUP_FORMAT}, the one this version reads",
            backup.palisade_backup
        )));
    }
    backup
        .state
        .table
        .validate()
        .map_err(|e| RestoreError::Backup(format!("the backup's lock table is invalid: {e}")))?;
    let taken_unix_secs = backup.taken_at_unix_ms / 1000;
    if now_unix_secs < taken_unix_secs {
        return Err(RestoreError::ClockBehind {
            now_unix_secs,
            taken_unix_secs,
        });
    }
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RestoreError::NotEmpty {
                    dir: dir.display().to_string(),
                });
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::fs::create_dir_all(dir)?,
        Err(e) => return Err(e.into()),
    }
    #[cfg(unix)]
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;

    let old = &backup.state.table;
    let floors = recovery_floors(
        old.last_token(),
        old.last_session(),
        backup.taken_at_unix_ms,
        now_unix_ms,
    );
    if floors.exhausted() {
        return Err(RestoreError::Exhausted {
            last_token: old.last_token(),
        });
    }
    let table = old.restored(floors.token, floors.session);
    let restored = Restored {
        taken_at_unix_ms: backup.taken_at_unix_ms,
        last_token_in_backup: old.last_token(),
        last_token: table.last_token(),
        last_session_in_backup: old.last_session(),
        last_session: table.last_session(),
        sessions_dropped: old.session_count(),
        locks_dropped: old.lock_count(),
    };
    // The mark first: a key never exists without it (see `crate::counters`).
    crate::counters::write(
        dir,
        &crate::counters::CounterMark::new(
            None,
            table.last_token(),
            table.last_session(),
            now_unix_ms,
            Vec::new(),
        ),
    )?;
    crate::keys::store(dir, &backup.founding_key.key())?;
    crate::state_machine::write_restored(dir, table, backup.state.keys)?;
    tracing::info!(
        dir = %dir.display(),
        last_token = restored.last_token.get(),
        "restored a backup as a new cluster"
    );
    Ok(restored)
}
