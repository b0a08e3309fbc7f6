//! The fenced store: a durable key/value store over HTTP that accepts a write only from the
//! current holder of the key's lock — the reference resource of Palisade.
//!
//! A write carries the holder's sequencer (`Palisade-Sequencer` header, `$PALISADE_SEQUENCER` in
//! the CLI). The store verifies it offline with the lock service's public key (invariant 5),
//! checks its token against the highest token of that lock it has accepted, and writes — the
//! check, the advance and the data in one durable redb transaction (invariant 3), built on
//! [`palisade_fence::RedbFence`]. It never talks to the lock service.
//!
//! ```text
//! palisade lock jobs/nightly -- palisade store put report "$(date)"
//! ```
//!
//! # Scope
//!
//! The accepted maximum is kept **per lock**, and each key is bound to the lock of its first
//! fenced write; see [`store`](crate::store#scope-the-lock-and-each-key-bound-to-one-lock) for
//! the reasoning. A stale token is refused for every key of its lock; another lock's sequencer
//! is refused as `wrong_lock` (invariant 4); a delete leaves a tombstone that keeps the binding.
//!
//! # HTTP API (`docs/store-http.md` has the full description)
//!
//! | request | effect |
//! |---|---|
//! | `PUT /v1/kv/{key}` | body = raw value bytes; fenced |
//! | `GET /v1/kv/{key}` | `{"key","value" or "value_base64","lock","token","session"}`; `?format=raw` for the bytes; no sequencer needed |
//! | `DELETE /v1/kv/{key}` | fenced; leaves a tombstone |
//! | `POST /v1/batch` | `{"ops":[{"op":"put","key":…,"value":…},{"op":"delete","key":…}]}`: one check, all or nothing |
//! | `GET /v1/fence/{lock}` | `{"lock","token_max","holder_session"}` |
//! | `GET /healthz` | `{"status":"ok"}` |
//!
//! Writes answer `200` with a [`WriteAck`] after the fsync. Rejections are JSON
//! `{"kind", "message", …}` ([`wire`]): `stale` 409 (with `lock`, `presented`, `accepted`,
//! `holder_session`), `token_reissued` 409 (with `lock`, `token`, `first_session`,
//! `presented_session`: another session presented this token first, so the lock service issued
//! it twice), `wrong_lock` 403, `forged` 403, `missing` 428, `malformed` 400,
//! `too_large` 413 (naming the limit), `not_found` 404. A write may carry a
//! `Palisade-Request-Id`: a retry with the same sequencer and request id returns the original
//! acknowledgement (`"replayed": true`) instead of writing again.
//!
//! # Code map
//!
//! - [`limits`]: every limit, with compile-time relations;
//! - [`Store`] ([`store`]): the fenced redb store, usable without HTTP; `schema.rs`: its
//!   stored form (every table, the key row, the request-id key), which imports nothing from the
//!   crate;
//! - [`server`]: the axum routes and error answers; [`StoreServer`] binds and serves;
//! - [`StoreClient`] ([`client`]): the reqwest client with typed errors;
//! - the errors by layer ([`StoreError`]: the store's refusals; [`HttpRefusal`]: the routes';
//!   [`StoreClientError`]: what a client meets), each with a [`StoreErrorClass`]; their wire
//!   form, owned by [`wire`] alone.
//!
//! **API Boundary:** [`wire`] is the only module that spells an error on the wire (its `kind`,
//! fields and HTTP status); the error enums carry no serde, so renaming one of their variants or
//! fields changes nothing a client reads.
//!
//! The `palisade store` subcommands, their output and exit statuses belong to the `palisade`
//! binary (`crates/cli/src/store.rs`); this crate parses no command line.
//!
//! **Architecture Invariant:** no write reaches the key/value table except through
//! [`RedbFence::begin`](palisade_fence::RedbFence::begin) in the same transaction, apart from
//! the benchmark-only `Store::put_unfenced` (only with the `bench` feature, which
//! `palisade-bench` turns on), which writes a separate table no read consults.

pub mod bindings;
pub mod client;
mod error;
pub mod limits;
pub mod quota;
mod schema;
pub mod server;
pub mod store;
mod types;
pub mod wire;
mod writer;

pub use bindings::Bindings;
pub use client::StoreClient;
pub use error::{HttpRefusal, StoreClientError, StoreError, StoreErrorClass};
pub use quota::LockQuota;
pub use server::StoreServer;
pub use store::{
    FENCE_ACCEPTED_METRIC, FENCE_REFUSED_METRIC, Store, StoreOptions, describe_metrics,
};
pub use types::{
    BatchOp, BatchRequest, ClaimAck, Compare, Entry, FenceView, OpAck, OpKind, WriteAck,
};
