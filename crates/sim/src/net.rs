//! The simulated network: turmoil's TCP, as a dialer for the client and the peers, and as a
//! listener for the server.

use std::net::SocketAddr;

use palisade_proto::transport::{BoxedConnection, Dial, Dialer, Dialing};
use palisade_server::Listener;

/// Dials `host:port` on turmoil's network, resolving the host by its simulated name.
#[derive(Debug)]
pub struct SimDialer;

impl Dial for SimDialer {
    fn dial(&self, host: &str, port: u16) -> Dialing {
        let target = format!("{host}:{port}");
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(target).await?;
            Ok(Box::new(stream) as BoxedConnection)
        })
    }
}

/// A shared [`SimDialer`].
pub fn dialer() -> Dialer {
    std::sync::Arc::new(SimDialer)
}

/// Listens on `port` of the current simulated host.
pub async fn listen(port: u16) -> std::io::Result<Listener> {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port)).await?;
    let local: SocketAddr = listener.local_addr()?;
    let accepts = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener
            .accept()
            .await
            .map(|(stream, remote)| (Box::new(stream) as BoxedConnection, remote));
        Some((accepted, listener))
    });
    Ok(Listener::from_stream(local, accepts))
}
