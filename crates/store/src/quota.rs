//! Per-lock quotas: how much one lock's keys may hold in the store.
//!
//! Bindings decide which keys a lock may write; quotas bound how much. Without them the holder
//! of any bound lock can fill the disk with the keys its prefixes allow. A lock is charged for
//! the rows it wrote last (a key's row names that lock):
//!
//! - **keys**: its live keys;
//! - **bytes**: the names of all its keys, deleted ones included (a tombstone keeps its name,
//!   and its binding, for ever), plus the values of its live keys.
//!
//! A write that would take its lock past a quota is refused before anything is written
//! ([`crate::StoreError::QuotaReached`]); a write that does not grow the lock's use (an
//! overwrite with a value no longer, a delete) is always let through, so a lock over a quota
//! lowered since can still shrink. The use of every lock is counted from the database when the
//! store opens, and kept by the writer thread as its groups commit.

use std::collections::HashMap;

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::StoreError;
use crate::schema::KV_TABLE;

/// The most one lock's keys may hold; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockQuota {
    /// Live keys.
    pub keys_max: Option<u64>,
    /// Bytes of key names (deleted keys' included) and live values.
    pub bytes_max: Option<u64>,
}

impl LockQuota {
    /// Whether any limit is set.
    pub fn is_limited(&self) -> bool {
        self.keys_max.is_some() || self.bytes_max.is_some()
    }
}

/// What one lock's rows take, or a change of it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) keys: i64,
    pub(crate) bytes: i64,
}

impl Usage {
    /// What one row counts for: `key` with a value of `value_len` bytes if `live`.
    pub(crate) fn of_row(key: &str, live: bool, value_len: usize) -> Usage {
        Usage {
            keys: i64::from(live),
            bytes: (key.len() + if live { value_len } else { 0 }) as i64,
        }
    }

    fn add(&mut self, other: Usage) {
        self.keys += other.keys;
        self.bytes += other.bytes;
    }

    fn sub(&mut self, other: Usage) {
        self.keys -= other.keys;
        self.bytes -= other.bytes;
    }
}

/// Every lock's use, as committed, and the quota it is held to: kept by the writer thread.
#[derive(Debug)]
pub(crate) struct Quotas {
    quota: LockQuota,
    committed: HashMap<String, Usage>,
    /// A commit failed with an unknown outcome: the counts are read again from the database
    /// before the next group.
    stale: bool,
}

impl Quotas {
    /// Counts every lock's use in the database `txn` sees.
    pub(crate) fn load(quota: LockQuota, txn: &WriteTransaction) -> Result<Quotas, StoreError> {
        let mut quotas = Quotas {
            quota,
            committed: HashMap::new(),
            stale: false,
        };
        quotas.count(txn)?;
        Ok(quotas)
    }

    fn count(&mut self, txn: &WriteTransaction) -> Result<(), StoreError> {
        let table = txn.open_table(KV_TABLE)?;
        let mut committed: HashMap<String, Usage> = HashMap::new();
        if table.len()? > 0 {
            for row in table.iter()? {
                let (key, row) = row?;
                let (lock, _, _, live, _, value) = row.value();
                committed
                    .entry(lock.to_owned())
                    .or_default()
                    .add(Usage::of_row(key.value(), live, value.len()));
            }
        }
        self.committed = committed;
        self.stale = false;
        Ok(())
    }

    /// Before a group runs in `txn`: counts again if the last commit's outcome is unknown.
    pub(crate) fn refresh(&mut self, txn: &WriteTransaction) -> Result<(), StoreError> {
        if self.stale {
            self.count(txn)?;
        }
        Ok(())
    }

    /// The group committed: its changes are what the database holds now.
    pub(crate) fn committed(&mut self, group: GroupUsage) {
        for (lock, change) in group.changes {
            self.committed.entry(lock).or_default().add(change);
        }
        self.committed.retain(|_, usage| *usage != Usage::default());
    }

    /// The group's commit failed and may or may not have happened.
    pub(crate) fn outcome_unknown(&mut self) {
        self.stale = true;
    }

    /// Refuses a request that would take `lock` past its quota, `change` being what the request
    /// does to it and `group` what the group's earlier requests did.
    pub(crate) fn check(
        &self,
        group: &GroupUsage,
        lock: &str,
        change: Usage,
    ) -> Result<(), StoreError> {
        let mut after = self.committed.get(lock).copied().unwrap_or_default();
        if let Some(earlier) = group.changes.get(lock) {
            after.add(*earlier);
        }
        after.add(change);
        let over = |quota: &str, grows: bool, used: i64, max: Option<u64>| match max {
            Some(max) if grows && used > max as i64 => Err(StoreError::QuotaReached {
                lock: lock.to_owned(),
                quota: quota.to_owned(),
                used: used as u64,
                quota_max: max,
            }),
            _ => Ok(()),
        };
        over("keys", change.keys > 0, after.keys, self.quota.keys_max)?;
        over("bytes", change.bytes > 0, after.bytes, self.quota.bytes_max)
    }
}

/// What the accepted requests of one group change, per lock, until it commits.
#[derive(Debug, Default)]
pub(crate) struct GroupUsage {
    changes: HashMap<String, Usage>,
}

impl GroupUsage {
    /// Counts an accepted request's change to each lock.
    pub(crate) fn record(&mut self, changes: &HashMap<String, Usage>) {
        for (lock, change) in changes {
            self.changes.entry(lock.clone()).or_default().add(*change);
        }
    }
}

/// What a request's operations do to each lock's use: fed with each touched key's row before
/// the request and after it.
#[derive(Debug, Default)]
pub(crate) struct RequestUsage {
    pub(crate) changes: HashMap<String, Usage>,
}

impl RequestUsage {
    /// A key's row goes from `before` (its lock and usage, if it had a row) to `after`.
    pub(crate) fn replace(&mut self, before: Option<(&str, Usage)>, after: (&str, Usage)) {
        if let Some((lock, usage)) = before {
            self.changes.entry(lock.to_owned()).or_default().sub(usage);
        }
        self.changes
            .entry(after.0.to_owned())
            .or_default()
            .add(after.1);
    }

    /// The change to `lock`.
    pub(crate) fn of(&self, lock: &str) -> Usage {
        self.changes.get(lock).copied().unwrap_or_default()
    }
}
