//! A short run of each benchmark workload against an in-process lock service: operations
//! complete and the report carries percentiles. Nothing here looks at speed.

use std::time::Duration;

use palisade_bench::bench::{BenchArgs, Workload, measure};
use palisade_bench::local::{LocalLockService, LocalStore};

fn args(service: &LocalLockService, workload: Workload) -> BenchArgs {
    BenchArgs {
        workload,
        targets: vec![service.target()],
        store: None,
        store_dir: None,
        clients: Some(2),
        duration: Duration::from_secs(1),
        warmup: Duration::from_millis(100),
        json: true,
        json_file: None,
        metrics: None,
        target_pids: Vec::new(),
        server_pid: Some(std::process::id()),
        nodes: 1,
        markdown: false,
        floor: false,
        tls: None,
        scale: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_workload_completes_operations_and_reports_percentiles() {
    let service = LocalLockService::start()
        .await
        .expect("lock service starts");

    let report = measure(&args(&service, Workload::All))
        .await
        .expect("the benchmark runs");

    for workload in [
        Workload::Uncontended,
        Workload::Contended,
        Workload::Latency,
    ] {
        let m = report
            .find(workload, None, "palisade")
            .unwrap_or_else(|| panic!("{workload:?} was measured: {report:#?}"));
        assert_eq!(m.errors, 0, "{m:#?}");
        assert!(m.operations > 0, "{m:#?}");
        assert_eq!(m.latency.samples, m.operations);
        assert!(m.latency.p50_us > 0.0 && m.latency.p50_us <= m.latency.p99_us);
        assert!(m.latency.p99_us <= m.latency.p999_us && m.latency.p999_us <= m.latency.max_us);
        let acquire = m.acquire.expect("lock workloads time the acquire");
        assert_eq!(acquire.samples, m.operations);
        // The server runs in this process here, so its CPU time is this process's: it was
        // busy for the window, on no more cores than the machine has, its threads switched,
        // and every cycle of the window is two lock operations (those straddling its edges
        // count what ended inside: at most 3 operations more per client).
        let cpu = m.server_cpu.as_ref().expect("the server was read by pid");
        assert_eq!(cpu.pids, vec![std::process::id()]);
        let cores_max = std::thread::available_parallelism().unwrap().get() as f64;
        assert!(cpu.cpu_cores > 0.0 && cpu.cpu_cores <= cores_max, "{cpu:?}");
        assert!(cpu.context_switches > 0 && cpu.threads > 0, "{cpu:?}");
        assert!(
            cpu.lock_operations >= 2 * m.operations
                && cpu.lock_operations <= 2 * m.operations + 3 * m.clients as u64,
            "{cpu:?} {m:?}"
        );
        let per_op = cpu.cpu_us_per_operation.expect("operations were counted");
        assert!(
            (per_op - cpu.cpu_s * 1e6 / cpu.lock_operations as f64).abs() < 1e-6,
            "{cpu:?}"
        );
    }
    let table = palisade_bench::bench::markdown_table(&report, &[service.target()]);
    for row in [
        "server CPU per lock operation",
        "server context switches per lock operation",
    ] {
        assert_eq!(
            table.lines().filter(|l| l.contains(row)).count(),
            3,
            "one {row} row per lock workload: {table}"
        );
    }
    assert_eq!(
        report
            .find(Workload::Latency, None, "palisade")
            .unwrap()
            .clients,
        1
    );
    assert_eq!(
        report
            .find(Workload::Contended, None, "palisade")
            .unwrap()
            .locks,
        1
    );
    for variant in ["unfenced", "fenced"] {
        let m = report
            .find(Workload::FencedWrite, Some(variant), "palisade")
            .unwrap_or_else(|| panic!("fenced-write {variant} was measured: {report:#?}"));
        assert_eq!(m.errors, 0, "{m:#?}");
        assert!(m.operations > 0, "{m:#?}");
        assert!(m.latency.p50_us > 0.0);
    }

    assert!(
        table.contains("grants/s") && table.contains("fencing cost"),
        "{table}"
    );
    service.stop().await.expect("lock service stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_reads_and_transactions_run_in_process_and_over_http() {
    let service = LocalLockService::start()
        .await
        .expect("lock service starts");
    let store = LocalStore::start(service.public_key())
        .await
        .expect("store starts");
    let store_url = store.url();

    for (workload, variants) in [
        (
            Workload::FencedRead,
            &[
                "fenced-write",
                "fenced-read",
                "fenced-write-http",
                "fenced-read-http",
                "advancing-read",
                "advancing-write",
                "advancing-read-http",
                "advancing-write-http",
            ][..],
        ),
        (
            Workload::Txn,
            &["fenced-write", "txn", "fenced-write-http", "txn-http"][..],
        ),
    ] {
        let mut args = args(&service, workload);
        args.store = Some(store.address().to_string());
        args.server_pid = None;
        let report = measure(&args).await.expect("the benchmark runs");
        let measured: Vec<_> = report
            .measurements
            .iter()
            .map(|m| m.variant.expect("store workloads name their path"))
            .collect();
        assert_eq!(measured, variants, "{report:#?}");
        for m in &report.measurements {
            assert_eq!(m.workload, workload);
            assert_eq!(m.errors, 0, "{m:#?}");
            assert!(m.operations > 0, "{m:#?}");
            assert_eq!(m.latency.samples, m.operations, "{m:#?}");
            assert!(m.latency.p50_us > 0.0, "{m:#?}");
            assert_eq!(m.clients, 2);
            assert!(
                m.duration_s > 0.0 && m.duration_s <= args.duration.as_secs_f64(),
                "{m:#?}"
            );
            let over_http = m.variant.is_some_and(|v| v.ends_with("-http"));
            assert_eq!(m.target == store_url, over_http, "{m:#?}");
        }
        let table = palisade_bench::bench::markdown_table(&report, &[service.target()]);
        let last = variants.last().expect("variants are listed");
        assert!(
            table.contains(&format!("cost of one {last} (fenced-write-http")),
            "{table}"
        );
        if workload == Workload::FencedRead {
            assert!(
                table.contains("cost of one advancing-read (advancing-write ÷"),
                "{table}"
            );
        }
    }

    store.stop().await.expect("store stops");
    service.stop().await.expect("lock service stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modes_runs_a_mutex_readers_and_permits_in_one_run_and_prints_them_side_by_side() {
    let service = LocalLockService::start()
        .await
        .expect("lock service starts");
    let mut args = args(&service, Workload::Modes);
    args.server_pid = None;
    let report = measure(&args).await.expect("the benchmark runs");

    let measured: Vec<(Option<&str>, usize)> = (report.measurements.iter())
        .map(|m| (m.variant, m.locks))
        .collect();
    // A lock per client as mutexes; one lock shared by the readers, one semaphore of two.
    assert_eq!(
        measured,
        [(Some("mutex"), 2), (Some("shared"), 1), (Some("permit"), 1)],
        "{report:#?}"
    );
    for m in &report.measurements {
        assert_eq!(
            (m.workload, m.clients, m.errors),
            (Workload::Modes, 2, 0),
            "{m:#?}"
        );
        assert!(
            m.operations > 0 && m.latency.samples == m.operations,
            "{m:#?}"
        );
    }
    let table = palisade_bench::bench::modes_table(&report);
    for row in [
        "| mutex | 2 clients, 2 locks |",
        "| reader (`--shared`) | 2 clients, 1 lock |",
        "| permit (`--permits 2`) | 2 clients, 1 lock |",
    ] {
        assert!(table.contains(row), "{row} in {table}");
    }
    service.stop().await.expect("lock service stops");
}
