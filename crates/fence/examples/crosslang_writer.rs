//! The Rust writer of the cross-language test (clients/go/internal/crosslang): appends a line to
//! one PostgreSQL row and one Redis list, each under its fence, with the grant in
//! `$PALISADE_SEQUENCER` (as `palisade lock -- CMD` sets it).
//!
//! ```text
//! crosslang_writer LINE   # env: PALISADE_SEQUENCER, PALISADE_PUBLIC_KEY, DATABASE_URL, REDIS_URL
//! ```
//!
//! The Python (`writer.py`) and Go (`writer/`) writers beside that test do the same with their
//! languages' fence helpers. PostgreSQL first: claim the scope, read the row, write it back, one
//! transaction; then Redis: `RPUSH` under the same scope's fence. Exit status: 0 both written,
//! 3 refused as stale (nothing written by this run), 1 anything else.

use std::process::ExitCode;

use palisade_fence::{FenceError, RedisFence, RedisOp, Verifier, postgres};
use palisade_sequencer::PublicKey;

/// The fence scope, row and key every writer of the test shares.
const SCOPE: &str = "crosslang/report";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            println!("written");
            ExitCode::SUCCESS
        }
        Err(Err(stale @ FenceError::Stale { .. })) => {
            eprintln!("refused: {stale}");
            ExitCode::from(3)
        }
        Err(Err(other)) => {
            eprintln!("error: {other}");
            ExitCode::from(1)
        }
        Err(Ok(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

/// A fence error, or any other failure as its message.
type Failure = Result<String, FenceError>;

fn other(e: impl std::fmt::Display) -> Failure {
    Ok(e.to_string())
}

async fn run() -> Result<(), Failure> {
    let line = std::env::args()
        .nth(1)
        .ok_or_else(|| other("usage: crosslang_writer LINE"))?;
    let env = |name: &str| std::env::var(name).map_err(|_| other(format!("set {name}")));
    let key: PublicKey = env("PALISADE_PUBLIC_KEY")?.parse().map_err(other)?;
    let sequencer = Verifier::new(key)
        .verify(std::env::var("PALISADE_SEQUENCER").ok().as_deref())
        .map_err(Err)?;

    let (mut client, connection) =
        tokio_postgres::connect(&env("DATABASE_URL")?, tokio_postgres::NoTls)
            .await
            .map_err(other)?;
    tokio::spawn(connection);
    let txn = client.transaction().await.map_err(other)?;
    postgres::claim(&txn, SCOPE, &sequencer)
        .await
        .map_err(Err)?;
    let body: Option<String> = txn
        .query_opt("SELECT body FROM crosslang WHERE name = 'report'", &[])
        .await
        .map_err(other)?
        .map(|row| row.get(0));
    let body = body.map_or(line.clone(), |body| format!("{body}\n{line}"));
    txn.execute(
        "INSERT INTO crosslang (name, body) VALUES ('report', $1) \
         ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
        &[&body],
    )
    .await
    .map_err(other)?;
    postgres::commit(txn).await.map_err(Err)?;

    let mut redis = redis::Client::open(env("REDIS_URL")?)
        .map_err(other)?
        .get_multiplexed_async_connection()
        .await
        .map_err(other)?;
    let push = RedisOp::RPush {
        key: SCOPE.to_owned(),
        value: line.into_bytes(),
    };
    RedisFence::new()
        .write(&mut redis, SCOPE, &sequencer, &[push])
        .await
        .map_err(Err)?;
    Ok(())
}
