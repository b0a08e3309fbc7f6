//! `palisade lock --permits N` and `--shared` against a real `palisade serve`: the slots and
//! phases a command sees, what `status` shows of them, and the refusals of a mismatched size.

use std::process::Stdio;
use std::time::Duration;

use palisade_testkit::{Lines, Palisade, Running};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");

/// Exit status of a lock not granted within its wait (`palisade --help`).
const NOT_ACQUIRED: i32 = 75;
const WAIT: Duration = Duration::from_secs(20);

/// Starts `palisade lock ARGS -- sh -c 'echo …; sleep 60'` and returns it with its first line
/// of output: the grant's fields, as the command sees them.
fn hold(server: &Palisade, args: &[&str]) -> (Running, String) {
    let mut all = args.to_vec();
    all.extend([
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo \"${PALISADE_SLOT:--} $PALISADE_TOKEN $PALISADE_SEQUENCER\"; exec sleep 60",
    ]);
    let mut command = server.command(&all);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut running = Running::spawn(command);
    let lines = Lines::new(running.child.stdout.take().unwrap());
    let line = lines.next(WAIT);
    (running, line)
}

fn fields(line: &str) -> (String, u64, String) {
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{line:?}");
    (
        parts[0].to_string(),
        parts[1].parse().unwrap(),
        parts[2].to_string(),
    )
}

#[test]
fn three_workers_over_three_shards_each_get_a_slot_and_token_of_their_own() {
    let server = Palisade::start(BIN);
    let args = ["lock", "shards", "--permits", "3", "--ttl", "30s"];
    let mut workers: Vec<(Running, String)> = (0..3).map(|_| hold(&server, &args)).collect();

    let mut slots = Vec::new();
    let mut tokens = Vec::new();
    for (_, line) in &workers {
        let (slot, token, sequencer) = fields(line);
        // The sequencer names the slot, so a resource keeps one maximum per slot.
        assert!(
            sequencer.starts_with("pal3.") && sequencer.contains(&format!(".p{slot}.")),
            "{line}"
        );
        slots.push(slot.parse::<u32>().unwrap());
        tokens.push(token);
    }
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2]);
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "every permit has its own token");

    // A fourth worker finds no free slot.
    let fourth = server.run(&[
        "lock",
        "shards",
        "--permits",
        "3",
        "--wait",
        "0",
        "--",
        "true",
    ]);
    assert_eq!(
        fourth.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        fourth.stderr
    );
    // Another size, or the name as a lock, is refused while the semaphore is in use.
    let other = server.run(&[
        "lock",
        "shards",
        "--permits",
        "4",
        "--wait",
        "0",
        "--",
        "true",
    ]);
    assert!(
        other.stderr.contains("semaphore of 3 permits, not 4"),
        "{}",
        other.stderr
    );
    let as_lock = server.run(&["lock", "shards", "--wait", "0", "--", "true"]);
    assert!(
        as_lock
            .stderr
            .contains("in use as a semaphore of 3 permits"),
        "{}",
        as_lock.stderr
    );

    let status = server.run_json(&["status", "shards"]);
    assert_eq!(status["permits"], 3, "{status}");
    assert_eq!(status["sharers"].as_array().unwrap().len(), 3, "{status}");
    assert!(status["holder"].is_null(), "{status}");
    let text = server.run_ok(&["status", "shards"]);
    assert!(text.contains("3 permits, 0 free"), "{text}");

    // A freed slot goes to the next worker, with a new token.
    let (mut first, line) = workers.remove(0);
    let (freed_slot, freed_token, _) = fields(&line);
    nix::sys::signal::kill(first.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    first.wait(WAIT);
    let (next, line) = hold(&server, &args);
    let (slot, token, _) = fields(&line);
    assert_eq!(slot, freed_slot);
    assert!(token > freed_token);
    for (mut worker, _) in workers.into_iter().chain([(next, line)]) {
        nix::sys::signal::kill(worker.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        worker.wait(WAIT);
    }
}

#[test]
fn readers_share_their_phase_token_and_a_writer_waits_until_they_are_done() {
    let server = Palisade::start(BIN);
    let args = ["lock", "config", "--shared", "--ttl", "30s"];
    let (mut first, line) = hold(&server, &args);
    let (mut second, other) = hold(&server, &args);
    let (slot, token, sequencer) = fields(&line);
    assert_eq!(slot, "-");
    assert_eq!(
        fields(&other).1,
        token,
        "readers of one phase share its token"
    );
    assert!(
        sequencer.starts_with("pal3.") && sequencer.contains(".s."),
        "{sequencer}"
    );

    let writer = server.run(&["lock", "config", "--wait", "0", "--", "true"]);
    assert_eq!(
        writer.status.code(),
        Some(NOT_ACQUIRED),
        "{}",
        writer.stderr
    );
    let text = server.run_ok(&["status", "config"]);
    assert_eq!(text.matches("reader ").count(), 2, "{text}");

    // A writer waits; a reader arriving after it waits behind it (writers do not starve).
    let mut command = server.command(&[
        "lock",
        "config",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $PALISADE_TOKEN",
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut writer = Running::spawn(command);
    server.wait_for_status("config", WAIT, |s| {
        s["waiters"].as_array().is_some_and(|w| w.len() == 1)
    });
    let late = server.run(&["lock", "config", "--shared", "--wait", "0", "--", "true"]);
    assert_eq!(late.status.code(), Some(NOT_ACQUIRED), "{}", late.stderr);

    for reader in [&mut first, &mut second] {
        nix::sys::signal::kill(reader.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
        reader.wait(WAIT);
    }
    let status = writer.wait(WAIT);
    assert!(status.success(), "{}", writer.stderr());
    let mut stdout = String::new();
    std::io::Read::read_to_string(writer.child.stdout.as_mut().unwrap(), &mut stdout).unwrap();
    let writer_token: u64 = stdout.trim().parse().unwrap();
    assert!(
        writer_token > token,
        "the writer's token is above the readers' phase"
    );
}
