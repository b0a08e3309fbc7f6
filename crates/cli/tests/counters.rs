//! Invariant 13, no sequencer is ever issued twice, with real processes: whatever an operator
//! deletes, puts back, restores or a crash cuts, the node either refuses to start (and, after
//! the recovery command it names, issues only tokens and session ids above every earlier one)
//! or issues only tokens above every earlier one. Every sequencer string any grant printed is
//! kept, and none may come twice.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use palisade_testkit::{Ran, ServerProcess, run};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// `palisade ARGS` as the operator on `node`'s host runs an admin command: with the admin token
/// the node keeps in its data directory.
fn admin(node: &ServerProcess, args: &[&str]) -> Ran {
    let mut command = palisade_testkit::command(BIN);
    command
        .env("PALISADE_ENDPOINT", node.endpoint())
        .env(
            "PALISADE_AUTH_TOKEN_FILE",
            node.data_dir().join("admin.token"),
        )
        .args(args);
    run(command)
}

fn palisade(endpoint: &str, args: &[&str]) -> Ran {
    let mut command = palisade_testkit::command(BIN);
    command.env("PALISADE_ENDPOINT", endpoint).args(args);
    run(command)
}

/// One grant as `palisade acquire` printed it.
#[derive(Debug, Clone)]
struct Grant {
    token: u64,
    session: u64,
    credential: String,
    sequencer: String,
}

/// Every grant issued so far, across every incarnation of the node.
#[derive(Debug, Default)]
struct Issued {
    grants: Vec<Grant>,
    sequencers: BTreeSet<String>,
}

impl Issued {
    /// Acquires `lock` in a new session and checks the grant against every earlier one: its
    /// token above every token, its session id above every session id (when `sessions_too`),
    /// its sequencer never seen before.
    fn acquire(&mut self, endpoint: &str, lock: &str, sessions_too: bool) -> Grant {
        let ran = palisade(endpoint, &["acquire", lock, "--ttl", "60s"]);
        ran.expect_success();
        let values = ran.key_values();
        let credential = values["PALISADE_SESSION"].clone();
        let grant = Grant {
            token: values["PALISADE_TOKEN"].parse().expect("a token"),
            session: credential
                .split_once('.')
                .expect("<id>.<secret>")
                .0
                .parse()
                .expect("a session id"),
            credential,
            sequencer: values["PALISADE_SEQUENCER"].clone(),
        };
        for earlier in &self.grants {
            assert!(
                grant.token > earlier.token,
                "token {} was issued after token {} (session {}): a resource refuses it, or \
                 accepts it from two holders if equal",
                grant.token,
                earlier.token,
                earlier.session
            );
            if sessions_too {
                assert!(
                    grant.session > earlier.session,
                    "session id {} was issued after session id {}",
                    grant.session,
                    earlier.session
                );
            }
        }
        assert!(
            self.sequencers.insert(grant.sequencer.clone()),
            "the sequencer {} was issued twice",
            grant.sequencer
        );
        self.grants.push(grant.clone());
        grant
    }

    fn release(endpoint: &str, lock: &str, grant: &Grant) {
        palisade(endpoint, &["release", lock, "--session", &grant.credential]).expect_success();
    }

    /// `rounds` grants of `lock`, each released after it.
    fn rounds(&mut self, endpoint: &str, lock: &str, rounds: usize) {
        for _ in 0..rounds {
            let grant = self.acquire(endpoint, lock, true);
            Issued::release(endpoint, lock, &grant);
        }
    }
}

/// Starts `node`, expecting the start to be refused; returns what the node printed.
fn refused_start(node: &mut ServerProcess) -> String {
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node.start()));
    if started.is_ok() {
        let log = node.log();
        node.kill9();
        panic!("the node started, and would issue tokens and session ids again; its log:\n{log}");
    }
    node.log()
}

fn recover_counters(dir: &Path) -> Ran {
    let mut command = palisade_testkit::command(BIN);
    command.args(["recover-counters", "--data-dir"]).arg(dir);
    run(command)
}

/// The refusal names the recovery command; after it, the node starts.
fn recover_and_start(node: &mut ServerProcess, dir: &Path) {
    let refusal = refused_start(node);
    assert!(
        refusal.contains("palisade recover-counters --data-dir"),
        "the refusal does not name the recovery command:\n{refusal}"
    );
    let recovered = recover_counters(dir);
    recovered.expect_success();
    assert!(
        recovered.stdout.contains("tokens will continue above"),
        "{}",
        recovered.stdout
    );
    node.start();
}

fn remove_log(dir: &Path) {
    for name in ["raft.wal", "snapshot.bin", "snapshot.json"] {
        match std::fs::remove_file(dir.join(name)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => panic!("{name}: {e}"),
            _ => {}
        }
    }
}

/// A lock service started on `parent/data`: its data directory and its process.
fn started_in(parent: &Path) -> (PathBuf, ServerProcess) {
    let dir = parent.join("data");
    let mut node = ServerProcess::lock_service(BIN, &dir);
    node.start();
    (dir, node)
}

/// `palisade cluster backup` of `node` into `parent/palisade.backup`.
fn backed_up(node: &ServerProcess, parent: &Path) -> PathBuf {
    let backup = parent.join("palisade.backup");
    admin(node, &["cluster", "backup", backup.to_str().unwrap()]).expect_success();
    backup
}

/// `palisade restore BACKUP` into `parent/restored`, and a lock service started on it.
fn restored_in(parent: &Path, backup: &Path) -> (PathBuf, ServerProcess) {
    let dir = parent.join("restored");
    let mut command = palisade_testkit::command(BIN);
    command
        .args(["restore", backup.to_str().unwrap(), "--data-dir"])
        .arg(&dir);
    run(command).expect_success();
    let mut node = ServerProcess::lock_service(BIN, &dir);
    node.start();
    (dir, node)
}

/// N3: the log deleted, the signing key kept. Before, the node started as new and issued
/// `token 1, session 1` again: the first grant's sequencer, byte for byte.
#[test]
fn a_deleted_log_beside_its_key_stops_the_start_until_the_counters_are_recovered() {
    let parent = tempfile::tempdir().unwrap();
    let (dir, mut node) = started_in(parent.path());
    let mut issued = Issued::default();
    issued.rounds(&node.endpoint(), "doc", 3);
    node.terminate();

    remove_log(&dir);
    recover_and_start(&mut node, &dir);
    issued.rounds(&node.endpoint(), "doc", 2);

    // A stop and start after the recovery is an ordinary restart.
    node.terminate();
    node.start();
    issued.rounds(&node.endpoint(), "doc", 1);
}

/// A data directory from before counter marks (here: its mark removed) is an upgrade: it
/// starts, and has a mark again, which then catches the loss of its log.
#[test]
fn a_directory_from_before_marks_starts_and_gets_one_that_then_catches_a_lost_log() {
    let parent = tempfile::tempdir().unwrap();
    let (dir, mut node) = started_in(parent.path());
    let mut issued = Issued::default();
    issued.rounds(&node.endpoint(), "doc", 2);
    node.terminate();

    std::fs::remove_file(dir.join("counters-mark.json")).unwrap();
    node.start();
    issued.rounds(&node.endpoint(), "doc", 1);
    node.terminate();
    assert!(dir.join("counters-mark.json").exists());

    remove_log(&dir);
    recover_and_start(&mut node, &dir);
    issued.rounds(&node.endpoint(), "doc", 1);
}

/// N3: an older copy of the log put back (a filesystem snapshot of the log alone, a "repair"),
/// after the node went on granting. Before, the node replayed the old log and issued the
/// tokens and session ids granted since again.
#[test]
fn an_older_log_put_back_stops_the_start_until_the_counters_are_recovered() {
    let parent = tempfile::tempdir().unwrap();
    let saved = parent.path().join("saved");
    std::fs::create_dir(&saved).unwrap();
    let (dir, mut node) = started_in(parent.path());
    let mut issued = Issued::default();
    issued.rounds(&node.endpoint(), "doc", 2);
    node.terminate();
    std::fs::copy(dir.join("raft.wal"), saved.join("raft.wal")).unwrap();

    node.start();
    issued.rounds(&node.endpoint(), "doc", 3);
    node.terminate();

    remove_log(&dir);
    std::fs::copy(saved.join("raft.wal"), dir.join("raft.wal")).unwrap();
    recover_and_start(&mut node, &dir);
    issued.rounds(&node.endpoint(), "doc", 2);
}

/// N2: after `raise-token-floor` (the documented recovery from a planted huge token) a restore
/// from a backup placed its counter at the time floor, below the raised counter, and copied the
/// session counter: the restored cluster issued the grants made after the backup again, the
/// same sequencers byte for byte, and a fenced store took writes from both holders.
#[test]
fn a_restore_after_a_raised_floor_issues_only_tokens_and_sessions_above_every_earlier_one() {
    let parent = tempfile::tempdir().unwrap();
    let (_, mut node) = started_in(parent.path());
    let endpoint = node.endpoint();
    let mut issued = Issued::default();
    issued.rounds(&endpoint, "doc", 1);
    let huge: u64 = 1 << 60;
    admin(
        &node,
        &["cluster", "raise-token-floor", &huge.to_string(), "--force"],
    )
    .expect_success();
    issued.rounds(&endpoint, "doc", 1);

    let backup = backed_up(&node, parent.path());
    // The cluster goes on after the backup: these are the grants a restore must not repeat.
    issued.rounds(&endpoint, "doc", 3);
    node.kill9();

    let (_, restored_node) = restored_in(parent.path(), &backup);
    issued.rounds(&restored_node.endpoint(), "doc", 3);
}

/// A backup taken *before* a raise knows nothing of it. The largest raise allowed without
/// `--force` lies 2^40 above the counter and the time floor: before, a restore of the older
/// backup within six days of the raise (2^40 tokens at 2^21 a second) placed the counter below
/// the raised one, and issued again the tokens granted after the raise.
#[test]
fn a_restore_of_a_backup_from_before_an_unforced_raise_issues_only_tokens_above_the_raise() {
    let parent = tempfile::tempdir().unwrap();
    let (_, mut node) = started_in(parent.path());
    let endpoint = node.endpoint();
    let mut issued = Issued::default();
    issued.rounds(&endpoint, "doc", 1);
    let backup = backed_up(&node, parent.path());

    // The time floor of a few seconds from now, plus 2^40: within what needs no `--force`.
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let raised = palisade_core::limits::restore_token_floor(now_s).get()
        + palisade_core::limits::TOKEN_FLOOR_JUMP_MAX;
    admin(
        &node,
        &["cluster", "raise-token-floor", &raised.to_string()],
    )
    .expect_success();
    // The grants a restore must not repeat.
    issued.rounds(&endpoint, "doc", 3);
    node.kill9();

    let (_, restored_node) = restored_in(parent.path(), &backup);
    issued.rounds(&restored_node.endpoint(), "doc", 3);
}

/// A restored directory's snapshot is the base its log starts from; with the snapshot lost the
/// log still reaches the mark's entry, but replays to counters far below it. The node does not
/// take over (the start fails, naming the recovery) rather than grant from there.
#[test]
fn a_lost_snapshot_under_a_log_that_starts_after_it_stops_the_takeover_until_recovered() {
    let parent = tempfile::tempdir().unwrap();
    let (_, mut node) = started_in(parent.path());
    let mut issued = Issued::default();
    issued.rounds(&node.endpoint(), "doc", 2);
    let backup = backed_up(&node, parent.path());
    node.kill9();

    let (restored_dir, mut restored) = restored_in(parent.path(), &backup);
    issued.rounds(&restored.endpoint(), "doc", 2);
    restored.terminate();

    std::fs::remove_file(restored_dir.join("snapshot.bin")).unwrap();
    let refusal = refused_start(&mut restored);
    assert!(
        refusal.contains("palisade recover-counters --data-dir"),
        "the refusal does not name the recovery command:\n{refusal}"
    );
    recover_counters(&restored_dir).expect_success();
    restored.start();
    issued.rounds(&restored.endpoint(), "doc", 2);
}

/// The start of each frame of the log at `path`, up to the preallocated zeros.
fn log_frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut frames = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + 8 + len > bytes.len() {
            break;
        }
        frames.push((at, at + 8 + len));
        at += 8 + len;
    }
    frames
}

/// N2: a torn-tail cut after `raise-token-floor`. The grant's frame is made the log's last and
/// one byte of it rots; the cut takes it. Before, the floor kept for the cut was the time
/// floor, far below the raised counter, and the same token went to a new session.
#[test]
fn a_cut_of_the_log_after_a_raised_floor_never_issues_a_cut_grants_token_again() {
    let parent = tempfile::tempdir().unwrap();
    let (dir, mut node) = started_in(parent.path());
    let endpoint = node.endpoint();
    let mut issued = Issued::default();
    let huge: u64 = 1 << 60;
    admin(
        &node,
        &["cluster", "raise-token-floor", &huge.to_string(), "--force"],
    )
    .expect_success();
    let seen = issued.acquire(&endpoint, "rot/a", true);
    assert!(seen.token > huge);
    node.kill9();

    let path = dir.join("raft.wal");
    let mut bytes = std::fs::read(&path).unwrap();
    let (start, end) = log_frames(&bytes)
        .into_iter()
        .rfind(|&(start, end)| String::from_utf8_lossy(&bytes[start + 8..end]).contains("rot/a"))
        .expect("a frame holds the acquire");
    bytes[end..].fill(0);
    bytes[(start + end) / 2] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    node.start();
    assert!(
        node.log().contains("cutting a torn tail"),
        "the rotten frame was not cut:\n{}",
        node.log()
    );
    // The session of the cut grant is gone with it: a new one takes the lock, with a token
    // (and a session id) above the cut grant's.
    let again = issued.acquire(&endpoint, "rot/a", true);
    assert!(again.token > seen.token);
    Issued::release(&endpoint, "rot/a", &again);
    issued.rounds(&endpoint, "rot/a", 2);
}

/// N5: a floor at or near the largest token is refused, forced or not (it would leave no lock
/// grantable, for ever); one far above the counter needs --force, and the refusal says why.
#[test]
fn raise_token_floor_refuses_the_limit_and_a_far_jump_without_force() {
    let parent = tempfile::tempdir().unwrap();
    let mut node = ServerProcess::lock_service(BIN, parent.path().join("data"));
    node.start();
    let endpoint = node.endpoint();
    let max = i64::MAX as u64;
    for args in [
        vec![max.to_string()],
        vec![max.to_string(), "--force".into()],
        vec![(max - (1 << 50)).to_string(), "--force".into()],
    ] {
        let mut command = vec!["cluster", "raise-token-floor"];
        command.extend(args.iter().map(String::as_str));
        let refused = admin(&node, &command);
        assert_ne!(refused.code(), Some(0), "{refused:?}");
        assert!(
            refused.stderr.contains("even with --force"),
            "{}",
            refused.stderr
        );
    }
    let far = admin(
        &node,
        &["cluster", "raise-token-floor", &(1u64 << 60).to_string()],
    );
    assert_ne!(far.code(), Some(0), "{far:?}");
    assert!(
        far.stderr.contains("--force") && far.stderr.contains("for ever"),
        "{}",
        far.stderr
    );
    // Nothing was raised: the next grant is the first.
    let mut issued = Issued::default();
    let first = issued.acquire(&endpoint, "doc", true);
    assert_eq!(first.token, 1, "{first:?}");
    Issued::release(&endpoint, "doc", &first);
    admin(
        &node,
        &[
            "cluster",
            "raise-token-floor",
            &(1u64 << 60).to_string(),
            "--force",
        ],
    )
    .expect_success();
    assert!(issued.acquire(&endpoint, "doc", true).token > 1 << 60);
}
