//! Policies → the ValidatingAdmissionPolicy and binding the API server runs in-process, when
//! that gives exactly the webhook's answer; otherwise the reason it would not.
//!
//! What the API server does differently, and so what keeps a Policy on the webhook:
//! - a binding has one set of actions for all of a policy's validations, and Deny with Warn
//!   together is refused: a Policy mixing Deny and Warn rules stays on the webhook;
//! - a Warn rule never refuses, on either path: under a Warn binding an expression that fails
//!   at run time only warns, and so does the engine's Warn rule (whatever `failurePolicy` says);
//! - a validation's message may not hold a line break (nor be blank);
//! - mutations, and the marking for effects, are not validations.
//!
//! Everything else maps one to one: rules (with `matchPolicy: Equivalent`), the namespaceSelector
//! with the system exclusion ANDed in, the objectSelector, `match.conditions` (with `authorizer`),
//! `failurePolicy`, and each rule (in order) as a validation whose denial is `Forbidden` (403),
//! as the webhook's is.
use std::collections::BTreeMap;

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, NamedRuleWithOperations, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding, ValidatingAdmissionPolicyBindingSpec,
    ValidatingAdmissionPolicySpec, Validation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{MANAGED_BY_LABEL, MATCH_POLICY, Wiring, match_conditions, namespace_selector, rules};
use gatehouse_api::v1alpha1::{Enforcement, Policy, PolicySpec, ValidationAction};
use gatehouse_engine::group::fnv1a;

/// Prefix of every generated object's name.
pub const GENERATED_PREFIX: &str = "gatehouse-";
/// Annotation on a generated object: the Policy it was generated from.
pub const POLICY_ANNOTATION: &str = "gatehouse.dev/policy";
/// Label on every generated object (beside [`MANAGED_BY_LABEL`]), so a watch can select them.
pub const GENERATED_LABEL: (&str, &str) = ("gatehouse.dev/generated", "validating");
/// Longest name the API server accepts (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The objects that enforce one Policy in-process.
#[derive(Clone, Debug, PartialEq)]
pub struct InProcess {
    pub policy: ValidatingAdmissionPolicy,
    pub binding: ValidatingAdmissionPolicyBinding,
}

/// The name of the objects generated for the Policy `policy`: `gatehouse-<policy>`, or, past
/// the API server's length limit, a prefix of that and a hash of the whole name.
pub fn generated_name(policy: &str) -> String {
    let full = format!("{GENERATED_PREFIX}{policy}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let hash = format!("{:08x}", fnv1a(policy.as_bytes()) as u32);
    // Policy names are DNS subdomains (ASCII), so any byte index is a character boundary.
    let mut head = full[..MAX_NAME - hash.len() - 1].to_string();
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    format!("{head}-{hash}")
}

/// The ValidatingAdmissionPolicy and binding that enforce `p` in the API server, or why they
/// would not give exactly the webhook's answers.
pub fn validating_admission_policy(p: &Policy, wiring: &Wiring) -> Result<InProcess, String> {
    let action = in_process_action(&p.spec)?;
    let spec = &p.spec;
    let name = generated_name(p.metadata.name.as_deref().unwrap_or_default());
    let metadata = generated_meta(&name, p, wiring);
    let validations = spec
        .validate
        .iter()
        .map(|rule| Validation {
            expression: rule.expression.clone(),
            message: Some(rule.message.clone()),
            message_expression: None,
            reason: Some("Forbidden".to_string()),
        })
        .collect();
    let policy = ValidatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(ValidatingAdmissionPolicySpec {
            failure_policy: Some(spec.failure_policy.as_str().to_string()),
            match_conditions: match_conditions(p),
            match_constraints: Some(match_constraints(p, wiring)),
            validations: Some(validations),
            ..ValidatingAdmissionPolicySpec::default()
        }),
        status: None,
    };
    let actions = match action {
        ValidationAction::Deny => "Deny",
        ValidationAction::Warn => "Warn",
    };
    let binding = ValidatingAdmissionPolicyBinding {
        metadata,
        spec: ValidatingAdmissionPolicyBindingSpec {
            match_resources: None,
            param_ref: None,
            policy_name: name,
            validation_actions: vec![actions.to_string()],
        },
    };
    Ok(InProcess { policy, binding })
}

/// The action all of `spec`'s rules share, when the Policy can be a ValidatingAdmissionPolicy;
/// otherwise why not, with the field.
fn in_process_action(spec: &PolicySpec) -> Result<ValidationAction, String> {
    if !spec.mutate.is_empty() {
        return Err(
            "spec.mutate: a Policy with mutations runs on the webhook (in-process enforcement \
             covers validation only)"
                .to_string(),
        );
    }
    if gatehouse_engine::policy::marks_for_effects(spec) {
        return Err(
            "spec.effects: marking objects for effects is a mutation, which runs on the webhook"
                .to_string(),
        );
    }
    let Some(first) = spec.validate.first() else {
        return Err("spec.validate: no validation rules to run in-process".to_string());
    };
    let action = first.action;
    if let Some(i) = spec.validate.iter().position(|r| r.action != action) {
        return Err(format!(
            "spec.validate[{i}].action: the Policy mixes Deny and Warn rules, and the API server \
             binds all of a policy's validations to one action"
        ));
    }
    if let Some(i) = spec
        .validate
        .iter()
        .position(|r| r.message.contains(['\n', '\r']) || r.message.trim().is_empty())
    {
        return Err(format!(
            "spec.validate[{i}].message: a ValidatingAdmissionPolicy's message may not be blank \
             or hold a line break"
        ));
    }
    Ok(action)
}

/// The generated policy's match constraints: the Policy's rules and selectors, the exclusion
/// ANDed into its namespaceSelector.
fn match_constraints(p: &Policy, wiring: &Wiring) -> MatchResources {
    let spec = &p.spec;
    MatchResources {
        exclude_resource_rules: None,
        match_policy: Some(MATCH_POLICY.to_string()),
        namespace_selector: Some(namespace_selector(
            spec.match_.namespace_selector.as_ref(),
            &wiring.excluded_namespaces,
        )),
        object_selector: Some(spec.match_.object_selector.clone().unwrap_or_default()),
        resource_rules: Some(
            rules(&spec.match_.rules)
                .into_iter()
                .map(|r| NamedRuleWithOperations {
                    api_groups: r.api_groups,
                    api_versions: r.api_versions,
                    operations: r.operations,
                    resource_names: None,
                    resources: r.resources,
                    scope: r.scope,
                })
                .collect(),
        ),
    }
}

fn generated_meta(name: &str, p: &Policy, wiring: &Wiring) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        owner_references: wiring.owner.as_ref().map(|o| vec![o.clone()]),
        labels: Some(BTreeMap::from([
            (
                MANAGED_BY_LABEL.0.to_string(),
                MANAGED_BY_LABEL.1.to_string(),
            ),
            (GENERATED_LABEL.0.to_string(), GENERATED_LABEL.1.to_string()),
        ])),
        annotations: Some(BTreeMap::from([(
            POLICY_ANNOTATION.to_string(),
            p.metadata.name.clone().unwrap_or_default(),
        )])),
        ..ObjectMeta::default()
    }
}

/// Where one valid Policy runs.
#[derive(Clone, Debug, PartialEq)]
pub enum Placement {
    /// In the API server, as these objects.
    InProcess(Box<InProcess>),
    /// In the API server, as a member of the generated MutatingAdmissionPolicy of this name
    /// ([`super::mutating_policy`]).
    InProcessMutating(String),
    /// On the webhook, and why not in-process.
    Webhook(String),
    /// Nowhere: `enforcement: InProcess` and this is why it cannot be.
    Refused(String),
}

/// Where `p` runs: `vap_served` says whether the API server serves
/// admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy.
pub fn place(p: &Policy, wiring: &Wiring, vap_served: bool) -> Placement {
    let required = match p.spec.enforcement {
        Enforcement::Webhook => {
            return Placement::Webhook("spec.enforcement is Webhook".to_string());
        }
        Enforcement::Auto => false,
        Enforcement::InProcess => true,
    };
    let generated = if vap_served {
        validating_admission_policy(p, wiring)
    } else {
        Err(
            "the API server does not serve admissionregistration.k8s.io/v1 \
             ValidatingAdmissionPolicy"
                .to_string(),
        )
    };
    match generated {
        Ok(objects) => Placement::InProcess(Box::new(objects)),
        Err(reason) if required => Placement::Refused(reason),
        Err(reason) => Placement::Webhook(reason),
    }
}

/// What the API server's type checking (kube-controller-manager's
/// validatingadmissionpolicy-status controller) warns of a stored generated policy at its
/// current generation, if anything: each expression's warning with its field.
pub fn type_check_warnings(stored: &ValidatingAdmissionPolicy) -> Option<String> {
    let status = stored.status.as_ref()?;
    if status.observed_generation != stored.metadata.generation {
        return None;
    }
    let warnings = status
        .type_checking
        .as_ref()?
        .expression_warnings
        .as_ref()?;
    let text: Vec<String> = warnings
        .iter()
        .map(|w| format!("{}: {}", w.field_ref, w.warning))
        .collect();
    (!text.is_empty()).then(|| {
        format!(
            "the API server's type checking of ValidatingAdmissionPolicy {}: {}",
            stored.metadata.name.as_deref().unwrap_or_default(),
            text.join("; ")
        )
    })
}

#[cfg(test)]
mod tests;
