//! The values the store takes and returns, with their JSON forms (shared by the server and
//! [`crate::StoreClient`]).
//!
//! Values are bytes. In JSON a value is sent as `"value": "<text>"` when it is UTF-8 and as
//! `"value_base64": "<standard base64>"` otherwise; a request may use either form.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// One operation of a write: what [`crate::Store::batch`] applies as one fenced unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireOp", into = "WireOp")]
pub enum BatchOp {
    /// Sets `key` to `value`.
    Put { key: String, value: Vec<u8> },
    /// Removes `key`, leaving a tombstone that keeps the key bound to its lock.
    Delete { key: String },
}

impl BatchOp {
    /// The key this operation writes.
    pub fn key(&self) -> &str {
        match self {
            BatchOp::Put { key, .. } | BatchOp::Delete { key } => key,
        }
    }

    /// Whether it is a put or a delete.
    pub fn kind(&self) -> OpKind {
        match self {
            BatchOp::Put { .. } => OpKind::Put,
            BatchOp::Delete { .. } => OpKind::Delete,
        }
    }
}

/// The kind of a [`BatchOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Put,
    Delete,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireOp {
    op: OpKind,
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
}

impl TryFrom<WireOp> for BatchOp {
    type Error = String;

    fn try_from(wire: WireOp) -> Result<BatchOp, String> {
        match wire.op {
            OpKind::Put => Ok(BatchOp::Put {
                value: decode_value(wire.value, wire.value_base64)?,
                key: wire.key,
            }),
            OpKind::Delete if wire.value.is_some() || wire.value_base64.is_some() => Err(format!(
                "delete of key {:?} must not carry a value",
                wire.key
            )),
            OpKind::Delete => Ok(BatchOp::Delete { key: wire.key }),
        }
    }
}

impl From<BatchOp> for WireOp {
    fn from(op: BatchOp) -> WireOp {
        match op {
            BatchOp::Put { key, value } => {
                let (value, value_base64) = encode_value(value);
                WireOp {
                    op: OpKind::Put,
                    key,
                    value,
                    value_base64,
                }
            }
            BatchOp::Delete { key } => WireOp {
                op: OpKind::Delete,
                key,
                value: None,
                value_base64: None,
            },
        }
    }
}

fn encode_value(value: Vec<u8>) -> (Option<String>, Option<String>) {
    match String::from_utf8(value) {
        Ok(text) => (Some(text), None),
        Err(error) => (None, Some(STANDARD.encode(error.as_bytes()))),
    }
}

fn decode_value(value: Option<String>, value_base64: Option<String>) -> Result<Vec<u8>, String> {
    match (value, value_base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(encoded)) => STANDARD
            .decode(encoded)
            .map_err(|error| format!("value_base64 is not standard base64: {error}")),
        (Some(_), Some(_)) => Err("give either value or value_base64, not both".into()),
        (None, None) => Err("a put needs value or value_base64".into()),
    }
}

/// The body of `POST /v1/batch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub ops: Vec<BatchOp>,
}

/// The outcome of one operation of an accepted write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpAck {
    pub op: OpKind,
    pub key: String,
    /// Whether the key had a value before this operation.
    pub existed: bool,
}

/// An accepted, durable write: the grant it was accepted under and what each operation did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteAck {
    /// The lock of the sequencer.
    pub lock: String,
    /// The token the write was accepted with (now at most the lock's accepted maximum).
    pub token: u64,
    /// The session of the grant.
    pub session: u64,
    /// One entry per operation, in request order.
    pub ops: Vec<OpAck>,
    /// The request id the write was made with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// True when this answer is the stored outcome of an earlier request with the same
    /// sequencer and request id: the write was applied once, then, not now.
    #[serde(default)]
    pub replayed: bool,
}

/// A key's current value and the grant that wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireEntry", into = "WireEntry")]
pub struct Entry {
    pub key: String,
    pub value: Vec<u8>,
    /// The lock the key is bound to.
    pub lock: String,
    /// The token of the grant that wrote the value.
    pub token: u64,
    /// The session of that grant.
    pub session: u64,
}

#[derive(Serialize, Deserialize)]
struct WireEntry {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
    lock: String,
    token: u64,
    session: u64,
}

impl TryFrom<WireEntry> for Entry {
    type Error = String;

    fn try_from(wire: WireEntry) -> Result<Entry, String> {
        Ok(Entry {
            value: decode_value(wire.value, wire.value_base64)?,
            key: wire.key,
            lock: wire.lock,
            token: wire.token,
            session: wire.session,
        })
    }
}

impl From<Entry> for WireEntry {
    fn from(entry: Entry) -> WireEntry {
        let (value, value_base64) = encode_value(entry.value);
        WireEntry {
            key: entry.key,
            value,
            value_base64,
            lock: entry.lock,
            token: entry.token,
            session: entry.session,
        }
    }
}

/// What the store has accepted for one lock (`GET /v1/fence/{lock}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceView {
    pub lock: String,
    /// The highest token of the lock accepted so far; `None` if no write of the lock was
    /// ever accepted.
    pub token_max: Option<u64>,
    /// The session of the grant that presented `token_max`.
    pub holder_session: Option<u64>,
}
