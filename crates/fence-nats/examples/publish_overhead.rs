//! Benchmark program: what the fence costs a NATS JetStream publish (`docs/benchmarks.md`).
//!
//! Three paths publish to subjects of one stream on the same server, one message at a time, each
//! waiting for the broker's acknowledgement: a plain publish; a conditional publish without a
//! token (`Nats-Expected-Last-Subject-Sequence` of the message it published last, no read); and
//! the fenced publish ([`NatsFence::publish`]: read the last message, verify its sequencer and
//! check, then the conditional publish). Runs alternate in rounds so drift affects all alike.
//! Reports numbers; asserts nothing.
//!
//! ```text
//! PALISADE_TEST_NATS=nats://127.0.0.1:4222 \
//!   cargo run --release -p palisade-fence-nats --example publish_overhead -- [PUBLISHES]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::message::PublishMessage;
use palisade_fence::Verifier;
use palisade_fence_nats::NatsFence;
use palisade_sequencer::{SigningKey, VerifiedSequencer};

const ROUNDS: usize = 10;
/// The most publishes one run makes, per path.
const PUBLISHES_MAX: usize = 100_000;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let publishes: usize = std::env::args()
        .nth(1)
        .map_or(2000, |a| a.parse().expect("PUBLISHES"))
        .min(PUBLISHES_MAX);
    let url = std::env::var("PALISADE_TEST_NATS")
        .map_err(|_| "set PALISADE_TEST_NATS, e.g. nats://127.0.0.1:4222")?;
    let context = palisade_fence_nats::connect(&url).await?;
    let stream = format!("BENCH_{}", std::process::id());
    context
        .create_stream(async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{stream}.>")],
            ..Default::default()
        })
        .await?;
    let service = SigningKey::generate();
    let verifier = Arc::new(Verifier::new(service.public_key()));
    let signed = service.sign(
        "bench/nats",
        palisade_core::Token::new(1),
        palisade_core::SessionId::new(1),
    )?;
    let sequencer: VerifiedSequencer = verifier.verify(Some(signed.as_str()))?;
    let fence = NatsFence::new(context.clone(), stream.clone(), verifier);
    let (plain_subject, conditional_subject, fenced_subject) = (
        format!("{stream}.plain"),
        format!("{stream}.conditional"),
        format!("{stream}.fenced"),
    );

    let per_round = (publishes / ROUNDS).max(1);
    let (mut plain, mut conditional, mut fenced) = (Vec::new(), Vec::new(), Vec::new());
    let mut last_conditional = 0;
    for _ in 0..ROUNDS {
        for _ in 0..per_round {
            let started = Instant::now();
            context
                .publish(plain_subject.clone(), "x".into())
                .await?
                .await?;
            plain.push(started.elapsed());

            let started = Instant::now();
            let ack = context
                .send_publish(
                    conditional_subject.clone(),
                    PublishMessage::build()
                        .payload("x".into())
                        .expected_last_subject_sequence(last_conditional),
                )
                .await?
                .await?;
            last_conditional = ack.sequence;
            conditional.push(started.elapsed());

            let started = Instant::now();
            fence
                .publish(&fenced_subject, &sequencer, "x".into(), None)
                .await?;
            fenced.push(started.elapsed());
        }
    }
    let report = |name: &str, samples: &mut Vec<Duration>| -> f64 {
        samples.sort_unstable();
        let p50 = samples[samples.len() / 2].as_secs_f64() * 1e3;
        let p99 = samples[samples.len() * 99 / 100].as_secs_f64() * 1e3;
        let mean = samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / samples.len() as f64;
        println!(
            "{name:>12}: p50 {p50:.3} ms, p99 {p99:.3} ms, mean {mean:.3} ms over {} publishes",
            samples.len()
        );
        p50
    };
    let plain_p50 = report("plain", &mut plain);
    let conditional_p50 = report("conditional", &mut conditional);
    let fenced_p50 = report("fenced", &mut fenced);
    println!(
        "fenced / plain at p50: {:.2}x; fenced / conditional: {:.2}x",
        fenced_p50 / plain_p50,
        fenced_p50 / conditional_p50
    );
    context.delete_stream(&stream).await?;
    Ok(())
}
