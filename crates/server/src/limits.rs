//! Every limit of the lock service that the lock table does not own, in one place, with
//! compile-time checks of how they relate to each other and to the table's limits
//! ([`palisade_core::limits`]) and the gRPC message size ([`palisade_proto::MESSAGE_BYTES_MAX`]).
//!
//! Names end in their unit or `_max`. A new limit goes here, with the relation that makes it
//! safe written as a `const` assertion, so a change that breaks the relation does not build.

use std::time::Duration;

pub use palisade_core::limits::{LOCK_NAME_BYTES_MAX, WAITERS_PER_LOCK_MAX};
pub use palisade_proto::MESSAGE_BYTES_MAX;

/// Client connections served at once.
pub const CONNECTIONS_MAX: usize = 4_096;

/// How long a new connection has to send the HTTP/2 client preface, which a gRPC client sends
/// as soon as it connects, before it is closed and its permit freed: idle sockets cannot keep
/// honest clients in the accept backlog for longer than this.
pub const CONNECTION_PREFACE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the server pings a client connection over HTTP/2, and how long it waits for the
/// answer before it closes the connection (and frees its permit). The Rust client pings every
/// second itself; this catches peers that stopped answering.
pub const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
pub const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The budgets of calls that stay open, each over all connections. Each call holds a task and
/// buffers; a server with every budget full is still far from its memory limit. Each kind of
/// call has a budget of its own, so that no number of watches keeps an acquire from waiting in
/// a queue, and neither keeps a session from being renewed.
///
/// Keepalive streams: one per live session at most is what honest clients need.
pub const KEEPALIVE_STREAMS_MAX: usize = 20_000;
/// Watches.
pub const WATCHES_MAX: usize = 20_000;
/// Acquires waiting in a lock's queue.
pub const WAITING_ACQUIRES_MAX: usize = 20_000;

/// How many calls of each of those budgets one client connection may have open at once.
/// HTTP/2's own limit on concurrent streams does not cover a stream once its response has
/// begun, so without this one connection could take a whole budget.
pub const LONG_LIVED_CALLS_PER_CONNECTION_MAX: usize = 1_000;

/// Streams one client connection may have open at once (HTTP/2's
/// `SETTINGS_MAX_CONCURRENT_STREAMS`). A client at the limit waits for a stream to end before it
/// opens another, without an error, so the limit sits above [`LONG_LIVED_CALLS_PER_CONNECTION_MAX`]
/// with room for short calls: a client whose long-lived calls are refused (RESOURCE_EXHAUSTED,
/// a clear error) still has streams for the `Renew` calls it falls back to. Left unset before,
/// which hyper takes as no limit at all.
pub const HTTP2_STREAMS_PER_CONNECTION_MAX: u32 = 1_100;
/// HTTP/2 flow-control windows the server grants a client: per stream, and per connection over
/// all its streams. They bound the request bytes a connection can have in the server's
/// buffers that no handler has read yet. The stream window holds two of the largest client
/// messages; the connection window is hyper's default, which a Raft append of
/// [`APPEND_ENTRIES_BYTES_MAX`] crosses in four round trips. (The stream window was hyper's
/// default of 1 MiB before.)
pub const HTTP2_STREAM_WINDOW_BYTES: u32 = 2 * (MESSAGE_BYTES_MAX as u32 + 5);
pub const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;

/// Bytes of request messages that have begun to arrive and are not complete yet, over all
/// connections. A handler sees a message only once it is complete, so these bytes sit in
/// buffers on behalf of a caller who may never finish; a message that arrives whole in one
/// HTTP/2 frame (every request of an honest client but the largest) never counts. A message
/// that would take the total over the budget fails its call with RESOURCE_EXHAUSTED.
pub const REQUEST_BYTES_IN_FLIGHT_MAX: usize = 64 * 1024 * 1024;
/// The same, on one connection, for the client API (`Locks`, `Cluster`); Raft messages, far
/// larger, count only against [`REQUEST_BYTES_IN_FLIGHT_MAX`].
pub const REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX: usize = 1024 * 1024;
/// How long a request message may take to arrive from its first byte to its last; then its
/// call fails with DEADLINE_EXCEEDED and its bytes are given back.
pub const REQUEST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Of [`CONNECTIONS_MAX`], how many only connections that presented a verified client
/// certificate (mutual TLS: a client or a peer) may use. Connections without one, which is
/// every connection without mutual TLS, share the rest.
pub const CONNECTIONS_RESERVED_FOR_CERTIFIED: usize = 512;
/// Connections without a client certificate one source address may have open at once
/// ([`ConnectionLimits::per_address_max`]).
pub const CONNECTIONS_PER_ADDRESS_MAX: usize = 256;
/// A connection with no call open for this long is closed ([`ConnectionLimits::idle_timeout`]).
pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A connection this old is asked to go away (HTTP/2 GOAWAY: no new calls on it, the open ones
/// go on) ([`ConnectionLimits::age_max`])…
pub const CONNECTION_AGE_MAX: Duration = Duration::from_secs(2 * 3600);
/// …and closed this much later, whatever is still open on it ([`ConnectionLimits::age_grace`]).
pub const CONNECTION_AGE_GRACE: Duration = Duration::from_secs(600);

/// How long client connections may be held, and how many one source may hold: what
/// `palisade serve` enforces in `incoming.rs`. [`ConnectionLimits::default`] is the constants
/// above; tests shorten the times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections without a verified client certificate one source IP address may have open
    /// at once; a further one is closed at once, with an HTTP/2 GOAWAY saying why. Behind a
    /// proxy or NAT, every client shares its address: raise it there.
    pub per_address_max: usize,
    /// Whether loopback sources are held to `per_address_max` too. Off by default: every local
    /// client shares one loopback address, so a cap there would let one local process lock
    /// every other out, which the global cap and the timeouts already prevent less bluntly.
    pub per_address_loopback: bool,
    /// A connection on which no call has been open for this long is closed.
    pub idle_timeout: Duration,
    /// A connection is sent a GOAWAY at this age…
    pub age_max: Duration,
    /// …and closed this much later.
    pub age_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            per_address_max: CONNECTIONS_PER_ADDRESS_MAX,
            per_address_loopback: false,
            idle_timeout: CONNECTION_IDLE_TIMEOUT,
            age_max: CONNECTION_AGE_MAX,
            age_grace: CONNECTION_AGE_GRACE,
        }
    }
}

/// Most locks one `ListLocks` page returns. Small enough that a page of locks with names of
/// the longest length fits in one message (see [`LOCK_INFO_BYTES_MAX`]).
pub const LIST_PAGE_LOCKS_MAX: usize = 128;

/// Upper bound on one encoded `LockInfo` without waiters: the name (at most
/// [`LOCK_NAME_BYTES_MAX`], with a 1-byte tag and a 2-byte length) and at most 96 bytes for
/// the rest (a holder of three `u64`s, the last token and the lock-delay, each a tag and at
/// most 10 bytes of varint, plus the holder's own tag and length, and the entry's framing).
/// Not covered: the waiters' session ids (up to [`WAITERS_PER_LOCK_MAX`] of them), so a page
/// of locks with long queues can still be too large; only paginating by bytes would cover it.
pub const LOCK_INFO_BYTES_MAX: usize = LOCK_NAME_BYTES_MAX + 3 + 96;

/// The web UI (`palisade serve --ui-listen`, `ui`): connections served at once; more
/// wait in the accept backlog.
pub const UI_CONNECTIONS_MAX: usize = 64;
/// Live views (`/api/stream`) open at once over all connections; each also counts against its
/// identity's quota of watches.
pub const UI_STREAMS_MAX: usize = 32;
/// How long a UI connection has to send a request's head before it is closed.
pub const UI_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (request line, query included, and headers) the UI reads, in bytes.
pub const UI_REQUEST_HEAD_BYTES_MAX: usize = 16 * 1024;
/// Most locks one UI answer or live view shows; beyond it the answer says where the next page
/// starts.
pub const UI_PAGE_LOCKS_MAX: usize = 100;
/// Most waiting sessions a UI answer names per lock (it always gives their number).
pub const UI_WAITERS_SHOWN_MAX: usize = 8;
/// Most readers of a phase, or permit holders of a semaphore, a UI answer shows per lock (it
/// always gives their number).
pub const UI_SHARERS_SHOWN_MAX: usize = 16;
/// How often a live view sends its page afresh: leases counting down, renewals (which make no
/// event), membership and leader.
pub const UI_REFRESH_INTERVAL: Duration = Duration::from_secs(2);
/// The timeline (`ui::timeline`): grants, releases and expiries kept per lock…
pub const TIMELINE_EVENTS_PER_LOCK_MAX: usize = 16;
/// …for at most this many locks, the least recently active forgotten first.
pub const TIMELINE_LOCKS_MAX: usize = 1_024;

/// Keepalive responses buffered per stream before the renewals wait for the client to read.
pub const KEEPALIVE_BUFFER_RESPONSES: usize = 16;

/// Events buffered per watcher before a slow watcher is cut off.
pub const WATCH_BUFFER_EVENTS: usize = 4096;

/// Largest write-ahead log frame payload accepted; a longer length field on replay means a
/// corrupt (torn) frame.
pub const RECORD_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Raft's heartbeat: how often the leader tells followers it is alive.
pub const HEARTBEAT_INTERVAL_MS: u64 = 100;
/// A follower that hears no leader for a random time in this range campaigns. The longest is
/// also openraft's leader lease: how long a leader keeps leading without a quorum's answer.
pub const ELECTION_TIMEOUT_MIN_MS: u64 = 300;
pub const ELECTION_TIMEOUT_MAX_MS: u64 = 600;
/// A leader that has heard no quorum acknowledge it for this long stops serving: its queued
/// acquires, watches and keepalive streams end with an answer that sends their clients to the
/// next leader (see `Node::watch_quorum`). It is openraft's leader lease (after which the leader
/// takes no new proposal) plus one heartbeat, so one late heartbeat does not end a term.
pub const QUORUM_SILENCE_MS: u64 = ELECTION_TIMEOUT_MAX_MS + HEARTBEAT_INTERVAL_MS;
/// Once its lease has lapsed without a quorum's answer, a leader alternates periods of this
/// length without heartbeats and with them (openraft's `quorum_loss_probe_interval`). openraft
/// requires at least its lease plus the longest election timeout.
pub const QUORUM_LOSS_PROBE_MS: u64 = 2 * ELECTION_TIMEOUT_MAX_MS;
/// How long a client's command may wait for its log entry to commit before the caller is told
/// the outcome is unknown (and retries elsewhere with the same request id). A commit takes
/// milliseconds; one that takes this long is on a leader cut off from its quorum.
pub const PROPOSAL_COMMIT_TIMEOUT_MS: u64 = 2_000;

/// How long the lease driver waits before proposing a `Tick` again after one failed.
pub const LEASE_DRIVER_RETRY: Duration = Duration::from_millis(100);

/// Log entries applied between two snapshots.
pub const SNAPSHOT_INTERVAL_ENTRIES: u64 = 20_000;

/// Upper bound on one log entry as JSON: a proposal made from a request of at most one message,
/// each byte escaped as `\u00XX` at worst, plus the entry's own fields.
pub const LOG_ENTRY_BYTES_MAX: usize = 6 * MESSAGE_BYTES_MAX + 1024;

/// Longest cluster name, in bytes. Every peer request carries it.
pub const CLUSTER_NAME_BYTES_MAX: usize = 128;

/// Largest gRPC message between two nodes of a cluster, either way. Larger ones are refused by
/// the receiver's decoder.
pub const PEER_MESSAGE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes a peer request spends besides its body: the envelope (the cluster name, two node ids)
/// and the protobuf framing.
pub const PEER_ENVELOPE_BYTES_MAX: usize = CLUSTER_NAME_BYTES_MAX + 64;

/// Largest body of one append-entries request the sender builds. A batch whose JSON is longer is
/// cut: the leading entries that fit are sent and reported as a partial success, and openraft
/// sends the rest next. Kept well under the message limit because openraft gives a replication
/// call only `heartbeat_interval` to complete.
pub const APPEND_ENTRIES_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Largest piece of a snapshot in one message of the snapshot stream. openraft's
/// `snapshot_max_chunk_size` can only make pieces smaller.
pub const SNAPSHOT_CHUNK_BYTES_MAX: usize = 1024 * 1024;

/// Largest snapshot a node sends or accepts, in bytes. The receiver holds it in memory until it
/// is complete, as the sender does. It is not derived from the lock table's limits: a table at
/// every limit at once (a million locks, each with a name of the longest length) serialises
/// larger, and its snapshot would be refused with an error naming this limit on both sides.
pub const SNAPSHOT_BYTES_MAX: usize = 1024 * 1024 * 1024;

// A full `ListLocks` page of the longest names, with `next_start_after` (one more name) and
// the response's framing, fits in one message. Broken before the page was cut from 1,000.
const _: () = assert!(
    LIST_PAGE_LOCKS_MAX * LOCK_INFO_BYTES_MAX + (LOCK_NAME_BYTES_MAX + 3) + 16 <= MESSAGE_BYTES_MAX
);
// A full `AcquireAll` response fits in one message: per lock its name twice (the grant's and
// the sequencer's, which is at most `SEQUENCER_BYTES_MAX` whole) and 64 bytes of numbers and
// framing. Its request (names and modes) is smaller.
const _: () = assert!(
    palisade_core::MULTI_LOCKS_MAX as usize
        * (LOCK_NAME_BYTES_MAX + palisade_sequencer::SEQUENCER_BYTES_MAX + 64)
        <= MESSAGE_BYTES_MAX
);
// A page holds at least one lock, or a listing could never advance.
const _: () = assert!(LIST_PAGE_LOCKS_MAX >= 1);
// One lock's full queue can wait over gRPC at once (over several connections): otherwise the
// table's waiter limit is unreachable and the service's limit answers first with a less
// precise error.
const _: () = assert!(WAITING_ACQUIRES_MAX >= WAITERS_PER_LOCK_MAX);
// Every connection can hold at least one call of each kind.
const _: () = assert!(KEEPALIVE_STREAMS_MAX >= CONNECTIONS_MAX);
const _: () = assert!(WATCHES_MAX >= CONNECTIONS_MAX);
const _: () = assert!(WAITING_ACQUIRES_MAX >= CONNECTIONS_MAX);
// One connection cannot take a whole budget.
const _: () = assert!(LONG_LIVED_CALLS_PER_CONNECTION_MAX < KEEPALIVE_STREAMS_MAX);
const _: () = assert!(LONG_LIVED_CALLS_PER_CONNECTION_MAX < WATCHES_MAX);
const _: () = assert!(LONG_LIVED_CALLS_PER_CONNECTION_MAX < WAITING_ACQUIRES_MAX);
// A client at its limit of long-lived calls on a connection still has streams for short ones,
// so it is refused with an error instead of waiting for a stream.
const _: () =
    assert!(HTTP2_STREAMS_PER_CONNECTION_MAX as usize >= LONG_LIVED_CALLS_PER_CONNECTION_MAX + 64);
// A whole client message fits in a stream's window, and a stream's window in the connection's.
const _: () = assert!(HTTP2_STREAM_WINDOW_BYTES as usize > MESSAGE_BYTES_MAX + 5);
const _: () = assert!(HTTP2_STREAM_WINDOW_BYTES <= HTTP2_CONNECTION_WINDOW_BYTES);
// A connection can receive one largest client message, and the server several connections'
// worth, and a whole Raft message.
const _: () = assert!(REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX > MESSAGE_BYTES_MAX + 5);
const _: () =
    assert!(REQUEST_BYTES_IN_FLIGHT_MAX >= 16 * REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX);
const _: () = assert!(REQUEST_BYTES_IN_FLIGHT_MAX > PEER_MESSAGE_BYTES_MAX + 5);
// Connections without a certificate are most of them, and one address cannot take them all.
const _: () = assert!(CONNECTIONS_RESERVED_FOR_CERTIFIED < CONNECTIONS_MAX / 2);
const _: () =
    assert!(CONNECTIONS_PER_ADDRESS_MAX < CONNECTIONS_MAX - CONNECTIONS_RESERVED_FOR_CERTIFIED);
// A connection is idle only well after the pings that keep checking it.
const _: () = assert!(CONNECTION_IDLE_TIMEOUT.as_secs() > 2 * HTTP2_KEEPALIVE_INTERVAL.as_secs());
// An honest client's pings are answered long before the server gives up on them.
const _: () = assert!(HTTP2_KEEPALIVE_TIMEOUT.as_secs() >= 1);
/// How long a snapshot's whole stream to a follower may take.
pub const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 30_000;
/// How often a node bootstrapping a cluster retries a member that has not started yet.
pub const BOOTSTRAP_RETRY: Duration = Duration::from_millis(500);
/// How long `AddMember` waits for the new node to catch up before it gives up (the node stays
/// a learner and can be added again or removed).
pub const ADD_MEMBER_CATCH_UP: Duration = Duration::from_secs(120);

// Followers hear several heartbeats before they campaign.
const _: () = assert!(HEARTBEAT_INTERVAL_MS * 2 < ELECTION_TIMEOUT_MIN_MS);
const _: () = assert!(ELECTION_TIMEOUT_MIN_MS < ELECTION_TIMEOUT_MAX_MS);
// A leader gives up serving no sooner than openraft stops taking its proposals (its lease),
// and before a client's proposal there times out: a waiter is answered by then.
const _: () = assert!(QUORUM_SILENCE_MS > ELECTION_TIMEOUT_MAX_MS);
const _: () = assert!(QUORUM_SILENCE_MS < PROPOSAL_COMMIT_TIMEOUT_MS);
// A proposal is given up on only after the leader's lease has lapsed twice over: by then a
// leader that has not committed it has no quorum, and a new leader can be elected.
const _: () =
    assert!(PROPOSAL_COMMIT_TIMEOUT_MS >= 2 * ELECTION_TIMEOUT_MAX_MS + HEARTBEAT_INTERVAL_MS);
// The shortest session outlives an election: a failover does not expire healthy sessions.
const _: () = assert!(
    palisade_core::limits::SESSION_TTL_MS_MIN.as_millis()
        >= ELECTION_TIMEOUT_MAX_MS + HEARTBEAT_INTERVAL_MS
);
// One proposal always fits in one frame, so no accepted request can make the log unwritable.
const _: () = assert!(LOG_ENTRY_BYTES_MAX <= RECORD_BYTES_MAX);
// A frame length must fit the frame header's `u32`.
const _: () = assert!(RECORD_BYTES_MAX <= u32::MAX as usize);
// One entry, with the request's other fields (a vote and two log ids, far under 1 KiB), always
// fits in an append-entries body, so cutting a batch always leaves at least one entry to send
// and replication cannot stall on a large entry.
const _: () = assert!(LOG_ENTRY_BYTES_MAX + 1024 <= APPEND_ENTRIES_BYTES_MAX);
// A full append-entries request, and a snapshot chunk, fit in one peer message.
const _: () = assert!(APPEND_ENTRIES_BYTES_MAX + PEER_ENVELOPE_BYTES_MAX <= PEER_MESSAGE_BYTES_MAX);
const _: () = assert!(SNAPSHOT_CHUNK_BYTES_MAX + 16 <= PEER_MESSAGE_BYTES_MAX);
// A chunk is a piece of a snapshot, never more than the whole.
const _: () = assert!(SNAPSHOT_CHUNK_BYTES_MAX <= SNAPSHOT_BYTES_MAX);
// A UI page fits within a gRPC listing page, so it costs no more to read than one `ListLocks`.
const _: () = assert!(UI_PAGE_LOCKS_MAX <= LIST_PAGE_LOCKS_MAX);
// Every live view can be open with connections to spare for the page and its JSON.
const _: () = assert!(UI_STREAMS_MAX < UI_CONNECTIONS_MAX);
// A prefix of the longest lock name, percent-encoded (3 bytes a byte), fits in a request head.
const _: () = assert!(3 * LOCK_NAME_BYTES_MAX * 2 + 4096 <= UI_REQUEST_HEAD_BYTES_MAX);
// hyper reads request heads into a buffer of at least 8 KiB.
const _: () = assert!(UI_REQUEST_HEAD_BYTES_MAX >= 8192);

/// Requests one client connection may have in flight at once.
pub const CONCURRENT_REQUESTS_PER_CONNECTION_MAX: usize = 1_024;

/// How long a graceful shutdown waits for in-flight requests.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

// Tokens and the policy (`auth`).

/// Largest token file, in bytes.
pub const TOKEN_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Most tokens one file may hold.
pub const TOKENS_MAX: usize = 10_000;
/// Longest token a client may present, in bytes (printable ASCII).
pub const TOKEN_BYTES_MAX: usize = 256;

/// Largest policy file, in bytes.
pub const POLICY_FILE_BYTES_MAX: u64 = 1024 * 1024;
/// Most `grant` and `quota` lines one policy may hold.
pub const POLICY_RULES_MAX: usize = 10_000;

// Peers (`peer`).

/// The first wait before retrying an unreachable peer.
pub const PEER_BACKOFF_FIRST: Duration = Duration::from_millis(50);
/// The longest wait before retrying an unreachable peer.
pub const PEER_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long establishing a TCP connection to a peer may take (a call's deadline may cut it
/// shorter).
pub(crate) const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// HTTP/2 pings on an open connection, and how long one may go unanswered before the
/// connection is dropped: a peer whose machine vanished is noticed within about two seconds.
pub(crate) const PEER_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
pub(crate) const PEER_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an admission call may take.
pub(crate) const PEER_ADMIT_TIMEOUT: Duration = Duration::from_secs(5);

// Backups (`cluster`).

/// How much of a backup one message carries.
pub(crate) const BACKUP_CHUNK_BYTES: usize = 60 * 1024;

// The log's file (`wal`).

/// Entries per frame when compaction rewrites the log, keeping frames far below the limit.
pub(crate) const COMPACT_ENTRIES_PER_FRAME: usize = 4096;
/// Compaction is considered once the file has grown past this size.
pub(crate) const COMPACT_FILE_BYTES_MIN: u64 = 64 * 1024 * 1024;
/// How far ahead of the data the file is extended with zeros at a time.
pub(crate) const PREALLOCATE_BYTES: u64 = 4 * 1024 * 1024;

// The web UI (`ui`).

/// Messages buffered per live view before its task waits for the browser to read; a view that
/// stays behind misses events and is sent a new snapshot.
pub(crate) const STREAM_BUFFER_MESSAGES: usize = 64;

/// Pause after a failed accept (out of file descriptors, say) before the next.
pub(crate) const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
// A backup chunk and its framing fit one gRPC message.
const _: () = assert!(BACKUP_CHUNK_BYTES + 64 <= palisade_proto::MESSAGE_BYTES_MAX);

// Starting a node (`node`).

/// How long a starting node waits for openraft to report the membership it recovered.
pub(crate) const MEMBERSHIP_KNOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a node that is its group's only voter may take to lead after it starts.
pub(crate) const SOLE_VOTER_TAKEOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// The most members an initial cluster may name (`--initial-cluster`): Raft's cost grows with
/// every member, and nine tolerate four failures.
pub const INITIAL_CLUSTER_MEMBERS_MAX: usize = 9;
