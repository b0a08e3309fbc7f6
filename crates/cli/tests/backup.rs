//! Backing up a running cluster and restoring it after losing every node: the restored cluster
//! grants tokens above everything the lost one granted, even after the backup, so a fenced
//! store configured once accepts its holders' writes and refuses every holder of before.

use std::collections::BTreeMap;

use palisade_testkit::{LocalCluster, Ran, ServerProcess, run};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade acquire` printed as `KEY=VALUE` lines.
fn grant(ran: &Ran) -> BTreeMap<String, String> {
    ran.key_values()
}

fn token(grant: &BTreeMap<String, String>) -> u64 {
    grant["PALISADE_TOKEN"].parse().expect("a token")
}

fn palisade(endpoint: &str, args: &[&str]) -> Ran {
    let mut command = palisade_testkit::command(BIN);
    command.env("PALISADE_ENDPOINT", endpoint).args(args);
    run(command)
}

fn store_put(store: &str, sequencer: &str, key: &str, value: &str) -> Ran {
    palisade_testkit::store_put(BIN, store, sequencer, key, value)
}

#[test]
fn a_cluster_restored_from_a_backup_never_reissues_a_token_the_lost_one_granted() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    let keys = palisade(&endpoints, &["pubkey"]);
    keys.expect_success();
    let mut store = ServerProcess::store(BIN, cluster.dir().join("store"), keys.stdout.trim());
    store.start();
    let store_url = store.endpoint();

    // Before the backup: a holder of "doc" that wrote, and a holder of "other".
    let first = grant(&palisade(&endpoints, &["acquire", "doc", "--ttl", "60s"]));
    store_put(&store_url, &first["PALISADE_SEQUENCER"], "doc", "v1").expect_success();
    grant(&palisade(&endpoints, &["acquire", "other", "--ttl", "60s"]));

    let file = cluster.dir().join("backups").join("palisade.backup");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    // A backup holds the signing key: without a policy it still takes the admin token, which
    // only who can read a member's data directory holds.
    let anonymous = palisade(&endpoints, &["cluster", "backup", file.to_str().unwrap()]);
    assert_eq!(anonymous.code(), Some(1), "{anonymous:?}");
    assert!(
        anonymous.stderr.contains("admin.token"),
        "the refusal says what to pass: {}",
        anonymous.stderr
    );
    assert!(!file.exists(), "an anonymous caller got a backup");
    let admin_token = cluster.admin_token_file();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&admin_token).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "{}", admin_token.display());
    let backed_up = palisade(
        &endpoints,
        &[
            "--token-file",
            admin_token.to_str().unwrap(),
            "cluster",
            "backup",
            file.to_str().unwrap(),
        ],
    );
    backed_up.expect_success();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the backup holds the signing keys");

    // After the backup, the cluster goes on: newer grants, and the store sees their tokens.
    palisade(
        &endpoints,
        &["release", "doc", "--session", &first["PALISADE_SESSION"]],
    )
    .expect_success();
    let mut latest = first.clone();
    for round in 0..5 {
        let next = grant(&palisade(&endpoints, &["acquire", "doc", "--ttl", "60s"]));
        assert!(token(&next) > token(&latest));
        store_put(
            &store_url,
            &next["PALISADE_SEQUENCER"],
            "doc",
            &format!("after-{round}"),
        )
        .expect_success();
        palisade(
            &endpoints,
            &["release", "doc", "--session", &next["PALISADE_SESSION"]],
        )
        .expect_success();
        latest = next;
    }

    // Every node is lost.
    let ids: Vec<u64> = cluster.nodes.keys().copied().collect();
    for id in ids {
        cluster.node(id).process.kill9();
    }

    // A restore refuses a directory that is not empty, and a file that is not a backup.
    let restored_dir = cluster.dir().join("restored");
    std::fs::create_dir_all(&restored_dir).unwrap();
    std::fs::write(restored_dir.join("keep-me"), "x").unwrap();
    let refused = palisade(
        &endpoints,
        &[
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            restored_dir.to_str().unwrap(),
        ],
    );
    assert_eq!(refused.code(), Some(1), "{refused:?}");
    assert!(refused.stderr.contains("not empty"), "{}", refused.stderr);
    assert_eq!(
        std::fs::read_dir(&restored_dir).unwrap().count(),
        1,
        "nothing was written"
    );
    std::fs::remove_file(restored_dir.join("keep-me")).unwrap();
    let garbage = cluster.dir().join("garbage");
    std::fs::write(&garbage, "{}").unwrap();
    let refused = palisade(
        &endpoints,
        &[
            "restore",
            garbage.to_str().unwrap(),
            "--data-dir",
            restored_dir.to_str().unwrap(),
        ],
    );
    assert_eq!(refused.code(), Some(1), "{refused:?}");
    assert!(
        refused.stderr.contains("not a palisade backup"),
        "{}",
        refused.stderr
    );

    let restored = palisade(
        &endpoints,
        &[
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            restored_dir.to_str().unwrap(),
        ],
    );
    restored.expect_success();
    assert!(
        restored.stdout.contains("2 sessions"),
        "{}",
        restored.stdout
    );

    // The restored directory serves as a new one-member cluster with the same keys.
    let mut node = ServerProcess::lock_service(BIN, &restored_dir);
    node.start();
    let endpoint = node.endpoint();
    let same_keys = palisade(&endpoint, &["pubkey"]);
    assert_eq!(same_keys.stdout, keys.stdout, "resources need no new key");
    let status = palisade(&endpoint, &["status", "doc", "--json"]);
    status.expect_success();
    assert!(
        status.json()["holder"].is_null(),
        "no holder of before: {}",
        status.stdout
    );

    // Its first grant is above every token the lost cluster granted, after the backup too: the
    // store, untouched, accepts it, and refuses the holders of before.
    let restored_grant = grant(&palisade(&endpoint, &["acquire", "doc", "--ttl", "60s"]));
    assert!(
        token(&restored_grant) > token(&latest),
        "restored token {} is not above {} granted after the backup",
        token(&restored_grant),
        token(&latest)
    );
    store_put(
        &store_url,
        &restored_grant["PALISADE_SEQUENCER"],
        "doc",
        "restored",
    )
    .expect_success();
    for old in [&first, &latest] {
        let stale = store_put(&store_url, &old["PALISADE_SEQUENCER"], "doc", "late");
        assert_ne!(stale.code(), Some(0), "{stale:?}");
        assert!(stale.stderr.contains("stale"), "{}", stale.stderr);
    }
    // A session of before does not exist in the restored cluster.
    let renew = palisade(
        &endpoint,
        &["renew", "--session", &first["PALISADE_SESSION"]],
    );
    assert_ne!(renew.code(), Some(0), "{renew:?}");
}
