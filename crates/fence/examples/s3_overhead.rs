//! Benchmark program: what the fence costs a write to an S3-compatible object store
//! (`docs/benchmarks.md`, "The S3 fence").
//!
//! Both paths overwrite one small object with a conditional `PUT` on the ETag they read: the
//! baseline reads the ETag (a `GET`) and writes with `If-Match`, with no token anywhere; the
//! fenced path is [`S3Fence::put`], which reads the fence state and ETag with the same `GET`,
//! runs the check, and writes with `If-Match` (plus the signature check, remembered by a
//! [`Verifier`] after the first). So the difference is the fence's own work: the envelope, the
//! check, and the metadata. Runs alternate in rounds so drift affects both alike. Reports
//! numbers; asserts nothing.
//!
//! ```text
//! PALISADE_TEST_S3='http://127.0.0.1:7070 palisade-test palisadetest palisadetestsecret' \
//!   cargo run --release -p palisade-fence --example s3_overhead -- [WRITES]
//! ```

use std::time::{Duration, Instant};

use palisade_core::{SessionId, Token};
use palisade_fence::s3::{PutCondition, PutOutcome, envelope};
use palisade_fence::{S3Config, S3Fence, Verifier};
use palisade_sequencer::SigningKey;

const ROUNDS: usize = 10;
/// Most writes one run makes, whatever it is asked for.
const WRITES_MAX: usize = 100_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let writes: usize = std::env::args()
        .nth(1)
        .map_or(1000, |a| a.parse().expect("WRITES"))
        .min(WRITES_MAX);
    let server = std::env::var("PALISADE_TEST_S3")
        .map_err(|_| "set PALISADE_TEST_S3 to 'endpoint bucket access-key secret-key'")?;
    let [endpoint, bucket, access_key, secret_key] =
        server.split_whitespace().collect::<Vec<_>>()[..]
    else {
        return Err("PALISADE_TEST_S3 is 'endpoint bucket access-key secret-key'".into());
    };
    let fence = S3Fence::new(S3Config {
        endpoint: endpoint.into(),
        region: "us-east-1".into(),
        bucket: bucket.into(),
        access_key: access_key.into(),
        secret_key: secret_key.into(),
    });
    let run = std::process::id();
    let (plain_key, fenced_key) = (
        format!("bench/{run}/conditional"),
        format!("bench/{run}/fenced"),
    );
    let service = SigningKey::generate();
    let verifier = Verifier::new(service.public_key());
    let sequencer = service.sign("bench/s3", Token::new(1), SessionId::new(1))?;
    let state = verifier.verify(Some(sequencer.as_str()))?;
    let state = palisade_fence::FenceState {
        lock: state.lock().into(),
        token_max: state.token(),
        holder_session: state.session(),
    };

    let per_round = (writes / ROUNDS).max(1);
    let (mut fenced, mut plain) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for i in 0..per_round {
            let body = format!("{{\"write\":\"{round}-{i}\"}}").into_bytes();
            // Which goes first alternates, so neither always follows the other's write.
            for fenced_turn in [i % 2 == 0, i % 2 != 0] {
                let started = Instant::now();
                if fenced_turn {
                    let verified = verifier.verify(Some(sequencer.as_str()))?;
                    fence.put(&fenced_key, &verified, &body).await?;
                    fenced.push(started.elapsed());
                } else {
                    // The same framing as the fence's, so both send the same bytes and headers.
                    let etag = fence.get(&plain_key).await?.map(|object| object.etag);
                    let condition = match &etag {
                        Some(etag) => PutCondition::Matches(etag),
                        None => PutCondition::Absent,
                    };
                    let body = envelope(&state, Some(&body));
                    let outcome = fence.put_raw(&plain_key, &state, body, condition).await?;
                    assert!(matches!(outcome, PutOutcome::Written(_)), "{outcome:?}");
                    plain.push(started.elapsed());
                }
            }
        }
    }
    let report = |name: &str, samples: &mut Vec<Duration>| -> f64 {
        samples.sort_unstable();
        let p50 = samples[samples.len() / 2].as_secs_f64() * 1e3;
        let p99 = samples[samples.len() * 99 / 100].as_secs_f64() * 1e3;
        let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / samples.len() as f64;
        println!(
            "{name:>12}: p50 {p50:.3} ms, p99 {p99:.3} ms, mean {mean:.3} ms over {} writes",
            samples.len()
        );
        p50
    };
    let plain_p50 = report("conditional", &mut plain);
    let fenced_p50 = report("fenced", &mut fenced);
    println!(
        "fenced / conditional at p50: {:.3}x",
        fenced_p50 / plain_p50
    );
    Ok(())
}
