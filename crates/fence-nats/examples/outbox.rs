//! A fenced outbox, runnable: a lock holder writes an event row in its fenced PostgreSQL or
//! MySQL/MariaDB transaction, and a relay publishes the rows to NATS JetStream with a
//! `Nats-Msg-Id`.
//!
//! ```text
//! export PALISADE_PUBLIC_KEY="$(palisade pubkey)"
//! export DATABASE_URL='host=127.0.0.1 user=postgres dbname=test'   # or mysql://root@127.0.0.1:3306/test
//! export NATS_URL=nats://127.0.0.1:4222
//! palisade lock invoices -- cargo run -p palisade-fence-nats --example outbox -- emit "invoice 42 sent"
//! cargo run -p palisade-fence-nats --example outbox -- relay
//! ```
//!
//! A `DATABASE_URL` that starts with `mysql://` is MySQL or MariaDB, any other PostgreSQL.
//! `emit` claims the scope `invoices` with `$PALISADE_SEQUENCER` first, then writes the event (a
//! real holder reads and writes its own tables between the two), and commits: a superseded
//! holder is refused at the claim and no event row exists. `relay` publishes the unpublished
//! rows to the stream `EVENTS` (subjects `events.>`, created if missing) and marks them. Exit
//! status: 0 done, 3 refused as stale, 4 bad sequencer, 77 outcome unknown, 1 other.

use std::process::ExitCode;

use mysql_async::{Conn, TxOpts};
use palisade_fence::{FenceError, Verifier, mysql, postgres};
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

/// The database the outbox lives in.
enum Database {
    Postgres(tokio_postgres::Client),
    Mysql(Conn),
}

async fn run() -> Result<(), Failure> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = env("DATABASE_URL")?;
    let bad_url = |e: &dyn std::fmt::Display| Failure::Other(format!("DATABASE_URL: {e}"));
    let mut database = if url.starts_with("mysql://") {
        let mut conn = Conn::from_url(url).await.map_err(|e| bad_url(&e))?;
        mysql::ensure_schema(&mut conn).await?;
        outbox::mysql::ensure_schema(&mut conn).await?;
        Database::Mysql(conn)
    } else {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .map_err(|e| bad_url(&e))?;
        tokio::spawn(connection);
        postgres::ensure_schema(&client).await?;
        outbox::ensure_schema(&client).await?;
        Database::Postgres(client)
    };
    let other = |e: &dyn std::fmt::Display| Failure::Other(e.to_string());
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["emit", event] => {
            let public_key: PublicKey = env("PALISADE_PUBLIC_KEY")?
                .parse()
                .map_err(|e| Failure::Other(format!("PALISADE_PUBLIC_KEY: {e}")))?;
            let sequencer = Verifier::new(public_key)
                .verify(std::env::var("PALISADE_SEQUENCER").ok().as_deref())?;
            // The claim first, before any read: no older grant can commit to the scope after it;
            // the holder's own reads and writes go between the claim and the event.
            let id = match &mut database {
                Database::Postgres(client) => {
                    let txn = client.transaction().await.map_err(|e| other(&e))?;
                    postgres::claim(&txn, SCOPE, &sequencer).await?;
                    let id = outbox::emit(&txn, SUBJECT, event.as_bytes(), &sequencer).await?;
                    postgres::commit(txn).await?;
                    id.to_string()
                }
                Database::Mysql(conn) => {
                    let mut txn = conn
                        .start_transaction(TxOpts::default())
                        .await
                        .map_err(|e| other(&e))?;
                    mysql::claim(&mut txn, SCOPE, &sequencer).await?;
                    let id = outbox::mysql::emit(&mut txn, SUBJECT, event.as_bytes(), &sequencer)
                        .await?;
                    mysql::commit(txn).await?;
                    id.to_string()
                }
            };
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
            let (origin, batch) = ("outbox-example", outbox::RELAY_BATCH_MAX);
            let published = match &mut database {
                Database::Postgres(client) => {
                    outbox::relay(client, &context, origin, batch).await?
                }
                Database::Mysql(conn) => {
                    outbox::mysql::relay(conn, &context, origin, batch).await?
                }
            };
            println!("{published} events published");
            Ok(())
        }
        _ => Err(Failure::Other(
            "usage: outbox emit EVENT | outbox relay".into(),
        )),
    }
}
