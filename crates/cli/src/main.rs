//! `palisade`: the lock service, its clients for shells, and the fenced store, in one binary.
//!
//! Each command group lives in its own module and exposes a clap `Args` type with an async
//! `run`; adding a command is one [`Command`] variant and one module. Errors end the process
//! with `palisade: <message>` on stderr and a status from [`exit`], never a panic.

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
    /// (at most 16; the client follows the leader). `http://` is assumed without a scheme.
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
}

impl Global {
    /// Connects to the lock service: to the first endpoint of the list that accepts a
    /// connection, following the leader from there. A malformed list (an empty entry, more than
    /// 16 entries) is a usage error.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        Ok(Client::connect_with(
            &self.endpoint,
            ClientOptions {
                bearer_token: self.bearer_token.clone(),
                ..ClientOptions::default()
            },
        )
        .await?)
    }

    /// What adds the bearer token to the cluster commands' calls.
    pub fn bearer(&self) -> palisade_client::Bearer {
        palisade_client::Bearer::new(self.bearer_token.clone())
    }
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
    let bearer_token = match (&cli.token_file, cli.token) {
        (Some(path), _) => Some(token::read_token_file(path)?),
        (None, token) => token,
    };
    let global = Global {
        endpoint: cli.endpoint,
        bearer_token,
    };
    match cli.command {
        Command::Serve(args) => serve::run(args).await.map(|()| ExitCode::SUCCESS),
        Command::Store(command) => palisade_cli::store::run(command).await,
        Command::Lock(args) => lock::run(args, &global).await,
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
        Command::Bench(args) => palisade_bench::bench::run(args)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Token(command) => token::run(command),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
        assert_eq!(args.name, "jobs/a");
        assert_eq!(args.ttl, std::time::Duration::from_secs(2));
        assert_eq!(args.wait, palisade_client::Wait::Forever);
        assert_eq!(args.command, ["sh", "-c", "echo --ttl"]);
    }

    #[test]
    fn lock_without_a_command_is_a_usage_error() {
        let error = parse(&["lock", "jobs/a"]).unwrap_err();
        assert_eq!(error.exit_code(), i32::from(exit::USAGE));
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
    fn acquire_requires_a_ttl() {
        assert!(parse(&["acquire", "a"]).is_err());
        assert!(parse(&["acquire", "a", "--ttl", "5s", "--wait", "1s", "--json"]).is_ok());
    }
}
