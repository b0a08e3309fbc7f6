//! Invariant 13, no sequencer is ever issued twice: the durable high-water mark of the token
//! and session counters, kept beside the signing key, and the recovery of the counters when
//! the log falls short of it.
//!
//! A sequencer is the signing key's signature over (lock, token, session). Whatever keeps the
//! key but loses the log's end (a deleted `raft.wal`, an older copy put back, a cut after bit
//! rot) would restart the counters below tokens and session ids already handed out, and sign
//! the very same sequencers again. So each node keeps [`MARK_FILE`]: the last applied log id
//! with the counters read at that point and the wall-clock time of the reading. It is written
//! from the applied state, atomically, at most every [`MARK_INTERVAL`] while entries apply (by
//! a task of its own, off the apply path), at once after an entry that jumps the counters
//! (`RaiseTokenFloor`: the counters' rate no longer bounds them), at a clean shutdown, and by
//! every restore and new data directory, before the key exists.
//!
//! At start ([`check_at_start`]), a directory with a key whose log (snapshot and `raft.wal`)
//! does not reach the mark refuses to start unless a pending floor above the mark is kept
//! (`token-floor-pending`, see `wal`): [`recover`] (`palisade recover-counters`)
//! writes one, relative to the mark ([`palisade_core::limits::recovery_floors`]); the node
//! proposes it before it grants anything, and votes carry it to the next leader.
//!
//! What the mark cannot see: a directory rolled back whole (mark, key and log together, as a
//! VM or filesystem snapshot does) looks current. That is a restore, and needs the restore
//! procedure (`palisade cluster backup` / `palisade restore`, or `recover-counters` by hand).

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use openraft::type_config::alias::LogIdOf;
use palisade_core::limits::{RecoveryFloors, recovery_floors};
use palisade_core::{SessionId, Token};
use serde::{Deserialize, Serialize};

use crate::files::{SECRET_FILE_MODE, read_small_file, write_file_atomically};
use crate::raft_types::C;

/// The mark's file, beside `signing.key`.
pub const MARK_FILE: &str = "counters-mark.json";

/// The format version written in every mark.
const MARK_FORMAT: u32 = 1;

/// A mark is a few hundred bytes; anything longer is not one.
const MARK_BYTES_MAX: u64 = 64 * 1024;

/// How often, at most, the mark is rewritten while entries apply.
pub const MARK_INTERVAL: Duration = Duration::from_millis(100);

/// The command that recovers a directory whose log falls short of its mark.
pub const RECOVER_COMMAND: &str = "palisade recover-counters --data-dir";

/// The high-water mark of the counters, as [`MARK_FILE`] holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterMark {
    palisade_counter_mark: u32,
    /// The last log entry applied when the counters were read (`None`: none yet, as in a new
    /// or restored directory, whose counters are its snapshot's).
    pub log_id: Option<LogIdOf<C>>,
    /// The token counter (the last token granted) at `log_id`.
    pub last_token: Token,
    /// The session counter (the last session id assigned) at `log_id`.
    pub last_session: SessionId,
    /// When the counters were read, in milliseconds since 1970 (this node's wall clock).
    pub read_at_unix_ms: u64,
    /// The voters of the membership at `log_id`: a member of a larger cluster is replaced, not
    /// recovered, when its log is lost.
    #[serde(default)]
    pub voters: Vec<u64>,
}

impl CounterMark {
    pub fn new(
        log_id: Option<LogIdOf<C>>,
        last_token: Token,
        last_session: SessionId,
        read_at_unix_ms: u64,
        voters: Vec<u64>,
    ) -> CounterMark {
        CounterMark {
            palisade_counter_mark: MARK_FORMAT,
            log_id,
            last_token,
            last_session,
            read_at_unix_ms,
            voters,
        }
    }

    /// Whether both counters of `self` are at or above those of `other`.
    fn counters_at_least(&self, other: &CounterMark) -> bool {
        self.last_token >= other.last_token && self.last_session >= other.last_session
    }

    /// Whether `floor` places both counters above this mark's.
    fn covered_by(&self, floor: &PendingFloor) -> bool {
        floor.token > self.last_token && floor.session.is_some_and(|s| s > self.last_session)
    }
}

/// Milliseconds since 1970 on this machine's wall clock (0 before 1970; a simulation's own
/// clock under `palisade_clock::wall::simulate_thread`).
pub fn now_unix_ms() -> u64 {
    palisade_clock::wall::unix_ms()
}

/// The floors a recovery at `now_unix_ms` places the counters at: relative to `mark`, or, with
/// no mark, at the time floor ([`recovery_floors`]).
pub(crate) fn floors_after(mark: Option<&CounterMark>, now_unix_ms: u64) -> RecoveryFloors {
    match mark {
        Some(mark) => recovery_floors(
            mark.last_token,
            mark.last_session,
            mark.read_at_unix_ms,
            now_unix_ms,
        ),
        None => recovery_floors(Token::ZERO, SessionId::new(0), now_unix_ms, now_unix_ms),
    }
}

/// The mark in `dir`, if there is one.
pub fn read(dir: &Path) -> io::Result<Option<CounterMark>> {
    let path = dir.join(MARK_FILE);
    let Some(bytes) = crate::files::read_small_file(&path, MARK_BYTES_MAX)? else {
        return Ok(None);
    };
    let unreadable = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is not a counter mark ({why}); it records the highest token and session id \
                 this node issued. If it was damaged, run `{RECOVER_COMMAND} {}`, which places \
                 the counters above any value they can have had",
                path.display(),
                dir.display()
            ),
        )
    };
    if bytes.len() as u64 > MARK_BYTES_MAX {
        return Err(unreadable(format!("longer than {MARK_BYTES_MAX} bytes")));
    }
    let mark: CounterMark =
        serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
    if mark.palisade_counter_mark != MARK_FORMAT {
        return Err(unreadable(format!(
            "format {}, not {MARK_FORMAT}, the one this version reads",
            mark.palisade_counter_mark
        )));
    }
    Ok(Some(mark))
}

/// Replaces the mark in `dir` with `mark`, atomically and durably.
pub fn write(dir: &Path, mark: &CounterMark) -> io::Result<()> {
    let bytes = serde_json::to_vec(mark).map_err(io::Error::other)?;
    write_file_atomically(dir, MARK_FILE, &bytes, Some(SECRET_FILE_MODE))
}

/// The mark a running node keeps: the last one written, so that a write that would lower the
/// counters (the replay of a log that a recovery's floor has not caught up with yet) or repeat
/// the log id is skipped.
#[derive(Debug)]
pub struct Marks {
    dir: std::path::PathBuf,
    written: Mutex<Option<CounterMark>>,
}

impl Marks {
    pub fn new(dir: &Path) -> Marks {
        Marks {
            dir: dir.to_path_buf(),
            written: Mutex::new(None),
        }
    }

    /// Starts from the mark found (or written) at start.
    pub fn start_from(&self, mark: CounterMark) {
        *self.written.lock().expect("marks lock poisoned") = Some(mark);
    }

    /// Whether a mark at `log_id` would be new.
    pub fn is_behind(&self, log_id: Option<LogIdOf<C>>) -> bool {
        self.written
            .lock()
            .expect("marks lock poisoned")
            .as_ref()
            .is_some_and(|written| written.log_id != log_id)
    }

    /// Writes `mark` unless it repeats the last one's log id or lowers a counter. Blocks on
    /// file I/O: call it on a blocking thread. Does nothing before [`Marks::start_from`].
    pub fn record(&self, mark: CounterMark) -> io::Result<()> {
        let mut written = self.written.lock().expect("marks lock poisoned");
        let Some(last) = written.as_ref() else {
            return Ok(());
        };
        if last.log_id == mark.log_id || !mark.counters_at_least(last) {
            return Ok(());
        }
        write(&self.dir, &mark)?;
        *written = Some(mark);
        Ok(())
    }
}

/// What the start found of the counters.
#[derive(Debug)]
pub struct Found<'a> {
    /// Whether `signing.key` existed before this start.
    pub key_existed: bool,
    /// How far the log reaches: the last log id of the snapshot or `raft.wal`, whichever is
    /// further.
    pub log_reach: Option<LogIdOf<C>>,
    /// The snapshot's last log id and counters (an empty table's when there is none).
    pub snapshot_log_id: Option<LogIdOf<C>>,
    pub snapshot_token: Token,
    pub snapshot_session: SessionId,
    /// Whether a snapshot file exists (a restored directory's has no log id).
    pub snapshot_exists: bool,
    pub dir: &'a Path,
}

/// Checks the counters of a directory at start, before the key is loaded or created, and
/// returns the mark the node goes on from (written here for a new directory or one from a
/// version before marks). An error says why the node must not start and how to recover.
pub fn check_at_start(found: &Found<'_>) -> Result<CounterMark, String> {
    let dir = found.dir;
    let io = |e: io::Error| e.to_string();
    let snapshot_mark = || {
        CounterMark::new(
            found.snapshot_log_id,
            found.snapshot_token,
            found.snapshot_session,
            now_unix_ms(),
            Vec::new(),
        )
    };
    let has_log = found.log_reach.is_some() || found.snapshot_exists;
    let Some(mark) = read(dir).map_err(io)? else {
        if found.key_existed && !has_log {
            // A key with nothing beside it: the log of a directory from before marks is lost.
            if pending_token_floor(dir)
                .map_err(io)?
                .is_some_and(|floor| floor.session.is_some())
            {
                let mark = snapshot_mark();
                write(dir, &mark).map_err(io)?;
                return Ok(mark);
            }
            return Err(format!(
                "{} holds the signing key but no log, no snapshot and no counter mark: its log \
                 was lost, and starting would issue tokens and session ids from 1 again, the \
                 same sequencers as before. Run `{RECOVER_COMMAND} {}` to place the counters \
                 above any value they can have had, then start again (docs/cluster.md, \
                 \"Recovering the counters\")",
                dir.display(),
                dir.display()
            ));
        }
        // A new directory, or one from a version before marks (an upgrade): its log is
        // what it is; record the snapshot's counters now, the writer follows the replay.
        let mark = snapshot_mark();
        write(dir, &mark).map_err(io)?;
        return Ok(mark);
    };
    let behind_log = found.log_reach < mark.log_id;
    // The replay of a log that ends at the snapshot gives exactly the snapshot's counters.
    let behind_counters = found.log_reach <= found.snapshot_log_id
        && (found.snapshot_token < mark.last_token || found.snapshot_session < mark.last_session);
    if !behind_log && !behind_counters {
        return Ok(mark);
    }
    let pending = pending_token_floor(dir).map_err(io)?;
    if pending.as_ref().is_some_and(|floor| mark.covered_by(floor)) {
        return Ok(mark);
    }
    let reach = match &found.log_reach {
        Some(log_id) => format!(
            "reaches entry {} (term {})",
            log_id.index, log_id.leader_id.term
        ),
        None if found.snapshot_exists => "holds a snapshot below the mark".to_string(),
        None => "is missing or empty".to_string(),
    };
    let marked = match &mark.log_id {
        Some(log_id) => format!("entry {} (term {})", log_id.index, log_id.leader_id.term),
        None => "its restored snapshot".to_string(),
    };
    Err(format!(
        "the log in {} {reach}, but this node had applied {marked}, with token {} and session \
         {} (counters-mark.json): the log was lost, cut or rolled back beside a surviving \
         signing key, and starting would issue those tokens and session ids again, the same \
         sequencers as before. Run `{RECOVER_COMMAND} {}` to place the counters above any \
         value they can have had, then start again (docs/cluster.md, \"Recovering the \
         counters\")",
        dir.display(),
        mark.last_token,
        mark.last_session,
        dir.display()
    ))
}

/// What [`recover`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// The mark the floors were computed from, if there was one.
    pub mark: Option<CounterMark>,
    /// The floors kept: every later token and session id is above them.
    pub floors: PendingFloor,
}

/// Why [`recover`] refused.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// `palisade recover-counters`: keeps, in the stopped node's directory `dir`, pending floors
/// above every token and session id the node can have issued by `now_unix_ms`: relative to its
/// mark, the time since the mark and a margin ([`recovery_floors`]), and never below the time
/// floor. The node proposes them before it grants anything. Refused for a directory in use, a
/// member of a larger cluster (replace it instead), or floors past the largest token.
pub fn recover(dir: &Path, now_unix_ms: u64) -> Result<Recovered, RecoverError> {
    if !dir.join("signing.key").exists() {
        return Err(RecoverError::Refused(format!(
            "{} holds no signing key: there is nothing to recover (a new directory starts its \
             counters with a key of its own)",
            dir.display()
        )));
    }
    // The server's own lock: no node may run on the directory meanwhile.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("raft.lock"))?;
    lock.try_lock().map_err(|_| {
        RecoverError::Refused(format!(
            "{} is in use by a running palisade process: stop it first",
            dir.display()
        ))
    })?;
    let mark = read(dir)?;
    if let Some(mark) = mark.as_ref().filter(|mark| mark.voters.len() > 1) {
        return Err(RecoverError::Refused(format!(
            "this node was one of the {} voters {:?} of a cluster: a member whose log was lost \
             or rolled back is replaced, not recovered. Remove it (`palisade cluster remove \
             ID` on the leader), delete this directory, and add a new one under a new id \
             (docs/cluster.md); if every member lost its log, restore a backup",
            mark.voters.len(),
            mark.voters
        )));
    }
    let floors = floors_after(mark.as_ref(), now_unix_ms);
    if floors.exhausted() {
        return Err(RecoverError::Refused(format!(
            "the token counter was at {} and would pass the largest token ({}) once the time \
             since and the margin are added: no lock could be granted after the recovery",
            mark.as_ref().map_or(Token::ZERO, |m| m.last_token),
            palisade_core::limits::TOKEN_MAX
        )));
    }
    let kept = keep_pending_floor(
        dir,
        PendingFloor {
            token: floors.token,
            session: Some(floors.session),
        },
    )?;
    Ok(Recovered { mark, floors: kept })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogIdOf<C> {
        openraft::testing::log_id::<C>(term, 1, index)
    }

    fn found(dir: &Path, key_existed: bool, reach: Option<LogIdOf<C>>) -> Found<'_> {
        Found {
            key_existed,
            log_reach: reach,
            snapshot_log_id: None,
            snapshot_token: Token::ZERO,
            snapshot_session: SessionId::new(0),
            snapshot_exists: false,
            dir,
        }
    }

    #[test]
    fn a_log_short_of_the_mark_stops_the_start_until_a_recovery_floor_covers_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("signing.key"), [7u8; 32]).unwrap();
        let now = now_unix_ms();
        let mark = CounterMark::new(
            Some(log_id(2, 40)),
            Token::new(1 << 60),
            SessionId::new(9),
            now - 5_000,
            vec![1],
        );
        write(dir.path(), &mark).unwrap();
        assert_eq!(read(dir.path()).unwrap().as_ref(), Some(&mark));

        // The log reaches the mark (or passes it): fine.
        for reach in [log_id(2, 40), log_id(2, 41), log_id(3, 1)] {
            assert_eq!(
                check_at_start(&found(dir.path(), true, Some(reach))),
                Ok(mark.clone())
            );
        }
        // Missing, shorter, or an older term's: refused, naming the command.
        for reach in [None, Some(log_id(2, 39)), Some(log_id(1, 90))] {
            let refused = check_at_start(&found(dir.path(), true, reach)).unwrap_err();
            assert!(
                refused.contains("palisade recover-counters --data-dir"),
                "{refused}"
            );
        }

        let recovered = recover(dir.path(), now).unwrap();
        assert!(
            recovered.floors.token.get() >= (1 << 60) + 6 * (1 << 21),
            "{recovered:?}"
        );
        assert!(recovered.floors.session.unwrap() > SessionId::new(9));
        assert_eq!(
            pending_token_floor(dir.path()).unwrap(),
            Some(recovered.floors.clone())
        );
        assert_eq!(check_at_start(&found(dir.path(), true, None)), Ok(mark));
        // Recovering again never lowers the floors kept.
        let again = recover(dir.path(), now - 60_000).unwrap();
        assert_eq!(again.floors, recovered.floors);
    }

    #[test]
    fn a_key_without_log_or_mark_is_refused_but_a_directory_from_before_marks_is_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        // New: no key, nothing else.
        let mark = check_at_start(&found(dir.path(), false, None)).unwrap();
        assert_eq!(mark.log_id, None);
        assert_eq!(read(dir.path()).unwrap(), Some(mark));

        // From before marks, with its log: a mark is written, nothing refused.
        let old = tempfile::tempdir().unwrap();
        let mark = check_at_start(&found(old.path(), true, Some(log_id(1, 5)))).unwrap();
        assert!(read(old.path()).unwrap().is_some());
        assert_eq!(mark.last_token, Token::ZERO);

        // From before marks, its log lost: refused.
        let lost = tempfile::tempdir().unwrap();
        std::fs::write(lost.path().join("signing.key"), [7u8; 32]).unwrap();
        let refused = check_at_start(&found(lost.path(), true, None)).unwrap_err();
        assert!(refused.contains("no counter mark"), "{refused}");
        assert!(read(lost.path()).unwrap().is_none());
        recover(lost.path(), now_unix_ms()).unwrap();
        check_at_start(&found(lost.path(), true, None)).unwrap();
    }

    #[test]
    fn a_member_of_a_larger_cluster_is_not_recovered_and_a_directory_in_use_neither() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("signing.key"), [7u8; 32]).unwrap();
        let mark = CounterMark::new(None, Token::new(3), SessionId::new(2), 0, vec![1, 2, 3]);
        write(dir.path(), &mark).unwrap();
        let refused = recover(dir.path(), now_unix_ms()).unwrap_err();
        assert!(refused.to_string().contains("replaced"), "{refused}");
        write(
            dir.path(),
            &CounterMark {
                voters: vec![1],
                ..mark
            },
        )
        .unwrap();
        let lock = std::fs::File::create(dir.path().join("raft.lock")).unwrap();
        lock.try_lock().unwrap();
        let refused = recover(dir.path(), now_unix_ms()).unwrap_err();
        assert!(refused.to_string().contains("in use"), "{refused}");
        assert_eq!(pending_token_floor(dir.path()).unwrap(), None);
    }

    #[test]
    fn marks_never_lower_a_counter_nor_repeat_a_log_id() {
        let dir = tempfile::tempdir().unwrap();
        let marks = Marks::new(dir.path());
        let at = |index, token, session| {
            CounterMark::new(
                Some(log_id(1, index)),
                Token::new(token),
                SessionId::new(session),
                0,
                vec![1],
            )
        };
        marks.record(at(1, 1, 1)).unwrap();
        assert_eq!(read(dir.path()).unwrap(), None, "nothing before start_from");
        marks.start_from(at(10, 100, 10));
        marks.record(at(5, 50, 5)).unwrap();
        assert_eq!(
            read(dir.path()).unwrap(),
            None,
            "a replay below the mark is not written"
        );
        marks.record(at(11, 100, 10)).unwrap();
        assert_eq!(read(dir.path()).unwrap(), Some(at(11, 100, 10)));
        assert!(!marks.is_behind(Some(log_id(1, 11))));
        assert!(marks.is_behind(Some(log_id(1, 12))));
    }
}

/// The file, beside the log, holding floors still to be proposed: written before a damaged
/// tail is cut off the log or by `palisade recover-counters`, removed once a leader applied
/// them. Its first line is the token floor (all older versions wrote); the second, if any, the
/// session floor.
pub const TOKEN_FLOOR_FILE: &str = "token-floor-pending";

/// Floors of the counters still to be proposed ([`TOKEN_FLOOR_FILE`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingFloor {
    /// Every later token goes above this one.
    pub token: Token,
    /// Every later session id goes above this one (`None` in a file of an older version).
    pub session: Option<SessionId>,
}

impl PendingFloor {
    /// The higher of two floors, counter by counter.
    pub fn max(self, other: PendingFloor) -> PendingFloor {
        PendingFloor {
            token: self.token.max(other.token),
            session: self.session.max(other.session),
        }
    }
}

/// The floors a cut of the log or a recovery left to propose in `dir`, if any.
pub fn pending_token_floor(dir: &Path) -> io::Result<Option<PendingFloor>> {
    let path = dir.join(TOKEN_FLOOR_FILE);
    // Two numbers and a newline each: anything much longer is not this file.
    let Some(bytes) = read_small_file(&path, 255)? else {
        return Ok(None);
    };
    let text =
        String::from_utf8(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let unreadable = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} holds {text:?}, not a token floor ({why}); it is written by palisade after \
                 cutting a damaged tail off the log or by `palisade recover-counters`: run that \
                 command again to rewrite it",
                path.display()
            ),
        )
    };
    let mut lines = text.lines().map(str::trim).filter(|line| !line.is_empty());
    let token = lines
        .next()
        .ok_or_else(|| unreadable("empty".into()))?
        .parse::<u64>()
        .map_err(|e| unreadable(e.to_string()))?;
    let session = match lines.next() {
        None => None,
        Some(line) => Some(
            line.strip_prefix("session ")
                .ok_or_else(|| unreadable("the second line is not `session N`".into()))?
                .parse::<u64>()
                .map_err(|e| unreadable(e.to_string()))?,
        ),
    };
    if lines.next().is_some() {
        return Err(unreadable("more than two lines".into()));
    }
    Ok(Some(PendingFloor {
        token: Token::new(token),
        session: session.map(SessionId::new),
    }))
}

/// Keeps `floor` in `dir` durably, raised to any floor the file already holds (a floor kept is
/// never lowered); returns what the file holds after.
pub fn keep_pending_floor(dir: &Path, floor: PendingFloor) -> io::Result<PendingFloor> {
    let kept = match pending_token_floor(dir)? {
        Some(earlier) => floor.max(earlier),
        None => floor,
    };
    let mut text = format!("{}\n", kept.token.get());
    if let Some(session) = kept.session {
        text.push_str(&format!("session {}\n", session.get()));
    }
    write_file_atomically(dir, TOKEN_FLOOR_FILE, text.as_bytes(), None)?;
    Ok(kept)
}

/// Removes the pending floor of `dir` once it is applied.
pub fn forget_token_floor(dir: &Path) -> io::Result<()> {
    match std::fs::remove_file(dir.join(TOKEN_FLOOR_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => File::open(dir)?.sync_all(),
    }
}
