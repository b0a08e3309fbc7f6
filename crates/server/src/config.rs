//! How to run the lock service ([`ServerConfig`]), and why it could not start ([`ServeError`]).
//!
//! A deployment without a policy is a loopback one: without `--policy`, a gRPC, web UI or
//! metrics address beyond loopback is refused unless `insecure_listen_any` is set
//! ([`ServeError::InsecureListen`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::{auth, limits, node, tls};

/// How to run the lock service. The `palisade serve` flags convert into this; tests and
/// embedders build it directly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Directory holding the Raft log, snapshots and the signing key.
    pub data_dir: PathBuf,
    /// Address the gRPC API listens on (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Address of the Prometheus `/metrics` endpoint (off when `None`).
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the read-only web UI (`ui`; off when `None`; port 0 picks a free one).
    pub ui_listen: Option<SocketAddr>,
    /// After a holder's session expires, its locks are not granted again for this long (in
    /// whole milliseconds, the lock table's unit: anything below one is dropped).
    pub lock_delay: Duration,
    /// This node's id in its cluster (1 for a single node). Never reused for another data
    /// directory.
    pub node_id: u64,
    /// Where clients and peers reach this node (`host:port`); the bound listen address if
    /// `None`.
    pub advertise: Option<String>,
    /// The members (id to address) a new cluster starts with; `None` starts a new data
    /// directory as a one-member cluster that can grow. Ignored once the directory holds a log.
    pub initial_cluster: Option<std::collections::BTreeMap<u64, String>>,
    /// A new data directory waits to be added to an existing cluster instead of starting a
    /// one-member cluster.
    pub join: bool,
    /// The token file (`NAME SHA256HEX` lines, [`auth::tokens`]): who can authenticate. Read
    /// at start and on SIGHUP.
    pub tokens_file: Option<PathBuf>,
    /// The policy file ([`auth::policy`]): what each identity may do. With one, everything it
    /// does not grant is refused, unauthenticated callers first. Read at start and on SIGHUP.
    pub policy_file: Option<PathBuf>,
    /// Without a policy, listen on an address other than loopback anyway: every client that
    /// reaches it may then do everything, the cluster's admin calls included.
    pub insecure_listen_any: bool,
    /// TLS on the listener and the peer links (plaintext when `None`); see [`tls`].
    pub tls: Option<tls::ServerTlsConfig>,
    /// Run a cluster whose peers are not authenticated (no TLS peer CA of their own) although
    /// a policy is configured or the listener is not loopback: whoever reaches the listener may
    /// then speak Raft as a member would. Only on a network nothing but the nodes reaches.
    pub insecure_peers: bool,
    /// How long client connections may be held, and how many one source address may hold.
    pub connections: limits::ConnectionLimits,
    /// Host names the web UI answers to besides localhost and IP addresses (checked with
    /// [`palisade_tls::host::parse_host_name`] at start); any other `Host` gets 421.
    pub ui_hosts: Vec<String>,
}

impl ServerConfig {
    /// A single node (id 1) keeping its data in `data_dir`, listening on `listen`, without
    /// metrics or lock-delay.
    pub fn single_node(data_dir: PathBuf, listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            data_dir,
            listen,
            metrics_listen: None,
            ui_listen: None,
            lock_delay: Duration::ZERO,
            node_id: 1,
            advertise: None,
            initial_cluster: None,
            join: false,
            tokens_file: None,
            policy_file: None,
            insecure_listen_any: false,
            tls: None,
            insecure_peers: false,
            connections: limits::ConnectionLimits::default(),
            ui_hosts: Vec::new(),
        }
    }
}

/// Why the lock service could not start or stopped serving. Every case is final for this
/// process: the operator must fix the directory, the address or the flags and start again.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The configured lock delay is outside the lock table's limits.
    #[error("invalid --lock-delay: {0}")]
    InvalidLockDelay(String),
    /// The gRPC address cannot be bound (in use, not local, no permission).
    #[error("cannot listen on {listen}")]
    Listen {
        listen: SocketAddr,
        source: std::io::Error,
    },
    /// The web UI's address cannot be bound.
    #[error("cannot listen on {listen} for the web UI")]
    UiListen {
        listen: SocketAddr,
        source: std::io::Error,
    },
    /// The node could not recover or take leadership in its data directory.
    #[error("cannot start the lock service in {}", data_dir.display())]
    Start {
        data_dir: PathBuf,
        #[source]
        source: node::StartError,
    },
    /// The Prometheus exporter could not be installed.
    #[error(transparent)]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// A TLS file is missing, is not valid PEM, or a key does not match its certificate.
    #[error("invalid TLS configuration: {0}")]
    Tls(#[from] palisade_tls::TlsError),
    /// The gRPC transport failed while serving.
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    /// The token file or the policy could not be loaded.
    #[error(transparent)]
    Auth(#[from] auth::FileError),
    /// Without a policy, the listen address (or the web UI's, or the metrics') is not loopback
    /// and `insecure_listen_any` is not set.
    #[error(
        "refusing to listen on {listen} without a policy: anyone who can reach it could {exposes}; \
         configure --tokens and --policy (see docs/security.md), listen on 127.0.0.1, or pass --insecure-listen-any on a network you trust"
    )]
    InsecureListen {
        listen: SocketAddr,
        /// What anyone who reaches the listener could do.
        exposes: &'static str,
    },
    /// Peers would not be authenticated where they must be (see `peer_authentication`), and
    /// `insecure_peers` is not set.
    #[error(
        "refusing to start: {why}: {reason}. Whoever speaks Raft to a member can rewrite \
         the lock table and take the signing key. Serve TLS with --tls-peer-ca naming a CA that signs the nodes' certificates \
         and nothing else (`palisade tls init` makes one, apart from the client CA; see docs/security.md), or pass \
         --insecure-peers on a network that nothing but the cluster's nodes can reach"
    )]
    PeersUnauthenticated { why: String, reason: String },
    /// A `--ui-host` name is not a host name.
    #[error("invalid --ui-host: {0}")]
    UiHost(String),
}
