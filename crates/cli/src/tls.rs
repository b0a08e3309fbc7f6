//! `palisade tls init DIR`: a CA, a node certificate and a client certificate for trying TLS
//! and mutual TLS (docs/security.md, "TLS"). Production deployments may use their own CA; the
//! flags take any PEM files.

use std::path::PathBuf;
use std::process::ExitCode;

/// `palisade tls` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TlsCommand {
    /// Make a new CA in DIR (ca.pem, ca.key), a node certificate signed by it (server.pem,
    /// server.key: for `palisade serve` and `palisade store serve`, and for peer links) and a
    /// client certificate (client.pem, client.key). Keys are written 0600; existing files are
    /// never overwritten.
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
            println!(
                "CA:          {} (key {})",
                files.ca_cert.display(),
                files.ca_key.display()
            );
            println!(
                "node:        {} (key {}) for {}",
                files.server_cert.display(),
                files.server_key.display(),
                args.hosts.join(", ")
            );
            println!(
                "client:      {} (key {}) named {}",
                files.client_cert.display(),
                files.client_key.display(),
                args.client_name
            );
            println!(
                "serve with:  palisade serve --tls-cert {} --tls-key {} [--tls-client-ca {} --tls-peer-ca {}]",
                files.server_cert.display(),
                files.server_key.display(),
                files.ca_cert.display(),
                files.ca_cert.display()
            );
            println!(
                "connect:     palisade --tls-ca {} [--tls-cert {} --tls-key {}] status LOCK",
                files.ca_cert.display(),
                files.client_cert.display(),
                files.client_key.display()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
