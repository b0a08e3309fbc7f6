//! `palisade serve`: the lock service's flags, converted into the server's plain
//! [`ServerConfig`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use palisade_server::ServerConfig;
use palisade_server::limits::INITIAL_CLUSTER_MEMBERS_MAX;

/// Flags of `palisade serve`; each can also be set by the environment variable named.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Directory holding the Raft log, snapshots and the signing key.
    #[arg(long, env = "PALISADE_DATA_DIR", default_value = "./palisade-data")]
    pub data_dir: PathBuf,
    /// Address the gRPC API listens on.
    #[arg(long, env = "PALISADE_LISTEN", default_value = palisade_proto::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Address of the Prometheus `/metrics` endpoint (off when not set).
    #[arg(long, env = "PALISADE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Address of the read-only web UI: members, leader, every lock and its recent grants,
    /// live (off when not set; docs/web-ui.md). Without --policy it must be loopback unless
    /// --insecure-listen-any; with one, its API asks for a bearer token with the read right.
    #[arg(long, env = "PALISADE_UI_LISTEN")]
    pub ui_listen: Option<SocketAddr>,
    /// A host name the web UI answers to besides localhost and IP addresses (repeat it, or
    /// separate names with commas in the variable): the name in the browser's address bar
    /// when the UI is reached through DNS. Requests naming any other host get 421, which
    /// keeps a web page from reading the UI through a name it rebinds to this address.
    #[arg(long = "ui-host", env = "PALISADE_UI_HOST", value_delimiter = ',', value_parser = palisade_tls::host::parse_host_name)]
    pub ui_hosts: Vec<String>,
    /// After a holder's session expires, its locks are not granted again for this long.
    #[arg(
        long,
        env = "PALISADE_LOCK_DELAY",
        default_value = "0s",
        value_parser = palisade_core::duration::parse_duration
    )]
    pub lock_delay: Duration,
    /// This node's id in its cluster, a positive number never given to another data directory.
    #[arg(long, env = "PALISADE_NODE_ID", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub node_id: u64,
    /// The address clients and the other nodes use to reach this one (`host:port`); by default
    /// the bound `--listen` address.
    #[arg(long, env = "PALISADE_ADVERTISE", value_parser = parse_address)]
    pub advertise: Option<String>,
    /// The members a new cluster starts with, `ID=HOST:PORT,...`, this node among them. Read
    /// only when the data directory is new; without it a new directory starts as a one-member
    /// cluster that can grow with `palisade cluster add`.
    #[arg(long, env = "PALISADE_INITIAL_CLUSTER", value_parser = parse_initial_cluster)]
    pub initial_cluster: Option<BTreeMap<u64, String>>,
    /// Start a new data directory as a node waiting to be added to a running cluster
    /// (`palisade cluster add ID ADDR` on the cluster), instead of as a one-member cluster.
    #[arg(long, env = "PALISADE_JOIN", conflicts_with = "initial_cluster")]
    pub join: bool,
    /// The token file: one `NAME SHA256HEX` line per bearer token (`palisade token new NAME`
    /// prints one), `#` comments. Read again on SIGHUP.
    #[arg(long, env = "PALISADE_TOKENS")]
    pub tokens: Option<PathBuf>,
    /// The policy file: `grant IDENTITY RIGHTS PREFIX` and `quota IDENTITY NAME=N ...` lines
    /// (docs/security.md). With one, whatever it does not grant is refused. Read again on
    /// SIGHUP; a file with an error leaves the previous policy in force.
    #[arg(long, env = "PALISADE_POLICY")]
    pub policy: Option<PathBuf>,
    /// Without --policy, listen on an address other than loopback anyway. Anyone who reaches
    /// the listener may then take any lock and change the cluster: only on a network you trust.
    #[arg(long, env = "PALISADE_INSECURE_LISTEN_ANY")]
    pub insecure_listen_any: bool,
    /// Run a cluster of several nodes whose peers are not authenticated (no TLS with a
    /// --tls-peer-ca of the nodes' own) although a --policy is given or the listener is beyond
    /// loopback: anyone who reaches the listener may then speak Raft as a member would, and
    /// rewrite the lock table. Only on a network nothing but the cluster's nodes can reach.
    #[arg(long, env = "PALISADE_INSECURE_PEERS")]
    pub insecure_peers: bool,
    /// Most connections one source IP address may have open at once without a client
    /// certificate (loopback addresses are not held to it); a further one is closed at once,
    /// told why. Behind a proxy or NAT every client shares an address: raise it there.
    #[arg(
        long,
        env = "PALISADE_CONNECTIONS_PER_ADDRESS",
        default_value_t = palisade_server::limits::CONNECTIONS_PER_ADDRESS_MAX,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=palisade_server::CONNECTIONS_MAX as u64)
    )]
    pub connections_per_address: usize,
    #[command(flatten)]
    pub tls: ServeTlsArgs,
}

/// TLS flags of `palisade serve` besides the global `--tls-cert` and `--tls-key`, which are the
/// node's certificate and key here (see docs/security.md, "TLS"). Files are read at start;
/// replacing them takes a restart.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeTlsArgs {
    /// Mutual TLS: refuse clients that present no certificate chaining to this CA (PEM).
    #[arg(long = "tls-client-ca", env = "PALISADE_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// The CA of the cluster's nodes' certificates (PEM): peers are checked against it both
    /// ways, and Raft calls are answered only for connections presenting one of its
    /// certificates. It must sign the nodes' certificates and nothing else: a CA shared with
    /// --tls-client-ca is refused (`palisade tls init` makes the two apart).
    #[arg(long = "tls-peer-ca", env = "PALISADE_TLS_PEER_CA")]
    pub tls_peer_ca: Option<PathBuf>,
}

/// The global TLS flags as `palisade serve` reads them: `--tls-cert` and `--tls-key` are the
/// node's own; `--tls-ca` is refused (it would be unclear which peers it is for).
#[derive(Debug, Clone, Default)]
pub struct GlobalTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl ServeTlsArgs {
    /// The server's TLS settings; `None` (plaintext) without `--tls-cert`.
    pub fn config(
        self,
        global: GlobalTls,
    ) -> Result<Option<palisade_server::tls::ServerTlsConfig>, String> {
        if global.ca.is_some() {
            return Err("palisade serve does not take --tls-ca (PALISADE_TLS_CA): give --tls-client-ca for mutual TLS with clients and --tls-peer-ca for the peers".into());
        }
        match (global.cert, global.key) {
            (Some(cert), Some(key)) => Ok(Some(palisade_server::tls::ServerTlsConfig {
                cert,
                key,
                client_ca: self.tls_client_ca,
                peer_ca: self.tls_peer_ca,
            })),
            (None, None) if self.tls_client_ca.is_none() && self.tls_peer_ca.is_none() => Ok(None),
            (None, None) => Err("--tls-client-ca and --tls-peer-ca need --tls-cert and --tls-key (the node's certificate)".into()),
            (Some(_), None) => Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => Err("--tls-key needs --tls-cert".into()),
        }
    }
}

/// Checks a `HOST:PORT` address (see [`palisade_proto::validate_member_address`]).
fn parse_address(text: &str) -> Result<String, String> {
    palisade_proto::validate_member_address(text)?;
    Ok(text.to_string())
}

/// Parses `--initial-cluster`: `ID=HOST:PORT` pairs separated by commas, ids positive and
/// distinct, addresses distinct.
fn parse_initial_cluster(text: &str) -> Result<BTreeMap<u64, String>, String> {
    let mut members = BTreeMap::new();
    for pair in text.split(',') {
        let (id, address) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not ID=HOST:PORT"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| format!("{id:?} in {pair:?} is not a positive node id"))?;
        let address = parse_address(address.trim())?;
        if members.values().any(|a| *a == address) {
            return Err(format!("{address} is given to two nodes"));
        }
        if members.insert(id, address).is_some() {
            return Err(format!("node {id} is given twice"));
        }
        if members.len() > INITIAL_CLUSTER_MEMBERS_MAX {
            return Err(format!(
                "at most {INITIAL_CLUSTER_MEMBERS_MAX} members can start a cluster"
            ));
        }
    }
    Ok(members)
}

impl ServeArgs {
    /// The server's configuration, with the global TLS flags.
    pub fn into_config(self, global: GlobalTls) -> Result<ServerConfig, String> {
        let args = self;
        let ServeArgs {
            data_dir,
            listen,
            metrics_listen,
            ui_listen,
            ui_hosts,
            lock_delay,
            node_id,
            advertise,
            initial_cluster,
            join,
            tokens,
            policy,
            insecure_listen_any,
            insecure_peers,
            connections_per_address,
            tls,
        } = args;
        Ok(ServerConfig {
            data_dir,
            listen,
            metrics_listen,
            ui_listen,
            lock_delay,
            node_id,
            advertise,
            initial_cluster,
            join,
            tokens_file: tokens,
            policy_file: policy,
            insecure_listen_any,
            tls: tls.config(global)?,
            insecure_peers,
            connections: palisade_server::limits::ConnectionLimits {
                per_address_max: connections_per_address,
                ..Default::default()
            },
            ui_hosts,
        })
    }
}

/// Runs the lock service until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs, global: GlobalTls) -> anyhow::Result<()> {
    let config = args
        .into_config(global)
        .map_err(|e| crate::exit::Exit::new(crate::exit::USAGE, e))?;
    Ok(palisade_server::serve(config).await?)
}
