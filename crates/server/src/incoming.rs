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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use futures::stream::BoxStream;
use palisade_proto::transport::BoxedConnection;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::limits::{CONNECTION_PREFACE_TIMEOUT, CONNECTIONS_MAX};
use crate::tls::{ConnectionInfo, Peer, ServerTls};

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
    /// Until the preface is in: when it is due, and how many of its bytes are still to come.
    preface: Option<(Pin<Box<Sleep>>, usize)>,
}

/// The connections `listener` accepts, at most `CONNECTIONS_MAX` open at once; with `tls`,
/// each once its handshake is done (within the preface deadline; one that fails or runs out of
/// time is closed and logged, never yielded).
pub(crate) fn limited(
    listener: Listener,
    tls: Option<ServerTls>,
) -> BoxStream<'static, io::Result<Connection>> {
    use futures::StreamExt as _;
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    let accepted = futures::stream::unfold(
        (listener.accepts, permits),
        |(mut accepts, permits)| async move {
            let permit = permits
                .clone()
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let accepted = accepts.next().await?.map(|(stream, tcp)| Connection {
                stream,
                info: ConnectionInfo {
                    tcp,
                    peer: Peer::default(),
                },
                _permit: permit,
                preface: Some((
                    Box::pin(tokio::time::sleep(CONNECTION_PREFACE_TIMEOUT)),
                    PREFACE_BYTES,
                )),
            });
            Some((accepted, (accepts, permits)))
        },
    );
    let Some(tls) = tls else {
        return accepted.boxed();
    };
    accepted
        .map(move |accepted| {
            let tls = tls.clone();
            async move {
                match accepted {
                    Err(error) => Some(Err(error)),
                    Ok(connection) => {
                        let remote = connection.info.tcp.remote_addr;
                        match handshake(connection, &tls).await {
                            Ok(connection) => Some(Ok(connection)),
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
        preface,
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
        },
        _permit,
        preface: Some((due, PREFACE_BYTES)),
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
            return Pin::new(&mut this.stream).poll_read(cx, buf);
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
