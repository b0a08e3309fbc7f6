//! `palisade lock --permits N` and `--shared` against a real `palisade serve`: the slots and
//! phases a command sees, what `status` shows of them, and the refusals of a mismatched size.
//!
//! Then the pause scenarios of docs/locks.md with real processes and the fenced store (`palisade
//! store serve`): a worker's whole `palisade lock … -- sh -c SCRIPT` is frozen (`SIGSTOP`) past
//! its lease, another takes its slot or the lock and writes, and the thawed script's late
//! `palisade store put` or `get` is refused, while the holders of the other slots work on.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use palisade_testkit::{Lines, Palisade, Running, wait_for_file};

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
    let writer_token: u64 = writer.stdout().trim().parse().unwrap();
    assert!(
        writer_token > token,
        "the writer's token is above the readers' phase"
    );
}

// ----- pause scenarios against the fenced store -----

/// A critical section in two steps, gated by files in `$D`: it records its process group (its
/// pid: `palisade lock` makes the command a group leader), slot and token, runs `$STEP1`, waits
/// for `$D/go` (at most about a minute, so a failed test leaves nothing behind), then runs
/// `$STEP2`. Each step's exit status goes to `$D/step1` and `$D/step2`, its output to
/// `$D/out1`, `$D/out2` and `$D/err2`.
const SECTION: &str = r#"
echo $$ > "$D/pid"
echo "${PALISADE_SLOT:--} $PALISADE_TOKEN" > "$D/grant"
sh -c "$STEP1" > "$D/out1"; echo $? > "$D/step1"
i=0
while [ ! -e "$D/go" ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i + 1)); done
sh -c "$STEP2" > "$D/out2" 2> "$D/err2"; echo $? > "$D/step2"
"#;

/// One `palisade lock ARGS -- sh -c SECTION` and the directory its section writes to.
struct Worker {
    lock: Running,
    dir: PathBuf,
}

impl Worker {
    /// Starts the worker `name` under `dir/name` with `$NAME`, `$PAL` (the binary) and the two
    /// steps in its environment, and waits until its first step has run.
    fn start(server: &Palisade, dir: &Path, name: &str, args: &[&str], steps: [&str; 2]) -> Worker {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let mut all = args.to_vec();
        all.extend([
            "--wait",
            "20s",
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            SECTION,
        ]);
        let mut command = server.command(&all);
        command
            .env("D", &dir)
            .env("NAME", name)
            .env("PAL", BIN)
            .env("STEP1", steps[0])
            .env("STEP2", steps[1])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .process_group(0);
        let worker = Worker {
            lock: Running::spawn(command),
            dir,
        };
        worker.read("step1");
        worker
    }

    /// What the section wrote to `file`, once it has.
    fn read(&self, file: &str) -> String {
        wait_for_file(&self.dir.join(file), WAIT).trim().to_string()
    }

    /// What `palisade lock` and the section wrote to stderr so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// The slot (`-` for none) and the token of its grant.
    fn grant(&self) -> (String, u64) {
        let grant = self.read("grant");
        let (slot, token) = grant.split_once(' ').unwrap();
        (slot.to_string(), token.parse().unwrap())
    }

    fn section(&self) -> Pid {
        Pid::from_raw(self.read("pid").parse().unwrap())
    }

    /// Freezes `palisade lock` and its section, as a pause of the whole host process would.
    fn freeze(&self) {
        kill(self.lock.pid(), Signal::SIGSTOP).unwrap();
        killpg(self.section(), Signal::SIGSTOP).unwrap();
    }

    /// Lets the section run its second step; thaws it first if frozen. Its `palisade lock` stays
    /// as it is: thawed, it would stop the section on finding its lease lost, and the point is
    /// what the resource does with a late step.
    fn go(&self) -> (i32, String) {
        std::fs::write(self.dir.join("go"), b"").unwrap();
        killpg(self.section(), Signal::SIGCONT).unwrap();
        let status = self.read("step2").parse().unwrap();
        let err = std::fs::read_to_string(self.dir.join("err2")).unwrap_or_default();
        (status, err)
    }

    /// Thaws `palisade lock` (if frozen) and waits for it to end.
    fn finish(mut self) -> std::process::ExitStatus {
        kill(self.lock.pid(), Signal::SIGCONT).unwrap();
        self.lock.wait(WAIT)
    }
}

impl Drop for Worker {
    /// Kills the section's group too (frozen or not), so a failed test leaves nothing behind.
    fn drop(&mut self) {
        if let Some(group) = std::fs::read_to_string(self.dir.join("pid"))
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
        {
            let _ = killpg(Pid::from_raw(group), Signal::SIGKILL);
        }
    }
}

/// Exit status of `palisade store` refusing a stale sequencer (`palisade --help`).
const STALE: i32 = 3;
/// Exit status of `palisade store` refusing a request (here: a reader's write).
const REFUSED: i32 = 1;

#[test]
fn a_frozen_permit_holder_is_refused_on_its_shard_and_the_other_shards_work_on() {
    let server = Palisade::start_with_store(BIN);
    let dir = tempfile::tempdir().unwrap();
    let put = |n: u8| format!("\"$PAL\" store put \"shard-$PALISADE_SLOT\" \"$NAME {n}\"");
    let steps = [put(1), put(2)];
    let steps = [steps[0].as_str(), steps[1].as_str()];
    let long = ["lock", "shards", "--permits", "3", "--ttl", "30s"];

    // Three workers over three shards, each writing its slot's shard; `a` on a short lease.
    let b = Worker::start(&server, dir.path(), "b", &long, steps);
    let c = Worker::start(&server, dir.path(), "c", &long, steps);
    let short = ["lock", "shards", "--permits", "3", "--ttl", "2s"];
    let a = Worker::start(&server, dir.path(), "a", &short, steps);
    for worker in [&a, &b, &c] {
        assert_eq!(worker.read("step1"), "0", "{}", worker.stderr());
    }
    let (slot_a, token_a) = a.grant();

    // `a` is frozen past its lease; `d` is granted its slot, with a larger token, and writes.
    a.freeze();
    let d = Worker::start(&server, dir.path(), "d", &long, steps);
    let (slot_d, token_d) = d.grant();
    assert_eq!(
        slot_d, slot_a,
        "the new worker takes the frozen worker's slot"
    );
    assert!(token_d > token_a);
    assert_eq!(d.read("step1"), "0");
    let status = server.run_json(&["status", "shards"]);
    assert_eq!(status["sharers"].as_array().unwrap().len(), 3, "{status}");

    // Thawed, `a` writes its shard as if it still held the slot: refused as stale.
    let (code, err) = a.go();
    assert_eq!(code, STALE, "the frozen worker's late write: {err}");
    assert!(err.contains("stale"), "{err}");
    // The other shards' workers never noticed: their next writes land.
    for worker in [&b, &c, &d] {
        let (code, err) = worker.go();
        assert_eq!(code, 0, "{err}");
    }
    for (worker, name) in [(&b, "b"), (&c, "c"), (&d, "d")] {
        let shard = format!("shard-{}", worker.grant().0);
        let value = server.run_ok(&["store", "get", "--unfenced", &shard]);
        assert_eq!(value.trim(), format!("{name} 2"), "{shard}");
    }
    let _ = a.finish();
    for worker in [b, c, d] {
        let status = worker.finish();
        assert!(status.success(), "{status}");
    }
}

#[test]
fn a_frozen_reader_is_refused_once_a_writer_has_written_and_a_reader_never_writes() {
    let server = Palisade::start_with_store(BIN);
    let dir = tempfile::tempdir().unwrap();
    server.run_ok(&["lock", "config", "--", BIN, "store", "put", "config", "v1"]);

    // Two readers of one phase read v1 with the phase's token (a fenced read).
    let read = "\"$PAL\" store get config";
    let read_then_write = "\"$PAL\" store get config && \"$PAL\" store put config \"$NAME\"";
    let short = ["lock", "config", "--shared", "--ttl", "2s"];
    let r1 = Worker::start(&server, dir.path(), "r1", &short, [read, read_then_write]);
    let long = ["lock", "config", "--shared", "--ttl", "30s"];
    let r2 = Worker::start(&server, dir.path(), "r2", &long, [read, read_then_write]);
    for reader in [&r1, &r2] {
        assert_eq!(reader.read("step1"), "0", "{}", reader.stderr());
        assert_eq!(reader.read("out1"), "v1");
    }
    assert_eq!(
        r1.grant().1,
        r2.grant().1,
        "readers of one phase share its token"
    );
    // The live reader reads again, and its write is refused: a reader never writes.
    let (code, err) = r2.go();
    assert_eq!(code, REFUSED, "a reader's write: {err}");
    assert!(err.contains("shared"), "{err}");
    assert!(r2.finish().success());

    // `r1` is frozen past its lease; a writer takes the lock and writes v2.
    r1.freeze();
    let writer = server.run(&[
        "lock", "config", "--wait", "20s", "--", BIN, "store", "put", "config", "v2",
    ]);
    assert!(writer.status.success(), "{}", writer.stderr);

    // Thawed, the reader of the superseded phase reads: refused, it would see the writer's
    // change under a grant that no longer holds.
    let (code, err) = r1.go();
    assert_eq!(code, STALE, "the frozen reader's late read: {err}");
    assert!(err.contains("stale"), "{err}");
    let _ = r1.finish();
    // A reader of a new phase reads what the writer wrote.
    let after = server.run_ok(&[
        "lock", "config", "--shared", "--", BIN, "store", "get", "config",
    ]);
    assert_eq!(after.trim(), "v2");
}
