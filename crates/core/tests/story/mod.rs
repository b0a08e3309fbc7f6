//! A lock table with the bookkeeping a scenario test needs to tell a story step by step:
//! shared by the scenario files that add their own steps to it (`impl Story` in each).

use palisade_core::{Command, DurationMs, Input, Limits, LockTable, Output, Reply, RequestId};
use palisade_core::{SessionId, TimeMs};

pub struct Story {
    pub table: LockTable,
    next_request_id: u64,
}

impl Story {
    pub fn new() -> Story {
        Story::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> Story {
        Story {
            table: LockTable::new(limits),
            next_request_id: 100,
        }
    }

    /// Applies `command` at `now_ms`, and checks the table's consistency after it.
    pub fn apply(&mut self, now_ms: u64, command: Command) -> Output {
        let output = self.table.apply(Input {
            now_ms: TimeMs::from_millis(now_ms),
            command,
        });
        self.table.check_consistency();
        output
    }

    /// Opens a session at `now_ms` with a TTL of `ttl_ms`.
    pub fn open_at(&mut self, now_ms: u64, ttl_ms: u64) -> SessionId {
        let command = Command::OpenSession {
            open_key: None,
            ttl_ms: DurationMs::from_millis(ttl_ms),
            secret_digest: None,
            owner: None,
        };
        match self.apply(now_ms, command).result {
            Ok(Reply::SessionOpened { session, .. }) => session,
            other => panic!("open failed: {other:?}"),
        }
    }

    /// A request id not used before in this story.
    pub fn request_id(&mut self) -> RequestId {
        self.next_request_id += 1;
        RequestId::new(self.next_request_id)
    }
}
