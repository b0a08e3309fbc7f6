//! TLS on the lock service's listener and on its links to its peers.
//!
//! One listener carries the `Locks` API, the `Cluster` API and the Raft traffic of the peers
//! (`lib.rs`), so one TLS configuration serves all three:
//!
//! - the node presents `cert`/`key` to everyone who connects;
//! - with `client_ca`, every connection must present a certificate chaining to it (or to
//!   `peer_ca`): mutual TLS for clients;
//! - with `peer_ca`, a connection may present a certificate chaining to it, and the Raft service
//!   answers only connections that did: anyone else gets `UNAUTHENTICATED`. The node also
//!   dials its peers with TLS, checking their certificates against `peer_ca` and presenting its
//!   own `cert` as its client certificate. `peer_ca` must sign the nodes' certificates and
//!   nothing else: a peer CA sharing a root with `client_ca` is refused at start (`lib.rs`),
//!   unless peers are left unauthenticated on purpose.
//!
//! The handshake runs under the listener's preface deadline (`incoming.rs`): a client that
//! stalls in the handshake loses its connection, and its permit, as one that never sends the
//! HTTP/2 preface does.
//!
//! A verified client certificate's name ([`palisade_tls::certificate_name`]) reaches every
//! request as a `connection::ClientCertName` in its extensions (`connection::ConnectionLayer`), for an
//! authorization layer to read. Nothing here authorizes anything beyond the peer check.
//!
//! Certificates are read once, at start: replacing the files takes a restart.

use std::path::PathBuf;
use std::sync::Arc;

use palisade_tls::{ClientTls, Identity, Roots, TlsError};

/// The TLS settings of `palisade serve`: file paths, read when the server starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsConfig {
    /// The node's certificate chain (PEM, leaf first), presented to clients and to peers.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// Require every client to present a certificate chaining to this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// The CA the cluster's nodes' certificates chain to: peers are checked against it both
    /// ways, and the Raft service answers only connections that presented such a certificate.
    pub peer_ca: Option<PathBuf>,
}

/// [`ServerTlsConfig`] loaded: what the listener and the peer network use.
#[derive(Clone)]
pub(crate) struct ServerTls {
    pub(crate) acceptor: tokio_rustls::TlsAcceptor,
    /// To tell a peer's certificate from a client's.
    peer_roots: Option<Roots>,
    /// How this node dials its peers; `None` without `peer_ca`.
    pub(crate) peer_dialing: Option<ClientTls>,
    /// The peer CA and the client CA have a root in common: a client's certificate may then
    /// pass for a peer's.
    shared_ca: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("peer_roots", &self.peer_roots)
            .field("peer_dialing", &self.peer_dialing)
            .finish_non_exhaustive()
    }
}

impl ServerTlsConfig {
    /// Reads and checks every file now, so that a bad one stops the server at start.
    pub(crate) fn load(&self) -> Result<ServerTls, TlsError> {
        let identity = Identity::from_files(&self.cert, &self.key)?;
        let peer_roots = self.peer_ca.as_deref().map(Roots::from_file).transpose()?;
        let client_roots = self
            .client_ca
            .as_deref()
            .map(Roots::from_file)
            .transpose()?;
        let shared_ca = match (&peer_roots, &client_roots) {
            (Some(peers), Some(clients)) => peers.shares_a_root_with(clients),
            _ => false,
        };
        let verifier = match (&self.client_ca, &self.peer_ca) {
            (None, None) => None,
            // Peers present certificates; clients need not.
            (None, Some(_)) => Some(peer_roots.as_ref().expect("loaded").client_verifier(true)?),
            (Some(client_ca), peer_ca) => {
                let mut cas = vec![client_ca.as_path()];
                cas.extend(peer_ca.as_deref());
                Some(Roots::from_files(&cas)?.client_verifier(false)?)
            }
        };
        let config = palisade_tls::server_config(&identity, verifier, palisade_tls::ALPN_H2)?;
        let peer_dialing = peer_roots
            .as_ref()
            .map(|roots| ClientTls::new(roots, Some(&identity), palisade_tls::ALPN_H2))
            .transpose()?;
        Ok(ServerTls {
            acceptor: tokio_rustls::TlsAcceptor::from(config),
            peer_roots,
            peer_dialing,
            shared_ca,
        })
    }
}

impl ServerTls {
    /// What a connection's verified certificate chain (leaf first) says about it.
    pub(crate) fn identify(
        &self,
        chain: Option<&[rustls::pki_types::CertificateDer<'static>]>,
    ) -> crate::connection::Peer {
        let Some(chain) = chain.filter(|c| !c.is_empty()) else {
            return crate::connection::Peer::default();
        };
        crate::connection::Peer {
            client_cert: palisade_tls::certificate_name(&chain[0])
                .map(crate::connection::ClientCertName),
            is_peer: self
                .peer_roots
                .as_ref()
                .is_some_and(|roots| roots.verifies_client(chain)),
        }
    }

    /// Whether the Raft service needs a peer certificate.
    pub(crate) fn peers_checked(&self) -> bool {
        self.peer_roots.is_some()
    }

    /// Whether the peer CA shares a root with the client CA, so that a client certificate
    /// could pass for a peer's.
    pub(crate) fn peer_ca_is_a_client_ca(&self) -> bool {
        self.shared_ca
    }
}

/// A peer network's dialer for `tls`: TLS to every peer, or, without a peer CA, a dialer that
/// refuses with the reason (so the node's logs say why its peers are unreachable).
pub(crate) fn peer_dialer(
    tls: &ServerTls,
    inner: Option<palisade_proto::transport::Dialer>,
) -> palisade_proto::transport::Dialer {
    match &tls.peer_dialing {
        Some(client) => palisade_proto::transport::TlsDialer::dialer(client.clone(), inner),
        None => Arc::new(NoPeerCa),
    }
}

/// The dialer of a node that serves TLS without a peer CA: it cannot check its peers.
#[derive(Debug)]
struct NoPeerCa;

impl palisade_proto::transport::Dial for NoPeerCa {
    fn dial(&self, host: &str, port: u16) -> palisade_proto::transport::Dialing {
        let error = std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "not dialing peer {host}:{port}: this node serves TLS without --tls-peer-ca, so it cannot check its peers' certificates"
            ),
        );
        Box::pin(async move { Err(error) })
    }
}
