//! The fenced store (being built): a durable key/value store over HTTP that enforces sequencers.

pub mod cli {
    //! The `palisade store` subcommands.

    /// `palisade store …`
    #[derive(Debug, clap::Subcommand)]
    pub enum StoreCommand {}

    /// Runs one `palisade store` subcommand and returns the process exit code.
    pub async fn run(command: StoreCommand) -> anyhow::Result<std::process::ExitCode> {
        match command {}
    }
}
