//! Benchmark program: what the fence costs a PostgreSQL write (target ≤ 1.10×, see
//! `docs/benchmarks.md`, "Targets").
//!
//! Both paths run the same transaction, `UPDATE reports SET body = $1 WHERE id = 1` and a
//! commit, on one connection; the fenced path adds the signature check (a [`Verifier`], which
//! remembers the sequencer after its first check, as a resource serving one holder would) and
//! [`postgres::claim`] inside the same transaction, pipelined with the write (the
//! pattern the guide recommends: one round trip instead of two). Runs alternate in rounds so
//! drift affects both alike. Reports numbers; asserts nothing.
//!
//! ```text
//! PALISADE_TEST_POSTGRES='host=127.0.0.1 user=postgres dbname=test' \
//!   cargo run --release -p palisade-fence --example postgres_overhead -- [WRITES]
//! ```

use std::time::{Duration, Instant};

use palisade_core::{SessionId, Token};
use palisade_fence::{Verifier, postgres};
use palisade_sequencer::SigningKey;

const ROUNDS: usize = 10;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let writes: usize = std::env::args()
        .nth(1)
        .map_or(2000, |a| a.parse().expect("WRITES"));
    let url = std::env::var("PALISADE_TEST_POSTGRES").map_err(
        |_| "set PALISADE_TEST_POSTGRES, e.g. 'host=127.0.0.1 user=postgres dbname=test'",
    )?;
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    postgres::ensure_schema(&client).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS palisade_bench_reports (id int PRIMARY KEY, body text);
             INSERT INTO palisade_bench_reports VALUES (1, '') ON CONFLICT DO NOTHING;
             DELETE FROM palisade_fence WHERE scope = 'bench/postgres-overhead';",
        )
        .await?;
    let service = SigningKey::generate();
    let verifier = Verifier::new(service.public_key());
    let sequencer = service.sign("bench/postgres", Token::new(1), SessionId::new(1))?;
    let update = client
        .prepare("UPDATE palisade_bench_reports SET body = $1 WHERE id = 1")
        .await?;

    let per_round = (writes / ROUNDS).max(1);
    let (mut fenced, mut unfenced) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for i in 0..per_round {
            let body = format!("write {round}-{i}");
            let started = Instant::now();
            let txn = client.transaction().await?;
            txn.execute(&update, &[&body]).await?;
            txn.commit().await?;
            unfenced.push(started.elapsed());

            let started = Instant::now();
            let verified = verifier.verify(Some(sequencer.as_str()))?;
            let txn = client.transaction().await?;
            // Pipelined: the check and the write travel together; the check runs first and
            // takes the fence row's lock, and a refusal rolls the write back with the txn.
            let check = postgres::claim(&txn, "bench/postgres-overhead", &verified);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&body];
            let (checked, written) = tokio::join!(check, txn.execute(&update, &params));
            checked?;
            written?;
            txn.commit().await?;
            fenced.push(started.elapsed());
        }
    }
    let report = |name: &str, samples: &mut Vec<Duration>| -> f64 {
        samples.sort_unstable();
        let p50 = samples[samples.len() / 2].as_secs_f64() * 1e3;
        let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / samples.len() as f64;
        println!(
            "{name:>9}: p50 {p50:.3} ms, mean {mean:.3} ms over {} writes",
            samples.len()
        );
        p50
    };
    let unfenced_p50 = report("unfenced", &mut unfenced);
    let fenced_p50 = report("fenced", &mut fenced);
    println!(
        "fenced / unfenced at p50: {:.3}x",
        fenced_p50 / unfenced_p50
    );
    Ok(())
}
