//! The snapshot's bytes: the binary format this version writes, and the JSON of older ones.
//!
//! A snapshot is `snapshot.bin` in the data directory, replaced atomically (temporary file,
//! fsync, rename, fsync of the directory). The same bytes are what a leader sends a follower.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "PLSDSNAP"
//!      8     4  format version, u32 little-endian (3; 1 and 2 are still read)
//!     12     8  payload length in bytes, u64 little-endian
//!     20     4  CRC-32 (IEEE) of the payload, u32 little-endian
//!     24     n  payload: postcard of (meta, table image)
//! ```
//!
//! `meta` is the JSON (as postcard bytes) of the small, rarely read part: the last applied log
//! id, the membership, retired node ids and the key ring; JSON because those types belong to
//! openraft and to the key ring and skip empty fields, which a positional encoding must not.
//! The table is [`LockTable::image`], in postcard (positional, see `palisade_core`'s image
//! module). Format 2 added shared holders and semaphores to each lock, format 3 the multi-lock a
//! waiter may be a part of; a format-1 file (every grant exclusive) or a format-2 file (every
//! waiter alone) is read into the same table. A file whose length or checksum does not match its header is refused: a torn write
//! or a flipped bit is never loaded as a smaller table.
//!
//! **Upgrade.** A data directory of an older version holds `snapshot.json` (the JSON of the
//! whole state). It is read when there is no `snapshot.bin`, and removed once a `snapshot.bin`
//! is durable. A leader of an older version may send JSON too: [`decode`] reads both.

use std::collections::BTreeSet;
use std::io;

use openraft::type_config::alias::{LogIdOf, StoredMembershipOf};
use palisade_core::{LockTable, TableImage, TableImageV1, TableImageV2};
use serde::{Deserialize, Serialize};

use crate::applied::Applied;
use crate::keyring::KeyRing;
use crate::limits::SNAPSHOT_BYTES_MAX;
use crate::raft_types::C;

/// The snapshot file this version writes.
pub const SNAPSHOT_FILE: &str = "snapshot.bin";
/// The snapshot file of older versions: read if there is no [`SNAPSHOT_FILE`].
pub const LEGACY_SNAPSHOT_FILE: &str = "snapshot.json";

const MAGIC: [u8; 8] = *b"PLSDSNAP";
const FORMAT_VERSION: u32 = 3;
/// The format before shared holders and semaphores, still read.
const FORMAT_VERSION_1: u32 = 1;
/// The format before multi-locks, still read.
const FORMAT_VERSION_2: u32 = 2;
const HEADER_BYTES: usize = 24;

/// Everything but the table, in JSON.
#[derive(Serialize, Deserialize)]
struct Meta {
    last_applied: Option<LogIdOf<C>>,
    membership: StoredMembershipOf<C>,
    retired: BTreeSet<u64>,
    keys: KeyRing,
}

/// The snapshot of `applied` in the binary format.
pub(crate) fn encode(applied: &Applied) -> io::Result<Vec<u8>> {
    let meta = Meta {
        last_applied: applied.last_applied,
        membership: applied.membership.clone(),
        retired: applied.retired.clone(),
        keys: applied.keys.clone(),
    };
    let meta = serde_json::to_vec(&meta).map_err(io::Error::other)?;
    let header = vec![0; HEADER_BYTES];
    let mut bytes =
        postcard::to_extend(&(meta, applied.table.image()), header).map_err(io::Error::other)?;
    let payload_bytes = (bytes.len() - HEADER_BYTES) as u64;
    let crc = crc32fast::hash(&bytes[HEADER_BYTES..]);
    bytes[0..8].copy_from_slice(&MAGIC);
    bytes[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    bytes[12..20].copy_from_slice(&payload_bytes.to_le_bytes());
    bytes[20..24].copy_from_slice(&crc.to_le_bytes());
    Ok(bytes)
}

/// Decodes a snapshot from outside this process, in either format (`source` names it in
/// errors), and refuses it unless it is whole and its lock table is valid: a table that
/// breaks its own invariants would hand out wrong grants instead of stopping.
pub(crate) fn decode(bytes: &[u8], source: &str) -> io::Result<Applied> {
    let refused = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{source} is refused: {why}; restore the data directory from a backup or a \
                 replica"
            ),
        )
    };
    if !bytes.starts_with(&MAGIC) {
        return decode_json(bytes).map_err(refused);
    }
    let (meta, image) = payload(bytes).map_err(&refused)?;
    let meta: Meta = serde_json::from_slice(&meta)
        .map_err(|e| refused(format!("its metadata is not readable ({e})")))?;
    let table = LockTable::from_image(image)
        .map_err(|e| refused(format!("its lock table is invalid: {e}")))?;
    Ok(Applied {
        table,
        last_applied: meta.last_applied,
        membership: meta.membership,
        retired: meta.retired,
        keys: meta.keys,
    })
}

/// The log position and membership of a snapshot in either format, without decoding its
/// table (a binary snapshot's checksum is still checked).
pub(crate) fn decode_meta(
    bytes: &[u8],
    source: &str,
) -> io::Result<(Option<LogIdOf<C>>, StoredMembershipOf<C>)> {
    if !bytes.starts_with(&MAGIC) {
        let applied = decode(bytes, source)?;
        return Ok((applied.last_applied, applied.membership));
    }
    let refused = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{source} is refused: {why}"),
        )
    };
    let payload = checked_payload(bytes).map_err(refused)?;
    let (meta, _) = postcard::take_from_bytes::<Vec<u8>>(payload)
        .map_err(|e| refused(format!("it is not a lock-table snapshot ({e})")))?;
    let meta: Meta = serde_json::from_slice(&meta)
        .map_err(|e| refused(format!("its metadata is not readable ({e})")))?;
    Ok((meta.last_applied, meta.membership))
}

/// The payload of a binary snapshot, checked against its header, decoded.
fn payload(bytes: &[u8]) -> Result<(Vec<u8>, TableImage), String> {
    let payload = checked_payload(bytes)?;
    let unreadable = |e: postcard::Error| format!("it is not a lock-table snapshot ({e})");
    match format_version(bytes) {
        FORMAT_VERSION_1 => {
            let (meta, v1): (Vec<u8>, TableImageV1) =
                postcard::from_bytes(payload).map_err(unreadable)?;
            Ok((meta, v1.into()))
        }
        FORMAT_VERSION_2 => {
            let (meta, v2): (Vec<u8>, TableImageV2) =
                postcard::from_bytes(payload).map_err(unreadable)?;
            Ok((meta, v2.into()))
        }
        _ => postcard::from_bytes(payload).map_err(unreadable),
    }
}

fn format_version(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"))
}

/// The payload of a binary snapshot, once its length and checksum match its header.
fn checked_payload(bytes: &[u8]) -> Result<&[u8], String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "it is torn: {} bytes, shorter than its {HEADER_BYTES}-byte header",
            bytes.len()
        ));
    }
    let version = format_version(bytes);
    if ![FORMAT_VERSION_1, FORMAT_VERSION_2, FORMAT_VERSION].contains(&version) {
        return Err(format!(
            "it is in snapshot format {version}, and this version reads formats \
             {FORMAT_VERSION_1} to {FORMAT_VERSION} (and the JSON of older versions); run a \
             version that reads it"
        ));
    }
    let payload_bytes = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(bytes[20..24].try_into().expect("4 bytes"));
    let payload = &bytes[HEADER_BYTES..];
    if payload_bytes > SNAPSHOT_BYTES_MAX as u64 {
        return Err(format!(
            "its header claims {payload_bytes} bytes, above the {SNAPSHOT_BYTES_MAX}-byte limit"
        ));
    }
    if payload.len() as u64 != payload_bytes {
        return Err(format!(
            "it is torn: its header says {payload_bytes} bytes follow it, and {} do",
            payload.len()
        ));
    }
    if crc32fast::hash(payload) != crc {
        return Err("its checksum (crc32) does not match: the file is corrupt".into());
    }
    Ok(payload)
}

/// The JSON snapshot of older versions.
fn decode_json(bytes: &[u8]) -> Result<Applied, String> {
    let applied: Applied = serde_json::from_slice(bytes)
        .map_err(|e| format!("it is not a lock-table snapshot ({e})"))?;
    applied
        .table
        .validate()
        .map_err(|e| format!("its lock table is invalid: {e}"))?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_err(bytes: &[u8]) -> String {
        decode(bytes, "snapshot.bin").unwrap_err().to_string()
    }

    #[test]
    fn a_snapshot_comes_back_from_its_bytes_and_a_torn_or_corrupt_one_is_refused() {
        let applied = crate::state_machine::tests::applied_holding_a_lock();
        let bytes = encode(&applied).unwrap();
        assert_eq!(&bytes[..8], b"PLSDSNAP");
        let decoded = decode(&bytes, "snapshot.bin").unwrap();
        assert_eq!(decoded.table, applied.table);
        assert_eq!(decoded.last_applied, applied.last_applied);
        assert!(decoded.table.holder("l").is_some());
        let (last_applied, _) = decode_meta(&bytes, "snapshot.bin").unwrap();
        assert_eq!(last_applied, applied.last_applied);

        // A flipped bit in the payload: the checksum catches it.
        let mut flipped = bytes.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(decode_err(&flipped).contains("checksum (crc32) does not match"));
        // A torn write: fewer bytes than the header says, or not even a header.
        let torn = decode_err(&bytes[..bytes.len() - 3]);
        assert!(torn.contains("it is torn"), "{torn}");
        assert!(decode_err(&bytes[..10]).contains("it is torn"));
        // A format this version does not know.
        let mut future = bytes.clone();
        future[8] = 4;
        assert!(decode_err(&future).contains("snapshot format 4"));
        // Every refusal names the file and says what to do.
        assert!(torn.starts_with("snapshot.bin is refused") && torn.contains("restore"));
    }
}
