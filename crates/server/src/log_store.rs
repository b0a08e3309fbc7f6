//! The Raft log on disk: a redb file, written by one thread that commits in groups.
//!
//! Every entry not yet purged is also kept in memory, so readers never touch the disk and see an
//! entry as soon as `append` returns (openraft's requirement), even before it is durable. Writes
//! go, in submission order, to a dedicated writer thread. The writer takes everything queued,
//! applies it in ONE redb write transaction and commits it with `Durability::Immediate` (an
//! fsync), then reports every batch in it as flushed. While one commit is in its fsync, the next
//! requests queue up and share the following fsync: that is the group commit.
//!
//! Only after the flush callback does openraft count an entry as committed, and only committed
//! entries reach the state machine, so a client learns a grant only once it is on disk
//! (invariant 2). [`DurableIndex`] carries the flushed index to the state machine, which asserts
//! it at the point of use.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use std::time::Instant;
use tokio::sync::oneshot;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{LogState, OptionalSend, RaftLogReader};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::raft_types::{C, Entry};

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const META_VOTE: &str = "vote";
const META_COMMITTED: &str = "committed";
const META_PURGED: &str = "last_purged";

/// The highest log index known to be on disk. Shared with the state machine, which checks that
/// it never applies an entry beyond it.
#[derive(Debug, Clone, Default)]
pub struct DurableIndex(Arc<AtomicU64>);

impl DurableIndex {
    /// The highest durable index plus one (0 when nothing is durable yet).
    pub fn end(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// An index that holds every entry durable: for driving a state machine without a log,
    /// as openraft's storage suite does. The server always uses [`LogStore::durable_index`].
    pub fn untracked() -> DurableIndex {
        DurableIndex(Arc::new(AtomicU64::new(u64::MAX)))
    }

    fn advance_to(&self, last_index: u64) {
        self.0.fetch_max(last_index + 1, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
struct Cache {
    entries: BTreeMap<u64, Entry>,
    vote: Option<VoteOf<C>>,
    committed: Option<LogIdOf<C>>,
    last_purged: Option<LogIdOf<C>>,
}

enum Write {
    Append {
        entries: Vec<(u64, Vec<u8>)>,
        done: IOFlushed<C>,
    },
    Meta {
        key: &'static str,
        value: Vec<u8>,
        done: Option<oneshot::Sender<io::Result<()>>>,
    },
    TruncateFrom {
        index: u64,
        done: oneshot::Sender<io::Result<()>>,
    },
    PurgeUpTo {
        index: u64,
    },
    /// Stop after everything queued before it, closing the database.
    Stop,
}

/// The Raft log store. Cheap to clone: clones share the cache and the writer.
#[derive(Clone)]
pub struct LogStore {
    cache: Arc<Mutex<Cache>>,
    writer: mpsc::Sender<Write>,
    writer_thread: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    durable: DurableIndex,
}

impl Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("durable_end", &self.durable.end())
            .finish()
    }
}

fn encode<T: serde::Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(io::Error::other)
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    serde_json::from_slice(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

impl LogStore {
    /// Opens (or creates) the log in `path`, loading every unpurged entry into memory.
    pub fn open(path: &Path) -> io::Result<LogStore> {
        let db = Database::create(path).map_err(io::Error::other)?;
        let mut cache = Cache::default();
        {
            let txn = db.begin_write().map_err(io::Error::other)?;
            txn.open_table(LOG).map_err(io::Error::other)?;
            txn.open_table(META).map_err(io::Error::other)?;
            txn.commit().map_err(io::Error::other)?;
        }
        {
            let txn = db.begin_read().map_err(io::Error::other)?;
            let meta = txn.open_table(META).map_err(io::Error::other)?;
            let get = |key: &str| -> io::Result<Option<Vec<u8>>> {
                Ok(meta
                    .get(key)
                    .map_err(io::Error::other)?
                    .map(|v| v.value().to_vec()))
            };
            cache.vote = get(META_VOTE)?.map(|b| decode(&b)).transpose()?;
            cache.committed = get(META_COMMITTED)?
                .map(|b| decode(&b))
                .transpose()?
                .flatten();
            cache.last_purged = get(META_PURGED)?.map(|b| decode(&b)).transpose()?.flatten();
            let log = txn.open_table(LOG).map_err(io::Error::other)?;
            for row in log.iter().map_err(io::Error::other)? {
                let (index, bytes) = row.map_err(io::Error::other)?;
                let entry: Entry = decode(bytes.value())?;
                assert_eq!(
                    entry.index(),
                    index.value(),
                    "log entry stored under the wrong index"
                );
                cache.entries.insert(index.value(), entry);
            }
        }
        let durable = DurableIndex::default();
        if let Some(last) = cache.entries.keys().next_back() {
            durable.advance_to(*last);
        }
        let (writer, queue) = mpsc::channel();
        let thread_durable = durable.clone();
        let writer_thread = std::thread::Builder::new()
            .name("palisade-log-writer".into())
            .spawn(move || write_loop(db, queue, thread_durable))?;
        Ok(LogStore {
            cache: Arc::new(Mutex::new(cache)),
            writer,
            writer_thread: Arc::new(Mutex::new(Some(writer_thread))),
            durable,
        })
    }

    /// Writes everything queued, then closes the database file so it can be opened again.
    /// Later writes fail. Call after Raft has shut down.
    pub fn close(&self) {
        let _ = self.writer.send(Write::Stop);
        let thread = self
            .writer_thread
            .lock()
            .expect("writer handle lock poisoned")
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    pub fn durable_index(&self) -> DurableIndex {
        self.durable.clone()
    }

    fn send(&self, write: Write) -> io::Result<()> {
        self.writer
            .send(write)
            .map_err(|_| io::Error::other("the log writer thread has stopped"))
    }

    /// Queues a metadata write and waits until it is durable.
    async fn write_meta_durably(&self, key: &'static str, value: Vec<u8>) -> io::Result<()> {
        let (done, wait) = oneshot::channel();
        self.send(Write::Meta {
            key,
            value,
            done: Some(done),
        })?;
        wait_durable(wait).await
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().expect("log cache lock poisoned")
    }
}

async fn wait_durable(wait: oneshot::Receiver<io::Result<()>>) -> io::Result<()> {
    wait.await
        .map_err(|_| io::Error::other("the log writer thread has stopped"))?
}

/// The writer thread: drains the queue, applies it in one transaction, fsyncs, reports.
fn write_loop(db: Database, queue: mpsc::Receiver<Write>, durable: DurableIndex) {
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        let stop = batch.iter().position(|w| matches!(w, Write::Stop));
        if let Some(at) = stop {
            batch.truncate(at);
        }
        let started = Instant::now();
        let result = commit_batch(&db, &batch);
        metrics::histogram!(crate::metrics::FSYNC_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(crate::metrics::LOG_BATCH_WRITES).record(batch.len() as f64);
        if let Err(e) = &result {
            tracing::error!(error = %e, "writing the raft log failed; the node will stop");
        }
        for write in batch {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            match write {
                Write::Append { entries, done } => {
                    if outcome.is_ok() {
                        let last = entries.last().expect("append batches are not empty").0;
                        durable.advance_to(last);
                    }
                    done.io_completed(outcome);
                }
                Write::Meta {
                    done: Some(done), ..
                }
                | Write::TruncateFrom { done, .. } => {
                    let _ = done.send(outcome);
                }
                Write::Meta { done: None, .. } | Write::PurgeUpTo { .. } | Write::Stop => {}
            }
        }
        if stop.is_some() {
            return;
        }
    }
}

fn commit_batch(db: &Database, batch: &[Write]) -> io::Result<()> {
    let txn = db.begin_write().map_err(io::Error::other)?;
    {
        let mut log = txn.open_table(LOG).map_err(io::Error::other)?;
        let mut meta = txn.open_table(META).map_err(io::Error::other)?;
        for write in batch {
            match write {
                Write::Append { entries, .. } => {
                    for (index, bytes) in entries {
                        log.insert(*index, bytes.as_slice())
                            .map_err(io::Error::other)?;
                    }
                }
                Write::Meta { key, value, .. } => {
                    meta.insert(*key, value.as_slice())
                        .map_err(io::Error::other)?;
                }
                Write::TruncateFrom { index, .. } => {
                    log.retain_in(*index.., |_, _| false)
                        .map_err(io::Error::other)?;
                }
                Write::PurgeUpTo { index } => {
                    log.retain_in(..=*index, |_, _| false)
                        .map_err(io::Error::other)?;
                }
                Write::Stop => {}
            }
        }
    }
    txn.commit().map_err(io::Error::other)
}

impl RaftLogReader<C> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .cache()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self.cache().vote)
    }
}

impl RaftLogStorage<C> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let cache = self.cache();
        let last = cache
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id())
            .or(cache.last_purged);
        Ok(LogState {
            last_purged_log_id: cache.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        self.cache().vote = Some(*vote);
        self.write_meta_durably(META_VOTE, encode(vote)?).await
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        // Not waited for: losing it only means re-applying from the snapshot on restart.
        self.cache().committed = committed;
        self.send(Write::Meta {
            key: META_COMMITTED,
            value: encode(&committed)?,
            done: None,
        })
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        Ok(self.cache().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut encoded = Vec::new();
        {
            let mut cache = self.cache();
            for entry in entries {
                encoded.push((entry.index(), encode(&entry)?));
                cache.entries.insert(entry.index(), entry);
            }
        }
        if encoded.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        self.send(Write::Append {
            entries: encoded,
            done: callback,
        })
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        self.cache().entries.split_off(&from);
        let (done, wait) = oneshot::channel();
        self.send(Write::TruncateFrom { index: from, done })?;
        wait_durable(wait).await
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        {
            let mut cache = self.cache();
            let kept = cache.entries.split_off(&(log_id.index + 1));
            cache.entries = kept;
            cache.last_purged = Some(log_id);
        }
        // The purge marker must reach the disk with (or before) the deletion it explains.
        self.send(Write::Meta {
            key: META_PURGED,
            value: encode(&Some(log_id))?,
            done: None,
        })?;
        self.send(Write::PurgeUpTo {
            index: log_id.index,
        })
    }
}
