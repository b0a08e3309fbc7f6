//! What the server knows of one client or peer connection, and the layer that hands it to
//! each request: who is at the other end ([`Peer`], from the TLS handshake), its address, and
//! its load ([`ConnectionLoad`]: calls open and bytes of messages under way, counted by
//! `admission.rs`, read by `incoming.rs` to close an idle connection). When peers are checked,
//! [`ConnectionLayer`] refuses a Raft call from a connection without a peer certificate.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;
use tonic::transport::server::TcpConnectInfo;

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;
/// Who is at the other end of a connection, as its TLS handshake showed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Peer {
    pub(crate) client_cert: Option<ClientCertName>,
    /// It presented a certificate chaining to the peer CA.
    pub(crate) is_peer: bool,
}

/// A connection's `ConnectInfo` (tonic puts it in every request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    pub(crate) tcp: TcpConnectInfo,
    pub(crate) peer: Peer,
    /// The connection's calls and request bytes ([`crate::admission`]).
    pub(crate) load: Arc<ConnectionLoad>,
}

/// The gRPC path prefix of the Raft service, answered only for peers when `peer_ca` is set.
const RAFT_PATH_PREFIX: &str = "/palisade.raft.v1.Raft/";

/// Puts each request's connection facts where handlers read them: the [`TcpConnectInfo`]
/// (`Request::remote_addr`) and the [`ClientCertName`]; and, when peers are checked, refuses a
/// Raft call from a connection without a peer certificate.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionLayer {
    pub(crate) peers_checked: bool,
}

impl<S> tower::Layer<S> for ConnectionLayer {
    type Service = ConnectionService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConnectionService {
            inner,
            peers_checked: self.peers_checked,
        }
    }
}

/// The service [`ConnectionLayer`] makes.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionService<S> {
    inner: S,
    peers_checked: bool,
}

impl<S, B> tower::Service<http::Request<B>> for ConnectionService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let info = request.extensions_mut().remove::<ConnectionInfo>();
        let is_peer = info.as_ref().is_some_and(|i| i.peer.is_peer);
        if let Some(info) = info {
            if let Some(name) = info.peer.client_cert {
                request.extensions_mut().insert(name);
            }
            request.extensions_mut().insert(info.tcp);
        }
        if self.peers_checked && !is_peer && request.uri().path().starts_with(RAFT_PATH_PREFIX) {
            let status = tonic::Status::unauthenticated(
                "Raft calls are answered only for peers presenting a certificate of the cluster's peer CA",
            );
            return Box::pin(async move { Ok(status.into_http()) });
        }
        Box::pin(self.inner.call(request))
    }
}

/// One connection's load, shared by its requests (through [`ConnectionInfo`]) and by its
/// socket (`incoming.rs`).
#[derive(Debug)]
pub(crate) struct ConnectionLoad {
    /// Calls open: started and not yet answered to the end.
    open_calls: AtomicUsize,
    /// When the last call ended (or the connection was accepted), in milliseconds after
    /// `epoch`.
    idle_since_ms: AtomicU64,
    epoch: Instant,
    /// Bytes of incomplete client API messages on this connection.
    pub(crate) partial_bytes: AtomicUsize,
}

impl ConnectionLoad {
    pub(crate) fn new() -> Arc<ConnectionLoad> {
        Arc::new(ConnectionLoad {
            open_calls: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            partial_bytes: AtomicUsize::new(0),
        })
    }

    /// When the connection last became idle; `None` while a call is open.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        if self.open_calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        let ms = self.idle_since_ms.load(Ordering::Acquire);
        // A call that starts and ends between the two loads leaves a later time: still idle
        // since then, which is what the caller needs.
        if self.open_calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.epoch + std::time::Duration::from_millis(ms))
    }

    pub(crate) fn call_started(self: &Arc<Self>) -> OpenCall {
        self.open_calls.fetch_add(1, Ordering::AcqRel);
        OpenCall { load: self.clone() }
    }
}

/// A call counted open on its connection until dropped (with its response's body).
#[derive(Debug)]
pub(crate) struct OpenCall {
    load: Arc<ConnectionLoad>,
}

impl Drop for OpenCall {
    fn drop(&mut self) {
        let ms = u64::try_from(self.load.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.load.idle_since_ms.fetch_max(ms, Ordering::AcqRel);
        self.load.open_calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The name of the verified certificate a client presented on this request's connection
/// ([`palisade_tls::certificate_name`]: the subject's common name, else its first DNS name).
/// In every request's extensions when there is one, absent otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClientCertName(pub String);
