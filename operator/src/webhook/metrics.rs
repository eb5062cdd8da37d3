//! The webhook's metrics: admission reviews per entry (`gatehouse_admission_*`) and each
//! Policy's part in them (`gatehouse_policy_*`). Entries are shared, so the API server's own
//! latency metrics are per entry: these say what each Policy did and cost inside them.
use std::sync::OnceLock;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::runtime::telemetry::{HistogramFamily, latency_histogram};
use gatehouse_engine::Phase;
use gatehouse_engine::chain::Evaluated;

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

/// The webhook's metric families, registered once by [`AdmissionMetrics::register`].
pub struct AdmissionMetrics {
    pub requests: Family<AdmissionLabels, Counter>,
    pub duration: HistogramFamily<AdmissionLabels>,
    pub policy_decisions: Family<DecisionLabels, Counter>,
    pub policy_evaluation: HistogramFamily<PolicyLabels>,
    pub policy_over_budget: Family<PolicyLabels, Counter>,
}

/// Evaluating one Policy takes microseconds: buckets from 10 µs, doubling, to about 5 s.
fn evaluation_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 20))
}

impl AdmissionMetrics {
    /// Registers the webhook's families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = AdmissionMetrics {
            requests: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            policy_decisions: Family::default(),
            policy_evaluation: Family::new_with_constructor(evaluation_histogram),
            policy_over_budget: Family::default(),
        };
        let admission = registry.sub_registry_with_prefix("admission");
        admission.register(
            "requests",
            "Admission reviews answered, by webhook entry, phase and decision",
            metrics.requests.clone(),
        );
        admission.register(
            "duration_seconds",
            "Time to decide an admission review, by webhook entry, phase and decision",
            metrics.duration.clone(),
        );
        let policy = registry.sub_registry_with_prefix("policy");
        policy.register(
            "decisions",
            "What each Policy did with the requests its entry received: skipped (no match), \
             allowed, patched, denied, ignored (a run-time error under failurePolicy Ignore)",
            metrics.policy_decisions.clone(),
        );
        policy.register(
            "evaluation_seconds",
            "Time to match and evaluate one Policy for one request",
            metrics.policy_evaluation.clone(),
        );
        policy.register(
            "over_budget",
            "Expressions not evaluated because, with the request's collections, their \
             estimated cost exceeded the budget (the Policy's failurePolicy decided)",
            metrics.policy_over_budget.clone(),
        );
        metrics
    }

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

/// One Policy's handles in one phase, each resolved from its family on first use and then kept
/// with the webhook store's members of a group: counting a member's part in a review then takes
/// no family lock, hashes no labels and allocates nothing, which at hundreds of members a review
/// shows in Gatehouse's CPU (`operator/benches/README.md`).
#[derive(Default)]
pub struct MemberMeters {
    /// By [`Decision`](gatehouse_engine::chain::Decision), in its declaration order.
    decisions: [OnceLock<Counter>; 5],
    evaluation: OnceLock<Histogram>,
    over_budget: OnceLock<Counter>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::telemetry::encode;

    #[test]
    fn admission_and_policy_families_are_prefixed() {
        let mut registry = Registry::with_prefix("gatehouse");
        let m = AdmissionMetrics::register(&mut registry);
        m.requests
            .get_or_create(&AdmissionLabels {
                entry: "fail-0123abcd".into(),
                phase: "validating",
                decision: "allowed",
            })
            .inc();
        m.policy_evaluation
            .get_or_create(&PolicyLabels {
                policy: "p".into(),
                phase: "mutating",
            })
            .observe(0.000_015);
        let text = encode(&registry).unwrap();
        assert!(text.contains(
            r#"gatehouse_admission_requests_total{entry="fail-0123abcd",phase="validating",decision="allowed"} 1"#
        ));
        // The first bucket is 10 µs: 15 µs lands in the second.
        assert!(text.contains(
            r#"gatehouse_policy_evaluation_seconds_bucket{le="1e-5",policy="p",phase="mutating"} 0"#
        ) || text.contains(r#"le="0.00001""#), "{text}");
    }

    #[test]
    fn members_are_counted_into_the_families_and_only_what_happened_is_created() {
        use gatehouse_engine::chain::Decision;
        use std::time::Duration;
        let policy: gatehouse_api::v1alpha1::Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "p"},
            "spec": {"match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
                     "validate": [{"expression": "true", "message": "m"}]},
        }))
        .unwrap();
        let compiled = gatehouse_engine::compile(&policy).unwrap();
        let mut registry = Registry::with_prefix("gatehouse");
        let m = AdmissionMetrics::register(&mut registry);
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
        let text = encode(&registry).unwrap();
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
