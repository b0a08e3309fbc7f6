//! The lock service's own account of a workload: deltas of its Prometheus `/metrics` (log group
//! commits, writes per commit, server-side request latency) and the CPU time of the server and of
//! this benchmark process. This is what tells "waiting on fsync" from "burning CPU".

use std::collections::HashMap;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;

/// Linux reports process CPU time in clock ticks of 1/100 s (`USER_HZ`).
pub(crate) const TICKS_PER_S: f64 = 100.0;

/// Where to look: the `/metrics` URL and, optionally, the server's process id.
#[derive(Debug, Clone)]
pub struct Probe {
    pub metrics_url: Option<String>,
    pub server_pid: Option<u32>,
}

/// A reading taken before a workload.
#[derive(Debug)]
pub struct Reading {
    at: Instant,
    metrics: HashMap<String, f64>,
    server_ticks: Option<u64>,
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
    /// CPU time per wall-clock second: 1.0 is one core busy.
    pub server_cpu_cores: Option<f64>,
    pub bench_cpu_cores: Option<f64>,
}

impl Probe {
    pub fn is_empty(&self) -> bool {
        self.metrics_url.is_none() && self.server_pid.is_none()
    }

    pub async fn read(&self) -> anyhow::Result<Reading> {
        let metrics = match &self.metrics_url {
            Some(url) => scrape(url).await?,
            None => HashMap::new(),
        };
        Ok(Reading {
            at: Instant::now(),
            metrics,
            server_ticks: self
                .server_pid
                .and_then(|pid| cpu_ticks(&format!("/proc/{pid}/stat"))),
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
            server_cpu_cores: cores(before.server_ticks, after.server_ticks),
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
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may contain spaces; fields after its closing parenthesis are
    // plain. utime and stime are fields 14 and 15, i.e. 12th and 13th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
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
    fn this_process_has_a_cpu_time() {
        assert!(cpu_ticks("/proc/self/stat").is_some());
    }
}
