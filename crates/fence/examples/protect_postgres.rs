//! Protect your own PostgreSQL table with a fence: the program a lock holder runs.
//!
//! ```text
//! export PALISADE_PUBLIC_KEY="$(palisade pubkey)"
//! export DATABASE_URL='host=127.0.0.1 user=postgres dbname=test'
//! palisade lock reports/nightly -- \
//!   cargo run -p palisade-fence --example protect_postgres -- "one more line"
//! ```
//!
//! `palisade lock` puts the grant's sequencer in `$PALISADE_SEQUENCER`. The program verifies it
//! with the lock service's public key and appends a line to a report: a read-modify-write. It
//! claims the fence first in its transaction, then reads the report, then writes it back. If a
//! newer holder has claimed since, the claim is refused and nothing is read or written. Exit
//! status: 0 written, 3 refused as stale, 4 bad sequencer, 77 outcome unknown, 1 other.

use std::process::ExitCode;

use palisade_fence::{FenceError, Verifier, postgres};
use palisade_sequencer::PublicKey;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Fence(stale @ FenceError::Stale { .. })) => {
            eprintln!("refused: {stale}; someone with a newer grant has the report now");
            ExitCode::from(3)
        }
        Err(Failure::Fence(unknown)) if unknown.is_outcome_unknown() => {
            eprintln!("the line may or may not have been appended: {unknown}");
            ExitCode::from(77)
        }
        Err(Failure::Fence(rejected)) if rejected.is_rejection() => {
            eprintln!("refused: {rejected}");
            ExitCode::from(4)
        }
        Err(Failure::Fence(other)) => {
            eprintln!("error: {other}");
            ExitCode::from(1)
        }
        Err(Failure::Other(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

enum Failure {
    Fence(FenceError),
    Other(String),
}

impl From<FenceError> for Failure {
    fn from(e: FenceError) -> Self {
        Failure::Fence(e)
    }
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Other(e.to_string())
    }
}

async fn run() -> Result<(), Failure> {
    let line = std::env::args()
        .nth(1)
        .ok_or(Failure::Other("usage: protect_postgres LINE".into()))?;
    let env = |name: &str| std::env::var(name).map_err(|_| Failure::Other(format!("set {name}")));
    let public_key: PublicKey = env("PALISADE_PUBLIC_KEY")?
        .parse()
        .map_err(|e| Failure::Other(format!("PALISADE_PUBLIC_KEY: {e}")))?;
    let (mut client, connection) =
        tokio_postgres::connect(&env("DATABASE_URL")?, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);

    // Once per database: the fence table, next to your own tables.
    postgres::ensure_schema(&client).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS reports (name text PRIMARY KEY, body text NOT NULL)",
        )
        .await?;

    // Verify before touching the database: a forged or foreign sequencer never gets this far.
    let verifier = Verifier::new(public_key);
    let sequencer = verifier.verify(std::env::var("PALISADE_SEQUENCER").ok().as_deref())?;

    // A read-modify-write: claim first, then read, then write, all in one transaction.
    let txn = client.transaction().await?;
    // The claim locks the scope's fence row until commit and advances its token: no older grant
    // can commit to this scope any more, so what we read next is what we will write over.
    postgres::claim(&txn, "reports/nightly", &sequencer).await?;
    let current: Option<String> = txn
        .query_opt("SELECT body FROM reports WHERE name = 'nightly'", &[])
        .await?
        .map(|row| row.get(0));
    let report = match current {
        Some(report) => format!("{report}\n{line}"),
        None => line,
    };
    txn.execute(
        "INSERT INTO reports (name, body) VALUES ('nightly', $1)
         ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
        &[&report],
    )
    .await?;
    // The write and the token advance become durable together; a commit whose answer was lost
    // is FenceError::OutcomeUnknown, not a failure.
    postgres::commit(txn).await?;
    println!(
        "appended with token {} of lock {:?}; the report has {} lines",
        sequencer.token(),
        sequencer.lock(),
        report.lines().count()
    );
    Ok(())
}
