//! What a gRPC request may cost before a handler has it: the [`AdmissionLayer`], outermost of
//! the server's layers (`lib.rs`).
//!
//! - **Authentication from the headers.** A request of the client API (`palisade.v1.*`) whose
//!   credential the server would refuse (none under a policy, an unknown or malformed token, a
//!   token and a certificate naming two identities) is answered UNAUTHENTICATED from its
//!   headers alone, before a byte of its body is read. The handler authenticates again
//!   ([`crate::auth::Auth::identity`]): this layer only refuses earlier, it never admits what the
//!   handler would refuse. Raft calls are left to the peer check (`tls.rs`).
//! - **A budget of request bytes in flight.** gRPC frames each message with its length; the
//!   handler sees a message only once all of it has arrived. The bytes of a message that has
//!   begun to arrive and is not complete are counted against a budget of the whole server
//!   ([`REQUEST_BYTES_IN_FLIGHT_MAX`]) and one of its connection
//!   ([`REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX`], client API only), as they arrive (never
//!   what a header declares), and given back when the message is complete or the call ends. A
//!   message that would go over either budget, or that takes longer than
//!   [`REQUEST_MESSAGE_TIMEOUT`] from its first byte to its last, fails its call (RESOURCE_EXHAUSTED
//!   or DEADLINE_EXCEEDED) and its bytes are dropped. A message that arrives whole in one HTTP/2
//!   frame, as every honest request but the largest does, never counts.
//! - **Calls open per connection** ([`ConnectionLoad`]): counted from the call's start to the
//!   end of its response, so that `incoming.rs` can close a connection that has had none for
//!   [`crate::limits::ConnectionLimits::idle_timeout`].

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Buf as _;
use http_body::{Frame, SizeHint};
use tokio::time::Sleep;
use tonic::codegen::http;

use crate::auth::Auth;
use crate::connection::{ConnectionInfo, ConnectionLoad, OpenCall};
use crate::limits::{
    REQUEST_BYTES_IN_FLIGHT_MAX, REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX,
    REQUEST_MESSAGE_TIMEOUT,
};

/// The gRPC path prefix of the client API (`Locks`, `Cluster`): authenticated from headers.
const CLIENT_API_PREFIX: &str = "/palisade.v1.";

/// The length of gRPC's message prefix: a compression flag and a 4-byte length.
const MESSAGE_PREFIX_BYTES: usize = 5;

/// A count of bytes against a maximum.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    taken: AtomicUsize,
    max: usize,
}

impl ByteBudget {
    pub(crate) fn new(max: usize) -> ByteBudget {
        ByteBudget {
            taken: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes `bytes` if they fit.
    fn take(taken: &AtomicUsize, max: usize, bytes: usize) -> bool {
        taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                now.checked_add(bytes).filter(|after| *after <= max)
            })
            .is_ok()
    }
}

/// The [`AdmissionLayer`]'s shared state: the server's authentication and its byte budget.
#[derive(Debug, Clone)]
pub(crate) struct AdmissionLayer {
    pub(crate) auth: Arc<Auth>,
    pub(crate) budget: Arc<ByteBudget>,
}

impl AdmissionLayer {
    pub(crate) fn new(auth: Arc<Auth>) -> AdmissionLayer {
        AdmissionLayer {
            auth,
            budget: Arc::new(ByteBudget::new(REQUEST_BYTES_IN_FLIGHT_MAX)),
        }
    }
}

impl<S> tower::Layer<S> for AdmissionLayer {
    type Service = Admission<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Admission {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`AdmissionLayer`] makes.
#[derive(Debug, Clone)]
pub(crate) struct Admission<S> {
    inner: S,
    layer: AdmissionLayer,
}

type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S> Admission<S> {
    /// The refusal of a request whose headers carry a credential the server refuses.
    fn refusal(&self, request: &http::Request<tonic::body::Body>) -> Option<tonic::Status> {
        let auth = &self.layer.auth;
        let authorization = request.headers().get(http::header::AUTHORIZATION);
        if !auth.has_policy() && authorization.is_none() {
            return None;
        }
        let certificate = request
            .extensions()
            .get::<ConnectionInfo>()
            .and_then(|info| info.peer.client_cert.as_ref())
            .map(|name| name.0.as_str());
        let mut headers = http::HeaderMap::with_capacity(1);
        if let Some(value) = authorization {
            headers.insert(http::header::AUTHORIZATION, value.clone());
        }
        let metadata = tonic::metadata::MetadataMap::from_headers(headers);
        auth.identity_of(certificate, &metadata)
            .err()
            .map(|error| palisade_proto::error::status_from_core(&error))
    }
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Admission<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        >,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let client_api = request.uri().path().starts_with(CLIENT_API_PREFIX);
        if client_api && let Some(status) = self.refusal(&request) {
            // The body is dropped unread: hyper resets the stream's sending side.
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let load = request
            .extensions()
            .get::<ConnectionInfo>()
            .map(|info| info.load.clone());
        let call = load.as_ref().map(ConnectionLoad::call_started);
        let (parts, body) = request.into_parts();
        let body = tonic::body::Body::new(CountedBody::new(
            body,
            self.layer.budget.clone(),
            load.filter(|_| client_api),
        ));
        let response = self.inner.call(http::Request::from_parts(parts, body));
        Box::pin(async move {
            let response = response.await?;
            Ok(match call {
                None => response,
                Some(call) => response.map(|body| {
                    tonic::body::Body::new(CallBody {
                        inner: body,
                        _call: call,
                    })
                }),
            })
        })
    }
}

/// A response body that keeps its call counted open until it ends.
struct CallBody {
    inner: tonic::body::Body,
    _call: OpenCall,
}

impl http_body::Body for CallBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body whose incomplete messages count against the byte budgets.
struct CountedBody {
    inner: tonic::body::Body,
    budget: Arc<ByteBudget>,
    /// The connection's budget, for the client API.
    connection: Option<Arc<ConnectionLoad>>,
    /// The message prefix read so far of the message arriving.
    prefix: [u8; MESSAGE_PREFIX_BYTES],
    prefix_read: usize,
    /// Bytes of the arriving message's payload still to come, once its prefix is in.
    payload_missing: usize,
    /// Bytes of the arriving message counted against the budgets.
    counted: usize,
    /// When the arriving message must be complete.
    due: Option<Pin<Box<Sleep>>>,
    /// Ended with an error: nothing more is read.
    failed: bool,
}

impl CountedBody {
    fn new(
        inner: tonic::body::Body,
        budget: Arc<ByteBudget>,
        connection: Option<Arc<ConnectionLoad>>,
    ) -> CountedBody {
        CountedBody {
            inner,
            budget,
            connection,
            prefix: [0; MESSAGE_PREFIX_BYTES],
            prefix_read: 0,
            payload_missing: 0,
            counted: 0,
            due: None,
            failed: false,
        }
    }

    /// Whether a message has begun to arrive and is not complete.
    fn mid_message(&self) -> bool {
        self.prefix_read > 0
    }

    /// Follows the message framing through `chunk`; returns how many bytes of the message
    /// still incomplete at its end arrived in it.
    fn follow(&mut self, mut chunk: &[u8]) -> usize {
        let mut arrived = 0;
        while !chunk.is_empty() {
            if self.prefix_read < MESSAGE_PREFIX_BYTES {
                let n = (MESSAGE_PREFIX_BYTES - self.prefix_read).min(chunk.len());
                self.prefix[self.prefix_read..self.prefix_read + n].copy_from_slice(&chunk[..n]);
                self.prefix_read += n;
                chunk = &chunk[n..];
                arrived += n;
                if self.prefix_read == MESSAGE_PREFIX_BYTES {
                    let length = u32::from_be_bytes([
                        self.prefix[1],
                        self.prefix[2],
                        self.prefix[3],
                        self.prefix[4],
                    ]);
                    self.payload_missing = length as usize;
                }
            }
            if self.prefix_read == MESSAGE_PREFIX_BYTES {
                let n = self.payload_missing.min(chunk.len());
                self.payload_missing -= n;
                chunk = &chunk[n..];
                arrived += n;
                if self.payload_missing == 0 {
                    // Complete: the decoder has all of it.
                    self.prefix_read = 0;
                    arrived = 0;
                    self.give_back();
                }
            }
        }
        arrived
    }

    /// Counts `bytes` more of the arriving message; false if a budget has no room.
    fn count(&mut self, bytes: usize) -> Result<(), tonic::Status> {
        if bytes == 0 {
            return Ok(());
        }
        if let Some(load) = &self.connection
            && !ByteBudget::take(
                &load.partial_bytes,
                REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX,
                bytes,
            )
        {
            return Err(tonic::Status::resource_exhausted(format!(
                "this connection has {REQUEST_BYTES_IN_FLIGHT_PER_CONNECTION_MAX} bytes of request messages arriving already: send each message whole, or fewer at once"
            )));
        }
        if !ByteBudget::take(&self.budget.taken, self.budget.max, bytes) {
            if let Some(load) = &self.connection {
                load.partial_bytes.fetch_sub(bytes, Ordering::AcqRel);
            }
            return Err(tonic::Status::resource_exhausted(format!(
                "the server is receiving {} bytes of request messages already; retry later",
                self.budget.max
            )));
        }
        self.counted += bytes;
        Ok(())
    }

    /// Gives back what the arriving message counted.
    fn give_back(&mut self) {
        let counted = std::mem::take(&mut self.counted);
        if counted > 0 {
            self.budget.taken.fetch_sub(counted, Ordering::AcqRel);
            if let Some(load) = &self.connection {
                load.partial_bytes.fetch_sub(counted, Ordering::AcqRel);
            }
        }
        self.due = None;
    }

    fn fail(
        &mut self,
        status: tonic::Status,
    ) -> Poll<Option<Result<Frame<bytes::Bytes>, tonic::Status>>> {
        self.failed = true;
        self.prefix_read = 0;
        self.give_back();
        Poll::Ready(Some(Err(status)))
    }
}

impl Drop for CountedBody {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if let Some(due) = &mut this.due
                    && due.as_mut().poll(cx).is_ready()
                {
                    return this.fail(tonic::Status::deadline_exceeded(format!(
                        "a request message did not arrive within {REQUEST_MESSAGE_TIMEOUT:?} of its first byte"
                    )));
                }
                return Poll::Pending;
            }
        };
        let Some(Ok(frame)) = frame else {
            // The end, or an error: nothing arriving any more.
            this.prefix_read = 0;
            this.give_back();
            return Poll::Ready(frame);
        };
        if let Some(data) = frame.data_ref() {
            let was_mid_message = this.mid_message();
            let arrived = this.follow(data.chunk());
            if let Err(status) = this.count(arrived) {
                return this.fail(status);
            }
            if this.mid_message() && (!was_mid_message || this.due.is_none()) {
                this.due = Some(Box::pin(tokio::time::sleep(REQUEST_MESSAGE_TIMEOUT)));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
