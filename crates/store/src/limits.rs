//! Every limit of the fenced store, in one place, with the relations between them checked at
//! compile time (invariant 10: every input has a limit).
//!
//! A request that exceeds a limit is refused with [`crate::StoreError::TooLarge`], which names
//! the constant (`value_bytes_max`, …) so the user knows which knob they hit.

use palisade_core::limits::LOCK_NAME_BYTES_MAX;
use palisade_fence::SCOPE_BYTES_MAX;
use palisade_sequencer::SEQUENCER_BYTES_MAX;

/// Longest key, in bytes of UTF-8.
pub const KEY_BYTES_MAX: usize = 1024;

/// Largest value, in bytes.
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;

/// Most operations in one batch.
pub const BATCH_OPS_MAX: usize = 1000;

/// Largest batch request body (JSON), in bytes.
pub const BATCH_BODY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Most compares in one transaction.
pub const COMPARES_MAX: usize = 1000;

/// Most requests waiting for the writer thread; an async request beyond it is refused at once
/// as unavailable (nothing applied), a blocking caller waits.
pub const WRITE_QUEUE_JOBS_MAX: usize = 4096;

/// Most bytes of keys and values waiting for the writer thread, over all queued requests.
pub const WRITE_QUEUE_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Most requests that share one commit (group commit).
pub const GROUP_JOBS_MAX: usize = 1024;

/// A group stops taking requests once it holds this many bytes of keys and values.
pub const GROUP_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Longest client-chosen request id, in bytes of printable ASCII.
pub const REQUEST_ID_BYTES_MAX: usize = 128;

/// How many completed request ids the store remembers for retries. The oldest is forgotten
/// first; a retry arriving after that many later requests is treated as a new request (and a
/// stale one is then refused by the fence as usual).
pub const REQUEST_IDS_RETAINED_MAX: u64 = 100_000;

/// Largest request body on `PUT /v1/kv/{key}`: the raw value.
pub const PUT_BODY_BYTES_MAX: usize = VALUE_BYTES_MAX;

/// Most key-prefix bindings (`palisade store serve --bind`, `--bindings-file`).
pub const BINDINGS_MAX: usize = 10_000;

/// Most connections the HTTP server serves at once; further clients wait in the listener's
/// accept backlog until one closes. (`palisade store serve --connections-max` lowers or raises
/// it.)
pub const CONNECTIONS_MAX: usize = 1024;

/// How long a client may take to send a request's headers, counted from when the server
/// starts waiting for them: on a new connection, and on a kept-alive one between requests. A
/// connection that sends nothing, or a header a byte at a time (slowloris), is closed then.
pub const HEADER_READ_TIMEOUT_MS: u64 = 10_000;

/// How long a client may take to send a request's body once its headers arrived; then the
/// request is refused as unavailable (nothing applied) and the connection closed.
pub const BODY_READ_TIMEOUT_MS: u64 = 30_000;

/// How long a client may take to send the first bytes of a request's body once its headers
/// arrived; then it is refused as [`BODY_READ_TIMEOUT_MS`] says.
pub const BODY_FIRST_BYTE_TIMEOUT_MS: u64 = 5_000;

/// Most bytes of request bodies being received or held in memory at once, over all
/// connections. Only a write whose sequencer verified takes any, and it takes its body's bytes
/// as they arrive (by the KiB), never what its `Content-Length` declares; it waits up to the
/// body read timeout for room.
pub const BODY_BYTES_IN_FLIGHT_MAX: usize = 64 * 1024 * 1024;

/// Base64 text length (with padding) of `bytes` bytes.
pub const fn base64_padded_len(bytes: usize) -> usize {
    bytes.div_ceil(3) * 4
}

/// Room for one operation's JSON framing besides its key and value (`{"op":"put",…}`).
const BATCH_OP_FRAMING_BYTES: usize = 64;

// A batch can always carry one largest value, base64-encoded, with a largest key (escaped
// worst-case as \uXXXX, six bytes per byte).
const _: () = assert!(
    base64_padded_len(VALUE_BYTES_MAX) + 6 * KEY_BYTES_MAX + BATCH_OP_FRAMING_BYTES
        <= BATCH_BODY_BYTES_MAX
);
// A batch can always carry its largest count of operations on largest keys.
const _: () =
    assert!(BATCH_OPS_MAX * (KEY_BYTES_MAX + BATCH_OP_FRAMING_BYTES) <= BATCH_BODY_BYTES_MAX);
const _: () = assert!(KEY_BYTES_MAX < VALUE_BYTES_MAX);
const _: () = assert!(PUT_BODY_BYTES_MAX <= BATCH_BODY_BYTES_MAX);
// The fence scope of a write is its lock's name, so every lock name must be a valid scope.
const _: () = assert!(LOCK_NAME_BYTES_MAX <= SCOPE_BYTES_MAX);
// A request-id record is keyed by sequencer text, one space, and the request id.
const _: () = assert!(SEQUENCER_BYTES_MAX + 1 + REQUEST_ID_BYTES_MAX <= 1024);
const _: () = assert!(REQUEST_IDS_RETAINED_MAX >= 1);
// Any one request fits in a group and in the queue.
const _: () = assert!(BATCH_BODY_BYTES_MAX <= GROUP_BYTES_MAX);
const _: () = assert!(GROUP_BYTES_MAX <= WRITE_QUEUE_BYTES_MAX);
const _: () = assert!(GROUP_JOBS_MAX <= WRITE_QUEUE_JOBS_MAX);
// Any one request's body fits in the bodies in flight.
const _: () = assert!(BATCH_BODY_BYTES_MAX <= BODY_BYTES_IN_FLIGHT_MAX);
// A header takes less time than a body to arrive, and a body's first bytes less than all of it.
const _: () = assert!(HEADER_READ_TIMEOUT_MS <= BODY_READ_TIMEOUT_MS);
const _: () = assert!(BODY_FIRST_BYTE_TIMEOUT_MS <= BODY_READ_TIMEOUT_MS);
const _: () = assert!(CONNECTIONS_MAX >= 1);
