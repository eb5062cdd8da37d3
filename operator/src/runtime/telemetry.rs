//! Logging, and what the subsystems' metrics share. Each subsystem registers its own families
//! in the process's one [`Registry`] (prefix `gatehouse`), under a prefix of its own
//! (`gatehouse_admission_`, `gatehouse_policy_`, `gatehouse_reconcile_`, `gatehouse_tls_`,
//! `gatehouse_ipam_`) so dashboards can tell the loops apart.
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A family of histograms made by a constructor function.
pub type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Latencies from 100 µs, doubling, to about 6.5 s: admission answers in well under a
/// millisecond, reconciles take longer.
pub fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// The registry every subsystem registers its metrics in.
pub fn registry() -> Registry {
    Registry::with_prefix("gatehouse")
}

/// The OpenMetrics text exposition of `registry`.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// Installs the tracing subscriber: human-readable by default, JSON when asked for.
pub fn init_logging(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colour only for a person at a terminal; log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // A second init (tests) is harmless; ignore it.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
