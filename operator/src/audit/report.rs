//! One audit pass's results gathered per Policy and scope (a namespace, or the cluster), and
//! the report objects they become: pure.
//!
//! Memory stays bounded by the cap, not by the cluster: a scope keeps its counts and at most
//! `cap` results; the summary counts every result, and a report that lists fewer says so
//! (annotation [`TRUNCATED_ANNOTATION`]).
use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::controller::wiring::MANAGED_BY_LABEL;
use gatehouse_api::reports::{
    ReportApi, ReportBody, ReportKind, ReportResult, ReportSummary, ResultKind,
};

/// Label holding the UID of the Policy a report is about (a name may be longer than a label
/// value can be).
pub const POLICY_UID_LABEL: &str = "gatehouse.dev/policy-uid";
/// Annotation naming the Policy a report is about.
pub const POLICY_ANNOTATION: &str = "gatehouse.dev/policy";
/// Annotation on a report that lists fewer results than it counts: `<listed> of <failing>`.
pub const TRUNCATED_ANNOTATION: &str = "gatehouse.dev/results-truncated";

/// Where a report is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReportLocation {
    Namespace(String),
    Cluster,
}

/// One Policy's results in one scope, so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    pub summary: ReportSummary,
    /// The failing results kept (at most the cap).
    pub results: Vec<ReportResult>,
    /// Failing results not kept.
    pub left_out: u64,
}

impl Tally {
    /// Counts one matched object's results: `held` rules passed, `failing` did not (kept, at
    /// most `cap` in all).
    pub fn add(&mut self, failing: Vec<ReportResult>, held: u64, cap: usize) {
        self.summary.pass += held;
        for r in failing {
            match r.result {
                ResultKind::Fail => self.summary.fail += 1,
                ResultKind::Warn => self.summary.warn += 1,
                ResultKind::Error => self.summary.error += 1,
                ResultKind::Pass => self.summary.pass += 1,
                ResultKind::Skip => self.summary.skip += 1,
            }
            if self.results.len() < cap {
                self.results.push(r);
            } else {
                self.left_out += 1;
            }
        }
    }

    /// The worst result of one object's failing results, for the metric (`pass` when none).
    pub fn worst(failing: &[ReportResult]) -> &'static str {
        let has = |k: ResultKind| failing.iter().any(|r| r.result == k);
        if has(ResultKind::Error) {
            "error"
        } else if has(ResultKind::Fail) {
            "fail"
        } else if has(ResultKind::Warn) {
            "warn"
        } else if has(ResultKind::Skip) {
            "skip"
        } else {
            "pass"
        }
    }
}

/// The name of Policy `policy`'s report in every scope: `gatehouse-<policy>`, or the Policy's
/// own name where the prefix would pass the 253 characters of a name.
pub fn report_name(policy: &str) -> String {
    let name = format!("gatehouse-{policy}");
    if name.len() <= gatehouse_cel::k8s_names::DNS1123_SUBDOMAIN_MAX_LENGTH {
        name
    } else {
        policy.to_string()
    }
}

/// The report object (for server-side apply), in `api`, of Policy `policy` (with `uid`) in
/// `scope`.
pub fn report_object(
    api: ReportApi,
    policy: &str,
    uid: &str,
    scope: &ReportLocation,
    tally: &Tally,
) -> Value {
    let kind = match scope {
        ReportLocation::Namespace(_) => ReportKind::Namespaced,
        ReportLocation::Cluster => ReportKind::Cluster,
    };
    let mut metadata = json!({
        "name": report_name(policy),
        "labels": {MANAGED_BY_LABEL.0: MANAGED_BY_LABEL.1, POLICY_UID_LABEL: uid},
        "annotations": {POLICY_ANNOTATION: policy},
        // Reports go with their Policy.
        "ownerReferences": [{
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "name": policy, "uid": uid,
        }],
    });
    if let ReportLocation::Namespace(ns) = scope {
        metadata["namespace"] = json!(ns);
    }
    let failing = tally.results.len() as u64 + tally.left_out;
    if tally.left_out > 0 {
        metadata["annotations"][TRUNCATED_ANNOTATION] =
            json!(format!("{} of {failing}", tally.results.len()));
    }
    let body = ReportBody {
        summary: tally.summary.clone(),
        results: tally.results.clone(),
    };
    let mut object = serde_json::to_value(body).unwrap_or_else(|_| json!({}));
    object["apiVersion"] = json!(api.api_version());
    object["kind"] = json!(api.kind(kind));
    object["metadata"] = metadata;
    object
}

/// Every scope's tally of one pass, by Policy name.
pub type Tallies = BTreeMap<String, BTreeMap<ReportLocation, Tally>>;

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::reports::{ResourceReference, Timestamp};

    fn failing(name: &str, kind: ResultKind) -> ReportResult {
        ReportResult {
            source: "gatehouse".into(),
            policy: "p".into(),
            rule: "validate[0]".into(),
            result: kind,
            severity: None,
            message: "m".into(),
            resources: vec![ResourceReference {
                name: name.into(),
                ..Default::default()
            }],
            timestamp: Timestamp::default(),
            scored: true,
            properties: BTreeMap::new(),
        }
    }

    #[test]
    fn the_summary_counts_everything_and_the_results_stop_at_the_cap() {
        let mut tally = Tally::default();
        tally.add(vec![], 1, 2);
        tally.add(vec![failing("a", ResultKind::Warn)], 0, 2);
        tally.add(vec![failing("b", ResultKind::Fail)], 0, 2);
        tally.add(
            vec![
                failing("c", ResultKind::Warn),
                failing("c", ResultKind::Error),
            ],
            0,
            2,
        );
        assert_eq!(
            tally.summary,
            ReportSummary {
                pass: 1,
                fail: 1,
                warn: 2,
                error: 1,
                skip: 0
            }
        );
        assert_eq!(tally.results.len(), 2);
        assert_eq!(tally.left_out, 2);
        let report = report_object(
            ReportApi::Wgpolicyk8s,
            "p",
            "uid-1",
            &ReportLocation::Namespace("ns".into()),
            &tally,
        );
        assert_eq!(report["apiVersion"], "wgpolicyk8s.io/v1alpha2");
        assert_eq!(report["kind"], "PolicyReport");
        assert_eq!(report["metadata"]["namespace"], "ns");
        assert_eq!(report["metadata"]["name"], "gatehouse-p");
        assert_eq!(
            report["metadata"]["annotations"][TRUNCATED_ANNOTATION],
            "2 of 4"
        );
        assert_eq!(report["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(report["summary"]["warn"], 2);
        assert_eq!(report["results"][1]["resources"][0]["name"], "b");
        let cluster = report_object(
            ReportApi::Openreports,
            "p",
            "uid-1",
            &ReportLocation::Cluster,
            &Tally::default(),
        );
        assert_eq!(cluster["apiVersion"], "openreports.io/v1alpha1");
        assert_eq!(cluster["kind"], "ClusterReport");
        assert!(cluster["metadata"].get("namespace").is_none());
        assert_eq!(cluster["metadata"]["annotations"][POLICY_ANNOTATION], "p");
        assert!(
            cluster["metadata"]["annotations"]
                .get(TRUNCATED_ANNOTATION)
                .is_none()
        );
        assert_eq!(cluster["metadata"]["labels"][POLICY_UID_LABEL], "uid-1");
    }

    #[test]
    fn the_worst_result_names_the_metric() {
        assert_eq!(Tally::worst(&[]), "pass");
        assert_eq!(
            Tally::worst(&[
                failing("a", ResultKind::Warn),
                failing("a", ResultKind::Fail)
            ]),
            "fail"
        );
    }
}
