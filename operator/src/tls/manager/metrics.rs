//! The TLS manager's metrics (`gatehouse_tls_*`): what it serves, and rotation steps waiting.
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a certificate.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub cert: String,
}

/// Labels of a CA-rotation step.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RotationLabels {
    pub step: String,
}

/// The TLS manager's gauges, registered once by [`TlsMetrics::register`].
pub struct TlsMetrics {
    pub cert_not_after: Family<CertLabels, Gauge>,
    pub rotation_waiting: Family<RotationLabels, Gauge>,
}

impl TlsMetrics {
    /// Registers the manager's gauges in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = TlsMetrics {
            cert_not_after: Family::default(),
            rotation_waiting: Family::default(),
        };
        let tls = registry.sub_registry_with_prefix("tls");
        tls.register(
            "not_after_seconds",
            "Expiry (unix seconds) of the CA and serving certificate in use",
            metrics.cert_not_after.clone(),
        );
        tls.register(
            "rotation_waiting",
            "1 while a CA-rotation step (switch, drop) waits for the cluster to confirm it is safe",
            metrics.rotation_waiting.clone(),
        );
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::telemetry::{encode, registry};

    #[test]
    fn expiries_are_exported_per_certificate() {
        let mut registry = registry();
        let m = TlsMetrics::register(&mut registry);
        m.cert_not_after
            .get_or_create(&CertLabels {
                cert: "serving".into(),
            })
            .set(42);
        let text = encode(&registry).unwrap();
        assert!(
            text.contains(r#"gatehouse_tls_not_after_seconds{cert="serving"} 42"#),
            "{text}"
        );
    }
}
