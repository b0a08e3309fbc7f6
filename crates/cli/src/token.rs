//! `palisade token`: bearer tokens for `palisade serve --tokens FILE`, and reading the client's
//! token from `--token-file`.

use std::path::Path;
use std::process::ExitCode;

use palisade_client::BearerToken;
use palisade_core::Identity;
use palisade_server::auth::tokens::{new_token, token_file_line};

use crate::exit::{self, Exit};

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Print a fresh random token for NAME (first line: give it to the client, as
    /// PALISADE_AUTH_TOKEN or in a --token-file) and the line to add to the server's token
    /// file (second line: NAME and the token's SHA-256; the server stores no token).
    New {
        /// The identity the token authenticates: 1 to 64 ASCII letters, digits and . _ - @ :
        #[arg(value_parser = parse_identity)]
        name: Identity,
    },
}

fn parse_identity(text: &str) -> Result<Identity, String> {
    Identity::new(text)
}

pub fn run(command: TokenCommand) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::New { name } => {
            let token = new_token().map_err(|e| Exit::new(exit::INTERNAL, e.to_string()))?;
            println!("{token}");
            println!("{}", token_file_line(&name, &token));
            eprintln!(
                "the first line is the token for {name}: keep it secret (PALISADE_AUTH_TOKEN or --token-file); \
                 add the second line to the file `palisade serve --tokens` reads, then send the server SIGHUP"
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Largest token file a client reads.
const TOKEN_FILE_BYTES_MAX: u64 = 4096;

/// The token in the first line of the file at `path`.
pub fn read_token_file(path: &Path) -> anyhow::Result<BearerToken> {
    let usage = |message: String| Exit::new(exit::USAGE, message);
    let metadata = std::fs::metadata(path).map_err(|e| {
        usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    if metadata.len() > TOKEN_FILE_BYTES_MAX {
        return Err(usage(format!(
            "the token file {} is larger than {TOKEN_FILE_BYTES_MAX} bytes",
            path.display()
        ))
        .into());
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        usage(format!(
            "cannot read the token file {}: {e}",
            path.display()
        ))
    })?;
    let first = text.lines().next().unwrap_or_default();
    Ok(BearerToken::new(first)
        .map_err(|e| usage(format!("the token file {}: {e}", path.display())))?)
}
