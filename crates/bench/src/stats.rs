//! Latency histograms (hdrhistogram, nanoseconds) and the percentiles a report shows.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Longest latency a histogram records; longer samples are clamped to it.
const LATENCY_NS_MAX: u64 = 120_000_000_000;
/// Significant decimal digits kept by the histograms.
const SIGNIFICANT_DIGITS: u8 = 3;

/// A latency histogram in nanoseconds.
#[derive(Debug, Clone)]
pub struct Latencies {
    histogram: Histogram<u64>,
}

impl Default for Latencies {
    fn default() -> Self {
        Latencies {
            histogram: Histogram::new_with_bounds(1, LATENCY_NS_MAX, SIGNIFICANT_DIGITS)
                .expect("static histogram bounds are valid"),
        }
    }
}

impl Latencies {
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos())
            .unwrap_or(u64::MAX)
            .clamp(1, LATENCY_NS_MAX);
        self.histogram
            .record(ns)
            .expect("a value clamped to the bounds records");
    }

    pub fn merge(&mut self, other: &Latencies) {
        self.histogram
            .add(&other.histogram)
            .expect("histograms with equal bounds merge");
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    pub fn percentiles(&self) -> Percentiles {
        let us = |ns: u64| ns as f64 / 1_000.0;
        let h = &self.histogram;
        Percentiles {
            samples: h.len(),
            mean_us: if h.is_empty() {
                0.0
            } else {
                h.mean() / 1_000.0
            },
            p50_us: us(h.value_at_quantile(0.50)),
            p90_us: us(h.value_at_quantile(0.90)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub samples: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (mean {}, {} samples)",
            format_us(self.p50_us),
            format_us(self.p90_us),
            format_us(self.p99_us),
            format_us(self.p999_us),
            format_us(self.max_us),
            format_us(self.mean_us),
            self.samples
        )
    }
}

/// `0.412 ms`, `12.3 ms`, `1.20 s`.
pub fn format_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1_000_000.0)
    } else if us >= 10_000.0 {
        format!("{:.1} ms", us / 1_000.0)
    } else {
        format!("{:.3} ms", us / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_recorded_latencies_are_ordered_and_in_microseconds() {
        let mut a = Latencies::default();
        let mut b = Latencies::default();
        for ms in 1..=100u64 {
            a.record(Duration::from_millis(ms));
        }
        b.record(Duration::from_secs(1));
        a.merge(&b);
        let p = a.percentiles();
        assert_eq!(p.samples, 101);
        // The 51st of 101 samples; hdrhistogram keeps 3 significant digits.
        assert!((p.p50_us - 51_000.0).abs() < 100.0, "{p:?}");
        assert!(p.p50_us <= p.p90_us && p.p90_us <= p.p99_us && p.p99_us <= p.p999_us);
        assert!((p.max_us - 1_000_000.0).abs() < 1_000.0, "{p:?}");
    }
}
