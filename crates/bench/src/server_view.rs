//! The lock service's own account of a workload: deltas of its Prometheus `/metrics` (log group
//! commits, writes per commit, server-side request latency) over the measured window, and the CPU
//! time of this benchmark process. This is what tells "waiting on fsync" from "burning CPU"; the
//! servers' own CPU is [`crate::server_cpu`]'s.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

/// Linux reports process CPU time in clock ticks of 1/100 s (`USER_HZ`).
pub(crate) const TICKS_PER_S: f64 = 100.0;

/// Where to look: the `/metrics` URL.
#[derive(Debug, Clone)]
pub struct Probe {
    pub metrics_url: String,
}

/// A reading taken before a workload.
#[derive(Debug)]
pub struct Reading {
    at: Instant,
    metrics: HashMap<String, f64>,
    bench_ticks: Option<u64>,
}

/// What the server did during one workload.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerView {
    /// Log group commits (each one fsync) per second.
    pub log_commits_per_s: Option<f64>,
    pub log_commit_mean_us: Option<f64>,
    /// Log records sharing one fsync, on average.
    pub writes_per_commit: Option<f64>,
    /// Server-side latency of Acquire and Release (from the request, to the response).
    pub acquire_mean_us: Option<f64>,
    pub release_mean_us: Option<f64>,
    /// Server-side latency of ReleaseThenAcquire (a handoff in one call).
    pub handoff_mean_us: Option<f64>,
    /// CPU time of this benchmark process per wall-clock second: 1.0 is one core busy.
    pub bench_cpu_cores: Option<f64>,
}

impl ServerView {
    /// The server-side means of the calls the workload made, e.g. "acquire 0.39 ms release
    /// 0.35 ms" ("no calls timed" if the server timed none).
    pub fn call_means(&self) -> String {
        let means: Vec<String> = [
            ("acquire", self.acquire_mean_us),
            ("release", self.release_mean_us),
            ("release-then-acquire", self.handoff_mean_us),
        ]
        .into_iter()
        .filter_map(|(call, mean)| mean.map(|us| format!("{call} {:.2} ms", us / 1e3)))
        .collect();
        if means.is_empty() {
            "no calls timed".to_string()
        } else {
            means.join(" ")
        }
    }
}

impl Probe {
    pub async fn read(&self) -> anyhow::Result<Reading> {
        let metrics = scrape(&self.metrics_url).await?;
        Ok(Reading {
            at: Instant::now(),
            metrics,
            bench_ticks: cpu_ticks("/proc/self/stat"),
        })
    }

    /// What happened since `before`.
    pub async fn since(&self, before: &Reading) -> anyhow::Result<ServerView> {
        let after = self.read().await?;
        let wall_s = after.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let delta = |name: &str| -> Option<f64> {
            let a = after.metrics.get(name)?;
            Some(a - before.metrics.get(name).copied().unwrap_or(0.0))
        };
        let mean_us = |prefix: &str, labels: &str| -> Option<f64> {
            let count = delta(&format!("{prefix}_count{labels}"))?;
            let sum = delta(&format!("{prefix}_sum{labels}"))?;
            (count > 0.0).then(|| sum / count * 1e6)
        };
        let commits = delta("palisade_log_commit_duration_seconds_count");
        let batch_mean = mean_us("palisade_log_commit_batch_writes", "").map(|v| v / 1e6);
        let cores = |b: Option<u64>, a: Option<u64>| match (b, a) {
            (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / TICKS_PER_S / wall_s),
            _ => None,
        };
        Ok(ServerView {
            log_commits_per_s: commits.map(|c| c / wall_s),
            log_commit_mean_us: mean_us("palisade_log_commit_duration_seconds", ""),
            writes_per_commit: batch_mean,
            acquire_mean_us: mean_us("palisade_request_duration_seconds", "{method=\"acquire\"}"),
            release_mean_us: mean_us("palisade_request_duration_seconds", "{method=\"release\"}"),
            handoff_mean_us: mean_us(
                "palisade_request_duration_seconds",
                "{method=\"release_then_acquire\"}",
            ),
            bench_cpu_cores: cores(before.bench_ticks, after.bench_ticks),
        })
    }
}

/// Reads a Prometheus text exposition into `series{labels}` → value.
async fn scrape(url: &str) -> anyhow::Result<HashMap<String, f64>> {
    let text = reqwest::get(url)
        .await
        .with_context(|| format!("cannot read {url}"))?
        .error_for_status()?
        .text()
        .await?;
    Ok(parse_exposition(&text))
}

fn parse_exposition(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.trim().to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// User plus system CPU time of a process, in ticks, from its `/proc/…/stat`.
pub(crate) fn cpu_ticks(path: &str) -> Option<u64> {
    crate::server_cpu::parse_stat_cpu_ticks(&std::fs::read_to_string(path).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_lines_parse_with_their_labels_and_comments_are_skipped() {
        let text = "# HELP x\n# TYPE x histogram\n\
                    palisade_request_duration_seconds_sum{method=\"acquire\"} 0.5\n\
                    palisade_log_commit_duration_seconds_count 42\n";
        let parsed = parse_exposition(text);
        assert_eq!(
            parsed.get("palisade_request_duration_seconds_sum{method=\"acquire\"}"),
            Some(&0.5)
        );
        assert_eq!(
            parsed.get("palisade_log_commit_duration_seconds_count"),
            Some(&42.0)
        );
        assert_eq!(parsed.len(), 2);
    }

    #[test]
    fn the_call_means_name_the_calls_the_server_timed() {
        let view = |acquire, release, handoff| ServerView {
            log_commits_per_s: None,
            log_commit_mean_us: None,
            writes_per_commit: None,
            acquire_mean_us: acquire,
            release_mean_us: release,
            handoff_mean_us: handoff,
            bench_cpu_cores: None,
        };
        assert_eq!(
            view(Some(390.0), Some(350.0), None).call_means(),
            "acquire 0.39 ms release 0.35 ms"
        );
        assert_eq!(
            view(None, None, Some(580.0)).call_means(),
            "release-then-acquire 0.58 ms"
        );
        assert_eq!(view(None, None, None).call_means(), "no calls timed");
    }

    #[test]
    fn this_process_has_a_cpu_time() {
        assert!(cpu_ticks("/proc/self/stat").is_some());
    }
}
