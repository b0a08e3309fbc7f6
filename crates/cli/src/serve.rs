//! `palisade serve`: the lock service's flags, converted into the server's plain
//! [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;

use palisade_server::ServerConfig;

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
    /// After a holder's session expires, its locks are not granted again for this long.
    #[arg(
        long,
        env = "PALISADE_LOCK_DELAY",
        default_value = "0s",
        value_parser = palisade_core::duration::parse_duration_ms
    )]
    pub lock_delay_ms: u64,
}

impl From<ServeArgs> for ServerConfig {
    fn from(args: ServeArgs) -> ServerConfig {
        let ServeArgs {
            data_dir,
            listen,
            metrics_listen,
            lock_delay_ms,
            node_id: 1,
            advertise: None,
            initial_cluster: None,
        } = args;
        ServerConfig {
            data_dir,
            listen,
            metrics_listen,
            lock_delay_ms,
        }
    }
}

/// Runs the lock service until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    Ok(palisade_server::serve(args.into()).await?)
}
