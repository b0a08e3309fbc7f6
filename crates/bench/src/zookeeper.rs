//! A minimal ZooKeeper client, just enough for ZooKeeper's standard lock recipe, so that
//! `palisade bench` can load ZooKeeper the way an application using the recipe would.
//!
//! The recipe (ZooKeeper's "Recipes and Solutions", Locks; Curator's `InterProcessMutex` is the
//! same): to acquire, create an ephemeral sequential node under the lock's node; list the lock's
//! children; if ours has the lowest sequence number, the lock is held; otherwise set a watch on
//! the next lower node (`exists` with a watch) and, when it goes, list again. To release, delete
//! the node. The session is a ZooKeeper session: when it expires, its ephemeral nodes go, and
//! with them its place in every line. The node's creation zxid (`czxid`) is the natural fencing
//! token: zxids only grow, and each grant's node is created after its predecessor's was.
//!
//! Why not a crate: the maintained async client (`zookeeper-client`) runs its sockets on its own
//! `async-io` reactor thread beside tokio's, which would put a thread hand-off on every operation
//! that the other targets do not pay, and brings some twenty crates. What the recipe needs of the
//! wire protocol (jute: connect, create2, create, delete, getChildren, exists with a watch, ping,
//! closeSession) is small, and is all here.
//!
//! One [`ZkSession`] is one TCP connection and one ZooKeeper session, driven by one task at a
//! time: each call writes its request and reads frames until its reply, keeping any watch event
//! that arrives first. Nothing reconnects: a lost connection is an error, as it is for a
//! benchmark client of every other target.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::time::Instant;

/// Largest frame this client reads or writes (ZooKeeper's own default `jute.maxbuffer` is 1 MiB).
const FRAME_BYTES_MAX: usize = 1 << 20;
/// Longest lock name, in bytes (a ZooKeeper path below the root).
pub const LOCK_NAME_BYTES_MAX: usize = 1024;
/// How long the connect handshake, and closing a session, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Watch events kept for a later wait; a session of the recipe has one watch at a time, so more
/// than this means events nobody waits for, and the oldest are dropped.
const EVENTS_MAX: usize = 64;
/// Lock nodes whose ancestors this session has already created.
const PARENTS_KNOWN_MAX: usize = 4096;

/// The prefix of each lock's contender nodes; the sequence number follows it.
const NODE_PREFIX: &str = "lock-";

// Operation codes and special xids of the jute protocol (ZooKeeper's `ZooDefs.OpCode`).
const OP_CREATE: i32 = 1;
const OP_DELETE: i32 = 2;
const OP_EXISTS: i32 = 3;
const OP_GET_CHILDREN: i32 = 8;
const OP_PING: i32 = 11;
const OP_CREATE2: i32 = 15;
const OP_CLOSE_SESSION: i32 = -11;
const XID_NOTIFICATION: i32 = -1;
const XID_PING: i32 = -2;

// Error codes (`KeeperException.Code`).
const OK: i32 = 0;
const NO_NODE: i32 = -101;
const NODE_EXISTS: i32 = -110;

// Create modes.
const PERSISTENT: i32 = 0;
const EPHEMERAL_SEQUENTIAL: i32 = 3;

/// ACL permission bits: all (read, write, create, delete, admin).
const PERMS_ALL: i32 = 31;

/// A lock held through the recipe: this session's node, and its creation zxid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZkGrant {
    /// The full path of the ephemeral sequential node; deleting it releases the lock.
    pub node: String,
    /// The node's creation zxid: the fencing token.
    pub czxid: i64,
}

/// One ZooKeeper session on one connection.
#[derive(Debug)]
pub struct ZkSession {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    session_id: i64,
    /// The session timeout the server granted.
    timeout: Duration,
    next_xid: i32,
    /// Paths named by watch events that arrived while a call waited for its reply.
    events: VecDeque<String>,
    /// Lock nodes whose persistent ancestors exist (created by this session or found).
    parents_known: HashSet<String>,
    /// When this session last wrote to the server: a wait pings when it has been quiet a third
    /// of the timeout, as ZooKeeper's own clients do.
    last_sent: Instant,
}

/// A reply: its header's error code and the body that follows on success.
struct Reply {
    err: i32,
    body: Vec<u8>,
}

impl ZkSession {
    /// Connects to one ZooKeeper server (`HOST:PORT`) and opens a session that the server ends
    /// after `timeout` without traffic (the server bounds it: by default 2 to 20 ticks).
    pub async fn connect(address: &str, timeout: Duration) -> anyhow::Result<ZkSession> {
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| anyhow!("no connection to zookeeper at {address} within 10 s"))?
            .with_context(|| format!("cannot connect to zookeeper at {address}"))?;
        stream.set_nodelay(true)?;
        let (reader, writer) = stream.into_split();
        let mut session = ZkSession {
            reader: BufReader::new(reader),
            writer,
            session_id: 0,
            timeout,
            next_xid: 1,
            events: VecDeque::new(),
            parents_known: HashSet::new(),
            last_sent: Instant::now(),
        };
        // ConnectRequest: protocol version, last zxid seen, timeout, session id, password, and
        // read-only allowed.
        let mut request = Vec::with_capacity(48);
        put_i32(&mut request, 0);
        put_i64(&mut request, 0);
        put_i32(&mut request, timeout_ms);
        put_i64(&mut request, 0);
        put_buffer(&mut request, &[0; 16]);
        request.push(0);
        let response = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            session.send(&request).await?;
            session.read_frame().await
        })
        .await
        .map_err(|_| anyhow!("zookeeper at {address} did not answer the handshake in 10 s"))??;
        let mut body = Decoder::new(&response);
        let _protocol_version = body.i32()?;
        let timeout_ms = body.i32()?;
        let session_id = body.i64()?;
        if timeout_ms <= 0 || session_id == 0 {
            bail!("zookeeper at {address} refused the session (it may be starting or read-only)");
        }
        session.session_id = session_id;
        session.timeout = Duration::from_millis(timeout_ms as u64);
        Ok(session)
    }

    /// The session id the server assigned.
    pub fn session_id(&self) -> i64 {
        self.session_id
    }

    /// Takes `lock` with the recipe, waiting in line behind any holder.
    pub async fn acquire(&mut self, lock: &str) -> anyhow::Result<ZkGrant> {
        let parent = lock_path(lock)?;
        self.ensure_path(&parent).await?;
        let (node, czxid) = self.create_contender(&parent).await?;
        let ours = sequence_of(&node)?;
        loop {
            let mut children = self.children(&parent).await?;
            children.retain(|c| c.starts_with(NODE_PREFIX));
            let mut sequenced = children
                .iter()
                .map(|c| Ok((sequence_of(c)?, c)))
                .collect::<anyhow::Result<Vec<_>>>()?;
            sequenced.sort();
            let Some(place) = sequenced.iter().position(|(sequence, _)| *sequence == ours) else {
                bail!("zookeeper lost our lock node {node} (did the session expire?)");
            };
            if place == 0 {
                return Ok(ZkGrant { node, czxid });
            }
            let predecessor = format!("{parent}/{}", sequenced[place - 1].1);
            if self.exists_watch(&predecessor).await? {
                self.wait_for_event(&predecessor).await?;
            }
        }
    }

    /// Releases a lock taken with [`ZkSession::acquire`]: deletes its node.
    pub async fn release(&mut self, grant: &ZkGrant) -> anyhow::Result<()> {
        let mut body = Vec::with_capacity(grant.node.len() + 8);
        put_string(&mut body, &grant.node);
        put_i32(&mut body, -1);
        let reply = self.call(OP_DELETE, &body).await?;
        match reply.err {
            OK => Ok(()),
            err => bail!("zookeeper delete {}: {}", grant.node, error_name(err)),
        }
    }

    /// Ends the session, which deletes its ephemeral nodes; waits at most 10 s for the reply.
    pub async fn close(mut self) -> anyhow::Result<()> {
        tokio::time::timeout(HANDSHAKE_TIMEOUT, self.call(OP_CLOSE_SESSION, &[]))
            .await
            .map_err(|_| anyhow!("zookeeper did not close the session in 10 s"))??;
        Ok(())
    }

    /// Creates every missing ancestor of `path` and `path` itself as persistent nodes.
    async fn ensure_path(&mut self, path: &str) -> anyhow::Result<()> {
        if self.parents_known.contains(path) {
            return Ok(());
        }
        let mut prefix = String::with_capacity(path.len());
        for segment in path.split('/').skip(1) {
            prefix.push('/');
            prefix.push_str(segment);
            let mut body = Vec::with_capacity(prefix.len() + 48);
            put_string(&mut body, &prefix);
            put_buffer(&mut body, &[]);
            put_open_acl(&mut body);
            put_i32(&mut body, PERSISTENT);
            let reply = self.call(OP_CREATE, &body).await?;
            match reply.err {
                OK | NODE_EXISTS => {}
                err => bail!("zookeeper create {prefix}: {}", error_name(err)),
            }
        }
        if self.parents_known.len() >= PARENTS_KNOWN_MAX {
            self.parents_known.clear();
        }
        self.parents_known.insert(path.to_string());
        Ok(())
    }

    /// Creates this session's ephemeral sequential node under `parent`: its path and czxid.
    async fn create_contender(&mut self, parent: &str) -> anyhow::Result<(String, i64)> {
        let prefix = format!("{parent}/{NODE_PREFIX}");
        let mut body = Vec::with_capacity(prefix.len() + 48);
        put_string(&mut body, &prefix);
        put_buffer(&mut body, &[]);
        put_open_acl(&mut body);
        put_i32(&mut body, EPHEMERAL_SEQUENTIAL);
        let reply = self.call(OP_CREATE2, &body).await?;
        if reply.err != OK {
            bail!("zookeeper create {prefix}: {}", error_name(reply.err));
        }
        let mut decoder = Decoder::new(&reply.body);
        let node = decoder.string()?;
        let czxid = decoder.i64()?;
        Ok((node, czxid))
    }

    /// The names of `path`'s children, without setting a watch.
    async fn children(&mut self, path: &str) -> anyhow::Result<Vec<String>> {
        let mut body = Vec::with_capacity(path.len() + 8);
        put_string(&mut body, path);
        body.push(0);
        let reply = self.call(OP_GET_CHILDREN, &body).await?;
        if reply.err != OK {
            bail!("zookeeper getChildren {path}: {}", error_name(reply.err));
        }
        let mut decoder = Decoder::new(&reply.body);
        let count = decoder.i32()?;
        let count = usize::try_from(count).map_err(|_| anyhow!("a negative child count"))?;
        // Each name takes at least its 4-byte length.
        if count > reply.body.len() / 4 {
            bail!(
                "zookeeper sent {count} children in a {} byte reply",
                reply.body.len()
            );
        }
        (0..count).map(|_| decoder.string()).collect()
    }

    /// Whether `path` exists, leaving a watch on it either way.
    async fn exists_watch(&mut self, path: &str) -> anyhow::Result<bool> {
        let mut body = Vec::with_capacity(path.len() + 8);
        put_string(&mut body, path);
        body.push(1);
        let reply = self.call(OP_EXISTS, &body).await?;
        match reply.err {
            OK => Ok(true),
            NO_NODE => Ok(false),
            err => bail!("zookeeper exists {path}: {}", error_name(err)),
        }
    }

    /// Waits until a watch event names `path`, pinging the server while it waits.
    async fn wait_for_event(&mut self, path: &str) -> anyhow::Result<()> {
        if let Some(at) = self.events.iter().position(|p| p == path) {
            self.events.remove(at);
            return Ok(());
        }
        let ping_interval = self.timeout / 3;
        loop {
            let quiet_until = self.last_sent + ping_interval;
            match tokio::time::timeout_at(quiet_until, self.read_frame()).await {
                Err(_) => {
                    let mut ping = Vec::with_capacity(8);
                    put_i32(&mut ping, XID_PING);
                    put_i32(&mut ping, OP_PING);
                    self.send(&ping).await?;
                }
                Ok(frame) => {
                    let frame = frame?;
                    let mut decoder = Decoder::new(&frame);
                    let xid = decoder.i32()?;
                    match xid {
                        XID_PING => {}
                        XID_NOTIFICATION => {
                            if self.notification(&mut decoder)? == path {
                                return Ok(());
                            }
                        }
                        xid => bail!("zookeeper replied to request {xid}, which nothing awaits"),
                    }
                }
            }
        }
    }

    /// Sends a request and reads frames until its reply, keeping the watch events that come
    /// first.
    async fn call(&mut self, op: i32, body: &[u8]) -> anyhow::Result<Reply> {
        let xid = self.next_xid;
        self.next_xid = if xid == i32::MAX { 1 } else { xid + 1 };
        let mut request = Vec::with_capacity(8 + body.len());
        put_i32(&mut request, xid);
        put_i32(&mut request, op);
        request.extend_from_slice(body);
        self.send(&request).await?;
        loop {
            let frame = self.read_frame().await?;
            let mut decoder = Decoder::new(&frame);
            match decoder.i32()? {
                XID_PING => {}
                XID_NOTIFICATION => {
                    let path = self.notification(&mut decoder)?;
                    if self.events.len() == EVENTS_MAX {
                        self.events.pop_front();
                    }
                    self.events.push_back(path);
                }
                reply_xid if reply_xid == xid => {
                    let _zxid = decoder.i64()?;
                    let err = decoder.i32()?;
                    return Ok(Reply {
                        err,
                        body: decoder.rest().to_vec(),
                    });
                }
                other => bail!("zookeeper answered request {other} while {xid} was awaited"),
            }
        }
    }

    /// Decodes the rest of a notification (after its xid): the path it names.
    fn notification(&mut self, decoder: &mut Decoder<'_>) -> anyhow::Result<String> {
        let _zxid = decoder.i64()?;
        let _err = decoder.i32()?;
        let _event_type = decoder.i32()?;
        let _state = decoder.i32()?;
        decoder.string()
    }

    async fn send(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        if payload.len() > FRAME_BYTES_MAX {
            bail!(
                "a zookeeper request of {} bytes is over the limit",
                payload.len()
            );
        }
        let mut frame = Vec::with_capacity(4 + payload.len());
        put_i32(&mut frame, payload.len() as i32);
        frame.extend_from_slice(payload);
        self.writer
            .write_all(&frame)
            .await
            .context("cannot write to zookeeper")?;
        self.last_sent = Instant::now();
        Ok(())
    }

    async fn read_frame(&mut self) -> anyhow::Result<Vec<u8>> {
        let length = self
            .reader
            .read_i32()
            .await
            .context("the connection to zookeeper closed")?;
        let length = usize::try_from(length)
            .ok()
            .filter(|n| *n <= FRAME_BYTES_MAX)
            .ok_or_else(|| anyhow!("zookeeper sent a frame of {length} bytes"))?;
        let mut frame = vec![0; length];
        self.reader
            .read_exact(&mut frame)
            .await
            .context("the connection to zookeeper closed mid-frame")?;
        Ok(frame)
    }
}

/// The ZooKeeper path of a lock: `/` and its name, whose `/`-separated parts must each be a
/// plain node name.
pub fn lock_path(lock: &str) -> anyhow::Result<String> {
    if lock.is_empty() || lock.len() > LOCK_NAME_BYTES_MAX {
        bail!(
            "a zookeeper lock name has 1 to {LOCK_NAME_BYTES_MAX} bytes, not {}",
            lock.len()
        );
    }
    for part in lock.split('/') {
        if part.is_empty() || part == "." || part == ".." || part.contains('\0') {
            bail!(
                "lock name {lock:?} is no zookeeper path: each '/'-separated part must be a \
                 non-empty name other than . and .."
            );
        }
    }
    Ok(format!("/{lock}"))
}

/// The sequence number ZooKeeper appended to a contender node (its last ten digits).
fn sequence_of(node: &str) -> anyhow::Result<u64> {
    let digits = node
        .len()
        .checked_sub(10)
        .and_then(|start| node.get(start..))
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| anyhow!("zookeeper node {node:?} has no sequence number"))?;
    Ok(digits.parse()?)
}

/// A readable name for the error codes the recipe can meet.
fn error_name(code: i32) -> String {
    let name = match code {
        -4 => "connection loss",
        -101 => "no node",
        -102 => "no auth",
        -103 => "bad version",
        -110 => "node exists",
        -111 => "not empty",
        -112 => "session expired",
        -118 => "session moved",
        _ => "error",
    };
    format!("{name} ({code})")
}

fn put_i32(out: &mut Vec<u8>, value: i32) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(&value.to_be_bytes());
}

fn put_buffer(out: &mut Vec<u8>, bytes: &[u8]) {
    put_i32(out, bytes.len() as i32);
    out.extend_from_slice(bytes);
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    put_buffer(out, text.as_bytes());
}

/// The ACL `world:anyone` with every permission, as the recipe's examples use.
fn put_open_acl(out: &mut Vec<u8>) {
    put_i32(out, 1);
    put_i32(out, PERMS_ALL);
    put_string(out, "world");
    put_string(out, "anyone");
}

/// Reads big-endian jute fields from a frame, refusing to run past its end.
struct Decoder<'a> {
    bytes: &'a [u8],
}

impl<'a> Decoder<'a> {
    fn new(bytes: &'a [u8]) -> Decoder<'a> {
        Decoder { bytes }
    }

    fn take(&mut self, n: usize) -> anyhow::Result<&'a [u8]> {
        if self.bytes.len() < n {
            bail!("a zookeeper frame ended early");
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn i32(&mut self) -> anyhow::Result<i32> {
        Ok(i32::from_be_bytes(self.take(4)?.try_into()?))
    }

    fn i64(&mut self) -> anyhow::Result<i64> {
        Ok(i64::from_be_bytes(self.take(8)?.try_into()?))
    }

    fn string(&mut self) -> anyhow::Result<String> {
        let length = self.i32()?;
        let length = usize::try_from(length).map_err(|_| anyhow!("a null zookeeper string"))?;
        Ok(String::from_utf8(self.take(length)?.to_vec())?)
    }

    fn rest(&self) -> &'a [u8] {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_become_zookeeper_paths_or_are_refused() {
        assert_eq!(
            lock_path("bench/1/contended").unwrap(),
            "/bench/1/contended"
        );
        for bad in ["", "/a", "a/", "a//b", "a/./b", "a/../b", "a\0b"] {
            assert!(lock_path(bad).is_err(), "{bad:?}");
        }
        assert!(lock_path(&"x".repeat(LOCK_NAME_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn contenders_are_ordered_by_their_sequence_number() {
        assert_eq!(sequence_of("/a/lock-0000000042").unwrap(), 42);
        assert_eq!(sequence_of("lock-2147483647").unwrap(), 2_147_483_647);
        assert!(sequence_of("lock-").is_err());
        assert!(sequence_of("lock-00000000x1").is_err());
    }

    #[test]
    fn a_frame_that_ends_early_is_an_error_not_a_panic() {
        let mut frame = Vec::new();
        put_string(&mut frame, "abc");
        assert_eq!(Decoder::new(&frame).string().unwrap(), "abc");
        assert!(Decoder::new(&frame[..5]).string().is_err());
        assert!(Decoder::new(&[0, 0]).i32().is_err());
        let mut negative = Vec::new();
        put_i32(&mut negative, -1);
        assert!(Decoder::new(&negative).string().is_err());
    }
}
