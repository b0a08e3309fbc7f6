//! The replicated state machine: the lock table, applied in log order, snapshotted to disk.
//!
//! The table lives in memory; its durability comes from the Raft log plus a snapshot file
//! (`snapshot.bin`, replaced atomically; see `snapshot_file`) that lets the log be
//! purged. On start the snapshot is loaded and openraft re-applies the committed entries after
//! it.
//!
//! **Taking a snapshot does not stop applying.** The table is copy-on-write, so the snapshot
//! builder holds the state machine's lock only to clone it (O(1)); encoding and writing happen
//! on a blocking thread while entries go on being applied to the live table.
//!
//! Applying an entry also tells the rest of the server what happened: waiting acquires are
//! completed through [`Waiters`], and watchers receive [`Event`]s. Each event goes out as a
//! `Published` carrying its lock's queue length, counted once at apply, so that a watcher never
//! takes the apply lock. A lock watcher more than `WATCH_BUFFER_EVENTS` (4,096) events behind is
//! cut off; the broadcast of every event (`subscribe_events`) serves the web UI and is skipped
//! when nobody listens. Installing a snapshot bumps `installs`, after which watchers read the
//! table afresh.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use futures::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::type_config::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StoredMembership};
use palisade_core::{
    Access, Command, Event, Limits, LockTable, Output, ReleaseCause, SessionId, TimeMs, Token,
    WaitEndCause,
};
use tokio::sync::{Notify, broadcast, mpsc};

use crate::applied::Applied;
use crate::files::{SECRET_FILE_MODE, write_file_atomically};
use crate::keyring::KeyRing;
use crate::lock_watchers::{LockSubscription, LockWatchers, Published};
use crate::log_store::DurableIndex;
use crate::platform::Blocking;
use crate::raft_types::{C, Proposal, SnapshotData};
use crate::snapshot_file::{LEGACY_SNAPSHOT_FILE, SNAPSHOT_FILE};

use crate::limits::WATCH_BUFFER_EVENTS;

/// How a queued acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    Granted(Token, Access),
    Ended(WaitEndCause),
}

/// A wait's outcome, with the index of the log entry that produced it.
pub type IndexedOutcome = (u64, WaitOutcome);
type WaiterList = Vec<(u64, mpsc::UnboundedSender<IndexedOutcome>)>;

/// Acquires waiting in a lock's queue, by (session, lock), to be completed when applied.
#[derive(Debug, Default)]
pub struct Waiters {
    by_wait: Mutex<HashMap<(SessionId, String), WaiterList>>,
    last_id: std::sync::atomic::AtomicU64,
}

/// One registered interest in the waits of a session for a lock; unregisters when dropped.
///
/// It hears every wait outcome for that (session, lock) applied after it registered, each with
/// its log index: the caller keeps only outcomes applied after its own acquire, because an
/// earlier wait of the same session (ended in the same entry, before the acquire) is not its.
#[derive(Debug)]
pub struct WaitRegistration<'a> {
    waiters: &'a Waiters,
    key: (SessionId, String),
    id: u64,
    pub outcomes: mpsc::UnboundedReceiver<IndexedOutcome>,
}

impl Drop for WaitRegistration<'_> {
    fn drop(&mut self) {
        let mut by_wait = self.waiters.lock();
        if let Some(list) = by_wait.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                by_wait.remove(&self.key);
            }
        }
    }
}

impl WaitRegistration<'_> {
    /// The first outcome produced by an entry after `index` (the caller's own acquire); `None`
    /// if the state machine went away.
    pub async fn outcome_after(&mut self, index: u64) -> Option<WaitOutcome> {
        loop {
            let (at, outcome) = self.outcomes.recv().await?;
            if at > index {
                return Some(outcome);
            }
        }
    }
}

impl Waiters {
    /// Registers interest in the outcomes of `session`'s waits for `lock`. Register before
    /// proposing the acquire, so the grant cannot be applied in between unseen. A retried
    /// acquire registers again; every registration hears every outcome.
    pub fn register(&self, session: SessionId, lock: &str) -> WaitRegistration<'_> {
        let (tx, outcomes) = mpsc::unbounded_channel();
        let id = self
            .last_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = (session, lock.to_string());
        self.lock().entry(key.clone()).or_default().push((id, tx));
        WaitRegistration {
            waiters: self,
            key,
            id,
            outcomes,
        }
    }

    /// How many acquires wait on this node.
    pub fn count(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    fn complete(&self, session: SessionId, lock: &str, index: u64, outcome: WaitOutcome) {
        if let Some(list) = self.lock().get(&(session, lock.to_string())) {
            for (_, tx) in list {
                let _ = tx.send((index, outcome));
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<(SessionId, String), WaiterList>> {
        self.by_wait.lock().expect("waiters lock poisoned")
    }
}

/// Writes the snapshot a restored data directory starts from: `table` and `keys`, at no log
/// position and with no membership, so the node bootstraps a new cluster on top of them
/// (see [`crate::backup`]).
pub(crate) fn write_restored(dir: &Path, table: LockTable, keys: KeyRing) -> io::Result<()> {
    let applied = Applied {
        table,
        last_applied: None,
        membership: StoredMembership::default(),
        retired: BTreeSet::new(),
        keys,
    };
    let bytes = crate::snapshot_file::encode(&applied)?;
    write_snapshot_file(dir, &bytes)
}

/// Replaces the snapshot file with `bytes`, then removes the JSON snapshot of an older
/// version, if any: the new file wins over it from the moment it is durable.
fn write_snapshot_file(dir: &Path, bytes: &[u8]) -> io::Result<()> {
    write_file_atomically(dir, SNAPSHOT_FILE, bytes, Some(SECRET_FILE_MODE))?;
    match std::fs::remove_file(dir.join(LEGACY_SNAPSHOT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether `dir` holds a snapshot file (this version's or an older version's).
pub(crate) fn snapshot_exists(dir: &Path) -> io::Result<bool> {
    for name in [SNAPSHOT_FILE, LEGACY_SNAPSHOT_FILE] {
        match std::fs::symlink_metadata(dir.join(name)) {
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(false)
}

/// The snapshot file in `dir` (this version's, else an older version's JSON) and its path,
/// if there is one.
fn read_snapshot_file(dir: &Path) -> io::Result<Option<(Vec<u8>, PathBuf)>> {
    for name in [SNAPSHOT_FILE, LEGACY_SNAPSHOT_FILE] {
        let path = dir.join(name);
        match std::fs::read(&path) {
            Ok(bytes) => return Ok(Some((bytes, path))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// What the rest of the server shares with the state machine.
#[derive(Debug)]
pub struct Shared {
    applied: Mutex<Applied>,
    /// The key ring's signing key, kept beside the ring whenever it changes, so that signing a
    /// grant does not take the lock the apply path holds.
    signing_key: std::sync::RwLock<Option<palisade_sequencer::SigningKey>>,
    waiters: Waiters,
    /// Every event, for the few that follow them all (the web UI).
    events: broadcast::Sender<Published>,
    /// Each lock's events, for its watchers.
    lock_watchers: Arc<LockWatchers>,
    lease_alarm: LeaseAlarm,
    /// How many snapshots this node has installed since it started. A snapshot replaces the
    /// table without events, so a watcher that sees this change reads the lock's state afresh.
    installs: tokio::sync::watch::Sender<u64>,
    durable: DurableIndex,
    dir: PathBuf,
    /// The counters' high-water mark (see [`crate::counters`]).
    marks: crate::counters::Marks,
    /// The last log id of the snapshot in the file, held while the file is replaced. A
    /// snapshot built here and one installed from the leader can be under way at once; the
    /// file only ever moves forward, so the older of the two is not written over the newer.
    stored: Mutex<Option<LogIdOf<C>>>,
}

/// The handshake between the state machine and the lease driver. The driver announces the
/// table time at which it will look at the table by itself ([`LeaseAlarm::set`]); the state
/// machine wakes it only when an applied batch brings a deadline before that, or replaces the
/// table. Take [`LeaseAlarm::notified`] before reading the table and setting the alarm, then read
/// again: a batch applied in between either shows in the second read or, reading the alarm
/// after it was set, wakes the driver.
#[derive(Debug)]
pub struct LeaseAlarm {
    at_ms: std::sync::atomic::AtomicU64,
    notify: Notify,
}

impl LeaseAlarm {
    fn new() -> LeaseAlarm {
        LeaseAlarm {
            at_ms: std::sync::atomic::AtomicU64::new(TimeMs::MAX.as_millis()),
            notify: Notify::new(),
        }
    }

    /// Resolves at the next wake-up (or at once if one is pending).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// The driver will look at the table by itself at `at_ms` ([`TimeMs::MAX`]: only when
    /// woken).
    pub fn set(&self, at_ms: TimeMs) {
        self.at_ms.store(at_ms.as_millis(), Ordering::SeqCst);
    }

    /// Wakes the driver if `next_deadline` comes before the time it announced.
    fn wake_if_before(&self, next_deadline: Option<TimeMs>) {
        let at_ms = TimeMs::from_millis(self.at_ms.load(Ordering::SeqCst));
        if next_deadline.is_some_and(|deadline| deadline < at_ms) {
            self.notify.notify_one();
        }
    }

    fn wake(&self) {
        self.notify.notify_one();
    }
}

impl Shared {
    /// Reads the lock table. Hold the closure short: it blocks applying.
    pub fn read<R>(&self, f: impl FnOnce(&LockTable) -> R) -> R {
        f(&self.applied().table)
    }

    /// Acquires waiting in a queue on this node.
    pub fn waiters(&self) -> &Waiters {
        &self.waiters
    }

    /// Every event of every applied entry from now on, each with its lock's queue length.
    /// Wakes its receiver for every event: a watcher of one lock takes
    /// [`Shared::subscribe_lock`] instead.
    pub fn subscribe_events(&self) -> broadcast::Receiver<Published> {
        self.events.subscribe()
    }

    /// The events of `lock` from now on, each with the lock's queue length.
    pub fn subscribe_lock(&self, lock: &str) -> LockSubscription {
        self.lock_watchers.subscribe(lock)
    }

    /// Changes whenever this node installs a snapshot (its value: how many it has installed).
    pub fn subscribe_installs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.installs.subscribe()
    }

    /// A copy of everything applied so far: what a backup holds (see [`crate::backup`]).
    pub(crate) fn applied_copy(&self) -> Applied {
        self.applied().clone()
    }

    /// The key ring's signing key, if anyone has rotated; read without the apply lock.
    pub fn signing_key(&self) -> Option<palisade_sequencer::SigningKey> {
        self.signing_key
            .read()
            .expect("signing key lock poisoned")
            .clone()
    }

    fn set_signing_key(&self, ring: &KeyRing) {
        *self.signing_key.write().expect("signing key lock poisoned") = ring.signing();
    }

    /// Reads the signing keys. Hold the closure short: it blocks applying.
    pub fn read_keys<R>(&self, f: impl FnOnce(&KeyRing) -> R) -> R {
        f(&self.applied().keys)
    }

    /// Whether node `id` was a member of this cluster and was removed.
    pub fn is_retired(&self, id: u64) -> bool {
        self.applied().retired.contains(&id)
    }

    /// How many snapshots this node has installed since it started.
    pub fn installs(&self) -> u64 {
        *self.installs.borrow()
    }

    pub fn lease_alarm(&self) -> &LeaseAlarm {
        &self.lease_alarm
    }

    /// The counters' high-water mark this node keeps.
    pub fn marks(&self) -> &crate::counters::Marks {
        &self.marks
    }

    /// The mark of the state applied now: its log id, counters and voters, read together.
    pub fn counter_mark(&self) -> crate::counters::CounterMark {
        let applied = self.applied();
        crate::counters::CounterMark::new(
            applied.last_applied,
            applied.table.last_token(),
            applied.table.last_session(),
            crate::counters::now_unix_ms(),
            applied.membership.membership().voter_ids().collect(),
        )
    }

    /// The last log id applied.
    pub fn last_applied(&self) -> Option<LogIdOf<C>> {
        self.applied().last_applied
    }

    fn applied(&self) -> MutexGuard<'_, Applied> {
        self.applied.lock().expect("state machine lock poisoned")
    }

    /// Writes the snapshot `bytes`, up to `last_applied`, unless the file already holds one at
    /// least as far along. Blocks on file I/O: call it on a blocking thread.
    fn store_snapshot(&self, bytes: &[u8], last_applied: Option<LogIdOf<C>>) -> io::Result<()> {
        let mut stored = self.stored.lock().expect("snapshot file lock poisoned");
        if stored.is_some() && *stored >= last_applied {
            return Ok(());
        }
        write_snapshot_file(&self.dir, bytes)?;
        *stored = last_applied;
        metrics::gauge!(crate::metrics::SNAPSHOT_BYTES).set(bytes.len() as f64);
        Ok(())
    }
}

/// The state machine handed to openraft. Clones share one [`Shared`].
#[derive(Debug, Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
    /// Where snapshot files are written.
    blocking: Blocking,
}

impl StateMachine {
    /// Loads the snapshot in `dir`, if any, or starts an empty table with the default limits.
    ///
    /// **Architecture Invariant:** the limits are never set here. They decide outcomes, so they
    /// come only from the snapshot and from `SetLimits` entries of the log; a replay after a
    /// restart with other flags then gives exactly the outcomes (and tokens) it gave before.
    pub fn open(dir: &Path, durable: DurableIndex) -> io::Result<StateMachine> {
        StateMachine::open_with(dir, durable, Blocking::Threads)
    }

    /// [`StateMachine::open`], writing snapshots where `blocking` says.
    pub fn open_with(
        dir: &Path,
        durable: DurableIndex,
        blocking: Blocking,
    ) -> io::Result<StateMachine> {
        let applied = match read_snapshot_file(dir)? {
            Some((bytes, path)) => {
                metrics::gauge!(crate::metrics::SNAPSHOT_BYTES).set(bytes.len() as f64);
                decode_snapshot(&bytes, &path.display().to_string())?
            }
            None => Applied {
                table: LockTable::new(Limits::default()),
                last_applied: None,
                membership: StoredMembership::default(),
                retired: BTreeSet::new(),
                keys: KeyRing::default(),
            },
        };
        let applied_at = applied.last_applied;
        let (events, _) = broadcast::channel(WATCH_BUFFER_EVENTS);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                signing_key: std::sync::RwLock::new(applied.keys.signing()),
                applied: Mutex::new(applied),
                waiters: Waiters::default(),
                events,
                lock_watchers: Arc::default(),
                lease_alarm: LeaseAlarm::new(),
                installs: tokio::sync::watch::channel(0).0,
                durable,
                dir: dir.to_path_buf(),
                marks: crate::counters::Marks::new(dir),
                stored: Mutex::new(applied_at),
            }),
            blocking,
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Completes the waits `output` ends and sends its events to the watchers, the `i`th with
    /// `waiters[i]`, its lock's queue length once the entry was applied.
    fn publish(&self, output: &Output, waiters: &[u64], index: u64) {
        assert_eq!(
            output.events.len(),
            waiters.len(),
            "every published event carries its lock's queue length"
        );
        for (event, &waiters) in output.events.iter().zip(waiters) {
            match event {
                Event::Granted {
                    lock,
                    session,
                    token,
                    access,
                    ..
                } => {
                    metrics::counter!(crate::metrics::GRANTS).increment(1);
                    self.shared.waiters.complete(
                        *session,
                        lock,
                        index,
                        WaitOutcome::Granted(*token, *access),
                    );
                }
                Event::Released { cause, .. } => {
                    let cause = match cause {
                        ReleaseCause::Released => "released",
                        ReleaseCause::SessionExpired => "expired",
                        ReleaseCause::SessionClosed => "closed",
                    };
                    metrics::counter!(crate::metrics::RELEASES, "cause" => cause).increment(1);
                }
                Event::WaitEnded {
                    lock,
                    session,
                    cause,
                    ..
                } => {
                    self.shared
                        .waiters
                        .complete(*session, lock, index, WaitOutcome::Ended(*cause));
                }
                Event::SessionEnded { expired: true, .. } => {
                    metrics::counter!(crate::metrics::SESSION_EXPIRIES).increment(1);
                }
                Event::SessionEnded { .. } | Event::ValueSet { .. } => {}
            }
            let published = Published {
                event: event.clone(),
                waiters,
            };
            if self.shared.events.receiver_count() > 0 {
                // A receiver that went in between is not an error.
                let _ = self.shared.events.send(published.clone());
            }
            self.shared.lock_watchers.publish(published);
        }
    }
}

/// The queue length of each event's lock in `table`, in the events' order. One look-up per
/// event, whatever the queue's length.
fn waiter_counts(table: &LockTable, events: &[Event]) -> Vec<u64> {
    events
        .iter()
        .map(|event| {
            event
                .lock()
                .map_or(0, |lock| table.waiter_count(lock) as u64)
        })
        .collect()
}

/// Decodes a snapshot from outside this process, in this version's format or an older
/// version's JSON (`source` names it in errors); see [`crate::snapshot_file::decode`].
fn decode_snapshot(bytes: &[u8], source: &str) -> io::Result<Applied> {
    crate::snapshot_file::decode(bytes, source)
}

impl RaftSnapshotBuilder<C> for StateMachine {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<C, SnapshotData>, io::Error> {
        let started = Instant::now();
        // The only work under the lock: an O(1) copy of the copy-on-write table.
        let applied = {
            let guard = self.shared.applied();
            let locked = Instant::now();
            let copy = guard.clone();
            drop(guard);
            metrics::histogram!(crate::metrics::SNAPSHOT_LOCK_SECONDS)
                .record(locked.elapsed().as_secs_f64());
            copy
        };
        let meta = SnapshotMetaOf::<C> {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
        };
        let shared = self.shared.clone();
        let bytes = self
            .blocking
            .run(move || {
                let bytes = crate::snapshot_file::encode(&applied)?;
                shared.store_snapshot(&bytes, applied.last_applied)?;
                Ok::<_, io::Error>(bytes)
            })
            .await??;
        metrics::histogram!(crate::metrics::SNAPSHOT_BUILD_SECONDS)
            .record(started.elapsed().as_secs_f64());
        Ok(SnapshotOf::<C, SnapshotData> {
            meta,
            snapshot: Cursor::new(bytes),
        })
    }
}

impl RaftStateMachine<C> for StateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<C>>, StoredMembershipOf<C>), io::Error> {
        let applied = self.shared.applied();
        Ok((applied.last_applied, applied.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<EntryResponder<C>, io::Error>> + Unpin + OptionalSend,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            // Invariant 2, where it is consumed: nothing is applied, and so nothing becomes
            // visible to a client, before this node's log holds it on disk. openraft may hand
            // over an entry a quorum has made durable before this node's own fsync returned.
            self.shared.durable.wait_durable(entry.log_id.index).await?;
            assert!(
                entry.log_id.index < self.shared.durable.end(),
                "applying log entry {} before it is durable",
                entry.log_id.index
            );
            let mut jumped = false;
            let (output, waiters) = {
                let mut applied = self.shared.applied();
                applied.last_applied = Some(entry.log_id);
                let output = match entry.payload {
                    EntryPayload::Normal(Proposal::Lock(input))
                        if matches!(input.command, Command::RaiseTokenFloor { .. }) =>
                    {
                        jumped = true;
                        Some(applied.table.apply(input))
                    }
                    EntryPayload::Blank => None,
                    EntryPayload::Normal(Proposal::Lock(input)) => Some(applied.table.apply(input)),
                    EntryPayload::Normal(Proposal::Keys { keys }) => {
                        // The leader checked the change against the same ring; a change that
                        // lost a race to another is refused here alike on every member.
                        match applied.keys.apply(&keys) {
                            Ok(()) => self.shared.set_signing_key(&applied.keys),
                            Err(refusal) => {
                                tracing::warn!(%refusal, "a key change did not apply");
                            }
                        }
                        None
                    }
                    EntryPayload::Membership(membership) => {
                        let after: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
                        let removed: Vec<u64> = applied
                            .membership
                            .membership()
                            .nodes()
                            .map(|(id, _)| *id)
                            .filter(|id| !after.contains(id))
                            .collect();
                        applied.retired.extend(removed);
                        applied.membership = StoredMembership::new(Some(entry.log_id), membership);
                        None
                    }
                };
                // Counted here, once per event, while the table is at hand: a watcher then
                // reads the count from the event and never takes the table (finding M4).
                let waiters = output
                    .as_ref()
                    .map(|output| waiter_counts(&applied.table, &output.events))
                    .unwrap_or_default();
                (output, waiters)
            };
            if jumped {
                // The counters jumped past what their rate bounds: the mark records it before
                // any later entry applies, so no grant above the jump is answered while a
                // recovery from the mark would still place tokens below it (invariant 13).
                let shared = self.shared.clone();
                self.blocking
                    .run(move || shared.marks.record(shared.counter_mark()))
                    .await??;
            }
            if let Some(output) = &output {
                self.publish(output, &waiters, entry.log_id.index);
            }
            if let Some(responder) = responder {
                responder.send(output.unwrap_or(Output {
                    result: Ok(palisade_core::Reply::Ticked),
                    events: Vec::new(),
                }));
            }
        }
        let next_deadline = {
            let applied = self.shared.applied();
            metrics::gauge!(crate::metrics::SESSIONS).set(applied.table.session_count() as f64);
            metrics::gauge!(crate::metrics::LOCKS).set(applied.table.lock_count() as f64);
            applied.table.next_deadline_ms()
        };
        self.shared.lease_alarm.wake_if_before(next_deadline);
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<C>,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let bytes = snapshot.into_inner();
        let (shared, meta) = (self.shared.clone(), meta.clone());
        let installed = self
            .blocking
            .run(move || {
                let mut installed = decode_snapshot(&bytes, "the snapshot sent by the leader")?;
                installed.last_applied = meta.last_log_id;
                installed.membership = meta.last_membership;
                let bytes = crate::snapshot_file::encode(&installed)?;
                shared.store_snapshot(&bytes, installed.last_applied)?;
                Ok::<_, io::Error>(installed)
            })
            .await??;
        self.shared.set_signing_key(&installed.keys);
        *self.shared.applied() = installed;
        // Only a follower installs a snapshot, and a node's queued acquires end when it stops
        // leading, so no waiter is left to complete here. Watchers read the new state, and the
        // lease driver (should this node lead next) looks at the new deadlines.
        self.shared.installs.send_modify(|n| *n += 1);
        self.shared.lease_alarm.wake();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<C, SnapshotData>>, io::Error> {
        let dir = self.shared.dir.clone();
        let found = self
            .blocking
            .run(move || {
                let Some((bytes, path)) = read_snapshot_file(&dir)? else {
                    return Ok(None);
                };
                let source = path.display().to_string();
                let meta = crate::snapshot_file::decode_meta(&bytes, &source)?;
                Ok::<_, io::Error>(Some((bytes, meta)))
            })
            .await??;
        let Some((bytes, (last_applied, membership))) = found else {
            return Ok(None);
        };
        if last_applied.is_none() {
            // The base a restored directory starts from, at no log position: not a snapshot of
            // the log (see `write_restored`).
            return Ok(None);
        }
        let meta = SnapshotMetaOf::<C> {
            last_log_id: last_applied,
            last_membership: membership,
        };
        Ok(Some(SnapshotOf::<C, SnapshotData> {
            meta,
            snapshot: Cursor::new(bytes),
        }))
    }
}

/// The Raft instance over this state machine: what a node runs and its peer service serves.
pub type PalisadeRaft = openraft::Raft<crate::raft_types::TypeConfig, StateMachine>;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_that_ended_before_the_acquire_is_not_its_outcome() {
        let waiters = Waiters::default();
        let session = SessionId::new(7);
        let mut registration = waiters.register(session, "l");
        // An earlier wait of session 7 timed out in entry 10, the same entry that applied the
        // new acquire (its deadline passed just before the command); the new wait is granted
        // in entry 12.
        waiters.complete(session, "l", 10, WaitOutcome::Ended(WaitEndCause::TimedOut));
        waiters.complete(
            session,
            "other",
            11,
            WaitOutcome::Granted(Token::new(3), Access::Exclusive),
        );
        waiters.complete(
            session,
            "l",
            12,
            WaitOutcome::Granted(Token::new(4), Access::Exclusive),
        );
        assert_eq!(
            registration.outcome_after(10).await,
            Some(WaitOutcome::Granted(Token::new(4), Access::Exclusive))
        );
        drop(registration);
        assert_eq!(waiters.count(), 0, "a dropped registration is gone");
    }

    #[test]
    fn a_handoff_publishes_the_queue_length_after_it_without_a_copy_of_the_queue() {
        use palisade_core::{Command, DurationMs, Input, RequestId, Wait};
        let mut table = LockTable::new(Limits::default());
        let now_ms = TimeMs::from_millis(1);
        let mut apply = |command| table.apply(Input { now_ms, command });
        // Phase 1: session 1 holds "l", sessions 2 to 4 queue behind it, 5 holds "m".
        for _ in 1..=5 {
            let command = Command::OpenSession {
                open_key: None,
                ttl_ms: DurationMs::from_millis(10_000),
                secret_digest: None,
                owner: None,
            };
            apply(command).result.unwrap();
        }
        for (session, lock, wait) in [
            (1, "l", Wait::Try),
            (2, "l", Wait::Forever),
            (3, "l", Wait::Forever),
            (4, "l", Wait::Forever),
            (5, "m", Wait::Try),
        ] {
            let command = Command::Acquire {
                session: SessionId::new(session),
                lock: lock.into(),
                request_id: RequestId::new(session),
                wait,
                value: None,
                mode: palisade_core::Mode::Exclusive,
            };
            apply(command).result.unwrap();
        }
        // Phase 2: the release hands "l" to session 2; both events carry the two still waiting.
        let output = apply(Command::Release {
            session: SessionId::new(1),
            lock: "l".into(),
            request_id: RequestId::new(10),
        });
        output.result.unwrap();
        assert!(
            matches!(
                output.events.as_slice(),
                [Event::Released { .. }, Event::Granted { .. }]
            ),
            "{:?}",
            output.events
        );
        assert_eq!(waiter_counts(&table, &output.events), vec![2, 2]);
        assert_eq!(table.lock_status("l").unwrap().waiters.len(), 2);
        assert_eq!(table.waiter_count("m"), 0);
        assert_eq!(table.waiter_count("unknown"), 0);
    }

    /// A snapshot of one session holding one lock, as JSON to tamper with.
    fn snapshot_holding_a_lock() -> serde_json::Value {
        serde_json::to_value(applied_holding_a_lock()).unwrap()
    }

    /// The state of one session holding lock "l".
    pub(crate) fn applied_holding_a_lock() -> Applied {
        use palisade_core::{Command, DurationMs, Input, RequestId};
        let mut table = LockTable::new(Limits::default());
        for command in [
            Command::OpenSession {
                open_key: None,
                ttl_ms: DurationMs::from_millis(10_000),
                secret_digest: None,
                owner: None,
            },
            Command::Acquire {
                session: SessionId::new(1),
                lock: "l".into(),
                request_id: RequestId::new(1),
                wait: palisade_core::Wait::Try,
                value: None,
                mode: palisade_core::Mode::Exclusive,
            },
        ] {
            let now_ms = TimeMs::from_millis(1);
            table.apply(Input { now_ms, command }).result.unwrap();
        }
        Applied {
            table,
            last_applied: None,
            membership: StoredMembership::default(),
            retired: BTreeSet::new(),
            keys: KeyRing::default(),
        }
    }

    #[test]
    fn an_older_versions_json_snapshot_loads_and_is_refused_if_its_table_breaks_its_invariants() {
        let dir = tempfile::tempdir().unwrap();
        let write = |snapshot: &serde_json::Value| {
            std::fs::write(dir.path().join(LEGACY_SNAPSHOT_FILE), snapshot.to_string()).unwrap()
        };
        let good = snapshot_holding_a_lock();
        write(&good);
        let loaded = StateMachine::open(dir.path(), DurableIndex::default())
            .expect("a valid snapshot loads");
        let holder = loaded.shared().read(|table| table.holder("l"));
        assert_eq!(holder.map(|g| g.session), Some(SessionId::new(1)));

        // The token counter behind the holder's token: the next grant would repeat a token.
        let mut behind = good.clone();
        behind["table"]["last_token"] = 0.into();
        // Limits above their ceilings.
        let mut loose = good.clone();
        loose["table"]["limits"]["sessions_max"] = (palisade_core::limits::SESSIONS_MAX + 1).into();
        for (bad, why) in [(behind, "above the counter"), (loose, "sessions_max")] {
            write(&bad);
            let refused = StateMachine::open(dir.path(), DurableIndex::default()).unwrap_err();
            assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
            let message = refused.to_string();
            assert!(
                message.contains("snapshot.json is refused") && message.contains(why),
                "{message}"
            );
        }
    }
    #[test]
    fn a_binary_snapshot_replaces_the_json_one_loads_whole_and_a_torn_one_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let json = serde_json::to_vec(&applied_holding_a_lock()).unwrap();
        std::fs::write(dir.path().join(LEGACY_SNAPSHOT_FILE), json).unwrap();
        // Phase 1: a data directory of an older version is written in the new format.
        let applied = applied_holding_a_lock();
        write_restored(dir.path(), applied.table.clone(), KeyRing::default()).unwrap();
        assert!(
            !dir.path().join(LEGACY_SNAPSHOT_FILE).exists(),
            "the JSON file is gone"
        );
        let loaded = StateMachine::open(dir.path(), DurableIndex::default()).unwrap();
        assert!(loaded.shared().read(|table| *table == applied.table));

        // Phase 2: a torn file is refused with the reason, not loaded as a smaller table.
        let path = dir.path().join(SNAPSHOT_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let refused = StateMachine::open(dir.path(), DurableIndex::default()).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
        let message = refused.to_string();
        assert!(
            message.contains("snapshot.bin is refused: it is torn"),
            "{message}"
        );
    }

    #[test]
    fn an_older_snapshot_finishing_late_does_not_replace_a_newer_one() {
        use openraft::vote::RaftLeaderId;
        let dir = tempfile::tempdir().unwrap();
        let machine = StateMachine::open(dir.path(), DurableIndex::default()).unwrap();
        let at = |index| {
            Some(LogIdOf::<C>::new(
                openraft::type_config::alias::CommittedLeaderIdOf::<C>::new(1, 1),
                index,
            ))
        };
        let shared = machine.shared();
        // The leader's snapshot up to 20 is installed while a local one up to 10 is encoded.
        shared.store_snapshot(b"newer", at(20)).unwrap();
        shared.store_snapshot(b"older", at(10)).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(SNAPSHOT_FILE)).unwrap(),
            b"newer"
        );
        shared.store_snapshot(b"newest", at(30)).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(SNAPSHOT_FILE)).unwrap(),
            b"newest"
        );
    }
}
