//! A fenced outbox, runnable: a lock holder writes an event row in its fenced PostgreSQL
//! transaction, and a relay publishes the rows to NATS JetStream with a `Nats-Msg-Id`.
//!
//! ```text
//! export PALISADE_PUBLIC_KEY="$(palisade pubkey)"
//! export DATABASE_URL='host=127.0.0.1 user=postgres dbname=test'
//! export NATS_URL=nats://127.0.0.1:4222
//! palisade lock invoices -- cargo run -p palisade-fence-nats --example outbox_postgres -- emit "invoice 42 sent"
//! cargo run -p palisade-fence-nats --example outbox_postgres -- relay
//! ```
//!
//! `emit` claims the scope `invoices` with `$PALISADE_SEQUENCER` first, then writes the event (a
//! real holder reads and writes its own tables between the two), and commits: a superseded
//! holder is refused at the claim and no event row exists. `relay` publishes the unpublished
//! rows to the stream `EVENTS` (subjects `events.>`, created if missing) and marks them. Exit
//! status: 0 done, 3 refused as stale, 4 bad sequencer, 77 outcome unknown, 1 other.

use std::process::ExitCode;

use palisade_fence::{FenceError, Verifier, postgres};
use palisade_fence_nats::outbox;
use palisade_sequencer::PublicKey;

const SCOPE: &str = "invoices";
const SUBJECT: &str = "events.invoices";

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Fence(stale @ FenceError::Stale { .. })) => {
            eprintln!("refused: {stale}");
            ExitCode::from(3)
        }
        Err(Failure::Fence(unknown)) if unknown.is_outcome_unknown() => {
            eprintln!("the event may or may not have been written: {unknown}");
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

fn env(name: &str) -> Result<String, Failure> {
    std::env::var(name).map_err(|_| Failure::Other(format!("set {name}")))
}

async fn run() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut client, connection) =
        tokio_postgres::connect(&env("DATABASE_URL")?, tokio_postgres::NoTls)
            .await
            .map_err(|e| Failure::Other(format!("DATABASE_URL: {e}")))?;
    tokio::spawn(connection);
    postgres::ensure_schema(&client).await?;
    outbox::ensure_schema(&client).await?;
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["emit", event] => {
            let public_key: PublicKey = env("PALISADE_PUBLIC_KEY")?
                .parse()
                .map_err(|e| Failure::Other(format!("PALISADE_PUBLIC_KEY: {e}")))?;
            let sequencer = Verifier::new(public_key)
                .verify(std::env::var("PALISADE_SEQUENCER").ok().as_deref())?;
            let txn = client
                .transaction()
                .await
                .map_err(|e| Failure::Other(e.to_string()))?;
            // First, before any read: no older grant can commit to the scope after this.
            postgres::claim(&txn, SCOPE, &sequencer).await?;
            // ... the holder's own reads and writes go here, in the same transaction ...
            let id = outbox::emit(&txn, SUBJECT, event.as_bytes(), &sequencer).await?;
            postgres::commit(txn).await?;
            println!("event {id} written");
            Ok(())
        }
        ["relay"] => {
            let context = palisade_fence_nats::connect(&env("NATS_URL")?).await?;
            context
                .get_or_create_stream(async_nats::jetstream::stream::Config {
                    name: "EVENTS".into(),
                    subjects: vec!["events.>".into()],
                    ..Default::default()
                })
                .await
                .map_err(|e| Failure::Other(format!("stream EVENTS: {e}")))?;
            let published = outbox::relay(
                &mut client,
                &context,
                "outbox-example",
                outbox::RELAY_BATCH_MAX,
            )
            .await?;
            println!("{published} events published");
            Ok(())
        }
        _ => Err(Failure::Other(
            "usage: outbox_postgres emit EVENT | outbox_postgres relay".into(),
        )),
    }
}
