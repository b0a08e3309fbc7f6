//! Accepting connections: TCP_NODELAY on every one, and at most [`CONNECTIONS_MAX`] at once.
//!
//! A connection holds a permit for its whole life. When all permits are taken, the server stops
//! accepting, and further clients wait in the kernel's accept backlog until a connection closes,
//! instead of each costing the server a task and buffers.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::limits::CONNECTIONS_MAX;

/// An accepted connection and its permit.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    _permit: OwnedSemaphorePermit,
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
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
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
