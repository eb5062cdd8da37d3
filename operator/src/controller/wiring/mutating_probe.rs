//! The mutating probe: how the leader sees that the API server runs the generated
//! MutatingAdmissionPolicies it wrote.
use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::mutating_policy::InProcessMutation;
use super::{MANAGED_BY_LABEL, MATCH_POLICY, Wiring};
use crate::controller::wiring::jsonpatch_cel::string_literal;

/// Name of the mutating probe's policy and binding ([`mutating_probe`]).
pub const MUTATING_PROBE_NAME: &str = "gatehouse-probe-mutating";
/// Annotation the mutating probe sets on its Lease: its token.
pub const MUTATING_PROBE_ANNOTATION: &str = "gatehouse.dev/probe";

/// The mutating probe: a policy and binding that annotate only the dry-run create of a Lease
/// named `token` (labelled with it) in `namespace`. As with the validating probe
/// ([`super::admission_policy::probe`]), the API server fills its caches of policies and
/// bindings in write order: once a probe written after the generated objects mutates its Lease,
/// the API server runs them.
pub fn mutating_probe(token: &str, namespace: &str, wiring: &Wiring) -> InProcessMutation {
    let metadata = ObjectMeta {
        name: Some(MUTATING_PROBE_NAME.to_string()),
        owner_references: wiring.owner.as_ref().map(|o| vec![o.clone()]),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        )])),
        ..ObjectMeta::default()
    };
    let token_literal = string_literal(token);
    let policy = MutatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Ignore".to_string()),
            reinvocation_policy: Some("Never".to_string()),
            match_conditions: Some(vec![
                k8s_openapi::api::admissionregistration::v1::MatchCondition {
                    name: "token".to_string(),
                    expression: format!("object.metadata.name == {token_literal}"),
                },
            ]),
            match_constraints: Some(MatchResources {
                match_policy: Some(MATCH_POLICY.to_string()),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        super::NAMESPACE_NAME_LABEL.to_string(),
                        namespace.to_string(),
                    )])),
                    match_expressions: None,
                }),
                resource_rules: Some(vec![NamedRuleWithOperations {
                    api_groups: Some(vec!["coordination.k8s.io".to_string()]),
                    api_versions: Some(vec!["v1".to_string()]),
                    operations: Some(vec!["CREATE".to_string()]),
                    resources: Some(vec!["leases".to_string()]),
                    resource_names: None,
                    scope: Some("Namespaced".to_string()),
                }]),
                ..MatchResources::default()
            }),
            mutations: Some(vec![Mutation {
                patch_type: "JSONPatch".to_string(),
                json_patch: Some(JSONPatch {
                    expression: Some(format!(
                        "[JSONPatch{{op: \"add\", path: \"/metadata/annotations\", value: {{{}: {token_literal}}}}}]",
                        string_literal(MUTATING_PROBE_ANNOTATION)
                    )),
                }),
                apply_configuration: None,
            }]),
            ..MutatingAdmissionPolicySpec::default()
        }),
    };
    let binding = MutatingAdmissionPolicyBinding {
        metadata,
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            match_resources: Some(MatchResources {
                object_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([(
                        super::admission_policy::PROBE_LABEL.to_string(),
                        token.to_string(),
                    )])),
                    match_expressions: None,
                }),
                ..MatchResources::default()
            }),
            param_ref: None,
            policy_name: Some(MUTATING_PROBE_NAME.to_string()),
        }),
    };
    InProcessMutation {
        policy,
        binding,
        members: Vec::new(),
    }
}
