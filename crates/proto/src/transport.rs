//! How the connections that carry gRPC are made: over TCP by default, or by a [`Dialer`] the
//! embedder supplies.
//!
//! The client's channels to the service and a node's channels to its peers are both made
//! here, so a deterministic simulation can run the real client and the real server over a
//! simulated network by handing both a dialer of its own. Production code passes `None` and
//! gets tonic's TCP connector with the endpoint's settings (timeouts, `TCP_NODELAY`).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::{Channel, Endpoint, Uri};

/// A connected byte stream, as a [`Dialer`] returns it and a server accepts it.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Connection for T {}

/// A boxed [`Connection`].
pub type BoxedConnection = Box<dyn Connection>;

/// The future a [`Dial::dial`] returns.
pub type Dialing = Pin<Box<dyn Future<Output = io::Result<BoxedConnection>> + Send>>;

/// Opens connections to `host:port`.
pub trait Dial: Send + Sync + fmt::Debug + 'static {
    fn dial(&self, host: &str, port: u16) -> Dialing;
}

/// A shared [`Dial`].
pub type Dialer = Arc<dyn Dial>;

/// Connects `endpoint` now, through `dialer` if there is one.
pub async fn connect(
    endpoint: Endpoint,
    dialer: Option<&Dialer>,
) -> Result<Channel, tonic::transport::Error> {
    match dialer {
        None => endpoint.connect().await,
        Some(dialer) => endpoint.connect_with_connector(connector(dialer)).await,
    }
}

/// A channel to `endpoint` that connects when first used (and again after a failure),
/// through `dialer` if there is one.
pub fn connect_lazy(endpoint: Endpoint, dialer: Option<&Dialer>) -> Channel {
    match dialer {
        None => endpoint.connect_lazy(),
        Some(dialer) => endpoint.connect_with_connector_lazy(connector(dialer)),
    }
}

/// `dialer` as the tower service tonic connects with.
fn connector(
    dialer: &Dialer,
) -> impl tower_service::Service<
    Uri,
    Response = TokioIo<BoxedConnection>,
    Error = io::Error,
    Future = impl Future<Output = io::Result<TokioIo<BoxedConnection>>> + Send,
> + Send
+ Clone
+ 'static {
    let dialer = dialer.clone();
    tower::service_fn(move |uri: Uri| {
        let dialing = match (uri.host(), uri.port_u16()) {
            (Some(host), Some(port)) => dialer.dial(host, port),
            _ => {
                let error = io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{uri} names no host and port"),
                );
                Box::pin(async move { Err(error) })
            }
        };
        async move { dialing.await.map(TokioIo::new) }
    })
}

/// A [`Dial`] that runs TLS over the connections of another dialer (or of TCP): the client's
/// connections to a server that serves TLS, and a node's links to its peers.
///
/// The server's certificate is checked against the name the connection was dialed with (the
/// endpoint's host, a DNS name or an IP address) and the configuration's trusted CAs. The
/// handshake is part of connecting, so it falls under the endpoint's connect timeout.
#[derive(Debug)]
pub struct TlsDialer {
    tls: palisade_tls::ClientTls,
    inner: Option<Dialer>,
}

impl TlsDialer {
    /// TLS with `tls` over `inner`'s connections, or over TCP (with `TCP_NODELAY`) without one.
    pub fn dialer(tls: palisade_tls::ClientTls, inner: Option<Dialer>) -> Dialer {
        Arc::new(TlsDialer { tls, inner })
    }
}

impl Dial for TlsDialer {
    fn dial(&self, host: &str, port: u16) -> Dialing {
        let server_name = palisade_tls::server_name(host);
        let connector = self.tls.connector();
        let connecting = match &self.inner {
            Some(inner) => inner.dial(host, port),
            None => {
                let address = format!("{}:{port}", host);
                Box::pin(async move {
                    let stream = tokio::net::TcpStream::connect(address).await?;
                    stream.set_nodelay(true)?;
                    Ok(Box::new(stream) as BoxedConnection)
                })
            }
        };
        Box::pin(async move {
            let server_name =
                server_name.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let stream = connecting.await?;
            let tls = connector
                .connect(server_name, stream)
                .await
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake failed: {e}")))?;
            Ok(Box::new(tls) as BoxedConnection)
        })
    }
}
