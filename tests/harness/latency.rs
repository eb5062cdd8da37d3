//! Latency figures of the admission loops that tests and benchmarks run beside other work.
use std::time::Duration;

/// The 99th percentile of `samples` (sorted in place); zero for none.
pub fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples
        .get((samples.len() * 99 / 100).min(samples.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}
