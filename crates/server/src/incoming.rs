//! Accepting connections: TCP_NODELAY on every one, and at most [`CONNECTIONS_MAX`] at once.
//!
//! A connection holds a permit for its whole life. When all permits are taken, the server stops
//! accepting, and further clients wait in the kernel's accept backlog until a connection closes,
//! instead of each costing the server a task and buffers.
//!
//! So that idle sockets cannot hold the permits for ever, a connection must deliver the HTTP/2
//! client preface (its first [`PREFACE_BYTES`] bytes, which every gRPC client sends at once)
//! within [`CONNECTION_PREFACE_TIMEOUT`] of being accepted, or it is closed. Past the preface,
//! the server's HTTP/2 keepalive pings (`lib.rs`) close a connection whose peer stops answering.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::limits::{CONNECTION_PREFACE_TIMEOUT, CONNECTIONS_MAX};

/// The length of the HTTP/2 client connection preface (RFC 9113, section 3.4).
pub const PREFACE_BYTES: usize = 24;

/// An accepted connection and its permit.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
    /// Until the preface is in: when it is due, and how many of its bytes are still to come.
    preface: Option<(Pin<Box<Sleep>>, usize)>,
}

/// The connections `listener` accepts, at most `CONNECTIONS_MAX` open at once.
pub fn limited(listener: TcpListener) -> impl Stream<Item = io::Result<Connection>> {
    let permits = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    futures::stream::unfold((listener, permits), |(listener, permits)| async move {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let accepted = listener.accept().await.and_then(|(stream, _)| {
            // Small gRPC frames must not wait for the previous one's acknowledgement.
            stream.set_nodelay(true)?;
            Ok(Connection {
                stream,
                _permit: permit,
                preface: Some((
                    Box::pin(tokio::time::sleep(CONNECTION_PREFACE_TIMEOUT)),
                    PREFACE_BYTES,
                )),
            })
        });
        Some((accepted, (listener, permits)))
    })
}

impl Connected for Connection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
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
