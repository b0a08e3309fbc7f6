//! `palisade elect` and `palisade leader` against a real `palisade serve`: two candidates in
//! turn, the epoch and value their commands see, what observers print, and values shown by
//! `status`, `locks` and `watch`.

use std::process::Stdio;
use std::time::Duration;

use palisade_testkit::{Lines, Palisade, Running};

const BIN: &str = env!("CARGO_BIN_EXE_palisade");
const WAIT: Duration = Duration::from_secs(20);

/// `palisade elect NAME --value VALUE -- sh -c …` whose command prints
/// `EPOCH VALUE TOKEN` and then runs until the file `stop` appears in `dir`.
fn candidate(server: &Palisade, value: &str, stop: &std::path::Path) -> (Running, Lines) {
    let script = format!(
        "echo \"$PALISADE_EPOCH $PALISADE_VALUE $PALISADE_TOKEN\"; while [ ! -e '{}' ]; do sleep 0.05; done",
        stop.display()
    );
    let mut command = server.command(&[
        "elect",
        "elections/db",
        "--value",
        value,
        "--ttl",
        "5s",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut running = Running::spawn(command);
    let lines = Lines::new(running.child.stdout.take().unwrap());
    (running, lines)
}

/// The command's first line: (epoch, value, token).
fn epoch_line(lines: &Lines) -> (u64, String, u64) {
    let line = lines.next(WAIT);
    let fields: Vec<&str> = line.split(' ').collect();
    assert_eq!(fields.len(), 3, "{line}");
    (
        fields[0].parse().unwrap(),
        fields[1].to_string(),
        fields[2].parse().unwrap(),
    )
}

#[test]
fn candidates_lead_in_turn_and_observers_follow_the_leader_and_its_value() {
    let server = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let none = server.run_json(&["leader", "elections/db"]);
    assert_eq!(
        none,
        serde_json::json!({"election": "elections/db", "leader": null})
    );
    assert_eq!(
        server.run_ok(&["leader", "elections/db"]).trim(),
        "none elections/db"
    );

    let mut observe = server.command(&["leader", "elections/db", "--watch", "--json"]);
    observe.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut observer = Running::spawn(observe);
    let observed = Lines::new(observer.child.stdout.take().unwrap());
    let next_observed = || -> serde_json::Value {
        serde_json::from_str(&observed.next(WAIT)).expect("a JSON line")
    };
    assert!(next_observed()["leader"].is_null());

    // The first candidate leads: its command sees its epoch (the token) and its value.
    let stop_a = dir.path().join("stop-a");
    let (mut a, a_lines) = candidate(&server, "10.0.0.1:5432", &stop_a);
    let (epoch_a, value_a, token_a) = epoch_line(&a_lines);
    assert_eq!((value_a.as_str(), token_a), ("10.0.0.1:5432", epoch_a));
    let seen = next_observed();
    assert_eq!(seen["leader"]["epoch"], epoch_a, "{seen}");
    assert_eq!(seen["leader"]["value"], "10.0.0.1:5432", "{seen}");
    assert_eq!(
        server.run_ok(&["leader", "elections/db"]).trim(),
        format!(
            "leader elections/db session={} epoch={epoch_a} value=10.0.0.1:5432",
            seen["leader"]["session"]
        )
    );

    // The value shows wherever the lock does.
    let status = server.run_json(&["status", "elections/db"]);
    assert_eq!(status["holder"]["value"], "10.0.0.1:5432", "{status}");
    let text = server.run_ok(&["status", "elections/db"]);
    assert!(text.contains("value        10.0.0.1:5432"), "{text}");
    let table = server.run_ok(&["locks", "--prefix", "elections/"]);
    assert!(table.lines().next().unwrap().ends_with("VALUE"), "{table}");
    assert!(table.contains("10.0.0.1:5432"), "{table}");
    let mut watch = server.command(&["watch", "elections/db"]);
    watch.stdout(Stdio::piped()).stderr(Stdio::null());
    let mut watcher = Running::spawn(watch);
    let snapshot = Lines::new(watcher.child.stdout.take().unwrap()).next(WAIT);
    assert!(
        snapshot.starts_with("snapshot elections/db session=")
            && snapshot.ends_with(&format!("token={epoch_a} waiters=0 value=10.0.0.1:5432")),
        "{snapshot}"
    );
    drop(watcher);

    // A second candidate waits: the leader does not change.
    let stop_b = dir.path().join("stop-b");
    let (mut b, b_lines) = candidate(&server, "10.0.0.2:5432", &stop_b);
    std::thread::sleep(Duration::from_millis(500));
    let still = server.run_json(&["leader", "elections/db"]);
    assert_eq!(still["leader"]["epoch"], epoch_a, "{still}");

    // The leader's command exits: it steps down, and the next candidate leads with a higher
    // epoch.
    std::fs::write(&stop_a, "").unwrap();
    let status = a.wait(WAIT);
    assert_eq!(status.code(), Some(0), "{}", a.stderr());
    let (epoch_b, value_b, _) = epoch_line(&b_lines);
    assert!(
        epoch_b > epoch_a,
        "epochs must grow: {epoch_a} then {epoch_b}"
    );
    assert_eq!(value_b, "10.0.0.2:5432");
    let mut seen = next_observed();
    if seen["leader"].is_null() {
        seen = next_observed();
    }
    assert_eq!(seen["leader"]["epoch"], epoch_b, "{seen}");
    assert_eq!(seen["leader"]["value"], "10.0.0.2:5432", "{seen}");

    std::fs::write(&stop_b, "").unwrap();
    assert_eq!(b.wait(WAIT).code(), Some(0), "{}", b.stderr());
    assert!(next_observed()["leader"].is_null());
    drop(observer);
}

#[test]
fn a_bad_value_is_a_usage_error_and_takes_nothing() {
    let server = Palisade::start(BIN);
    for bad in ["", "tab\there", &"v".repeat(1025)] {
        let ran = server.run(&["elect", "elections/x", "--value", bad, "--", "true"]);
        assert_eq!(ran.status.code(), Some(2), "{bad:?}: {}", ran.stderr);
        assert!(ran.stderr.contains("value"), "{}", ran.stderr);
    }
    let status = server.run_json(&["status", "elections/x"]);
    assert!(status["holder"].is_null(), "{status}");
}

/// Three `palisade elect` processes: exactly one runs its command at a time, and killing the
/// leader (`kill -9` of its `palisade elect`, whose command dies with it) hands leadership to
/// the next candidate in line, with a higher epoch.
///
/// Each command checks, as it starts, that no earlier leader's command is still running (a
/// zombie left unreaped by whoever adopted it does not count: it runs nothing), and appends
/// `start EPOCH PID` (or `overlap …`) to a shared journal.
#[test]
fn killing_the_leader_hands_over_to_the_next_of_three_candidates_with_a_higher_epoch() {
    use nix::sys::signal::{Signal, kill};
    let server = Palisade::start(BIN);
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("journal");
    std::fs::write(&journal, "").unwrap();
    let script = format!(
        "j='{}'; for p in $(cut -d' ' -f3 \"$j\"); do state=$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null); \
         if [ -n \"$state\" ] && [ \"$state\" != Z ]; then echo \"overlap $PALISADE_EPOCH $p\" >> \"$j\"; fi; done; \
         echo \"start $PALISADE_EPOCH $$\" >> \"$j\"; echo started; while :; do sleep 0.05; done",
        journal.display()
    );
    let mut candidates: Vec<(Running, Lines)> = ["a:1", "b:2", "c:3"]
        .iter()
        .enumerate()
        .map(|(queued, value)| {
            let mut command = server.command(&[
                "elect",
                "elections/ha",
                "--value",
                value,
                "--ttl",
                "2s",
                "--",
                "sh",
                "-c",
                &script,
            ]);
            command.stdout(Stdio::piped()).stderr(Stdio::piped());
            let mut running = Running::spawn(command);
            let lines = Lines::new(running.child.stdout.take().unwrap());
            // Each candidate campaigns only once the one before leads or waits, so the order
            // of succession is known: a, b, c.
            if queued == 0 {
                assert_eq!(lines.next(WAIT), "started");
            } else {
                server.wait_for_status("elections/ha", WAIT, |s| {
                    s["waiters"].as_array().is_some_and(|w| w.len() == queued)
                });
            }
            (running, lines)
        })
        .collect();

    let leader = |expected: &str| -> u64 {
        let seen = server.run_json(&["leader", "elections/ha"]);
        assert_eq!(seen["leader"]["value"], expected, "{seen}");
        seen["leader"]["epoch"].as_u64().unwrap()
    };
    let mut epochs = vec![leader("a:1")];
    for (next, value) in [(1, "b:2"), (2, "c:3")] {
        // Kill the leader's palisade: its command gets SIGKILL with it, its session expires
        // after the 2 s ttl, and the next in line leads.
        let (killed, _) = &mut candidates[next - 1];
        kill(killed.pid(), Signal::SIGKILL).unwrap();
        killed.wait(WAIT);
        assert_eq!(candidates[next].1.next(WAIT), "started");
        let epoch = leader(value);
        assert!(
            epoch > *epochs.last().unwrap(),
            "epochs {epochs:?} then {epoch}"
        );
        epochs.push(epoch);
    }

    let journal = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<&str> = journal.lines().collect();
    assert_eq!(
        lines.len(),
        3,
        "one start per leader, no overlap:\n{journal}"
    );
    for (line, epoch) in lines.iter().zip(&epochs) {
        assert!(line.starts_with(&format!("start {epoch} ")), "{journal}");
    }
}
