//! `palisade store serve` against clients that do not play fair (issue #14): key squatting by
//! the holder of another lock (bindings set by the operator), idle and slow connections past
//! the connection cap, a slowloris header, and huge bodies that never arrive. Every test runs
//! a real store process.

use std::path::Path;
use std::time::Duration;

use palisade_store::{StoreClient, StoreError};
use palisade_testkit::{ServerProcess, ServiceKey};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// A store process trusting `service`, with these extra flags.
fn store(service: &ServiceKey, dir: &Path, flags: &[&str]) -> ServerProcess {
    let key = service.key.public_key().to_string();
    let mut store = ServerProcess::store(BIN, dir.join("store-data"), &key);
    for flag in flags {
        store = store.arg(*flag);
    }
    store.start();
    store
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fenced put of `key` under `sequencer`.
fn put(store: &ServerProcess, key: &str, sequencer: &str) -> Result<(), StoreError> {
    let client = StoreClient::new(&store.endpoint()).unwrap();
    runtime()
        .block_on(client.put(key, b"value", Some(sequencer), None))
        .map(|_| ())
}

#[test]
fn a_holder_of_another_lock_cannot_take_a_key_the_bindings_give_to_a_lock() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let squatter = service.grant("x", 5, 1);
    let owner = service.grant("jobs/nightly", 6, 2);

    // Without bindings the first writer binds the key: the holder of `x` takes `report`.
    let mut unbound = store(&service, dir.path(), &[]);
    put(&unbound, "report", &squatter).expect("first writer binds the key");
    let error = put(&unbound, "report", &owner).unwrap_err();
    assert_eq!(error.kind(), "wrong_lock", "{error}");
    unbound.terminate();

    // The operator gives `report` to `jobs/nightly`: the squatter's binding no longer counts.
    let bound = store(
        &service,
        dir.path(),
        &["--bind", "report=jobs/nightly", "--bind", "shared/=x"],
    );
    let error = put(&bound, "report", &squatter).unwrap_err();
    match &error {
        StoreError::WrongLock {
            expected,
            presented,
            ..
        } => {
            assert_eq!(expected, "jobs/nightly");
            assert_eq!(presented, "x");
        }
        other => panic!("expected wrong_lock, got {other}"),
    }
    put(&bound, "report", &owner).expect("the bound lock writes its key");
    put(&bound, "shared/a", &squatter).expect("x writes what the bindings give it");

    // Default-deny: a key no binding covers is nobody's.
    let error = put(&bound, "elsewhere", &owner).unwrap_err();
    assert_eq!(error.kind(), "unbound", "{error}");
    assert!(
        error.to_string().contains("not bound to any lock"),
        "{error}"
    );
}

#[test]
fn a_bindings_file_is_read_and_bad_bindings_stop_the_store_with_the_reason() {
    let service = ServiceKey::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bindings");
    std::fs::write(
        &file,
        "# reports belong to the nightly job\nreports/=jobs/nightly\n",
    )
    .unwrap();
    let bound = store(
        &service,
        dir.path(),
        &["--bindings-file", file.to_str().unwrap()],
    );
    put(
        &bound,
        "reports/today",
        &service.grant("jobs/nightly", 3, 1),
    )
    .unwrap();
    let error = put(&bound, "reports/today", &service.grant("x", 4, 2)).unwrap_err();
    assert_eq!(error.kind(), "wrong_lock", "{error}");
    drop(bound);

    std::fs::write(&file, "reports/=jobs/nightly\nno equals sign\n").unwrap();
    let key = service.key.public_key().to_string();
    let mut command = palisade_testkit::command(BIN);
    command.args([
        "store",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--public-key",
        &key,
        "--data-dir",
        dir.path().join("other").to_str().unwrap(),
        "--bindings-file",
        file.to_str().unwrap(),
    ]);
    let ran = palisade_testkit::run(command);
    assert!(!ran.status.success());
    assert!(ran.stderr.contains("line 2"), "{}", ran.stderr);
}
