//! `PolicyException`: the platform's word that a rule does not apply to some workloads.
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type on a PolicyException: whether Gatehouse honours it.
pub const HONOURED_CONDITION: &str = "Honoured";
/// The versions PolicyException is served at beside `v1alpha1` (its storage version), with the
/// same schema: Gatehouse judges the stored object, so whichever version an exception was sent
/// under, the same namespace rule holds.
pub const EXCEPTION_EXTRA_VERSIONS: &[&str] = &["v1beta1"];

/// A PolicyException exempts the requests it matches from the Policies it names (or from some
/// of their validate rules). Gatehouse honours it only from the namespaces its operator lists
/// (`--exception-namespaces`, by default Gatehouse's own namespace): written anywhere else it
/// changes nothing, and its `Honoured` condition says why. Honoured exceptions apply wherever
/// the Policy runs (webhook or in-process) and in the audit, whose result for an exempted object
/// is `skip`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "PolicyException",
    plural = "policyexceptions",
    shortname = "gpolex",
    namespaced,
    status = "PolicyExceptionStatus",
    doc = "A PolicyException: requests exempted from some Policies, honoured only from the namespaces the platform allows.",
    printcolumn = r#"{"name":"Policies","type":"string","jsonPath":".spec.policies"}"#,
    printcolumn = r#"{"name":"Honoured","type":"string","jsonPath":".status.conditions[?(@.type==\"Honoured\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Honoured\")].reason"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PolicyExceptionSpec {
    /// Names of the Policies the matched requests are exempted from.
    #[schemars(length(min = 1))]
    pub policies: Vec<String>,

    /// Indexes into each named Policy's `validate` list: only these rules are exempted. Absent:
    /// the whole Policy (its mutations too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(range(min = 0)))]
    pub rules: Vec<i32>,

    /// The requests exempted: every field given must match.
    #[serde(rename = "match")]
    pub match_: ExceptionMatch,
}

/// Which requests a PolicyException exempts. At least one field must be given.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new(
        "(has(self.namespaces) && size(self.namespaces) > 0) || (has(self.names) && size(self.names) > 0) || (has(self.objectSelector) && ((has(self.objectSelector.matchLabels) && size(self.objectSelector.matchLabels) > 0) || (has(self.objectSelector.matchExpressions) && size(self.objectSelector.matchExpressions) > 0)))"
    )
        .message("a PolicyException must match something: give namespaces, names or a non-empty objectSelector")
)]
pub struct ExceptionMatch {
    /// Namespaces of the exempted objects (any namespace when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Names of the exempted objects (any name when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Only objects whose labels match: the new object's or, on DELETE, the old one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,
}

/// Observed state of a PolicyException.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyExceptionStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Honoured`: whether Gatehouse applies this exception, and if not, why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// The PolicyException CRD: `v1alpha1` stored, and served at [`EXCEPTION_EXTRA_VERSIONS`] too.
pub fn policy_exception_crd() -> CustomResourceDefinition {
    let mut crd = PolicyException::crd();
    let Some(stored) = crd.spec.versions.first().cloned() else {
        return crd;
    };
    for version in EXCEPTION_EXTRA_VERSIONS {
        let mut served = stored.clone();
        served.name = (*version).to_string();
        served.storage = false;
        crd.spec.versions.push(served);
    }
    crd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_at_every_version_stored_at_one() {
        let crd = policy_exception_crd();
        let versions: Vec<(&str, bool, bool)> = crd
            .spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(
            versions,
            [("v1alpha1", true, true), ("v1beta1", true, false)]
        );
        assert_eq!(crd.spec.scope, "Namespaced");
    }
}
