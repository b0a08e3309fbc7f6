//! The shared sequencer vectors (`spec/sequencer/v1`, and `v2` with `pal3`): every case of every
//! file, verified as a resource verifies, with the result the file expects. The Python and Go
//! clients run the same files.

use std::path::Path;

use palisade_core::Access;
use palisade_sequencer::{KeySet, VerifiedSequencer};
use serde_json::Value;

/// Runs every case of every `*.json` file of `spec/sequencer/<version>`; returns how many ran.
fn run_version(version: &str) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../spec/sequencer")
        .join(version);
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    let mut cases = 0;
    for path in paths {
        let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for case in file["cases"].as_array().expect("a file has cases") {
            cases += 1;
            let what = format!("{}: {}", path.display(), case["description"]);
            let result = KeySet::parse(case["keys"].as_str().unwrap())
                .map_err(|_| "malformed")
                .and_then(|keys| {
                    keys.verify(case["sequencer"].as_str().unwrap())
                        .map_err(|e| {
                            if e.is_malformed() {
                                "malformed"
                            } else {
                                "forged"
                            }
                        })
                });
            let expect = &case["expect"];
            match (expect["result"].as_str().unwrap(), result) {
                ("valid", Ok(verified)) => assert_valid(&verified, expect, &what),
                (want, Err(got)) if want == got => {}
                (want, got) => panic!(
                    "{what}: expected {want}, got {:?}",
                    got.map(|v| v.to_string())
                ),
            }
        }
    }
    cases
}

fn assert_valid(verified: &VerifiedSequencer, expect: &Value, what: &str) {
    assert_eq!(verified.lock(), expect["lock"].as_str().unwrap(), "{what}");
    assert_eq!(
        verified.token().get(),
        expect["token"].as_u64().unwrap(),
        "{what}"
    );
    assert_eq!(
        verified.session().get(),
        expect["session"].as_u64().unwrap_or(0),
        "{what}"
    );
    assert_eq!(
        verified.key_id().to_string(),
        expect["key_id"].as_str().unwrap(),
        "{what}"
    );
    // Version 2 also names the access, the slot and the fence binding; v1 cases are exclusive.
    let access = match (expect["access"].as_str(), expect["slot"].as_u64()) {
        (None | Some("exclusive"), None) => Access::Exclusive,
        (Some("shared"), None) => Access::Shared,
        (Some("slot"), Some(slot)) => Access::Slot(u32::try_from(slot).unwrap()),
        other => panic!("{what}: unknown access {other:?}"),
    };
    assert_eq!(verified.access(), access, "{what}");
    let binding = expect["binding"].as_str().unwrap_or(verified.lock());
    assert_eq!(verified.binding(), binding, "{what}");
}

#[test]
fn every_v1_vector_gives_its_expected_result() {
    let cases = run_version("v1");
    assert!(cases >= 20, "only {cases} cases in v1");
}

#[test]
fn every_v2_vector_gives_its_expected_result() {
    let cases = run_version("v2");
    assert!(cases >= 40, "only {cases} cases in v2");
}
