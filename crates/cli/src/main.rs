//! `palisade`: the lock service, its clients for shells, and the fenced store, in one binary.
//!
//! Each command group lives in its own module and exposes a clap `Args` type with an async
//! `run`; adding a command is one [`Command`] variant and one module. Errors end the process
//! with `palisade: <message>` on stderr and a status from [`exit`], never a panic.
//!
//! The libraries parse no command line: `serve.rs` turns `palisade serve`'s flags into the
//! server's `ServerConfig`, and `store.rs` is `palisade store`'s. Only `palisade-bench` still
//! brings its own clap arguments (`DemoArgs`, `BenchArgs`).

mod args;
mod cluster;
mod exit;
mod inspect;
mod lock;
mod oneshot;
mod output;
mod serve;
mod token;

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::{CommandFactory as _, Parser, Subcommand};
use palisade_client::{AUTH_TOKEN_ENV, BearerToken, Client, ClientOptions};
use palisade_proto::DEFAULT_ENDPOINT;
use tracing_subscriber::EnvFilter;

/// Palisade: locks with fencing tokens, and resources that enforce them.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about, after_help = exit::HELP)]
struct Cli {
    /// Address of the lock service, or a comma-separated list of the members of a cluster
    /// (at most 16; the client follows the leader, to an address not on the list only with
    /// TLS: give every member). `http://` is assumed without a scheme.
    #[arg(long, global = true, env = "PALISADE_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    endpoint: String,
    /// The bearer token to authenticate with (`palisade token new`), sent with every call.
    /// Prefer the environment variable or --token-file: a flag's value is visible in `ps`.
    #[arg(
        long,
        global = true,
        env = AUTH_TOKEN_ENV,
        hide_env_values = true,
        value_parser = BearerToken::new
    )]
    token: Option<BearerToken>,
    /// Read the bearer token from this file (its first line); takes precedence over --token
    /// and the environment variable.
    #[arg(long, global = true, env = "PALISADE_AUTH_TOKEN_FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Connect with TLS, checking the service's certificate against this CA (PEM). Endpoints
    /// without a scheme are then https://; http:// ones are refused. `palisade store` commands
    /// use it for https:// store URLs.
    #[arg(long = "tls-ca", global = true, env = "PALISADE_TLS_CA")]
    tls_ca: Option<std::path::PathBuf>,
    /// Mutual TLS: present this client certificate (PEM), with --tls-key. For `palisade serve`
    /// and `palisade store serve`: the server's certificate, which turns TLS on.
    #[arg(long = "tls-cert", global = true, env = "PALISADE_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long = "tls-key", global = true, env = "PALISADE_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the lock service.
    Serve(serve::ServeArgs),
    /// The fenced store: a key/value store over HTTP that refuses stale sequencers.
    #[command(subcommand)]
    Store(palisade_cli::store::StoreCommand),
    /// Wait for a lock, run a command while holding it, release it when the command exits.
    Lock(lock::LockArgs),
    /// Campaign in an election, run a command while leading (its epoch in PALISADE_EPOCH),
    /// step down when it exits.
    Elect(lock::ElectArgs),
    /// Show an election's leader (session, epoch, value), or follow it with --watch.
    Leader(inspect::LeaderArgs),
    /// Take a lock once, for scripts: prints the grant; the session is not kept alive.
    Acquire(oneshot::AcquireArgs),
    /// Renew the lease of a session from `palisade acquire`.
    Renew(oneshot::RenewArgs),
    /// Release a lock held by a session from `palisade acquire`.
    Release(oneshot::ReleaseArgs),
    /// Show one lock: holder, token, last token, waiters, lease remaining.
    Status(inspect::StatusArgs),
    /// List locks by name prefix.
    Locks(inspect::LocksArgs),
    /// Stream the holder changes of a lock, one line per event.
    Watch(inspect::WatchArgs),
    /// The members of a replicated lock service: status, add, remove; and backups.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Print the public keys resources use to verify sequencers.
    Pubkey(inspect::PubkeyArgs),
    /// Create a new cluster's data directory from a backup (`palisade cluster backup`).
    Restore(cluster::RestoreArgs),
    /// Place a stopped node's token and session counters above every value they can have had,
    /// after its log was lost, cut or rolled back beside its signing key (the start refuses
    /// and names this command). See docs/cluster.md.
    RecoverCounters(cluster::RecoverCountersArgs),
    /// The signing keys of the lock service: list, add, rotate, retire.
    #[command(subcommand)]
    Keys(cluster::KeysCommand),
    /// Watch a paused lock holder lose an update without fencing, and be refused with it.
    Demo(palisade_bench::DemoArgs),
    /// Load generator: Palisade (or etcd) lock throughput and latency, and what fencing costs.
    Bench(palisade_bench::BenchArgs),
    /// Bearer tokens for `palisade serve --tokens FILE`.
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Print a shell completion script on stdout, e.g.
    /// `palisade completions bash > /etc/bash_completion.d/palisade`.
    Completions(CompletionsArgs),
    /// TLS certificates: `palisade tls init DIR` makes a CA, a node and a client certificate.
    #[command(subcommand)]
    Tls(palisade_cli::tls::TlsCommand),
}

/// `palisade completions SHELL`.
#[derive(Debug, clap::Args)]
struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: CompletionShell,
}

/// The shells `palisade completions` writes scripts for.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

impl From<CompletionShell> for clap_complete::Shell {
    fn from(shell: CompletionShell) -> clap_complete::Shell {
        match shell {
            CompletionShell::Bash => clap_complete::Shell::Bash,
            CompletionShell::Zsh => clap_complete::Shell::Zsh,
            CompletionShell::Fish => clap_complete::Shell::Fish,
        }
    }
}

/// What every client command needs: where the lock service is, and how to authenticate.
#[derive(Debug, Clone)]
pub struct Global {
    /// One endpoint, or a comma-separated list of them.
    pub endpoint: String,
    /// Sent with every call, if any.
    pub bearer_token: Option<BearerToken>,
    /// TLS to the lock service (`--tls-ca`, `--tls-cert`, `--tls-key`), or plaintext.
    pub tls: Option<palisade_tls::ClientTls>,
    /// The files of `tls`, as the environment variables `palisade lock` passes to its command.
    pub tls_files: Vec<(&'static str, std::path::PathBuf)>,
}

impl Global {
    /// Connects to the lock service: to the first endpoint of the list that accepts a
    /// connection, following the leader from there. A malformed list (an empty entry, more than
    /// 16 entries) is a usage error.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        let options = ClientOptions {
            bearer_token: self.bearer_token.clone(),
            tls: self.tls.clone(),
            ..ClientOptions::default()
        };
        Ok(Client::connect_with(&self.endpoint, options).await?)
    }

    /// What adds the bearer token to the cluster commands' calls.
    pub fn bearer(&self) -> palisade_client::Bearer {
        palisade_client::Bearer::new(self.bearer_token.clone())
    }
}

/// The client TLS settings of the global flags, for `alpn`; `None` without `--tls-ca`. A
/// certificate or key without a CA, or a bad file, is a usage error.
fn client_tls(cli: &Cli, alpn: &[u8]) -> anyhow::Result<Option<palisade_tls::ClientTls>> {
    let Some(ca) = &cli.tls_ca else {
        if cli.tls_cert.is_some() || cli.tls_key.is_some() {
            return Err(exit::Exit::new(
                exit::USAGE,
                "--tls-cert and --tls-key need --tls-ca (the CA to check the server's certificate with)",
            )
            .into());
        }
        return Ok(None);
    };
    palisade_tls::ClientTls::from_files(ca, cli.tls_cert.as_deref(), cli.tls_key.as_deref(), alpn)
        .map(Some)
        .map_err(|e| exit::Exit::new(exit::USAGE, e.to_string()).into())
}

impl Command {
    /// The log level when `RUST_LOG` is not set: the service logs what it does, clients only
    /// warn.
    fn default_log_filter(&self) -> &'static str {
        match self {
            Command::Serve(_) | Command::Store(palisade_cli::store::StoreCommand::Serve(_)) => {
                "info"
            }
            // The demo runs a lock service in-process; its timeline is the output, so the
            // service's own warnings (e.g. during its shutdown) would only interleave with it.
            Command::Demo(_) => "error",
            _ => "warn",
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let bearer_token = match (&cli.token_file, cli.token.clone()) {
        (Some(path), _) => Some(token::read_token_file(path)?),
        (None, token) => token,
    };
    // `palisade serve` and `palisade store serve` take their own TLS flags; `tls init` none.
    let serves = matches!(
        cli.command,
        Command::Serve(_)
            | Command::Tls(_)
            | Command::Store(palisade_cli::store::StoreCommand::Serve(_))
    );
    let global_tls = serve::GlobalTls {
        ca: cli.tls_ca.clone(),
        cert: cli.tls_cert.clone(),
        key: cli.tls_key.clone(),
    };
    let (tls, store_tls) = if serves {
        (None, None)
    } else {
        (
            client_tls(&cli, palisade_tls::ALPN_H2)?,
            client_tls(&cli, palisade_tls::ALPN_HTTP1)?,
        )
    };
    cluster::set_tls(tls.clone());
    palisade_cli::store::set_client_tls(store_tls);
    let tls_files = if tls.is_some() {
        [
            ("PALISADE_TLS_CA", &global_tls.ca),
            ("PALISADE_TLS_CERT", &global_tls.cert),
            ("PALISADE_TLS_KEY", &global_tls.key),
        ]
        .into_iter()
        .filter_map(|(name, path)| Some((name, path.clone()?)))
        .collect()
    } else {
        Vec::new()
    };
    // The default endpoint names its scheme for plaintext; with TLS it is the same address
    // over https://, not a refused http:// one.
    let endpoint = match cli.endpoint.strip_prefix("http://") {
        Some(address) if tls.is_some() && cli.endpoint == DEFAULT_ENDPOINT => address.to_string(),
        _ => cli.endpoint,
    };
    let global = Global {
        endpoint,
        bearer_token,
        tls,
        tls_files,
    };
    match cli.command {
        Command::Serve(args) => serve::run(args, global_tls)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Store(command) => {
            palisade_cli::store::run(command, global_tls.cert, global_tls.key).await
        }
        Command::Lock(args) => lock::run(args, &global).await,
        Command::Elect(args) => lock::run(args.into(), &global).await,
        Command::Leader(args) => inspect::leader(args, &global).await,
        Command::Acquire(args) => oneshot::acquire(args, &global).await,
        Command::Renew(args) => oneshot::renew(args, &global).await,
        Command::Release(args) => oneshot::release(args, &global).await,
        Command::Status(args) => inspect::status(args, &global).await,
        Command::Locks(args) => inspect::locks(args, &global).await,
        Command::Watch(args) => inspect::watch(args, &global).await,
        Command::Pubkey(args) => inspect::pubkey(args, &global).await,
        Command::Cluster(command) => {
            let endpoints = palisade_client::parse_endpoints(&global.endpoint)?;
            cluster::run(command, &endpoints, &global.bearer()).await
        }
        Command::Restore(args) => cluster::restore(args),
        Command::RecoverCounters(args) => cluster::recover_counters(args),
        Command::Keys(command) => {
            let endpoints = palisade_client::parse_endpoints(&global.endpoint)?;
            cluster::keys(command, &endpoints, &global.bearer()).await
        }
        Command::Demo(args) => palisade_bench::demo::run(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Completions(args) => {
            let shell = clap_complete::Shell::from(args.shell);
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "palisade",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Token(command) => token::run(command),
        Command::Bench(mut args) => {
            args.tls = global.tls.clone();
            palisade_bench::bench::run(args)
                .await
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Tls(command) => palisade_cli::tls::run(command),
    }
}

/// The warning for a session credential given as `--session` (N16): the secret in it acts for
/// the session, and every local user reads a process's arguments.
const SESSION_FLAG_WARNING: &str = "palisade: warning: --session puts the session's secret in the \
     process list, where every local user can read it (`ps`); export PALISADE_SESSION instead \
     (`export PALISADE_SESSION` after `eval \"$(palisade acquire ...)\"`) and leave --session out";

fn main() -> ExitCode {
    let mut matches = Cli::command().get_matches();
    let session_flag = matches.subcommand().is_some_and(|(name, sub)| {
        matches!(name, "renew" | "release")
            && sub.value_source("session") == Some(clap::parser::ValueSource::CommandLine)
    });
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches_mut(&mut matches) {
        Ok(cli) => cli,
        Err(error) => error.format(&mut Cli::command()).exit(),
    };
    if session_flag {
        eprintln!("{SESSION_FLAG_WARNING}");
    }
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(cli.command.default_log_filter()));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("palisade: cannot start the async runtime: {error}");
            return ExitCode::from(exit::INTERNAL);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("palisade: {error:#}");
            ExitCode::from(exit::code_for(&error))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("palisade").chain(args.iter().copied()))
    }

    #[test]
    fn lock_takes_its_command_after_the_flags() {
        let cli = parse(&[
            "lock",
            "jobs/a",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "echo --ttl",
        ])
        .unwrap();
        let Command::Lock(args) = cli.command else {
            panic!("not a lock command")
        };
        assert_eq!(args.names, ["jobs/a"]);
        assert_eq!(args.ttl, std::time::Duration::from_secs(2));
        assert_eq!(args.wait, palisade_client::Wait::Forever);
        assert_eq!(args.command, ["sh", "-c", "echo --ttl"]);
    }

    #[test]
    fn lock_without_a_command_is_a_usage_error() {
        let error = parse(&["lock", "jobs/a"]).unwrap_err();
        assert_eq!(error.exit_code(), i32::from(exit::USAGE));
        // Every word before `--` is a lock name: without it there is no command.
        let error = parse(&["lock", "jobs/a", "true"]).unwrap_err();
        assert_eq!(error.exit_code(), i32::from(exit::USAGE));
    }

    #[test]
    fn lock_takes_several_names_before_the_command_and_flags_between_them() {
        let cli = parse(&[
            "lock", "a", "b", "--wait", "5s", "c", "--", "sh", "-c", "echo", "--", "x",
        ])
        .unwrap();
        let Command::Lock(args) = cli.command else {
            panic!("not a lock command")
        };
        assert_eq!(args.names, ["a", "b", "c"]);
        assert_eq!(
            args.wait,
            palisade_client::Wait::For(std::time::Duration::from_secs(5))
        );
        assert_eq!(args.command, ["sh", "-c", "echo", "--", "x"]);
    }

    #[test]
    fn the_endpoint_flag_is_accepted_after_the_command() {
        let cli = parse(&["status", "a", "--endpoint", "http://127.0.0.1:9"]).unwrap();
        assert_eq!(cli.endpoint, "http://127.0.0.1:9");
    }

    #[test]
    fn a_token_file_and_a_token_may_both_be_given() {
        let cli = parse(&[
            "status",
            "a",
            "--token",
            "pst_a",
            "--token-file",
            "/dev/null",
        ])
        .unwrap();
        assert!(cli.token.is_some() && cli.token_file.is_some());
        assert!(parse(&["status", "a", "--token", "has space"]).is_err());
    }

    #[test]
    fn serve_takes_its_certificate_from_the_global_flags_and_refuses_a_bare_ca() {
        let config = |args: &[&str]| {
            let cli = parse(args).unwrap();
            let global = serve::GlobalTls {
                ca: cli.tls_ca.clone(),
                cert: cli.tls_cert.clone(),
                key: cli.tls_key.clone(),
            };
            let Command::Serve(serve) = cli.command else {
                panic!("not serve")
            };
            serve.into_config(global)
        };
        let tls = config(&[
            "serve",
            "--tls-cert",
            "s.pem",
            "--tls-key",
            "s.key",
            "--tls-client-ca",
            "ca.pem",
        ])
        .unwrap()
        .tls
        .unwrap();
        assert_eq!(tls.cert, std::path::Path::new("s.pem"));
        assert_eq!(
            tls.client_ca.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
        assert_eq!(tls.peer_ca, None);
        assert!(config(&["serve"]).unwrap().tls.is_none());
        let refused = config(&["serve", "--tls-ca", "ca.pem"]).unwrap_err();
        assert!(refused.contains("--tls-client-ca"), "{refused}");
        let refused = config(&["serve", "--tls-client-ca", "ca.pem"]).unwrap_err();
        assert!(refused.contains("need --tls-cert"), "{refused}");
        let refused = config(&["serve", "--tls-cert", "s.pem"]).unwrap_err();
        assert!(refused.contains("needs --tls-key"), "{refused}");
    }

    #[test]
    fn acquire_requires_a_ttl() {
        assert!(parse(&["acquire", "a"]).is_err());
        assert!(parse(&["acquire", "a", "--ttl", "5s", "--wait", "1s", "--json"]).is_ok());
    }
}
