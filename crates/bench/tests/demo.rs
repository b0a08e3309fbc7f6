//! The demo's scenario, checked on its structured result: a holder paused past its lease
//! overwrites the next holder's update when the resource trusts the lock, and is refused when
//! the resource checks sequencers.

use palisade_bench::demo::{DemoArgs, Outcome, WriteOutcome, play};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_loses_an_update_unfenced_and_is_refused_fenced() {
    // Phase 1: play both runs quietly.
    let report = play(&DemoArgs::default(), false)
        .await
        .expect("the demo runs");
    assert_eq!(report.runs.len(), 2);
    let (unfenced, fenced) = (&report.runs[0], &report.runs[1]);
    assert!(!unfenced.fenced && fenced.fenced);

    // Phase 2: in both runs the lock service ordered the grants: B's token is higher.
    for run in &report.runs {
        assert!(run.token_b > run.token_a, "{run:?}");
        assert_eq!(run.b_write, WriteOutcome::Accepted, "{run:?}");
        assert!(!run.timeline.is_empty());
    }

    // Phase 3: without fencing, A's stale write landed and B's update is gone.
    assert_eq!(unfenced.outcome, Outcome::LostUpdate, "{unfenced:#?}");
    assert_eq!(unfenced.a_stale_write, WriteOutcome::Accepted);
    assert!(
        !unfenced.final_report.iter().any(|l| l.starts_with("B's")),
        "{:?}",
        unfenced.final_report
    );

    // Phase 4: with fencing, A was refused with 409 naming B's token, and B's update survived.
    assert_eq!(fenced.outcome, Outcome::StaleWriteRefused, "{fenced:#?}");
    match &fenced.a_stale_write {
        WriteOutcome::Refused {
            http_status,
            accepted_token,
            ..
        } => {
            assert_eq!(*http_status, 409);
            assert_eq!(*accepted_token, Some(fenced.token_b));
        }
        other => panic!("A's stale write was not refused: {other:?}"),
    }
    assert!(
        fenced.final_report.iter().any(|l| l.starts_with("B's")),
        "{:?}",
        fenced.final_report
    );
    assert!(!fenced.final_report.iter().any(|l| l.starts_with("A's")));
}
