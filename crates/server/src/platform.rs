//! What a server runs on besides its configuration ([`Platform`]): its clock, its network, and
//! where its blocking file work runs ([`Blocking`]).
//!
//! Production uses [`Platform::default`]: the tokio clock, a TCP listener, TCP to peers, threads
//! for blocking work and the direct disk. Only the deterministic simulation (`crates/sim`)
//! supplies the others: a simulated clock and network (`Listener::from_stream`), `Inline`
//! blocking so that file writes take their turn among its events, and a disk that can fail.

use crate::disk;
use crate::incoming::Listener;

/// Where the server's blocking file work runs: the log's writes and fsyncs, and snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Blocking {
    /// On threads of its own: the log's writer thread and tokio's blocking pool. Production.
    #[default]
    Threads,
    /// On the task that asks for it, blocking the runtime meanwhile, so that a single-threaded
    /// deterministic simulation orders every file write among its other events.
    Inline,
}

impl Blocking {
    /// Runs `work` where this says.
    pub(crate) async fn run<T: Send + 'static>(
        self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        match self {
            Blocking::Threads => tokio::task::spawn_blocking(work)
                .await
                .map_err(std::io::Error::other),
            Blocking::Inline => Ok(work()),
        }
    }
}

/// What a server runs on besides its configuration: its clock, its network, and where its
/// blocking file work runs. [`Platform::default`] is production; a deterministic simulation
/// supplies its own.
#[derive(Debug)]
pub struct Platform {
    /// Where the node reads time.
    pub clock: palisade_clock::SharedClock,
    /// Where it accepts connections; `None` binds `listen` over TCP.
    pub listener: Option<Listener>,
    /// How it connects to its peers; TCP when `None`.
    pub dialer: Option<palisade_proto::transport::Dialer>,
    /// Where the log's writes and the snapshots run.
    pub blocking: Blocking,
    /// How the log's file meets the disk.
    pub disk: disk::Disk,
}

impl Default for Platform {
    fn default() -> Self {
        Platform {
            clock: palisade_clock::TokioClock::shared(),
            listener: None,
            dialer: None,
            blocking: Blocking::Threads,
            disk: disk::Disk::direct(),
        }
    }
}
