//! The stored form of the store: every redb table it defines, the row of its key table, and
//! how a request id is keyed. The fence's own table is `palisade_fence::redb::FENCE_TABLE`.
//!
//! These are the file format: a name, a key or a value type changed here is a change of every
//! store on disk, and needs a migration in [`crate::store`] (as [`KV_TABLE_V1`] had). The
//! module imports nothing from the crate, so the store, its writer thread and the quotas all
//! read the tables from here without importing each other.

use redb::TableDefinition;

/// key → (lock, token, session, live, revision, value). A row with `live == false` is a
/// tombstone.
pub(crate) type KvRow = (&'static str, u64, u64, bool, u64, &'static [u8]);

/// key → (lock, token, session, live, revision, value), as [`KvRow`].
pub(crate) const KV_TABLE: TableDefinition<'static, &str, KvRow> =
    TableDefinition::new("palisade_store_kv_v2");

/// The key table of stores written before revisions existed: key → (lock, token, session,
/// live, value). [`crate::Store::open`] moves its rows into [`KV_TABLE`] and deletes it.
pub(crate) const KV_TABLE_V1: TableDefinition<'static, &str, (&str, u64, u64, bool, &[u8])> =
    TableDefinition::new("palisade_store_kv");

/// name → value: the store's own counters ([`REVISION_KEY`]).
pub(crate) const META_TABLE: TableDefinition<'static, &str, u64> =
    TableDefinition::new("palisade_store_meta");

/// The [`META_TABLE`] entry holding the store's revision: that of its latest write.
pub(crate) const REVISION_KEY: &str = "revision";

/// "sha256:<hash of the sequencer> <request id>" → (serial, request fingerprint, acknowledgement
/// JSON). Stores of earlier versions keyed it "<sequencer> <request id>"; [`crate::Store::open`]
/// rewrites those keys.
pub(crate) const REQUESTS_TABLE: TableDefinition<'static, &str, (u64, u64, &[u8])> =
    TableDefinition::new("palisade_store_requests");

/// serial → the [`REQUESTS_TABLE`] key, oldest first, to forget the oldest request id.
pub(crate) const REQUEST_ORDER_TABLE: TableDefinition<'static, u64, &str> =
    TableDefinition::new("palisade_store_request_order");

/// Benchmark-only (the `bench` feature): same row shape as [`KV_TABLE`], written by
/// `Store::put_unfenced`.
#[cfg(feature = "bench")]
pub(crate) const UNFENCED_BENCH_TABLE: TableDefinition<'static, &str, KvRow> =
    TableDefinition::new("palisade_store_unfenced_bench_v2");

/// How the request-id table names a sequencer's request: `sha256:<hex of the SHA-256 of the
/// sequencer's text> <request id>`. The hash, not the sequencer: the file must not hold a
/// capability to write as the current holder (a sequencer is one, until the next grant).
pub(crate) fn request_key(sequencer: &str, request_id: &str) -> String {
    use sha2::Digest as _;
    use std::fmt::Write as _;
    let digest = sha2::Sha256::digest(sequencer.as_bytes());
    let mut key =
        String::with_capacity(REQUEST_KEY_PREFIX.len() + 2 * digest.len() + 1 + request_id.len());
    key.push_str(REQUEST_KEY_PREFIX);
    for byte in digest {
        let _ = write!(key, "{byte:02x}");
    }
    key.push(' ');
    key.push_str(request_id);
    key
}

/// What every request key of today starts with; a key without it is of an older store, which
/// named the sequencer in full ([`crate::store`] rewrites those when it opens).
pub(crate) const REQUEST_KEY_PREFIX: &str = "sha256:";
