//! Accepting connections: from a [`Listener`] (TCP with `TCP_NODELAY`, or a simulated
//! network), at most [`CONNECTIONS_MAX`] at once.
//!
//! A connection holds a permit for its whole life. When all permits are taken, the server stops
//! accepting, and further clients wait in the kernel's accept backlog until a connection closes,
//! instead of each costing the server a task and buffers.
//!
//! So that idle sockets cannot hold the permits for ever, a connection must deliver the HTTP/2
//! client preface (its first [`PREFACE_BYTES`] bytes, which every gRPC client sends at once)
//! within [`CONNECTION_PREFACE_TIMEOUT`] of being accepted, or it is closed. Past the preface,
//! the server's HTTP/2 keepalive pings (`lib.rs`) close a connection whose peer stops answering.
//!
//! With TLS ([`crate::tls`]), the handshake comes first and counts against the same deadline:
//! from acceptance, a connection has [`CONNECTION_PREFACE_TIMEOUT`] to finish its handshake and
//! send the preface (decrypted) over it. Handshakes run concurrently, each holding its
//! connection's permit, so a client that stalls mid-handshake delays nobody else's and holds a
//! permit no longer than a silent plaintext socket does.
//!
//! Past the preface, what one client may hold is bounded by [`ConnectionLimits`]:
//!
//! - a connection on which no call has been open for
//!   [`idle_timeout`](ConnectionLimits::idle_timeout) is closed (pings do not count: a client
//!   that only answers them holds nothing open). The calls are counted by the admission layer
//!   ([`crate::admission::ConnectionLoad`]); the close is abrupt, as no call is open, and a
//!   client whose next call crosses it sees UNAVAILABLE and retries;
//! - a connection is sent an HTTP/2 GOAWAY at [`age_max`](ConnectionLimits::age_max) (tonic's
//!   `max_connection_age`, `lib.rs`): the client opens its next calls on a new connection, the
//!   open ones go on; and it is closed [`age_grace`](ConnectionLimits::age_grace) later,
//!   whatever is still open;
//! - connections without a verified client certificate share all permits but
//!   [`CONNECTIONS_RESERVED_FOR_CERTIFIED`], and one source address may hold at most
//!   [`per_address_max`](ConnectionLimits::per_address_max) of them (loopback sources only if
//!   [`per_address_loopback`](ConnectionLimits::per_address_loopback)). A connection over
//!   either is accepted and closed at once, after an HTTP/2 GOAWAY (`ENHANCE_YOUR_CALM`) whose
//!   debug text says why. Which connections are authenticated is known at accept time only
//!   through mutual TLS: a bearer token arrives with each call, after the connection was
//!   admitted, so without mutual TLS every connection counts as unauthenticated here.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use palisade_proto::transport::BoxedConnection;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::connection::ConnectionLoad;
use crate::connection::{ConnectionInfo, Peer};
use crate::limits::{
    CONNECTION_PREFACE_TIMEOUT, CONNECTIONS_MAX, CONNECTIONS_RESERVED_FOR_CERTIFIED,
    ConnectionLimits,
};
use crate::tls::ServerTls;

/// The length of the HTTP/2 client connection preface (RFC 9113, section 3.4).
pub const PREFACE_BYTES: usize = 24;

/// Where a server accepts its connections.
pub struct Listener {
    local_addr: SocketAddr,
    accepts: BoxStream<'static, io::Result<(BoxedConnection, TcpConnectInfo)>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Listener {
    /// Listens on `addr` over TCP (port 0 picks a free one).
    pub async fn bind(addr: SocketAddr) -> io::Result<Listener> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let accepts = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.and_then(|(stream, remote)| {
                // Small gRPC frames must not wait for the previous one's acknowledgement.
                stream.set_nodelay(true)?;
                let info = TcpConnectInfo {
                    local_addr: stream.local_addr().ok(),
                    remote_addr: Some(remote),
                };
                Ok((Box::new(stream) as BoxedConnection, info))
            });
            Some((accepted, listener))
        });
        Ok(Listener {
            local_addr,
            accepts: Box::pin(accepts),
        })
    }

    /// The connections `accepts` yields, as if listening on `local_addr`: a simulated network.
    pub fn from_stream(
        local_addr: SocketAddr,
        accepts: impl Stream<Item = io::Result<(BoxedConnection, SocketAddr)>> + Send + 'static,
    ) -> Listener {
        use futures::StreamExt as _;
        let accepts = accepts.map(move |accepted| {
            accepted.map(|(connection, remote)| {
                let info = TcpConnectInfo {
                    local_addr: Some(local_addr),
                    remote_addr: Some(remote),
                };
                (connection, info)
            })
        });
        Listener {
            local_addr,
            accepts: Box::pin(accepts),
        }
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

/// An accepted connection and its permit.
pub struct Connection {
    stream: BoxedConnection,
    info: ConnectionInfo,
    _permit: OwnedSemaphorePermit,
    /// Its place among the connections of its source address, once admitted without a client
    /// certificate.
    _slot: Option<Slot>,
    /// Until the preface is in: when it is due, and how many of its bytes are still to come.
    preface: Option<(Pin<Box<Sleep>>, usize)>,
    /// When to look again whether the connection has been idle for too long.
    idle_check: Pin<Box<Sleep>>,
    idle_timeout: std::time::Duration,
    /// When it is closed whatever is open: its age limit and grace.
    closes_at: Pin<Box<Sleep>>,
}

impl Connection {
    fn accepted(
        stream: BoxedConnection,
        tcp: TcpConnectInfo,
        permit: OwnedSemaphorePermit,
        limits: &ConnectionLimits,
    ) -> Connection {
        Connection {
            stream,
            info: ConnectionInfo {
                tcp,
                peer: Peer::default(),
                load: ConnectionLoad::new(),
            },
            _permit: permit,
            _slot: None,
            preface: Some((
                Box::pin(tokio::time::sleep(CONNECTION_PREFACE_TIMEOUT)),
                PREFACE_BYTES,
            )),
            idle_check: Box::pin(tokio::time::sleep(limits.idle_timeout)),
            idle_timeout: limits.idle_timeout,
            closes_at: Box::pin(tokio::time::sleep(
                limits.age_max.saturating_add(limits.age_grace),
            )),
        }
    }

    /// Why the connection must close now, if it must: too old, or idle for too long. Polls the
    /// timers, so that the task is woken when one is due.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        if self.closes_at.as_mut().poll(cx).is_ready() {
            return Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection reached its age limit and grace; closed",
            ));
        }
        while self.idle_check.as_mut().poll(cx).is_ready() {
            let now = tokio::time::Instant::now();
            let next = match self.info.load.idle_since() {
                Some(since) => {
                    let due = tokio::time::Instant::from_std(since) + self.idle_timeout;
                    if due <= now {
                        return Some(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "no call on the connection for {:?}; closed",
                                self.idle_timeout
                            ),
                        ));
                    }
                    due
                }
                None => now + self.idle_timeout,
            };
            self.idle_check.as_mut().reset(next);
        }
        None
    }
}

/// The connections without a client certificate: how many there are, and from which source
/// addresses.
#[derive(Debug)]
struct Holders {
    limits: ConnectionLimits,
    counts: Mutex<HolderCounts>,
}

#[derive(Debug, Default)]
struct HolderCounts {
    uncertified: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// A connection's place in [`Holders`], given back when it closes.
struct Slot {
    holders: Arc<Holders>,
    address: Option<IpAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self
            .holders
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        counts.uncertified -= 1;
        if let Some(address) = self.address
            && let std::collections::hash_map::Entry::Occupied(mut entry) =
                counts.per_address.entry(address)
        {
            *entry.get_mut() -= 1;
            if *entry.get() == 0 {
                entry.remove();
            }
        }
    }
}

impl Holders {
    /// `connection` if it may stay: it presented a verified certificate, or it fits the share
    /// of connections without one and its address's. Otherwise it is told why and closed, in
    /// a task of its own, and `None` is returned.
    fn admit(self: &Arc<Self>, mut connection: Connection) -> Option<Connection> {
        let peer = &connection.info.peer;
        if peer.client_cert.is_some() || peer.is_peer {
            return Some(connection);
        }
        let remote = connection.info.tcp.remote_addr.map(|a| a.ip());
        let counted = remote.filter(|ip| self.limits.per_address_loopback || !ip.is_loopback());
        let refusal = {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            let from_address =
                counted.map_or(0, |ip| counts.per_address.get(&ip).copied().unwrap_or(0));
            if counts.uncertified >= CONNECTIONS_MAX - CONNECTIONS_RESERVED_FOR_CERTIFIED {
                Some(format!(
                    "the server's {} connections for clients without a certificate are all open; retry later, or connect with a client certificate (mutual TLS)",
                    CONNECTIONS_MAX - CONNECTIONS_RESERVED_FOR_CERTIFIED
                ))
            } else if let Some(ip) = counted
                && from_address >= self.limits.per_address_max
            {
                Some(format!(
                    "{ip} has {} connections open, its most; close one, or share one connection among calls",
                    self.limits.per_address_max
                ))
            } else {
                counts.uncertified += 1;
                if let Some(ip) = counted {
                    *counts.per_address.entry(ip).or_default() += 1;
                }
                None
            }
        };
        match refusal {
            None => {
                connection._slot = Some(Slot {
                    holders: self.clone(),
                    address: counted,
                });
                Some(connection)
            }
            Some(reason) => {
                tracing::debug!(remote = ?connection.info.tcp.remote_addr, "connection refused: {reason}");
                metrics::counter!(crate::metrics::CONNECTIONS_REFUSED_TOTAL).increment(1);
                tokio::spawn(go_away(connection, reason));
                None
            }
        }
    }
}

/// How long a refused connection is given to read why before it is closed.
const GO_AWAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Tells a refused client why, as HTTP/2 does (an empty SETTINGS frame, the server's
/// preface, then GOAWAY with `ENHANCE_YOUR_CALM` and `reason` as its debug data), and closes.
async fn go_away(mut connection: Connection, reason: String) {
    let reason = &reason.as_bytes()[..reason.len().min(1024)];
    let mut frames = Vec::with_capacity(9 + 9 + 8 + reason.len());
    frames.extend_from_slice(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]);
    let length = u32::try_from(8 + reason.len()).expect("at most 1032 bytes");
    frames.extend_from_slice(&length.to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&0u32.to_be_bytes()); // no stream was processed
    frames.extend_from_slice(&0xbu32.to_be_bytes()); // ENHANCE_YOUR_CALM
    frames.extend_from_slice(reason);
    let goodbye = async {
        connection.stream.write_all(&frames).await?;
        connection.stream.flush().await?;
        // Read what the client sent until it closes, so that closing does not reset the
        // connection before the client read the GOAWAY.
        let mut sink = [0u8; 4096];
        while connection.stream.read(&mut sink).await? > 0 {}
        io::Result::Ok(())
    };
    let _ = tokio::time::timeout(GO_AWAY_TIMEOUT, goodbye).await;
}

/// The connections `listener` accepts, at most `CONNECTIONS_MAX` open at once, each admitted
/// by `limits` (module docs); with `tls`, each once its handshake is done (within the preface
/// deadline; one that fails or runs out of time is closed and logged, never yielded).
pub(crate) fn limited(
    listener: Listener,
    tls: Option<ServerTls>,
    limits: ConnectionLimits,
) -> BoxStream<'static, io::Result<Connection>> {
    use futures::StreamExt as _;
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let holders = Arc::new(Holders {
        limits,
        counts: Mutex::new(HolderCounts::default()),
    });
    let accepted = futures::stream::unfold(
        (listener.accepts, permits),
        move |(mut accepts, permits)| async move {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let accepted = accepts
                .next()
                .await?
                .map(|(stream, tcp)| Connection::accepted(stream, tcp, permit, &limits));
            Some((accepted, (accepts, permits)))
        },
    );
    let Some(tls) = tls else {
        return accepted
            .filter_map(move |accepted| {
                std::future::ready(match accepted {
                    Err(error) => Some(Err(error)),
                    Ok(connection) => holders.admit(connection).map(Ok),
                })
            })
            .boxed();
    };
    accepted
        .map(move |accepted| {
            let tls = tls.clone();
            let holders = holders.clone();
            async move {
                match accepted {
                    Err(error) => Some(Err(error)),
                    Ok(connection) => {
                        let remote = connection.info.tcp.remote_addr;
                        match handshake(connection, &tls).await {
                            Ok(connection) => holders.admit(connection).map(Ok),
                            Err(error) => {
                                tracing::info!(?remote, "TLS handshake failed: {error}");
                                None
                            }
                        }
                    }
                }
            }
        })
        // Every connection in a handshake holds a permit, so at most this many are.
        .buffer_unordered(CONNECTIONS_MAX)
        .filter_map(std::future::ready)
        .boxed()
}

/// Runs the server's side of the TLS handshake on `connection` before its preface deadline,
/// and returns the encrypted connection, still under that deadline for the preface.
async fn handshake(connection: Connection, tls: &ServerTls) -> io::Result<Connection> {
    let Connection {
        stream,
        info,
        _permit,
        _slot,
        preface,
        idle_check,
        idle_timeout,
        closes_at,
    } = connection;
    let (due, _) = preface.expect("a new connection has its preface ahead");
    let deadline = due.deadline();
    let encrypted = match tokio::time::timeout_at(deadline, tls.acceptor.accept(stream)).await {
        Ok(encrypted) => encrypted?,
        Err(_) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no TLS handshake and HTTP/2 preface within {CONNECTION_PREFACE_TIMEOUT:?} of connecting; closed"
                ),
            ));
        }
    };
    let peer = tls.identify(encrypted.get_ref().1.peer_certificates());
    Ok(Connection {
        stream: Box::new(encrypted),
        info: ConnectionInfo {
            tcp: info.tcp,
            peer,
            load: info.load,
        },
        _permit,
        _slot,
        preface: Some((due, PREFACE_BYTES)),
        idle_check,
        idle_timeout,
        closes_at,
    })
}

impl Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some((due, missing)) = &mut this.preface else {
            let read = Pin::new(&mut this.stream).poll_read(cx, buf);
            if read.is_pending()
                && let Some(error) = this.expired(cx)
            {
                return Poll::Ready(Err(error));
            }
            return read;
        };
        // Polled first, so that a read that waits also waits for the deadline.
        if due.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no HTTP/2 preface within {CONNECTION_PREFACE_TIMEOUT:?} of connecting; closed"
                ),
            )));
        }
        let filled = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let arrived = buf.filled().len() - filled;
        if arrived >= *missing {
            this.preface = None;
        } else {
            *missing -= arrived;
        }
        read
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
