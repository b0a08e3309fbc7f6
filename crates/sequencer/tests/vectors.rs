//! The shared sequencer vectors (`spec/sequencer/v1`): every case of every file, verified as a
//! resource verifies, with the result the file expects. The Python and Go clients run the same
//! files.

use std::path::Path;

use palisade_sequencer::KeySet;
use serde_json::Value;

#[test]
fn every_shared_vector_gives_its_expected_result() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../spec/sequencer/v1");
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
                ("valid", Ok(verified)) => {
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
                }
                (want, Err(got)) if want == got => {}
                (want, got) => panic!(
                    "{what}: expected {want}, got {:?}",
                    got.map(|v| v.to_string())
                ),
            }
        }
    }
    assert!(cases >= 20, "only {cases} cases in {}", dir.display());
}
