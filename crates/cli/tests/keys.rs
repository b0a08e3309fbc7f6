//! Key rotation as operators do it: `palisade keys add`, give resources the new
//! `palisade pubkey`, `palisade keys rotate`, and `palisade keys retire` once the old key's
//! holders are gone, with a fenced store that reads its keys from a file on SIGHUP. Every step
//! is checked where a user would look: the sequencers' key ids, the store's answers, the keys
//! the service publishes, across a failover and on a member added after the rotation.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use palisade_testkit::{LocalCluster, Palisade, Ran, ServerProcess, wait_until};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade acquire` printed as `KEY=VALUE` lines.
fn grant(ran: &Ran) -> BTreeMap<String, String> {
    ran.key_values()
}

/// The key id a sequencer names: its second field.
fn key_id_of(sequencer: &str) -> String {
    sequencer
        .split('.')
        .nth(1)
        .expect("a key id field")
        .to_string()
}

fn store_put(store: &str, sequencer: &str, key: &str, value: &str) -> Ran {
    palisade_testkit::store_put(BIN, store, sequencer, key, value)
}

/// `palisade keys list --json` as `(key_id, signing)` pairs, oldest first.
fn keys(cluster: &LocalCluster, endpoints: &str) -> Vec<(String, bool)> {
    let ran = cluster.palisade(endpoints, &["keys", "list", "--json"]);
    ran.expect_success();
    ran.json()
        .as_array()
        .expect("an array")
        .iter()
        .map(|k| {
            (
                k["key_id"].as_str().expect("key_id").to_string(),
                k["signing"].as_bool().expect("signing"),
            )
        })
        .collect()
}

/// Writes what `palisade pubkey` prints now into the store's key file and tells the store.
fn publish_to_store(
    cluster: &LocalCluster,
    endpoints: &str,
    key_file: &Path,
    store: &ServerProcess,
) {
    let ran = cluster.palisade(endpoints, &["pubkey"]);
    ran.expect_success();
    std::fs::write(key_file, format!("# from palisade pubkey\n{}", ran.stdout)).unwrap();
    store.hangup();
}

#[test]
fn a_rotation_keeps_the_store_verifying_across_a_failover_and_retires_the_old_key() {
    let mut cluster = LocalCluster::start(BIN, 3);
    let endpoints = cluster.endpoints();
    let key_file = cluster.dir().join("palisade.keys");
    let first = cluster.palisade(&endpoints, &["pubkey"]);
    first.expect_success();
    assert!(
        !first.stdout.trim().contains(','),
        "one key before any rotation: {}",
        first.stdout
    );
    std::fs::write(&key_file, &first.stdout).unwrap();
    let mut store = ServerProcess::store_with_key_file(BIN, cluster.dir().join("store"), &key_file);
    store.start();
    let store_url = store.endpoint();

    // A grant of the founding key, written with; and one never written with, kept for the end.
    let before = grant(&cluster.palisade(&endpoints, &["acquire", "doc", "--ttl", "30s"]));
    let founding = key_id_of(&before["PALISADE_SEQUENCER"]);
    store_put(&store_url, &before["PALISADE_SEQUENCER"], "doc", "v1").expect_success();
    let unused_old = grant(&cluster.palisade(&endpoints, &["acquire", "spare", "--ttl", "30s"]));
    cluster
        .palisade(
            &endpoints,
            &[
                "release",
                "spare",
                "--session",
                &unused_old["PALISADE_SESSION"],
            ],
        )
        .expect_success();
    assert_eq!(keys(&cluster, &endpoints), vec![(founding.clone(), true)]);

    // 1. Publish a new key: nothing signs with it yet.
    let added = cluster.palisade(&endpoints, &["keys", "add"]);
    added.expect_success();
    let listed = keys(&cluster, &endpoints);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0], (founding.clone(), true));
    let (new_key, new_signing) = listed[1].clone();
    assert!(!new_signing);
    assert!(added.stdout.contains(&new_key), "{}", added.stdout);
    let published = cluster.palisade(&endpoints, &["pubkey"]);
    assert_eq!(
        published.stdout.trim().split(',').count(),
        2,
        "{}",
        published.stdout
    );

    // 2. Rotate before the store knows the new key: the store refuses its sequencers, saying
    //    which key it does not trust, and nothing is written.
    cluster
        .palisade(
            &endpoints,
            &["release", "doc", "--session", &before["PALISADE_SESSION"]],
        )
        .expect_success();
    let rotated = cluster.palisade(&endpoints, &["keys", "rotate"]);
    rotated.expect_success();
    assert!(rotated.stdout.contains(&new_key), "{}", rotated.stdout);
    let after = grant(&cluster.palisade(&endpoints, &["acquire", "doc", "--ttl", "30s"]));
    assert_eq!(
        key_id_of(&after["PALISADE_SEQUENCER"]),
        new_key,
        "the new key signs"
    );
    let refused = store_put(&store_url, &after["PALISADE_SEQUENCER"], "doc", "v2");
    assert_ne!(refused.code(), Some(0), "{refused:?}");
    assert!(
        refused.stderr.contains(&new_key) && refused.stderr.contains("does not trust"),
        "{}",
        refused.stderr
    );

    // 3. The store takes the published set on SIGHUP: the new key's grant writes, and the old
    //    key's grant, still trusted, is refused only because it is stale.
    publish_to_store(&cluster, &endpoints, &key_file, &store);
    wait_until(
        "the store trusts the new key",
        Duration::from_secs(10),
        || store_put(&store_url, &after["PALISADE_SEQUENCER"], "doc", "v2").code() == Some(0),
    );
    let stale = store_put(&store_url, &before["PALISADE_SEQUENCER"], "doc", "late");
    assert!(stale.stderr.contains("stale"), "{}", stale.stderr);
    cluster
        .palisade(
            &endpoints,
            &["release", "doc", "--session", &after["PALISADE_SESSION"]],
        )
        .expect_success();

    // 4. A new leader signs with the rotated key too.
    let leader = cluster.leader();
    cluster.node(leader).process.kill9();
    let failed_over = grant(&cluster.palisade(&endpoints, &["acquire", "doc", "--ttl", "30s"]));
    assert_eq!(key_id_of(&failed_over["PALISADE_SEQUENCER"]), new_key);
    store_put(&store_url, &failed_over["PALISADE_SEQUENCER"], "doc", "v3").expect_success();
    cluster.node(leader).process.start();

    // 5. Retire the founding key: it is no longer published, and once the store drops it a
    //    sequencer of that key is refused even where no newer grant was ever seen.
    let signing_retire = cluster.palisade(&endpoints, &["keys", "retire", &new_key]);
    assert_eq!(signing_retire.code(), Some(1), "{signing_retire:?}");
    assert!(
        signing_retire.stderr.contains("signs"),
        "{}",
        signing_retire.stderr
    );
    cluster
        .palisade(&endpoints, &["keys", "retire", &founding])
        .expect_success();
    assert_eq!(keys(&cluster, &endpoints), vec![(new_key.clone(), true)]);
    publish_to_store(&cluster, &endpoints, &key_file, &store);
    wait_until(
        "the store stops trusting the old key",
        Duration::from_secs(10),
        || {
            let ran = store_put(&store_url, &unused_old["PALISADE_SEQUENCER"], "spare", "x");
            ran.code() != Some(0)
                && ran.stderr.contains(&founding)
                && ran.stderr.contains("does not trust")
        },
    );
    // The store never took the spare write.
    let mut get = palisade_testkit::command(BIN);
    get.args(["store", "get", "spare"])
        .env("PALISADE_STORE", &store_url);
    let got = palisade_testkit::run(get);
    assert_ne!(got.code(), Some(0), "{got:?}");
}

#[test]
fn key_commands_refuse_what_would_break_verification_and_change_nothing() {
    let mut palisade = Palisade::start(BIN);
    let founding = palisade.run_ok(&["pubkey"]).trim().to_string();

    // Nothing to rotate to until a key is published; retiring the signing key is refused.
    let rotate = palisade.run(&["keys", "rotate"]);
    assert_eq!(rotate.code(), Some(1), "{rotate:?}");
    assert!(rotate.stderr.contains("keys add"), "{}", rotate.stderr);
    let list = palisade.run_json(&["keys", "list"]);
    let founding_id = list[0]["key_id"].as_str().unwrap().to_string();
    let retire = palisade.run(&["keys", "retire", &founding_id]);
    assert_eq!(retire.code(), Some(1), "{retire:?}");
    // Malformed and unknown key ids.
    let malformed = palisade.run(&["keys", "retire", "not-a-key"]);
    assert_eq!(malformed.code(), Some(2), "{malformed:?}");
    let unknown = palisade.run(&["keys", "rotate", "0123456789abcdef"]);
    assert_eq!(unknown.code(), Some(1), "{unknown:?}");
    assert!(
        unknown.stderr.contains("not published"),
        "{}",
        unknown.stderr
    );
    assert_eq!(
        palisade.run_ok(&["pubkey"]).trim(),
        founding,
        "nothing changed"
    );

    // After a rotation, the keys survive a restart, and `pubkey --json` marks the signer.
    palisade.run_ok(&["keys", "add"]);
    palisade.run_ok(&["keys", "rotate"]);
    palisade.locks.kill9();
    // The log now carries a secret key: only its owner may read it.
    let wal = palisade.locks.data_dir().join("raft.wal");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&wal).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", wal.display());
    palisade.locks.start();
    let json = palisade.run_json(&["pubkey"]);
    let keys = json["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0]["public_key"], founding);
    assert_eq!(keys[0]["signing"], false);
    assert_eq!(keys[1]["signing"], true);
    assert_eq!(json["public_key"], keys[1]["public_key"]);
    let granted = grant(&palisade.run(&["acquire", "jobs/a", "--ttl", "10s"]));
    assert_eq!(
        key_id_of(&granted["PALISADE_SEQUENCER"]),
        keys[1]["key_id"].as_str().unwrap(),
        "the rotated key signs after a restart"
    );
}

/// 64 lowercase hex digits of the SHA-256 of `bytes`.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[test]
fn pubkey_shows_each_keys_fingerprint_to_compare_out_of_band_and_keeps_its_output_for_scripts() {
    let palisade = Palisade::start(BIN);

    // Standard output stays one line a resource's `--public-key` takes as it is.
    let ran = palisade.run(&["pubkey"]);
    ran.expect_success();
    let public_key = ran.stdout.trim().to_string();
    assert_eq!(ran.stdout.lines().count(), 1, "{:?}", ran.stdout);
    let hex = public_key
        .strip_prefix("ed25519:")
        .unwrap_or_else(|| panic!("{public_key:?}"));

    // Standard error names the key by id and SHA-256 fingerprint, which an operator computes
    // alike from the key's bytes on a trusted host.
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let fingerprint = format!("SHA256:{}", sha256_hex(&bytes));
    let key_id = palisade.run_json(&["keys", "list"])[0]["key_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        ran.stderr.trim(),
        format!("key {key_id} fingerprint {fingerprint} (signing)"),
        "{}",
        ran.stderr
    );
    assert!(
        fingerprint[7..].starts_with(&key_id),
        "the id is the fingerprint's start"
    );

    // `--json` carries it too.
    let json = palisade.run_json(&["pubkey"]);
    assert_eq!(json["keys"][0]["fingerprint"], fingerprint.as_str());
}

/// A resource that trusted a key it should not have (another cluster's, pasted by mistake;
/// or a leaked one) accepted a huge token, and refuses every honest holder since. The
/// recovery: drop the key from the resource's set, and raise the cluster's token floor above
/// the token it accepted. Honest holders write again; the wrong key's sequencers are refused.
#[test]
fn a_huge_token_from_a_wrong_key_is_recovered_from_by_retiring_the_key_and_raising_the_floor() {
    let mut ours = LocalCluster::start(BIN, 1);
    let ours_endpoints = ours.endpoints();
    let mut other = LocalCluster::start(BIN, 1);
    let other_endpoints = other.endpoints();
    let our_key = ours.palisade(&ours_endpoints, &["pubkey"]);
    our_key.expect_success();
    let wrong_key = other.palisade(&other_endpoints, &["pubkey"]);
    wrong_key.expect_success();

    // The store trusts both: the wrong line was pasted beside ours.
    let key_file = ours.dir().join("palisade.keys");
    std::fs::write(&key_file, format!("{}{}", our_key.stdout, wrong_key.stdout)).unwrap();
    let mut store = ServerProcess::store_with_key_file(BIN, ours.dir().join("store"), &key_file);
    store.start();
    let store_url = store.endpoint();

    // The other cluster's counter is far ahead (here raised on purpose), and its holder writes.
    let huge: u64 = 1 << 40;
    other
        .palisade(
            &other_endpoints,
            &["cluster", "raise-token-floor", &huge.to_string()],
        )
        .expect_success();
    let intruder = grant(&other.palisade(&other_endpoints, &["acquire", "doc", "--ttl", "30s"]));
    let intruder_token: u64 = intruder["PALISADE_TOKEN"].parse().unwrap();
    assert!(intruder_token > huge, "{intruder:?}");
    store_put(&store_url, &intruder["PALISADE_SEQUENCER"], "doc", "wrong").expect_success();

    // Every honest holder is now refused as stale.
    let honest = grant(&ours.palisade(&ours_endpoints, &["acquire", "doc", "--ttl", "30s"]));
    let refused = store_put(&store_url, &honest["PALISADE_SEQUENCER"], "doc", "right");
    assert_ne!(refused.code(), Some(0), "{refused:?}");
    ours.palisade(
        &ours_endpoints,
        &["release", "doc", "--session", &honest["PALISADE_SESSION"]],
    )
    .expect_success();

    // The recovery. 1: the resource drops the wrong key.
    std::fs::write(&key_file, &our_key.stdout).unwrap();
    store.hangup();
    wait_until(
        "the store drops the wrong key",
        Duration::from_secs(10),
        || {
            let again = store_put(&store_url, &intruder["PALISADE_SEQUENCER"], "doc", "wrong");
            again.code() != Some(0) && again.stderr.contains("does not trust")
        },
    );
    // 2: the cluster's counter goes above the token the resource accepted.
    let raised = ours.palisade(
        &ours_endpoints,
        &["cluster", "raise-token-floor", &intruder_token.to_string()],
    );
    raised.expect_success();
    assert!(
        raised.stdout.contains(&intruder_token.to_string()),
        "{}",
        raised.stdout
    );
    let recovered = grant(&ours.palisade(&ours_endpoints, &["acquire", "doc", "--ttl", "30s"]));
    let token: u64 = recovered["PALISADE_TOKEN"].parse().unwrap();
    assert!(token > intruder_token, "{recovered:?}");
    store_put(&store_url, &recovered["PALISADE_SEQUENCER"], "doc", "right").expect_success();

    // A floor past the largest token is refused, and changes nothing.
    let past = ours.palisade(
        &ours_endpoints,
        &["cluster", "raise-token-floor", &u64::MAX.to_string()],
    );
    assert_eq!(past.code(), Some(2), "{past:?}");
}
