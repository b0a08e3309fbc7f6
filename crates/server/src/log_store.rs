//! The Raft log store: the log in memory, made durable by one writer thread that commits in
//! groups to the write-ahead file of `wal`.
//!
//! Every entry not yet purged is kept in memory, so readers never touch the disk and see an
//! entry as soon as `append` returns (openraft's requirement), even before it is durable. Writes
//! go, in submission order, to the writer thread. It takes everything queued, appends it to the
//! file and calls `fdatasync` once, then reports every batch in it as flushed. While one batch
//! is in its fsync the next requests queue up and share the following one: that is the group
//! commit.
//!
//! Only after the flush callback does openraft count an entry as committed, and only committed
//! entries reach the state machine, so a client learns a grant only once it is on disk
//! (invariant 2). [`DurableIndex`] carries the flushed index to the state machine, which asserts
//! it at the point of use.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::type_config::alias::{LogIdOf, VoteOf};
use openraft::{LogState, OptionalSend, RaftLogReader};
use tokio::sync::{mpsc, oneshot};

use crate::disk::Disk;
use crate::platform::Blocking;
use crate::raft_types::{C, Entry};
use crate::wal::{self, Record, Wal};

/// The end of the log's durable prefix: every entry below it, as the log holds it now, is on
/// disk. Shared with the state machine, which waits for an entry to be durable here before it
/// applies it ([`DurableIndex::wait_durable`]) and asserts it.
///
/// **Truncation.** A truncate from index `f` lowers the end to at most `f` as soon as it is
/// submitted: from then on entries at `f` and above are new ones, durable only once their own
/// write is. Writes submitted *before* the truncate may still complete after it (queued behind
/// it in the same batch, or in their fsync while it was submitted); they must not raise the end
/// past `f` again, because the entries they wrote there are gone. So each truncate stays
/// *pending* until the writer reaches its record, and a completed write raises the end only up
/// to the lowest pending `f`. Writes submitted after the truncate complete after the writer has
/// passed it, when it is no longer pending.
#[derive(Debug, Clone)]
pub struct DurableIndex(Arc<Durable>);

#[derive(Debug)]
struct Durable {
    end: AtomicU64,
    /// The `from` index of each truncate submitted but not yet reached by the writer, in
    /// submission order.
    pending_truncates: Mutex<VecDeque<u64>>,
    /// Woken when `end` rises and when the writer stops.
    risen: tokio::sync::Notify,
    /// The writer has stopped: `end` will not rise again.
    writer_stopped: AtomicBool,
}

impl Default for DurableIndex {
    /// Nothing durable yet.
    fn default() -> DurableIndex {
        DurableIndex::starting_at(0)
    }
}

impl DurableIndex {
    /// The highest durable index plus one (0 when nothing is durable yet).
    pub fn end(&self) -> u64 {
        self.0.end.load(Ordering::Acquire)
    }

    /// An index that holds every entry durable: for driving a state machine without a log,
    /// as openraft's storage suite does. The server always uses [`LogStore::durable_index`].
    pub fn untracked() -> DurableIndex {
        DurableIndex::starting_at(u64::MAX)
    }

    fn starting_at(end: u64) -> DurableIndex {
        DurableIndex(Arc::new(Durable {
            end: AtomicU64::new(end),
            pending_truncates: Mutex::new(VecDeque::new()),
            risen: tokio::sync::Notify::new(),
            writer_stopped: AtomicBool::new(false),
        }))
    }

    /// Waits until the entry at `index` is durable on this node; fails if the log writer stops
    /// first (a failed write stops it, and so does [`LogStore::close`]).
    ///
    /// openraft applies a committed entry as soon as it is submitted to the local log, not once
    /// it is flushed: a quorum has it on disk, which need not include this node (a follower, or
    /// a leader whose own fsync is slower than two followers'). Waiting keeps every node's
    /// state machine behind its own disk, so nothing a node applies, answers or snapshots is
    /// missing from its log after a crash.
    pub async fn wait_durable(&self, index: u64) -> io::Result<()> {
        loop {
            let risen = self.0.risen.notified();
            let mut risen = std::pin::pin!(risen);
            risen.as_mut().enable();
            if index < self.end() {
                return Ok(());
            }
            if self.0.writer_stopped.load(Ordering::Acquire) {
                return Err(io::Error::other(format!(
                    "the log writer stopped before entry {index} was durable"
                )));
            }
            risen.await;
        }
    }

    /// The writer stopped: wakes every [`DurableIndex::wait_durable`] to fail.
    fn writer_stopped(&self) {
        self.0.writer_stopped.store(true, Ordering::Release);
        self.0.risen.notify_waiters();
    }

    fn pending(&self) -> MutexGuard<'_, VecDeque<u64>> {
        self.0
            .pending_truncates
            .lock()
            .expect("pending truncates lock poisoned")
    }

    /// Lowers the end to `from` and submits the truncate with `submit`, both under the lock,
    /// so truncates are pending in the order the writer receives them.
    fn truncate(&self, from: u64, submit: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
        let mut pending = self.pending();
        self.0.end.fetch_min(from, Ordering::AcqRel);
        submit()?;
        pending.push_back(from);
        Ok(())
    }

    /// The writer made the truncate from `from` durable: it no longer caps earlier writes.
    fn truncate_written(&self, from: u64) {
        let oldest = self.pending().pop_front();
        // Paired with `truncate`: the writer meets truncates in the order they were submitted.
        assert_eq!(
            oldest,
            Some(from),
            "the log writer reached a truncate from {from} that is not the oldest pending one"
        );
    }

    /// The writer made entries up to `last_index` durable, as they were when submitted.
    fn entries_written(&self, last_index: u64) {
        let pending = self.pending();
        let cap = pending.iter().copied().min().unwrap_or(u64::MAX);
        self.0
            .end
            .fetch_max((last_index + 1).min(cap), Ordering::AcqRel);
        self.0.risen.notify_waiters();
    }
}

/// What happens once a queued write is durable.
enum Done {
    Flushed(IOFlushed<C>),
    Notify(oneshot::Sender<io::Result<()>>),
    Nothing,
}

struct Write {
    record: Record,
    /// The last entry index an `Entries` record makes durable.
    last_index: Option<u64>,
    done: Done,
}

enum Message {
    Write(Write),
    /// Stop after everything queued before it, closing the file.
    Stop,
    /// For tests: take nothing more until a signal arrives (or its sender is gone), so that the
    /// writes queued meanwhile go to the disk in one batch, at a moment the test chooses.
    #[cfg(test)]
    Hold(std::sync::mpsc::Receiver<()>),
    /// For tests: see `Writer::compaction_hold`.
    #[cfg(test)]
    HoldCompaction(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>),
    /// For tests: lower the frame payload limit, so a test reaches it with a few entries.
    #[cfg(test)]
    LimitFrames(usize),
}

/// The Raft log store. Cheap to clone: clones share the in-memory log and the writer.
#[derive(Clone)]
pub struct LogStore {
    state: Arc<Mutex<wal::LogState>>,
    writer: mpsc::UnboundedSender<Message>,
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

impl LogStore {
    /// Opens (or creates) the log file at `path`, loading every unpurged entry into memory,
    /// with its writer on a thread of its own.
    pub fn open(path: &Path) -> io::Result<LogStore> {
        LogStore::open_with(path, Blocking::Threads, Disk::direct())
    }

    /// [`LogStore::open`], with the writer where `blocking` says, writing through `disk`.
    /// [`Blocking::Inline`] must be called within a tokio runtime.
    pub fn open_with(path: &Path, blocking: Blocking, disk: Disk) -> io::Result<LogStore> {
        let (wal, state) = Wal::open_on(path, disk)?;
        let durable =
            DurableIndex::starting_at(state.entries.keys().next_back().map_or(0, |last| last + 1));
        let state = Arc::new(Mutex::new(state));
        let (writer, queue) = mpsc::unbounded_channel();
        let background = Writer::new(wal, durable.clone(), state.clone());
        let writer_thread = match blocking {
            Blocking::Threads => Some(
                std::thread::Builder::new()
                    .name("palisade-log-writer".into())
                    .spawn(move || background.run_on_thread(queue))?,
            ),
            Blocking::Inline => {
                tokio::spawn(background.run_as_task(queue));
                None
            }
        };
        Ok(LogStore {
            state,
            writer,
            writer_thread: Arc::new(Mutex::new(writer_thread)),
            durable,
        })
    }

    /// Writes everything queued, then closes the file so it can be opened again. Later writes
    /// fail. Call after Raft has shut down.
    pub fn close(&self) {
        let _ = self.writer.send(Message::Stop);
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

    /// Applies `record` to the in-memory log now and queues it for the disk.
    fn submit(&self, record: Record, done: Done) -> io::Result<()> {
        let last_index = match &record {
            Record::Entries(entries) => entries.last().map(|e| e.index()),
            _ => None,
        };
        let write = Write {
            record,
            last_index,
            done,
        };
        self.writer
            .send(Message::Write(write))
            .map_err(|_| io::Error::other("the log writer thread has stopped"))
    }

    /// Queues `record` and waits until it is durable.
    async fn submit_durably(&self, record: Record) -> io::Result<()> {
        let (done, wait) = oneshot::channel();
        self.submit(record, Done::Notify(done))?;
        wait.await
            .map_err(|_| io::Error::other("the log writer thread has stopped"))?
    }

    fn state(&self) -> MutexGuard<'_, wal::LogState> {
        lock_state(&self.state)
    }
}

fn lock_state(state: &Mutex<wal::LogState>) -> MutexGuard<'_, wal::LogState> {
    state.lock().expect("log state lock poisoned")
}

/// The writer: drains the queue, appends it with one fdatasync, reports, compacts.
struct Writer {
    wal: Wal,
    durable: DurableIndex,
    state: Arc<Mutex<wal::LogState>>,
    encoded: Vec<u8>,
    /// The longest frame payload written: a batch longer than that goes to the file as several
    /// frames, each made durable before the next ([`crate::limits::RECORD_BYTES_MAX`] but in tests).
    frame_payload_bytes_max: usize,
    written_committed: Option<LogIdOf<C>>,
    /// For tests: compact after the next purge whatever the file's size, announcing the copy
    /// on the first channel and waiting on the second before rewriting the file.
    #[cfg(test)]
    compaction_hold: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
}

/// However the writer ends (stopped, a failed write, a panic, a dropped task), waiters learn
/// it.
impl Drop for Writer {
    fn drop(&mut self) {
        self.durable.writer_stopped();
    }
}

impl Writer {
    fn new(wal: Wal, durable: DurableIndex, state: Arc<Mutex<wal::LogState>>) -> Writer {
        let written_committed = lock_state(&state).committed;
        Writer {
            wal,
            durable,
            state,
            encoded: Vec::new(),
            frame_payload_bytes_max: crate::limits::RECORD_BYTES_MAX,
            written_committed,
            #[cfg(test)]
            compaction_hold: None,
        }
    }

    /// On a thread of its own: the production writer.
    fn run_on_thread(mut self, mut queue: mpsc::UnboundedReceiver<Message>) {
        while let Some(first) = queue.blocking_recv() {
            if !self.write(first, &mut queue) {
                return;
            }
        }
    }

    /// As a task of the runtime, for a single-threaded simulation ([`Blocking::Inline`]): the
    /// file is written and synced inside the task's poll, so no other task runs meanwhile.
    async fn run_as_task(mut self, mut queue: mpsc::UnboundedReceiver<Message>) {
        while let Some(first) = queue.recv().await {
            if !self.write(first, &mut queue) {
                return;
            }
        }
    }

    /// Writes `first` and everything queued behind it as one frame (several if one would be
    /// above the frame limit). False once the writer must stop (asked to, or a write failed).
    fn write(&mut self, first: Message, queue: &mut mpsc::UnboundedReceiver<Message>) -> bool {
        let mut stopping = false;
        let mut batch = Vec::new();
        let queued = std::iter::from_fn(|| queue.try_recv().ok());
        for message in std::iter::once(first).chain(queued) {
            match message {
                Message::Write(write) => batch.push(write),
                Message::Stop => {
                    stopping = true;
                    break;
                }
                #[cfg(test)]
                Message::Hold(release) => {
                    let _ = release.recv();
                }
                #[cfg(test)]
                Message::HoldCompaction(reached, release) => {
                    self.compaction_hold = Some((reached, release));
                }
                #[cfg(test)]
                Message::LimitFrames(bytes) => self.frame_payload_bytes_max = bytes,
            }
        }
        if batch.is_empty() {
            return !stopping;
        }
        self.encoded.clear();
        let started = Instant::now();
        let committed = lock_state(&self.state).committed;
        let committed_record =
            (committed != self.written_committed).then_some(Record::Committed(committed));
        let records = batch.iter().map(|w| &w.record).chain(&committed_record);
        // Usually one frame; a batch above the frame limit goes as several, each made durable
        // before the next is written (N19).
        let result = wal::encode_frames(records, &mut self.encoded, self.frame_payload_bytes_max)
            .and_then(|ends| {
                let mut start = 0;
                for end in ends {
                    self.wal.append(&self.encoded[start..end])?;
                    start = end;
                }
                Ok(())
            });
        if result.is_ok() {
            self.written_committed = committed;
        }
        metrics::histogram!(crate::metrics::FSYNC_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(crate::metrics::LOG_BATCH_WRITES).record(batch.len() as f64);
        if let Err(e) = &result {
            tracing::error!(error = %e, "writing the raft log failed; the node will stop");
        }
        let mut purged = false;
        for write in batch {
            let outcome = match &result {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            if outcome.is_ok() {
                match (&write.record, write.last_index) {
                    (Record::TruncateFrom(from), _) => self.durable.truncate_written(*from),
                    (_, Some(last)) => self.durable.entries_written(last),
                    _ => {}
                }
            }
            purged |= matches!(write.record, Record::Purge(_));
            match write.done {
                Done::Flushed(callback) => callback.io_completed(outcome),
                Done::Notify(sender) => {
                    let _ = sender.send(outcome);
                }
                Done::Nothing => {}
            }
        }
        if result.is_err() {
            return false;
        }
        if purged {
            self.maybe_compact();
        }
        !stopping
    }

    /// Rewrites the file without its purged records if they make up most of it. The state is
    /// copied under the log's lock and written without it, so appends and readers of the
    /// in-memory log go on during the rewrite and its fsync (finding M5). The copy may be ahead
    /// of the file by writes still queued, and writes made during the rewrite are queued behind
    /// it: each is an assignment that re-applies cleanly on top of the compacted state, in the
    /// order it was made.
    fn maybe_compact(&mut self) {
        let image = {
            let state = lock_state(&self.state);
            let live_bytes = state.entries.len() as u64 * 256;
            #[cfg(test)]
            let due = self.compaction_hold.is_some() || self.wal.compaction_due(live_bytes);
            #[cfg(not(test))]
            let due = self.wal.compaction_due(live_bytes);
            due.then(|| wal::Compaction::of(&state))
        };
        let Some(image) = image else {
            return;
        };
        #[cfg(test)]
        if let Some((reached, release)) = self.compaction_hold.take() {
            let _ = reached.send(());
            let _ = release.recv();
        }
        match self.wal.compact(&image) {
            // The file now holds the copy's committed id: the next frame repeats it only once
            // it changes.
            Ok(()) => self.written_committed = image.committed,
            Err(e) => {
                tracing::warn!(error = %e, "compacting the raft log failed; it keeps growing");
            }
        }
    }
}

impl RaftLogReader<C> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .state()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<C>>, io::Error> {
        Ok(self.state().vote)
    }
}

impl RaftLogStorage<C> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<C>, io::Error> {
        let state = self.state();
        let last = state
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id())
            .or(state.last_purged);
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<C>) -> Result<(), io::Error> {
        self.state().apply(Record::Vote(*vote));
        self.submit_durably(Record::Vote(*vote)).await
    }

    async fn save_committed(&mut self, committed: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        // Not queued: the writer adds the latest committed id to the next frame it writes.
        // Losing it in a crash only means re-applying from the snapshot on restart, and it
        // saves the writer a wake-up and a `write` per commit.
        self.state().apply(Record::Committed(committed));
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<C>>, io::Error> {
        Ok(self.state().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: IOFlushed<C>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            callback.io_completed(Ok(()));
            return Ok(());
        }
        {
            let mut state = self.state();
            state.assert_appendable(&entries);
            for entry in &entries {
                state.entries.insert(entry.index(), entry.clone());
            }
        }
        self.submit(Record::Entries(entries), Done::Flushed(callback))
    }

    async fn truncate_after(&mut self, last_log_id: Option<LogIdOf<C>>) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index + 1);
        // Entries from `from` on are gone; one appended there again is durable only once its own
        // batch is, so the state machine's check must not count the removed ones, not even when
        // a write of them submitted earlier completes later (see `DurableIndex`).
        let (done, wait) = oneshot::channel();
        self.durable.truncate(from, || {
            self.state().apply(Record::TruncateFrom(from));
            self.submit(Record::TruncateFrom(from), Done::Notify(done))
        })?;
        wait.await
            .map_err(|_| io::Error::other("the log writer thread has stopped"))?
    }

    async fn purge(&mut self, log_id: LogIdOf<C>) -> Result<(), io::Error> {
        self.state().apply(Record::Purge(log_id));
        self.submit(Record::Purge(log_id), Done::Nothing)
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use openraft::testing::log_id;
    use openraft::type_config::TypeConfigExt;

    use super::*;

    fn blank_entries(term: u64, indexes: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
        indexes
            .map(|index| Entry::new_blank(log_id::<C>(term, 1, index)))
            .collect()
    }

    /// Appends and waits until the entries are durable.
    async fn append_durably(log: &mut LogStore, entries: Vec<Entry>) {
        let (flushed, done) = C::oneshot();
        log.append(entries, IOFlushed::signal(flushed))
            .await
            .unwrap();
        done.await.unwrap().unwrap();
    }

    /// Stops the writer thread before its next batch until the returned sender signals.
    fn hold_writer(log: &LogStore) -> std::sync::mpsc::Sender<()> {
        let (release, held) = std::sync::mpsc::channel();
        log.writer.send(Message::Hold(held)).unwrap();
        release
    }

    /// Every frame is durable before the next one is written. A frame written without an
    /// fdatasync and followed by another could be lost while the later one lands (the disk
    /// writes pages back in any order), which replay cannot tell from corruption.
    #[tokio::test]
    async fn a_purge_the_writer_has_handled_survives_a_power_loss() {
        use crate::disk::OnCrash;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.wal");
        let mut log =
            LogStore::open_with(&path, Blocking::Threads, Disk::volatile(OnCrash::LoseAll))
                .unwrap();
        append_durably(&mut log, blank_entries(1, 1..=3)).await;
        log.purge(log_id::<C>(1, 1, 2)).await.unwrap();
        // The writer handles the purge, then stops; the power goes: the file is dropped with
        // whatever was not synced lost.
        log.close();
        drop(log);
        let (_wal, replayed) = wal::Wal::open(&path).unwrap();
        assert_eq!(replayed.last_purged, Some(log_id::<C>(1, 1, 2)));
        assert_eq!(
            replayed.entries.keys().copied().collect::<Vec<_>>(),
            vec![3]
        );
    }

    /// N19: the writer groups whatever is queued, and a group longer than one frame may be
    /// (256 MiB outside this test) goes to the file as several frames instead of stopping the
    /// node; each entry is replayed once, in order, with the vote written beside them.
    #[tokio::test]
    async fn a_batch_longer_than_a_frame_is_written_as_several_frames_and_replays_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.wal");
        let mut log = LogStore::open(&path).unwrap();
        let one_entry = serde_json::to_vec(&blank_entries(1, 1..=1)[0])
            .unwrap()
            .len();
        let frame_bytes = 10 * one_entry;
        log.writer.send(Message::LimitFrames(frame_bytes)).unwrap();

        // Phase 1: with the writer held, appends of 25 and 30 entries (each above a frame by
        // itself) and a vote queue up, 5 frames' worth and more; then the writer takes them all.
        let release = hold_writer(&log);
        let (first_flushed, first_done) = C::oneshot();
        log.append(blank_entries(1, 1..=25), IOFlushed::signal(first_flushed))
            .await
            .unwrap();
        let vote = VoteOf::<C>::new(2, 1);
        let mut voting = log.clone();
        let voted = tokio::spawn(async move { voting.save_vote(&vote).await });
        tokio::task::yield_now().await;
        let (second_flushed, second_done) = C::oneshot();
        log.append(blank_entries(1, 26..=55), IOFlushed::signal(second_flushed))
            .await
            .unwrap();
        release.send(()).unwrap();
        first_done
            .await
            .unwrap()
            .expect("the first append is durable");
        second_done
            .await
            .unwrap()
            .expect("the second append is durable");
        voted.await.unwrap().expect("the vote is durable");
        assert_eq!(log.durable_index().end(), 56);

        // Phase 2: the file replays to every entry and the vote; every frame is within the limit.
        log.close();
        let contents = std::fs::read(&path).unwrap();
        let (_wal, replayed) = wal::Wal::open(&path).unwrap();
        assert_eq!(
            replayed.entries.keys().copied().collect::<Vec<_>>(),
            (1..=55).collect::<Vec<_>>()
        );
        assert_eq!(replayed.vote, Some(vote));
        let mut offset = 0;
        let mut frames = 0;
        while offset + 8 <= contents.len() {
            let length = u32::from_le_bytes(contents[offset..offset + 4].try_into().unwrap());
            if length == 0 {
                break; // Preallocated zeros.
            }
            assert!(length as usize <= frame_bytes, "a frame of {length} bytes");
            offset += 8 + length as usize;
            frames += 1;
        }
        assert!(frames >= 6, "{frames} frames for 55 entries of 10 a frame");
    }

    #[tokio::test]
    async fn an_append_that_completes_after_a_truncate_does_not_make_the_removed_entries_durable() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LogStore::open(&dir.path().join("raft.wal")).unwrap();
        let durable = log.durable_index();
        append_durably(&mut log, blank_entries(1, 1..=1)).await;
        assert_eq!(durable.end(), 2);

        // A follower appends entries 2..=4 from one leader; their write is still queued when a
        // new leader's entries conflict from index 2 and the follower truncates them.
        let release = hold_writer(&log);
        log.append(blank_entries(1, 2..=4), IOFlushed::noop())
            .await
            .unwrap();
        let mut truncating = log.clone();
        let mut truncate = pin!(truncating.truncate_after(Some(log_id::<C>(1, 1, 1))));
        assert!(
            futures::poll!(truncate.as_mut()).is_pending(),
            "the truncate waits for the writer"
        );
        assert_eq!(durable.end(), 2);

        // The writer now makes both durable, the append first.
        release.send(()).unwrap();
        truncate.await.unwrap();
        assert_eq!(
            durable.end(),
            2,
            "entries 2..=4 were truncated: only entry 1 is on disk as the log has it"
        );

        // The new leader's entries at 2..=3 count once they are durable themselves.
        append_durably(&mut log, blank_entries(2, 2..=3)).await;
        assert_eq!(durable.end(), 4);
        log.close();
    }

    #[tokio::test]
    async fn appends_and_reads_go_on_while_a_compaction_rewrites_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raft.wal");
        let mut log = LogStore::open(&path).unwrap();
        append_durably(&mut log, blank_entries(1, 1..=10)).await;

        // Phase 1: a purge starts a compaction, which stops once it has copied the log.
        let (reached, at_rewrite) = std::sync::mpsc::channel();
        let (release, held) = std::sync::mpsc::channel();
        log.writer
            .send(Message::HoldCompaction(reached, held))
            .unwrap();
        log.purge(log_id::<C>(1, 1, 5)).await.unwrap();
        at_rewrite
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the writer copies the log for a compaction");

        // Phase 2: with the rewrite not yet done, an append goes into the log and is read back
        // (on a thread of its own, so that a log lock held by the rewrite fails the test).
        let (appended, read) = std::sync::mpsc::channel();
        let mut appending = log.clone();
        std::thread::spawn(move || {
            futures::executor::block_on(async {
                appending
                    .append(blank_entries(1, 11..=12), IOFlushed::noop())
                    .await
                    .unwrap();
                let read = appending.try_get_log_entries(6..=12).await.unwrap();
                let _ = appended.send(read);
            })
        });
        let read = read
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("an append and a read finish while the compaction rewrites the file");
        assert_eq!(
            read.iter().map(|e| e.index()).collect::<Vec<_>>(),
            (6..=12).collect::<Vec<_>>()
        );

        // Phase 3: the rewrite finishes; the append queued behind it lands on the new file.
        release.send(()).unwrap();
        append_durably(&mut log, blank_entries(1, 13..=13)).await;
        log.close();
        let (_wal, replayed) = wal::Wal::open(&path).unwrap();
        assert_eq!(
            replayed.entries.keys().copied().collect::<Vec<_>>(),
            (6..=13).collect::<Vec<_>>()
        );
        assert_eq!(replayed.last_purged, Some(log_id::<C>(1, 1, 5)));
    }

    #[tokio::test]
    async fn waiting_for_an_entry_ends_when_it_is_durable_or_when_the_writer_stops() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LogStore::open(&dir.path().join("raft.wal")).unwrap();
        let durable = log.durable_index();

        // Entry 1 is in the log (openraft may apply it: a quorum elsewhere has it on disk) but
        // its write has not reached this node's disk.
        let release = hold_writer(&log);
        log.append(blank_entries(1, 1..=1), IOFlushed::noop())
            .await
            .unwrap();
        let mut waiting = pin!(durable.wait_durable(1));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        release.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("the wait ends once the entry is durable")
            .unwrap();

        // Entry 2 is never written: the log is closed first.
        let mut waiting = pin!(durable.wait_durable(2));
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        log.close();
        let stopped = tokio::time::timeout(std::time::Duration::from_secs(30), waiting)
            .await
            .expect("the wait ends when the writer stops")
            .unwrap_err();
        assert!(
            stopped.to_string().contains("stopped before entry 2"),
            "{stopped}"
        );
    }
}
