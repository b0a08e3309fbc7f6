//! The shared fence rule vectors (`spec/fence/v1`): every case of every file through
//! [`palisade_fence::check`], with the state or the refusal the file expects. The Python and Go
//! fences run the same files.

use std::path::Path;

use palisade_core::{Access, SessionId, Token};
use palisade_fence::{FenceState, Intent, LockBinding, check};
use palisade_sequencer::{SigningKey, VerifiedSequencer};
use serde_json::Value;

fn state(value: &Value) -> Option<FenceState> {
    if value.is_null() {
        return None;
    }
    Some(FenceState {
        lock: value["lock"].as_str().expect("a lock").to_owned(),
        token_max: Token::new(value["token_max"].as_u64().expect("a token_max")),
        holder_session: SessionId::new(value["holder_session"].as_u64().expect("a holder")),
    })
}

fn presented(value: &Value) -> VerifiedSequencer {
    let key = SigningKey::from_bytes([7; 32]);
    let access = match value["access"].as_str().expect("an access") {
        "exclusive" => Access::Exclusive,
        "shared" => Access::Shared,
        "slot" => Access::Slot(
            u32::try_from(value["slot"].as_u64().expect("a slot")).expect("a slot fits u32"),
        ),
        other => panic!("unknown access {other:?}"),
    };
    let sequencer = key
        .sign_access(
            value["lock"].as_str().expect("a lock"),
            access,
            Token::new(value["token"].as_u64().expect("a token")),
            SessionId::new(value["session"].as_u64().expect("a session")),
        )
        .expect("a case presents a sequencer the service could sign");
    sequencer
        .verify(&key.public_key().into())
        .expect("signed by the trusted key")
}

#[test]
fn every_fence_rule_vector_gives_its_expected_result() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/fence/v1");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    let (mut cases, mut kinds) = (0, std::collections::BTreeSet::new());
    for path in paths {
        let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for case in file["cases"].as_array().expect("a file has cases") {
            cases += 1;
            let what = format!("{}: {}", path.display(), case["description"]);
            let accepted = state(&case["accepted"]);
            let binding = match case["expected_binding"].as_str() {
                Some(expected) => LockBinding::Expect(expected),
                None => LockBinding::BindOnFirstWrite,
            };
            let intent = match case["intent"].as_str().expect("an intent") {
                "read" => Intent::Read,
                "write" => Intent::Write,
                other => panic!("{what}: unknown intent {other:?}"),
            };
            let sequencer = presented(&case["presented"]);
            let result = check(accepted.as_ref(), binding, &sequencer, intent);
            let expect = &case["expect"];
            match (expect["result"].as_str().expect("a result"), result) {
                ("accepted", Ok(next)) => {
                    assert_eq!(Some(next), state(&expect["state"]), "{what}");
                }
                ("refused", Err(refusal)) => {
                    let kind = expect["kind"].as_str().expect("a kind");
                    assert_eq!(refusal.kind(), kind, "{what}: {refusal}");
                    assert!(refusal.is_rejection() && refusal.is_final(), "{what}");
                    kinds.insert(kind.to_owned());
                }
                (want, got) => panic!("{what}: expected {want}, got {got:?}"),
            }
        }
    }
    assert!(cases >= 40, "only {cases} cases in {}", dir.display());
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["shared_write", "stale", "token_reissued", "wrong_lock"],
        "every refusal kind has a case"
    );
}
