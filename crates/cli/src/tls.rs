//! `palisade tls init DIR`: the certificates of a cluster, a fenced store and a client, for
//! trying TLS and mutual TLS (docs/security.md, "TLS"). Two CAs keep clients from being peers:
//! the cluster CA signs the nodes' certificates (and the store's, for server authentication
//! only), the client CA signs client certificates. Production deployments may use their own
//! CAs; the flags take any PEM files.

use std::path::PathBuf;
use std::process::ExitCode;

/// `palisade tls` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TlsCommand {
    /// Make two CAs in DIR: the cluster CA (ca.pem, ca.key), which signs a node certificate
    /// (server.pem, server.key: for `palisade serve` and its peer links; only nodes may hold
    /// it) and a store certificate (store.pem, store.key: for `palisade store serve`); and the
    /// client CA (client-ca.pem, client-ca.key), which signs a client certificate (client.pem,
    /// client.key). Keys are written 0600; existing files are never overwritten.
    Init(InitArgs),
}
/// Flags of `palisade tls init`.
#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// Directory to write the files into (created if missing).
    pub dir: PathBuf,
    /// A DNS name or IP address the node certificate is valid for; repeat for several (every
    /// name clients and peers use to reach the nodes). Default: localhost and 127.0.0.1.
    #[arg(long = "host", default_values_t = [String::from("localhost"), String::from("127.0.0.1")])]
    pub hosts: Vec<String>,
    /// The client certificate's common name: the identity a server sees for it.
    #[arg(long, default_value = "palisade-client")]
    pub client_name: String,
}

/// Runs a `palisade tls` command.
pub fn run(command: TlsCommand) -> anyhow::Result<ExitCode> {
    match command {
        TlsCommand::Init(args) => {
            let files = palisade_tls::generate::init(&args.dir, &args.hosts, &args.client_name)?;
            let show = |path: &PathBuf| path.display().to_string();
            println!(
                "cluster CA:  {} (key {}): signs the nodes' and the store's certificates",
                show(&files.ca_cert),
                show(&files.ca_key)
            );
            println!(
                "node:        {} (key {}) for {}",
                show(&files.server_cert),
                show(&files.server_key),
                args.hosts.join(", ")
            );
            println!(
                "store:       {} (key {}) for {}",
                show(&files.store_cert),
                show(&files.store_key),
                args.hosts.join(", ")
            );
            println!(
                "client CA:   {} (key {}): signs client certificates",
                show(&files.client_ca_cert),
                show(&files.client_ca_key)
            );
            println!(
                "client:      {} (key {}) named {}",
                show(&files.client_cert),
                show(&files.client_key),
                args.client_name
            );
            println!(
                "serve with:  palisade serve --tls-cert {} --tls-key {} --tls-peer-ca {} [--tls-client-ca {}]",
                show(&files.server_cert),
                show(&files.server_key),
                show(&files.ca_cert),
                show(&files.client_ca_cert)
            );
            println!(
                "store with:  palisade store serve --tls-cert {} --tls-key {} [--tls-client-ca {}] --public-key KEY",
                show(&files.store_cert),
                show(&files.store_key),
                show(&files.client_ca_cert)
            );
            println!(
                "connect:     palisade --tls-ca {} [--tls-cert {} --tls-key {}] status LOCK",
                show(&files.ca_cert),
                show(&files.client_cert),
                show(&files.client_key)
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
