//! `palisade bench scale` end to end on the built binary: a tiny run starts its own
//! `palisade serve`, grows each kind of state, and reports every step with its measurements.
//! Nothing here looks at speed.
//!
//! With `PALISADE_TEST_ETCD_BIN` set to an etcd binary, the same run also covers etcd.

use std::process::Command;

fn scale_run(etcd_bin: Option<&str>) -> (String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json_file = dir.path().join("scale.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_palisade"));
    command
        .args([
            "bench",
            "scale",
            "--sessions",
            "10,20",
            "--locks",
            "10,50",
            "--lock-sessions",
            "4",
            "--waiters",
            "20",
            "--watchers",
            "20",
            "--probe-cycles",
            "20",
            "--snapshot",
            "last",
            "--time-limit",
            "10m",
            "--store-dir",
        ])
        .arg(dir.path())
        .arg("--json-file")
        .arg(&json_file);
    if let Some(bin) = etcd_bin {
        command.arg("--etcd-bin").arg(bin);
    }
    let output = command.output().expect("palisade runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "bench scale failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let report = serde_json::from_slice(&std::fs::read(&json_file).unwrap()).unwrap();
    (stdout, report)
}

fn check_system(stdout: &str, report: &serde_json::Value, system: &str) {
    for row in [
        "10 sessions",
        "20 sessions",
        "10 locks",
        "50 locks",
        "20 waiters",
        "20 watchers",
    ] {
        assert!(
            stdout.contains(&format!("| {system} | {row} |")),
            "no {system} row for {row}:\n{stdout}"
        );
    }
    let steps: Vec<&serde_json::Value> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["system"] == system)
        .collect();
    assert_eq!(steps.len(), 6, "{report:#}");
    for step in &steps {
        let phase = step["phase"].as_str().unwrap();
        assert_eq!(step["reached"], step["target"], "{step:#}");
        assert_eq!(step["errors"], 0, "{step:#}");
        assert!(step["rss_bytes"].as_u64().unwrap() > 0, "{step:#}");
        assert!(step["rss_baseline_bytes"].as_u64().unwrap() > 0, "{step:#}");
        assert_eq!(step["probe"]["samples"], 20, "{step:#}");
        assert!(step["probe"]["p50_us"].as_f64().unwrap() > 0.0, "{step:#}");
        assert_eq!(step["restart"]["signal"], "SIGKILL");
        assert!(step["restart"]["ms"].as_f64().unwrap() > 0.0, "{step:#}");
        let listing = &step["listing"];
        match phase {
            // Every held lock is listed, with its holder.
            "locks" => {
                assert_eq!(listing["held"], step["reached"], "{step:#}");
                assert_eq!(listing["entries"], step["reached"], "{step:#}");
            }
            // The queue: one lock (etcd: a key per waiter and the holder's).
            "waiters" if system == "palisade" => assert_eq!(listing["entries"], 1, "{step:#}"),
            "waiters" => assert_eq!(listing["entries"], 21, "{step:#}"),
            _ => assert_eq!(listing["entries"], 0, "{step:#}"),
        }
    }
    // The last step of each phase brought on a snapshot: a file, and for Palisade its build
    // timed with the probe running through it.
    let last_of_phase = [1, 3, 4, 5];
    for &i in &last_of_phase {
        let snapshot = &steps[i]["snapshot"];
        assert!(snapshot["bytes"].as_u64().unwrap() > 0, "{:#}", steps[i]);
        if system == "palisade" {
            assert!(
                snapshot["build_ms"].as_f64().unwrap() > 0.0,
                "{:#}",
                steps[i]
            );
            assert!(
                snapshot["stall_ratio"].as_f64().unwrap() > 0.0,
                "{:#}",
                steps[i]
            );
        }
    }
    assert!(steps[0]["snapshot"].is_null() && steps[2]["snapshot"].is_null());
}

#[test]
fn a_tiny_scale_run_reports_every_step_with_memory_listing_snapshot_and_restart() {
    let etcd_bin = std::env::var("PALISADE_TEST_ETCD_BIN").ok();
    if etcd_bin.is_none() {
        println!("skipping: the etcd steps (set PALISADE_TEST_ETCD_BIN to an etcd binary)");
    }
    let (stdout, report) = scale_run(etcd_bin.as_deref());
    check_system(&stdout, &report, "palisade");
    if etcd_bin.is_some() {
        check_system(&stdout, &report, "etcd");
    }
    // The goals are printed, and judged only at a million locks: not in a tiny run.
    assert!(stdout.contains("| goal (issue #12) |"), "{stdout}");
    let goals = report["goals"].as_array().unwrap();
    assert_eq!(goals.len(), 4, "{goals:#?}");
    for goal in &goals[..3] {
        assert!(goal["met"].is_null(), "{goal:#}");
    }
}
