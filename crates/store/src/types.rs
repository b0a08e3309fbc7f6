//! The values the store takes and returns, with their JSON forms (shared by the server and
//! [`crate::StoreClient`]).
//!
//! Values are bytes. In JSON a value is sent as `"value": "<text>"` when it is UTF-8 and as
//! `"value_base64": "<standard base64>"` otherwise; a request may use either form.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// One operation of a transaction: what [`crate::Store::txn`] applies, in order, as one
/// fenced unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireOp", into = "WireOp")]
pub enum BatchOp {
    /// Sets `key` to `value`.
    Put { key: String, value: Vec<u8> },
    /// Removes `key`, leaving a tombstone that keeps the key bound to its lock.
    Delete { key: String },
    /// Reads `key` inside the transaction: it sees the operations before it, and it is
    /// fenced like the rest of the transaction.
    Get { key: String },
}

impl BatchOp {
    /// The key this operation touches.
    pub fn key(&self) -> &str {
        match self {
            BatchOp::Put { key, .. } | BatchOp::Delete { key } | BatchOp::Get { key } => key,
        }
    }

    /// Whether it is a put, a delete or a get.
    pub fn kind(&self) -> OpKind {
        match self {
            BatchOp::Put { .. } => OpKind::Put,
            BatchOp::Delete { .. } => OpKind::Delete,
            BatchOp::Get { .. } => OpKind::Get,
        }
    }
}

/// The kind of a [`BatchOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    Put,
    Delete,
    Get,
}

/// A condition a transaction checks before it applies anything; every compare must hold,
/// or nothing is applied and the store answers [`crate::StoreError::CompareFailed`].
///
/// A key that was never written, or is deleted, has revision 0 and no value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireCompare", into = "WireCompare")]
pub enum Compare {
    /// The key's revision is exactly `revision` (0: the key has no value).
    Revision { key: String, revision: u64 },
    /// The key has exactly this value.
    Value { key: String, value: Vec<u8> },
    /// The key has a value (`true`) or has none (`false`).
    Exists { key: String, exists: bool },
}

impl Compare {
    /// The key the condition is about.
    pub fn key(&self) -> &str {
        match self {
            Compare::Revision { key, .. }
            | Compare::Value { key, .. }
            | Compare::Exists { key, .. } => key,
        }
    }

    /// Whether the condition holds for a key whose current entry is `entry`.
    pub(crate) fn holds(&self, entry: Option<(&[u8], u64)>) -> bool {
        match self {
            Compare::Revision { revision, .. } => entry.map_or(0, |(_, rev)| rev) == *revision,
            Compare::Value { value, .. } => entry.is_some_and(|(current, _)| current == value),
            Compare::Exists { exists, .. } => entry.is_some() == *exists,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireCompare {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exists: Option<bool>,
}

impl TryFrom<WireCompare> for Compare {
    type Error = String;

    fn try_from(wire: WireCompare) -> Result<Compare, String> {
        let has_value = wire.value.is_some() || wire.value_base64.is_some();
        match (wire.revision, has_value, wire.exists) {
            (Some(revision), false, None) => Ok(Compare::Revision {
                key: wire.key,
                revision,
            }),
            (None, true, None) => Ok(Compare::Value {
                value: decode_value(wire.value, wire.value_base64)?,
                key: wire.key,
            }),
            (None, false, Some(exists)) => Ok(Compare::Exists {
                key: wire.key,
                exists,
            }),
            _ => Err(format!(
                "compare of key {:?} needs exactly one of revision, value (or value_base64) and exists",
                wire.key
            )),
        }
    }
}

impl From<Compare> for WireCompare {
    fn from(compare: Compare) -> WireCompare {
        let mut wire = WireCompare {
            key: String::new(),
            revision: None,
            value: None,
            value_base64: None,
            exists: None,
        };
        match compare {
            Compare::Revision { key, revision } => {
                wire.key = key;
                wire.revision = Some(revision);
            }
            Compare::Value { key, value } => {
                wire.key = key;
                (wire.value, wire.value_base64) = encode_value(value);
            }
            Compare::Exists { key, exists } => {
                wire.key = key;
                wire.exists = Some(exists);
            }
        }
        wire
    }
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
            OpKind::Delete | OpKind::Get if wire.value.is_some() || wire.value_base64.is_some() => {
                Err(format!(
                    "{} of key {:?} must not carry a value",
                    if wire.op == OpKind::Get {
                        "get"
                    } else {
                        "delete"
                    },
                    wire.key
                ))
            }
            OpKind::Delete => Ok(BatchOp::Delete { key: wire.key }),
            OpKind::Get => Ok(BatchOp::Get { key: wire.key }),
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
            BatchOp::Get { key } => WireOp {
                op: OpKind::Get,
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

/// The body of `POST /v1/txn` (and of `POST /v1/batch`, its older name): compares that must
/// all hold, then operations applied in order, all or nothing, under one sequencer check.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// Conditions checked before anything is applied (the read-set of a batch).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compare: Vec<Compare>,
    pub ops: Vec<BatchOp>,
}

/// The outcome of one operation of an accepted write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpAck {
    pub op: OpKind,
    pub key: String,
    /// Whether the key had a value before this operation.
    pub existed: bool,
    /// For a get: the key's entry as the transaction saw it (`None`: no value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Entry>,
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
    /// The store's revision after this write: every key it put or deleted now has this
    /// revision. A transaction of gets only leaves the revision as it was.
    #[serde(default)]
    pub revision: u64,
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
    /// The store revision of the write that set the value; a conditional write names it to
    /// change the key only if nobody wrote it since.
    pub revision: u64,
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
    #[serde(default)]
    revision: u64,
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
            revision: wire.revision,
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
            revision: entry.revision,
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

/// An accepted claim (`POST /v1/claim`): the lock's accepted token is now the sequencer's, so
/// no older grant of the lock can read or write here any more. Nothing else changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimAck {
    pub lock: String,
    /// The claimed token, now the lock's accepted maximum.
    pub token: u64,
    pub session: u64,
    /// The accepted maximum before the claim; `None` if the store had seen no grant of the lock.
    pub previous_token_max: Option<u64>,
    /// False when the store had already accepted this token: the claim changed nothing.
    pub advanced: bool,
}
