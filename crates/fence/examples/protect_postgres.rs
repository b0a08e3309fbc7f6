//! Protect your own PostgreSQL table with a fence: the program a lock holder runs.
//!
//! ```text
//! export PALISADE_PUBLIC_KEY="$(palisade pubkey)"
//! export DATABASE_URL='host=127.0.0.1 user=postgres dbname=test'
//! palisade lock reports/nightly -- \
//!   cargo run -p palisade-fence --example protect_postgres -- "nightly report body"
//! ```
//!
//! `palisade lock` puts the grant's sequencer in `$PALISADE_SEQUENCER`. The program verifies it
//! with the lock service's public key, claims the fence inside its own
//! transaction, and writes. If a newer holder has written since, the transaction is refused
//! and nothing is written. Exit status: 0 written, 3 refused as stale, 4 bad sequencer, 1 other.

use std::process::ExitCode;

use palisade_fence::{FenceError, Verifier, postgres};
use palisade_sequencer::PublicKey;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Fence(stale @ FenceError::Stale { .. })) => {
            eprintln!(
                "refused: {stale}; someone with a newer grant has written, re-read before acting"
            );
            ExitCode::from(3)
        }
        Err(Failure::Fence(rejected)) => {
            eprintln!("refused: {rejected}");
            ExitCode::from(4)
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
    let body = std::env::args()
        .nth(1)
        .ok_or(Failure::Other("usage: protect_postgres BODY".into()))?;
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

    let txn = client.transaction().await?;
    // The check and the write travel in one round trip; the check runs first and locks the
    // fence row until commit, so writers of this scope apply in token order.
    let check = postgres::claim(&txn, "reports/nightly", &sequencer);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&body];
    let write = txn.execute(
        "INSERT INTO reports (name, body) VALUES ('nightly', $1)
         ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
        &params,
    );
    let (checked, written) = tokio::join!(check, write);
    checked?; // on Err the transaction is dropped: rolled back, the write with it
    written?;
    txn.commit().await?; // the write and the token advance become durable together
    println!(
        "written with token {} of lock {:?}",
        sequencer.token(),
        sequencer.lock()
    );
    Ok(())
}
