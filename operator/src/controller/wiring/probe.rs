//! The probes: how the leader sees that the API server enforces the generated admission
//! policies it wrote. A probe is a policy and binding acting only on the server-dry-run create
//! of a Lease named after a fresh token (and labelled with it) in Gatehouse's namespace. The API
//! server fills its caches of policies and of bindings each in write order, so once a probe
//! written after some generated objects acts on its Lease, the API server runs those objects.
use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchCondition, MatchResources, MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding, MutatingAdmissionPolicyBindingSpec,
    MutatingAdmissionPolicySpec, Mutation, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use super::admission_policy::InProcess;
use super::jsonpatch_cel::string_literal;
use super::mutating_policy::InProcessMutation;
use super::{MANAGED_BY_LABEL, MATCH_POLICY, NAMESPACE_NAME_LABEL, Wiring};

/// Name of the validating probe's policy and binding ([`probe`]).
pub const PROBE_NAME: &str = "gatehouse-probe";
/// Name of the mutating probe's policy and binding ([`mutating_probe`]).
pub const MUTATING_PROBE_NAME: &str = "gatehouse-probe-mutating";
/// Label a probe Lease carries: its token.
pub const PROBE_LABEL: &str = "gatehouse.dev/probe";
/// Annotation the mutating probe sets on its Lease: its token.
pub const MUTATING_PROBE_ANNOTATION: &str = "gatehouse.dev/probe";

/// The validating probe: denies only the dry-run create of the Lease `token` in `namespace`,
/// with [`probe_message`].
pub fn probe(token: &str, namespace: &str, wiring: &Wiring) -> InProcess {
    let metadata = meta(PROBE_NAME, wiring);
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some("Ignore".to_string()),
            match_conditions: Some(vec![named_token(token)]),
            match_constraints: Some(lease_creates(namespace)),
            validations: Some(vec![Validation {
                expression: "false".to_string(),
                message: Some(probe_message(token)),
                message_expression: None,
                reason: None,
            }]),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            match_resources: Some(labelled(token)),
            param_ref: None,
            policy_name: PROBE_NAME.to_string(),
            validation_actions: vec!["Deny".to_string()],
        },
    };
    InProcess { policy, binding }
}

/// The message the validating probe denies its Lease with.
pub fn probe_message(token: &str) -> String {
    format!("gatehouse probe {token}")
}

/// The mutating probe: annotates only the dry-run create of the Lease `token` in `namespace`
/// with [`MUTATING_PROBE_ANNOTATION`]` = token`.
pub fn mutating_probe(token: &str, namespace: &str, wiring: &Wiring) -> InProcessMutation {
    let metadata = meta(MUTATING_PROBE_NAME, wiring);
    let token_literal = string_literal(token);
    let policy = MutatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Ignore".to_string()),
            reinvocation_policy: Some("Never".to_string()),
            match_conditions: Some(vec![named_token(token)]),
            match_constraints: Some(lease_creates(namespace)),
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
            match_resources: Some(labelled(token)),
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

/// A probe object's metadata: owned by the installation like every generated object.
fn meta(name: &str, wiring: &Wiring) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        owner_references: wiring.owner.as_ref().map(|o| vec![o.clone()]),
        labels: Some(BTreeMap::from([(
            MANAGED_BY_LABEL.0.to_string(),
            MANAGED_BY_LABEL.1.to_string(),
        )])),
        ..ObjectMeta::default()
    }
}

/// The condition that only the Lease named `token` meets.
fn named_token(token: &str) -> MatchCondition {
    MatchCondition {
        name: "token".to_string(),
        expression: format!("object.metadata.name == {}", string_literal(token)),
    }
}

/// Creates of Leases in `namespace`.
fn lease_creates(namespace: &str) -> MatchResources {
    MatchResources {
        match_policy: Some(MATCH_POLICY.to_string()),
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
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
    }
}

/// What a probe binding selects: objects labelled with `token`.
fn labelled(token: &str) -> MatchResources {
    MatchResources {
        object_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                PROBE_LABEL.to_string(),
                token.to_string(),
            )])),
            match_expressions: None,
        }),
        ..MatchResources::default()
    }
}
