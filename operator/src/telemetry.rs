//! Logging and metrics. Metric names carry a prefix per subsystem (`gatehouse_admission_`,
//! `gatehouse_reconcile_`, `gatehouse_tls_`) so dashboards can tell the loops apart.
use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::engine::Phase;
use crate::engine::chain::Evaluated;

/// Labels of one admission decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// The webhook entry's id (`fail-…`, `ignore-…`, `policy/<name>`).
    pub entry: String,
    pub phase: &'static str,
    pub decision: &'static str,
}

/// Labels of one Policy's part in admission requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
    pub phase: &'static str,
}

/// Labels of one Policy's decisions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub policy: String,
    pub phase: &'static str,
    /// skipped, allowed, patched, denied, ignored.
    pub decision: &'static str,
}

/// Labels of a reconcile loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub controller: String,
}

/// Labels of a certificate.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabels {
    pub cert: String,
}

/// Labels of TLS handshakes on the webhook port.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// ok, failed (the client gave up or refused the certificate, or spoke something else),
    /// timeout.
    pub result: &'static str,
}

/// Labels of a CA-rotation step.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RotationLabels {
    pub step: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// One Policy's handles in one phase, each resolved from its family on first use and then kept
/// with the webhook store's members of a group: counting a member's part in a review then takes
/// no family lock, hashes no labels and allocates nothing, which at hundreds of members a review
/// shows in Gatehouse's CPU (`operator/benches/README.md`).
#[derive(Default)]
pub struct MemberMeters {
    /// By [`Decision`](crate::engine::chain::Decision), in its declaration order.
    decisions: [OnceLock<Counter>; 5],
    evaluation: OnceLock<Histogram>,
    over_budget: OnceLock<Counter>,
}

impl Metrics {
    /// Counts `evaluated`, one Policy's part in a review of `phase`, with that Policy's `meters`.
    pub fn record_member(&self, meters: &MemberMeters, phase: Phase, evaluated: &Evaluated<'_>) {
        let policy = evaluated.policy.name();
        let labels = || PolicyLabels {
            policy: policy.to_string(),
            phase: phase.as_str(),
        };
        let decision = evaluated.decision;
        meters.decisions[decision as usize]
            .get_or_init(|| {
                self.policy_decisions.get_or_create_owned(&DecisionLabels {
                    policy: policy.to_string(),
                    phase: phase.as_str(),
                    decision: decision.as_str(),
                })
            })
            .inc();
        if evaluated.over_budget {
            meters
                .over_budget
                .get_or_init(|| self.policy_over_budget.get_or_create_owned(&labels()))
                .inc();
        }
        meters
            .evaluation
            .get_or_init(|| self.policy_evaluation.get_or_create_owned(&labels()))
            .observe(evaluated.elapsed.as_secs_f64());
    }
}

/// Evaluating one Policy takes microseconds: buckets from 10 µs, doubling, to about 5 s.
fn evaluation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

fn latency_histogram() -> Histogram {
    // 100µs .. ~6.5s: admission answers in well under a millisecond, reconciles take longer.
    Histogram::new(exponential_buckets(0.0001, 2.0, 17))
}

/// Every metric Gatehouse exports, registered once and shared through the context.
pub struct Metrics {
    pub registry: Registry,
    pub admission_requests: Family<AdmissionLabels, Counter>,
    pub admission_duration: HistogramFamily<AdmissionLabels>,
    pub policy_decisions: Family<DecisionLabels, Counter>,
    pub policy_evaluation: HistogramFamily<PolicyLabels>,
    pub policy_over_budget: Family<PolicyLabels, Counter>,
    pub reconcile_runs: Family<ReconcileLabels, Counter>,
    pub reconcile_failures: Family<ReconcileLabels, Counter>,
    pub reconcile_duration: HistogramFamily<ReconcileLabels>,
    pub webhook_config_writes: Counter,
    pub cert_not_after: Family<CertLabels, Gauge>,
    pub tls_rotation_waiting: Family<RotationLabels, Gauge>,
    pub tls_handshakes: Family<HandshakeLabels, Counter>,
    pub leader: Gauge,
    pub ipam_allocations: Counter,
    pub ipam_orphans_collected: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("gatehouse");
        let admission_requests = Family::<AdmissionLabels, Counter>::default();
        let admission_duration: HistogramFamily<AdmissionLabels> =
            Family::new_with_constructor(latency_histogram);
        let policy_decisions = Family::<DecisionLabels, Counter>::default();
        let policy_evaluation: HistogramFamily<PolicyLabels> =
            Family::new_with_constructor(evaluation_histogram);
        let policy_over_budget = Family::<PolicyLabels, Counter>::default();
        let reconcile_runs = Family::<ReconcileLabels, Counter>::default();
        let reconcile_failures = Family::<ReconcileLabels, Counter>::default();
        let reconcile_duration: HistogramFamily<ReconcileLabels> =
            Family::new_with_constructor(latency_histogram);
        let webhook_config_writes = Counter::default();
        let cert_not_after = Family::<CertLabels, Gauge>::default();
        let tls_rotation_waiting = Family::<RotationLabels, Gauge>::default();
        let tls_handshakes = Family::<HandshakeLabels, Counter>::default();
        let leader = Gauge::default();
        let ipam_allocations = Counter::default();
        let ipam_orphans_collected = Counter::default();
        {
            let ipam = registry.sub_registry_with_prefix("ipam");
            ipam.register(
                "allocations",
                "IPAllocations created by the effects loop",
                ipam_allocations.clone(),
            );
            ipam.register(
                "orphans_collected",
                "IPAllocations deleted by garbage collection because their owner Pod was gone",
                ipam_orphans_collected.clone(),
            );
        }
        {
            let admission = registry.sub_registry_with_prefix("admission");
            admission.register(
                "requests",
                "Admission reviews answered, by webhook entry, phase and decision",
                admission_requests.clone(),
            );
            admission.register(
                "duration_seconds",
                "Time to decide an admission review, by webhook entry, phase and decision",
                admission_duration.clone(),
            );
        }
        {
            // Entries are shared, so the API server's own latency metrics are per entry: these
            // say what each Policy did and cost inside them.
            let policy = registry.sub_registry_with_prefix("policy");
            policy.register(
                "decisions",
                "What each Policy did with the requests its entry received: skipped (no match), \
                 allowed, patched, denied, ignored (a run-time error under failurePolicy Ignore)",
                policy_decisions.clone(),
            );
            policy.register(
                "evaluation_seconds",
                "Time to match and evaluate one Policy for one request",
                policy_evaluation.clone(),
            );
            policy.register(
                "over_budget",
                "Expressions not evaluated because, with the request's collections, their \
                 estimated cost exceeded the budget (the Policy's failurePolicy decided)",
                policy_over_budget.clone(),
            );
        }
        {
            let reconcile = registry.sub_registry_with_prefix("reconcile");
            reconcile.register("runs", "Reconcile runs", reconcile_runs.clone());
            reconcile.register(
                "failures",
                "Failed reconcile runs",
                reconcile_failures.clone(),
            );
            reconcile.register(
                "duration_seconds",
                "Duration of reconcile runs",
                reconcile_duration.clone(),
            );
            reconcile.register(
                "webhook_configuration_writes",
                "Server-side applies of the webhook configurations",
                webhook_config_writes.clone(),
            );
            reconcile.register(
                "leader",
                "1 while this replica leads (writes configurations and statuses), else 0",
                leader.clone(),
            );
        }
        {
            let tls = registry.sub_registry_with_prefix("tls");
            tls.register(
                "not_after_seconds",
                "Expiry (unix seconds) of the CA and serving certificate in use",
                cert_not_after.clone(),
            );
            tls.register(
                "rotation_waiting",
                "1 while a CA-rotation step (switch, drop) waits for the cluster to confirm it is safe",
                tls_rotation_waiting.clone(),
            );
            // The API server speaks HTTP/1.1 to webhooks and keeps a bounded pool of idle
            // connections: every handshake is a new connection, so a handshake rate that grows
            // with load is that pool churning (a full handshake costs both sides far more than
            // a review), and failures are a client that does not trust the serving certificate.
            tls.register(
                "handshakes",
                "TLS handshakes on the webhook port, by result (ok, failed, timeout)",
                tls_handshakes.clone(),
            );
        }
        Self {
            registry,
            admission_requests,
            admission_duration,
            policy_decisions,
            policy_evaluation,
            policy_over_budget,
            reconcile_runs,
            reconcile_failures,
            reconcile_duration,
            webhook_config_writes,
            cert_not_after,
            tls_rotation_waiting,
            tls_handshakes,
            leader,
            ipam_allocations,
            ipam_orphans_collected,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_prefixed_per_subsystem() {
        let m = Metrics::new();
        m.admission_requests
            .get_or_create(&AdmissionLabels {
                entry: "fail-0123abcd".into(),
                phase: "validating",
                decision: "allowed",
            })
            .inc();
        m.policy_decisions
            .get_or_create(&DecisionLabels {
                policy: "p".into(),
                phase: "mutating",
                decision: "patched",
            })
            .inc();
        m.policy_evaluation
            .get_or_create(&PolicyLabels {
                policy: "p".into(),
                phase: "mutating",
            })
            .observe(0.000_015);
        m.reconcile_runs
            .get_or_create(&ReconcileLabels {
                controller: "policy".into(),
            })
            .inc();
        m.cert_not_after
            .get_or_create(&CertLabels {
                cert: "serving".into(),
            })
            .set(42);
        let text = m.encode().unwrap();
        assert!(text.contains(
            r#"gatehouse_admission_requests_total{entry="fail-0123abcd",phase="validating",decision="allowed"} 1"#
        ));
        assert!(text.contains(
            r#"gatehouse_policy_decisions_total{policy="p",phase="mutating",decision="patched"} 1"#
        ));
        // The first bucket is 10 µs: 15 µs lands in the second.
        assert!(text.contains(
            r#"gatehouse_policy_evaluation_seconds_bucket{le="1e-5",policy="p",phase="mutating"} 0"#
        ) || text.contains(r#"le="0.00001""#), "{text}");
        assert!(text.contains(r#"gatehouse_reconcile_runs_total{controller="policy"} 1"#));
        assert!(text.contains(r#"gatehouse_tls_not_after_seconds{cert="serving"} 42"#));
    }

    #[test]
    fn members_are_counted_into_the_families_and_only_what_happened_is_created() {
        use crate::engine::chain::Decision;
        use std::time::Duration;
        let policy: crate::api::v1alpha1::Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
            "spec": {"match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
                     "validate": [{"expression": "true", "message": "m"}]},
        }))
        .unwrap();
        let compiled = crate::engine::compile(&policy).unwrap();
        let m = Metrics::new();
        let part = |decision, over_budget| Evaluated {
            policy: &compiled,
            member: 0,
            decision,
            over_budget,
            elapsed: Duration::from_micros(15),
        };
        let (validating, mutating) = (MemberMeters::default(), MemberMeters::default());
        m.record_member(
            &validating,
            Phase::Validating,
            &part(Decision::Denied, false),
        );
        m.record_member(
            &validating,
            Phase::Validating,
            &part(Decision::Denied, true),
        );
        m.record_member(&mutating, Phase::Mutating, &part(Decision::Skipped, false));
        let text = m.encode().unwrap();
        for line in [
            r#"gatehouse_policy_decisions_total{policy="p",phase="validating",decision="denied"} 2"#,
            r#"gatehouse_policy_decisions_total{policy="p",phase="mutating",decision="skipped"} 1"#,
            r#"gatehouse_policy_over_budget_total{policy="p",phase="validating"} 1"#,
            r#"gatehouse_policy_evaluation_seconds_count{policy="p",phase="validating"} 2"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains(r#"decision="allowed""#), "{text}");
        assert!(
            !text.contains(r#"gatehouse_policy_over_budget_total{policy="p",phase="mutating"}"#),
            "{text}"
        );
    }
}
