//! The store's one writer thread: group commit.
//!
//! Every request that changes the database — a fenced write or transaction, a fenced read, a
//! claim — becomes a [`Job`] on a bounded queue. The writer takes the first job, drains
//! whatever else is queued (at most [`GROUP_JOBS_MAX`] jobs, [`GROUP_BYTES_MAX`] bytes), and
//! runs them all, in queue order, inside **one** redb write transaction with one commit and
//! one fsync. Thirty-two writers then pay for about one fsync between them instead of one
//! each, the way the lock service's log batches its appends.
//!
//! # Why a job never half-applies
//!
//! A transaction cannot roll back one job and keep the others, so each job runs in two
//! phases: first everything that can refuse it is checked without writing (the sequencer
//! against the fence, the request id, the compares, each key's lock binding); only then does
//! it write. A refused job has written nothing, and the jobs after it see exactly the state
//! the accepted ones left. The write phase can fail only if redb itself fails; then the whole
//! group is aborted and every job in it is told nothing was applied.
//!
//! # Durability
//!
//! Nobody hears "ok" before the group's commit returned (fsync,
//! [`redb::Durability::Immediate`]). If the commit fails, every accepted job of the group is
//! answered [`StoreError::OutcomeUnknown`]. A group that changed nothing — fenced reads by the
//! current holder, repeated claims — is not committed at all: what made it acceptable was
//! already durable, since every earlier group committed before this one began.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};

use palisade_fence::{FenceError, FenceTable, Intent, RedbFence};
use palisade_sequencer::VerifiedSequencer;
use palisade_sequencer::display_binding;
use redb::{Durability, ReadableTable, ReadableTableMetadata, Table, WriteTransaction};

use crate::StoreError;
use crate::bindings::Bindings;
use crate::limits::{
    GROUP_BYTES_MAX, GROUP_JOBS_MAX, REQUEST_IDS_RETAINED_MAX, WRITE_QUEUE_BYTES_MAX,
    WRITE_QUEUE_JOBS_MAX,
};
use crate::quota::{GroupUsage, Quotas, RequestUsage, Usage};
use crate::schema::{
    KV_TABLE, KvRow, META_TABLE, REQUEST_ORDER_TABLE, REQUESTS_TABLE, REVISION_KEY, request_key,
};
use crate::types::{BatchOp, ClaimAck, Compare, Entry, OpAck, WriteAck};

/// What a job asks the writer to do. Inputs are validated before they are queued.
#[derive(Debug)]
pub(crate) enum Work {
    /// Compares, then operations, all or nothing, under one sequencer check.
    Txn {
        sequencer: Arc<VerifiedSequencer>,
        compare: Vec<Compare>,
        ops: Vec<BatchOp>,
        request_id: Option<String>,
    },
    /// A fenced read of one key: the lock's accepted token advances before the value is read.
    Read {
        sequencer: Arc<VerifiedSequencer>,
        key: String,
    },
    /// Advance the lock's accepted token to the sequencer's, and nothing else. `lock`, when
    /// given, must be the sequencer's lock.
    Claim {
        sequencer: Arc<VerifiedSequencer>,
        lock: Option<String>,
    },
    /// Benchmark only: the write path of a put without the fence, into a table no read uses.
    #[cfg(feature = "bench")]
    UnfencedPut { key: String, value: Vec<u8> },
}

impl Work {
    /// Roughly how much memory the job holds while it is queued.
    fn bytes(&self) -> usize {
        const OVERHEAD_BYTES: usize = 256;
        OVERHEAD_BYTES
            + match self {
                Work::Txn { compare, ops, .. } => {
                    let compares: usize = compare
                        .iter()
                        .map(|c| {
                            c.key().len()
                                + match c {
                                    Compare::Value { value, .. } => value.len(),
                                    _ => 8,
                                }
                        })
                        .sum();
                    let ops: usize = ops
                        .iter()
                        .map(|op| {
                            op.key().len()
                                + match op {
                                    BatchOp::Put { value, .. } => value.len(),
                                    _ => 0,
                                }
                        })
                        .sum();
                    compares + ops
                }
                Work::Read { key, .. } => key.len(),
                Work::Claim { lock, .. } => lock.as_ref().map_or(0, String::len),
                #[cfg(feature = "bench")]
                Work::UnfencedPut { key, value } => key.len() + value.len(),
            }
    }
}

/// What an accepted job produced.
#[derive(Debug)]
pub(crate) enum Done {
    Write(WriteAck),
    Read(Option<Entry>),
    Claim(ClaimAck),
    #[cfg(feature = "bench")]
    Unfenced,
}

type Outcome = Result<Done, StoreError>;

/// Where the answer goes: a blocked thread, or an awaiting task.
#[derive(Debug)]
enum ReplyTo {
    Blocking(SyncSender<Outcome>),
    Async(tokio::sync::oneshot::Sender<Outcome>),
}

impl ReplyTo {
    fn send(self, outcome: Outcome) {
        // A caller that went away (a dropped HTTP request) no longer wants the answer; the
        // job's effect, if any, is durable either way.
        let _ = match self {
            ReplyTo::Blocking(sender) => sender.send(outcome).map_err(drop),
            ReplyTo::Async(sender) => sender.send(outcome).map_err(drop),
        };
    }
}

#[derive(Debug)]
struct Job {
    work: Work,
    bytes: usize,
    reply: ReplyTo,
}

/// The sending side of the writer's queue, and the thread, which it stops and joins on drop.
#[derive(Debug)]
pub(crate) struct Writer {
    jobs: Option<SyncSender<Job>>,
    queued_bytes: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    /// Starts the writer thread of `fence`'s database, holding each lock to `quotas` if given.
    pub(crate) fn start(
        fence: Arc<RedbFence>,
        bindings: Option<Arc<Bindings>>,
        mut quotas: Option<Quotas>,
    ) -> Result<Writer, StoreError> {
        let (jobs, queue) = std::sync::mpsc::sync_channel(WRITE_QUEUE_JOBS_MAX);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("palisade-store-writer".into())
            .spawn({
                let queued_bytes = queued_bytes.clone();
                move || {
                    run(
                        &fence,
                        bindings.as_deref(),
                        quotas.as_mut(),
                        &queue,
                        &queued_bytes,
                    )
                }
            })
            .map_err(|error| StoreError::Storage {
                message: format!("cannot start the store's writer thread: {error}"),
            })?;
        Ok(Writer {
            jobs: Some(jobs),
            queued_bytes,
            thread: Some(thread),
        })
    }

    /// Runs `work` and blocks until its group has committed.
    pub(crate) fn submit_blocking(&self, work: Work) -> Outcome {
        let (sender, receiver) = std::sync::mpsc::sync_channel(1);
        self.enqueue(work, ReplyTo::Blocking(sender), true)?;
        receiver.recv().unwrap_or_else(|_| Err(writer_stopped()))
    }

    /// Runs `work`; the future completes when its group has committed. A full queue is
    /// refused at once ([`StoreError::Unavailable`]: nothing was applied) rather than
    /// blocking an async thread.
    pub(crate) async fn submit(&self, work: Work) -> Outcome {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.enqueue(work, ReplyTo::Async(sender), false)?;
        receiver.await.unwrap_or_else(|_| Err(writer_stopped()))
    }

    fn enqueue(&self, work: Work, reply: ReplyTo, block: bool) -> Result<(), StoreError> {
        let bytes = work.bytes();
        let before = self.queued_bytes.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > WRITE_QUEUE_BYTES_MAX {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return Err(queue_full("write_queue_bytes_max", WRITE_QUEUE_BYTES_MAX));
        }
        let jobs = self
            .jobs
            .as_ref()
            .expect("the queue lives as long as the writer");
        let job = Job { work, bytes, reply };
        let sent = if block {
            jobs.send(job).map_err(|_| writer_stopped())
        } else {
            jobs.try_send(job).map_err(|error| match error {
                TrySendError::Full(_) => queue_full("write_queue_jobs_max", WRITE_QUEUE_JOBS_MAX),
                TrySendError::Disconnected(_) => writer_stopped(),
            })
        };
        if sent.is_err() {
            self.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        }
        sent
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has answered every queued job; joining it
        // releases the database before the store is reported closed.
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn writer_stopped() -> StoreError {
    StoreError::OutcomeUnknown {
        message: "the store's writer stopped before answering".into(),
    }
}

fn queue_full(limit: &str, limit_max: usize) -> StoreError {
    StoreError::Unavailable {
        message: format!(
            "the store's write queue is full ({limit} is {limit_max}); nothing was applied, retry shortly"
        ),
    }
}

/// Aborts the process if the writer thread panics: a broken invariant stops the store rather
/// than leave it serving from state it no longer trusts.
struct AbortOnPanic;

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("store invariant broken in the writer thread, stopping");
            std::process::abort();
        }
    }
}

fn run(
    fence: &RedbFence,
    bindings: Option<&Bindings>,
    mut quotas: Option<&mut Quotas>,
    queue: &Receiver<Job>,
    queued_bytes: &AtomicUsize,
) {
    let _abort = AbortOnPanic;
    while let Ok(first) = queue.recv() {
        let mut bytes = first.bytes;
        let mut group = vec![first];
        while group.len() < GROUP_JOBS_MAX && bytes < GROUP_BYTES_MAX {
            match queue.try_recv() {
                Ok(job) => {
                    bytes += job.bytes;
                    group.push(job);
                }
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        let outcomes = run_group(fence, bindings, quotas.as_deref_mut(), &group);
        debug_assert_eq!(outcomes.len(), group.len());
        for (job, outcome) in group.into_iter().zip(outcomes) {
            job.reply.send(outcome);
        }
    }
}

/// Why a job was not applied.
enum Failure {
    /// The job was refused; it wrote nothing, and the group goes on.
    Refused(StoreError),
    /// redb failed while the job was writing: the whole group must be aborted.
    Storage(StoreError),
}

impl<E: Into<StoreError>> From<E> for Failure {
    fn from(error: E) -> Failure {
        Failure::Storage(error.into())
    }
}

fn refused(error: impl Into<StoreError>) -> Failure {
    Failure::Refused(error.into())
}

/// A fence error is a refusal unless it is redb failing underneath.
fn fence_failure(error: FenceError) -> Failure {
    let error = StoreError::from(error);
    match error {
        StoreError::Storage { .. } | StoreError::OutcomeUnknown { .. } => Failure::Storage(error),
        error => Failure::Refused(error),
    }
}

/// Runs every job of `group` in one transaction; one outcome per job, in order.
fn run_group(
    fence: &RedbFence,
    bindings: Option<&Bindings>,
    mut quotas: Option<&mut Quotas>,
    group: &[Job],
) -> Vec<Outcome> {
    let all_failed = |error: &StoreError| group.iter().map(|_| Err(error.clone())).collect();
    let mut txn = match fence.database().begin_write() {
        Ok(txn) => txn,
        Err(error) => return all_failed(&StoreError::storage(error)),
    };
    if let Err(error) = txn.set_durability(Durability::Immediate) {
        return all_failed(&StoreError::storage(error));
    }
    if let Some(quotas) = quotas.as_deref_mut()
        && let Err(error) = quotas.refresh(&txn)
    {
        return all_failed(&error);
    }
    let mut tables = match Tables::open(&txn) {
        Ok(tables) => tables,
        Err(error) => return all_failed(&error),
    };
    let mut group_state = match GroupState::load(&tables.meta) {
        Ok(state) => state,
        Err(error) => return all_failed(&error),
    };
    let mut outcomes = Vec::with_capacity(group.len());
    for job in group {
        let limits = Limits {
            bindings,
            quotas: quotas.as_deref(),
        };
        match run_job(
            fence,
            limits,
            &txn,
            &mut tables,
            &mut group_state,
            &job.work,
        ) {
            Ok(done) => outcomes.push(Ok(done)),
            Err(Failure::Refused(error)) => outcomes.push(Err(error)),
            Err(Failure::Storage(error)) => {
                // Aborting drops every job's writes; none of them happened.
                drop(tables);
                let _ = txn.abort();
                return all_failed(&error);
            }
        }
    }
    if !group_state.dirty {
        drop(tables);
        let _ = txn.abort();
        return outcomes;
    }
    let stored = group_state.store_revision(&mut tables.meta);
    drop(tables);
    if let Err(error) = stored {
        let _ = txn.abort();
        return all_failed(&error);
    }
    if let Err(error) = txn.commit() {
        if let Some(quotas) = quotas {
            quotas.outcome_unknown();
        }
        let unknown = StoreError::OutcomeUnknown {
            message: format!(
                "the store's commit failed, the write may or may not be durable: {error}"
            ),
        };
        return outcomes
            .into_iter()
            .map(|outcome| outcome.and(Err(unknown.clone())))
            .collect();
    }
    if let Some(quotas) = quotas {
        quotas.committed(group_state.usage);
    }
    outcomes
}

/// What a job is checked against besides the fence: the operator's bindings and quotas.
#[derive(Clone, Copy)]
struct Limits<'a> {
    bindings: Option<&'a Bindings>,
    quotas: Option<&'a Quotas>,
}

/// The tables every group uses, opened once per group rather than once per job: opening a
/// redb table in a write transaction costs ≈ 7k instructions (a lookup in the table tree,
/// bookkeeping, and the root's update when it is dropped), and a fenced put opened three (the
/// fence table, the key table twice), which was most of the fencing cost (`docs/benchmarks.md`,
/// "The fencing cost, found"). They are dropped before the transaction commits or aborts.
struct Tables<'txn> {
    kv: Table<'txn, &'static str, KvRow>,
    fence: FenceTable<'txn>,
    meta: Table<'txn, &'static str, u64>,
    /// Benchmark only: opened by the group's first unfenced put.
    #[cfg(feature = "bench")]
    unfenced: Option<Table<'txn, &'static str, KvRow>>,
}

impl<'txn> Tables<'txn> {
    fn open(txn: &'txn WriteTransaction) -> Result<Tables<'txn>, StoreError> {
        Ok(Tables {
            kv: txn.open_table(KV_TABLE)?,
            fence: txn.open_table(palisade_fence::redb::FENCE_TABLE)?,
            meta: txn.open_table(META_TABLE)?,
            #[cfg(feature = "bench")]
            unfenced: None,
        })
    }
}

/// What the jobs of one group share: the store revision, whether anything was written, and
/// what the accepted jobs changed of each lock's use.
struct GroupState {
    revision: u64,
    revision_at_start: u64,
    dirty: bool,
    usage: GroupUsage,
}

impl GroupState {
    fn load(meta: &Table<'_, &'static str, u64>) -> Result<GroupState, StoreError> {
        let revision = meta.get(REVISION_KEY)?.map_or(0, |value| value.value());
        Ok(GroupState {
            revision,
            revision_at_start: revision,
            dirty: false,
            usage: GroupUsage::default(),
        })
    }

    fn store_revision(&self, meta: &mut Table<'_, &'static str, u64>) -> Result<(), StoreError> {
        if self.revision != self.revision_at_start {
            assert!(
                self.revision > self.revision_at_start,
                "store revision went back"
            );
            meta.insert(REVISION_KEY, self.revision)?;
        }
        Ok(())
    }
}

fn run_job<'txn>(
    fence: &RedbFence,
    limits: Limits<'_>,
    txn: &'txn WriteTransaction,
    tables: &mut Tables<'txn>,
    state: &mut GroupState,
    work: &Work,
) -> Result<Done, Failure> {
    match work {
        Work::Txn {
            sequencer,
            compare,
            ops,
            request_id,
        } => run_txn(
            fence,
            limits,
            txn,
            tables,
            state,
            TxnRequest {
                sequencer,
                compare,
                ops,
                request_id: request_id.as_deref(),
            },
        )
        .map(Done::Write),
        Work::Read { sequencer, key } => {
            let advance = fence
                .check_in_table(&tables.fence, sequencer, &sequencer.binding(), Intent::Read)
                .map_err(fence_failure)?;
            let entry = {
                let row = tables
                    .kv
                    .get(key.as_str())?
                    .map(|row| Row::from_value(row.value()));
                check_binding(
                    limits.bindings,
                    key,
                    row.as_ref().map(|row| (row.lock.as_str(), row.token)),
                    sequencer,
                )
                .map_err(refused)?;
                row.and_then(|row| row.into_entry(key))
            };
            state.dirty |= advance.write_to(&mut tables.fence).map_err(fence_failure)?;
            Ok(Done::Read(entry))
        }
        Work::Claim { sequencer, lock } => {
            if let Some(lock) = lock
                && lock != sequencer.lock()
            {
                return Err(refused(StoreError::WrongLock {
                    key: None,
                    expected: lock.clone(),
                    presented: sequencer.lock().to_owned(),
                }));
            }
            let advance = fence
                .check_in_table(&tables.fence, sequencer, &sequencer.binding(), Intent::Read)
                .map_err(fence_failure)?;
            let advanced = advance.write_to(&mut tables.fence).map_err(fence_failure)?;
            state.dirty |= advanced;
            Ok(Done::Claim(ClaimAck {
                lock: sequencer.lock().to_owned(),
                token: sequencer.token().get(),
                session: sequencer.session().get(),
                previous_token_max: advance.previous().map(|previous| previous.token_max.get()),
                advanced,
            }))
        }
        #[cfg(feature = "bench")]
        Work::UnfencedPut { key, value } => {
            // Opened once per group, as the fenced path's tables are.
            let table = match &mut tables.unfenced {
                Some(table) => table,
                unopened => unopened.insert(txn.open_table(crate::schema::UNFENCED_BENCH_TABLE)?),
            };
            table.insert(key.as_str(), ("", 0, 0, true, 0, value.as_slice()))?;
            state.dirty = true;
            Ok(Done::Unfenced)
        }
    }
}

/// A key's stored row.
pub(crate) struct Row {
    pub(crate) lock: String,
    pub(crate) token: u64,
    pub(crate) session: u64,
    pub(crate) live: bool,
    pub(crate) revision: u64,
    pub(crate) value: Vec<u8>,
}

impl Row {
    pub(crate) fn from_value(
        (lock, token, session, live, revision, value): (&str, u64, u64, bool, u64, &[u8]),
    ) -> Row {
        Row {
            lock: lock.to_owned(),
            token,
            session,
            live,
            revision,
            value: value.to_vec(),
        }
    }

    /// The entry a read shows: none for a tombstone.
    pub(crate) fn into_entry(self, key: &str) -> Option<Entry> {
        self.live.then(|| Entry {
            key: key.to_owned(),
            value: self.value,
            lock: self.lock,
            token: self.token,
            session: self.session,
            revision: self.revision,
        })
    }
}

/// A key bound to another lock refuses the sequencer (invariant 4): bound by the operator's
/// `bindings` when there are any (a key they do not cover is refused, whatever its row says),
/// else by the key's row. `stored` is the row's lock and token, read in place (no copy of the
/// row); `None` for a key that never existed.
fn check_binding(
    bindings: Option<&Bindings>,
    key: &str,
    stored: Option<(&str, u64)>,
    sequencer: &VerifiedSequencer,
) -> Result<(), StoreError> {
    // A key's row records the binding that wrote it: the lock, or a permit's lock and slot, so
    // a key written under one slot is refused to another (each slot has its own maximum).
    let binding = sequencer.binding();
    if let Some(bindings) = bindings {
        bindings.check(key, sequencer.lock())?;
        // A row written by another lock before the bindings were set is overwritten by this
        // lock's write; only a row of this lock is under its fence.
        if let Some((lock, token)) = stored
            && lock == binding
        {
            assert_token_fenced(key, lock, token, sequencer);
        }
        return Ok(());
    }
    let Some((lock, token)) = stored else {
        return Ok(());
    };
    if lock != binding {
        return Err(StoreError::WrongLock {
            key: Some(key.to_owned()),
            expected: display_binding(lock).into_owned(),
            presented: display_binding(&binding).into_owned(),
        });
    }
    assert_token_fenced(key, lock, token, sequencer);
    Ok(())
}

/// Pair of the fence's own assertion: a key's token never exceeds its lock's accepted maximum,
/// which the sequencer's token (of that lock) has just reached.
fn assert_token_fenced(key: &str, lock: &str, token: u64, sequencer: &VerifiedSequencer) {
    assert!(
        token <= sequencer.token().get(),
        "store invariant broken: key {key:?} holds token {token}, above the accepted token {} of lock {lock:?}",
        sequencer.token(),
    );
}

/// What one transaction asks for: its sequencer, compares, operations and request id.
struct TxnRequest<'a> {
    sequencer: &'a VerifiedSequencer,
    compare: &'a [Compare],
    ops: &'a [BatchOp],
    request_id: Option<&'a str>,
}

fn run_txn(
    fence: &RedbFence,
    limits: Limits<'_>,
    txn: &WriteTransaction,
    tables: &mut Tables<'_>,
    state: &mut GroupState,
    request: TxnRequest<'_>,
) -> Result<WriteAck, Failure> {
    let TxnRequest {
        sequencer,
        compare,
        ops,
        request_id,
    } = request;
    let request = request_id.map(|request_id| RequestKey {
        key: request_key(sequencer.as_str(), request_id),
        request_id,
        fingerprint: fingerprint(compare, ops),
    });
    // A retry of a committed (or, in this group, accepted) request: its first outcome, even if
    // the fence would now refuse the sequencer.
    if let Some(request) = &request
        && let Some(ack) =
            stored_ack(&txn.open_table(REQUESTS_TABLE)?, request).map_err(|error| match error {
                StoreError::RequestIdReused { .. } => Failure::Refused(error),
                error => Failure::Storage(error),
            })?
    {
        return Ok(ack);
    }

    // Phase 1: everything that can refuse the request, writing nothing. A request of reads
    // alone is a fenced read, which a shared grant (a reader) may make.
    let intent = if compare.is_empty() && ops.iter().all(|op| matches!(op, BatchOp::Get { .. })) {
        Intent::Read
    } else {
        Intent::Write
    };
    let advance = fence
        .check_in_table(&tables.fence, sequencer, &sequencer.binding(), intent)
        .map_err(fence_failure)?;
    {
        let table = &tables.kv;
        for (index, condition) in compare.iter().enumerate() {
            let row = table
                .get(condition.key())?
                .map(|row| Row::from_value(row.value()));
            let current = row.as_ref().filter(|row| row.live);
            check_binding(
                limits.bindings,
                condition.key(),
                row.as_ref().map(|row| (row.lock.as_str(), row.token)),
                sequencer,
            )
            .map_err(refused)?;
            if !condition.holds(current.map(|row| (row.value.as_slice(), row.revision))) {
                return Err(refused(StoreError::CompareFailed {
                    compare: index as u64,
                    key: condition.key().to_owned(),
                    revision: current.map_or(0, |row| row.revision),
                }));
            }
        }
        for op in ops {
            let stored = table.get(op.key())?;
            let binding = stored.as_ref().map(|stored| {
                let (lock, token, ..) = stored.value();
                (lock, token)
            });
            check_binding(limits.bindings, op.key(), binding, sequencer).map_err(refused)?;
        }
    }
    let usage = match limits.quotas {
        Some(quotas) => {
            let usage = request_usage(&tables.kv, sequencer.lock(), ops)?;
            quotas
                .check(&state.usage, sequencer.lock(), usage.of(sequencer.lock()))
                .map_err(refused)?;
            Some(usage)
        }
        None => None,
    };

    // Phase 2: write. Only redb itself can fail from here on.
    state.dirty |= advance.write_to(&mut tables.fence)?;
    let writes = ops.iter().any(|op| !matches!(op, BatchOp::Get { .. }));
    if writes {
        state.revision += 1;
        state.dirty = true;
    }
    let revision = state.revision;
    let mut acks = Vec::with_capacity(ops.len());
    {
        let table = &mut tables.kv;
        let binding = sequencer.binding();
        let (lock, token, session) = (
            binding.as_ref(),
            sequencer.token().get(),
            sequencer.session().get(),
        );
        for op in ops {
            let key = op.key();
            // Whether the key has a value (`Some(false)`: a tombstone), read in place; only a
            // `get` copies the row out.
            let (existed, entry) = match op {
                BatchOp::Put { value, .. } => {
                    let old = table.insert(
                        key,
                        (lock, token, session, true, revision, value.as_slice()),
                    )?;
                    (old.is_some_and(|old| old.value().3), None)
                }
                BatchOp::Delete { .. } => {
                    let live = table.get(key)?.map(|row| row.value().3);
                    // A tombstone keeps the binding; a key that never existed needs none.
                    if live.is_some() {
                        table.insert(key, (lock, token, session, false, revision, &[][..]))?;
                    }
                    (live == Some(true), None)
                }
                BatchOp::Get { .. } => {
                    let row = table.get(key)?.map(|row| Row::from_value(row.value()));
                    let existed = row.as_ref().is_some_and(|row| row.live);
                    (existed, row.and_then(|row| row.into_entry(key)))
                }
            };
            acks.push(OpAck {
                op: op.kind(),
                key: key.to_owned(),
                existed,
                entry,
            });
        }
    }
    if let Some(usage) = usage {
        state.usage.record(&usage.changes);
    }
    let ack = WriteAck {
        lock: sequencer.lock().to_owned(),
        token: sequencer.token().get(),
        session: sequencer.session().get(),
        revision,
        ops: acks,
        request_id: request_id.map(str::to_owned),
        replayed: false,
    };
    if let Some(request) = &request {
        record_request(txn, request, &ack)?;
        state.dirty = true;
    }
    Ok(ack)
}

/// What `ops`, written by `lock`, would change of each lock's use: each key's row goes from what
/// the table (or an earlier op of the request) holds to what the op writes.
fn request_usage(
    table: &Table<'_, &'static str, KvRow>,
    lock: &str,
    ops: &[BatchOp],
) -> Result<RequestUsage, StoreError> {
    let mut rows: HashMap<&str, Option<(String, Usage)>> = HashMap::new();
    let mut usage = RequestUsage::default();
    for op in ops {
        let key = op.key();
        let before = match rows.get(key) {
            Some(row) => row.clone(),
            None => table.get(key)?.map(|row| {
                let (lock, _, _, live, _, value) = row.value();
                (lock.to_owned(), Usage::of_row(key, live, value.len()))
            }),
        };
        let after = match op {
            BatchOp::Put { value, .. } => Usage::of_row(key, true, value.len()),
            // Deleting a key that never existed writes no row.
            BatchOp::Delete { .. } if before.is_none() => continue,
            BatchOp::Delete { .. } => Usage::of_row(key, false, 0),
            BatchOp::Get { .. } => continue,
        };
        usage.replace(
            before.as_ref().map(|(lock, usage)| (lock.as_str(), *usage)),
            (lock, after),
        );
        rows.insert(key, Some((lock.to_owned(), after)));
    }
    Ok(usage)
}

struct RequestKey<'a> {
    key: String,
    request_id: &'a str,
    fingerprint: u64,
}

fn stored_ack(
    table: &impl ReadableTable<&'static str, (u64, u64, &'static [u8])>,
    request: &RequestKey<'_>,
) -> Result<Option<WriteAck>, StoreError> {
    let Some(row) = table.get(request.key.as_str())? else {
        return Ok(None);
    };
    let (_, fingerprint, ack) = row.value();
    if fingerprint != request.fingerprint {
        return Err(StoreError::RequestIdReused {
            request_id: request.request_id.to_owned(),
        });
    }
    let mut ack: WriteAck = serde_json::from_slice(ack).map_err(|error| StoreError::Corrupt {
        message: format!(
            "stored outcome of request {:?}: {error}",
            request.request_id
        ),
    })?;
    ack.replayed = true;
    Ok(Some(ack))
}

fn record_request(
    txn: &WriteTransaction,
    request: &RequestKey<'_>,
    ack: &WriteAck,
) -> Result<(), StoreError> {
    let ack_json = serde_json::to_vec(ack).map_err(StoreError::storage)?;
    let mut order = txn.open_table(REQUEST_ORDER_TABLE)?;
    let serial = match order.last()? {
        Some((serial, _)) => serial.value() + 1,
        None => 0,
    };
    order.insert(serial, request.key.as_str())?;
    let mut requests = txn.open_table(REQUESTS_TABLE)?;
    requests.insert(
        request.key.as_str(),
        (serial, request.fingerprint, ack_json.as_slice()),
    )?;
    while requests.len()? > REQUEST_IDS_RETAINED_MAX {
        let oldest = order
            .pop_first()?
            .map(|(_, key)| key.value().to_owned())
            .ok_or_else(|| StoreError::Corrupt {
                message: "request-id table is larger than its order table".into(),
            })?;
        requests.remove(oldest.as_str())?;
    }
    Ok(())
}

/// FNV-1a over the compares and operations: tells a retry from a different request reusing
/// its request id. A request without compares hashes as it did before compares existed, so
/// request ids stored by an older store still match their retries.
fn fingerprint(compare: &[Compare], ops: &[BatchOp]) -> u64 {
    fn feed(hash: &mut u64, bytes: &[u8]) {
        for byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            *hash ^= u64::from(*byte);
            *hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    let mut hash = 0xcbf2_9ce4_8422_2325;
    for op in ops {
        match op {
            BatchOp::Put { key, value } => {
                feed(&mut hash, b"put");
                feed(&mut hash, key.as_bytes());
                feed(&mut hash, value);
            }
            BatchOp::Delete { key } => {
                feed(&mut hash, b"delete");
                feed(&mut hash, key.as_bytes());
            }
            BatchOp::Get { key } => {
                feed(&mut hash, b"get");
                feed(&mut hash, key.as_bytes());
            }
        }
    }
    for condition in compare {
        match condition {
            Compare::Revision { key, revision } => {
                feed(&mut hash, b"if-revision");
                feed(&mut hash, key.as_bytes());
                feed(&mut hash, &revision.to_le_bytes());
            }
            Compare::Value { key, value } => {
                feed(&mut hash, b"if-value");
                feed(&mut hash, key.as_bytes());
                feed(&mut hash, value);
            }
            Compare::Exists { key, exists } => {
                feed(&mut hash, b"if-exists");
                feed(&mut hash, key.as_bytes());
                feed(&mut hash, &[u8::from(*exists)]);
            }
        }
    }
    hash
}
