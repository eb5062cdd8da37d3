//! One mutating Policy's `mutate[]` and match as the mutations of the generated
//! MutatingAdmissionPolicy ([`super::mutating_policy`]), or why it cannot run in-process: each
//! entry becomes [`jsonpatch_cel`] mutations, repeated as many passes as the engine makes at
//! most, each guarded by the Policy's match (rules, namespaceSelector, objectSelector,
//! conditions) written in CEL.
use k8s_openapi::api::admissionregistration::v1::{JSONPatch, Mutation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::controller::wiring::defaulting::{
    Footprint, independent, interacts, settles_in_one_pass,
};
use crate::controller::wiring::jsonpatch_cel::{self, string_literal};
use gatehouse_api::v1alpha1::{FailurePolicy, Operation, Policy, ReinvocationPolicy, Rule};
use gatehouse_cel as cel;

/// The mutations of one Policy, each guarded by its match, or why it cannot run in-process.
/// `footprints`: its mutations' ([`footprints_of`]); `later_overwrites`: whether a Policy after
/// it in the order overwrites.
pub fn policy_mutations(
    p: &Policy,
    footprints: &[Footprint],
    later_overwrites: bool,
) -> Result<Vec<Mutation>, String> {
    let spec = &p.spec;
    let reads = Reads {
        guarded: spec.mutate.iter().any(|m| m.when.is_some()),
        object: match_reads_object(p),
    };
    translatable(p, footprints, later_overwrites, &reads)?;
    let Reads {
        guarded,
        object: reads_object,
    } = reads;
    let mut expressions = Vec::new();
    for (i, m) in spec.mutate.iter().enumerate() {
        let translated = jsonpatch_cel::mutation_expression(m, false)
            .map_err(|e| format!("spec.mutate[{i}]: {e}"))?;
        expressions.extend(translated);
    }
    // One pass when no guard reads what another mutation writes (a single merge without a
    // per-element guard among them); otherwise as many passes as the engine makes at most.
    let single = spec.mutate.len() == 1 && !(spec.mutate[0].for_each.is_some() && guarded);
    let passes = if single || settles_in_one_pass(footprints) {
        1
    } else {
        spec.mutate.len() + 2
    };
    if reads_object && passes * expressions.len() > 1 {
        return Err(
            "spec.match: the match reads the object and the Policy has more than one mutation \
             (the API server would match each mutation against the previous one's output, the \
             webhook matches the Policy once)"
                .to_string(),
        );
    }
    let guard = match_expression(p);
    let mutation = |expression: &str| Mutation {
        patch_type: "JSONPatch".to_string(),
        json_patch: Some(JSONPatch {
            expression: Some(format!("{guard} ? ({expression}) : []")),
        }),
        apply_configuration: None,
    };
    // The API server decodes and defaults the object after every mutation, even an empty one:
    // independent merges go in one.
    if passes == 1 && expressions.len() > 1 && independent(footprints) {
        let joined: Vec<String> = expressions.iter().map(|e| format!("({e})")).collect();
        return Ok(vec![mutation(&joined.join(" + "))]);
    }
    let mut mutations = Vec::new();
    for _ in 0..passes {
        for expression in &expressions {
            mutations.push(mutation(expression));
        }
    }
    Ok(mutations)
}

/// What a Policy's translation depends on, worked out once.
struct Reads {
    /// Whether a mutation has a `when` guard.
    guarded: bool,
    /// Whether its match reads the object ([`match_reads_object`]).
    object: bool,
}

/// Why `p`'s mutations cannot run in a generated MutatingAdmissionPolicy as the webhook runs
/// them, with the field; `Ok` when nothing stands in the way of translating them.
fn translatable(
    p: &Policy,
    footprints: &[Footprint],
    later_overwrites: bool,
    reads: &Reads,
) -> Result<(), String> {
    let spec = &p.spec;
    if gatehouse_engine::policy::marks_for_effects(spec) {
        return Err(
            "spec.effects: the marking for effects runs on the webhook (its scheduling gate \
             and pool mark are not translated)"
                .to_string(),
        );
    }
    if !spec.validate.is_empty() {
        return Err(
            "spec.validate: a Policy with both mutations and validations runs on the webhook"
                .to_string(),
        );
    }
    for (i, rule) in spec.match_.rules.iter().enumerate() {
        if rule.operations.contains(&Operation::Connect) {
            return Err(format!(
                "spec.match.rules[{i}].operations: CONNECT requests carry options, not the object"
            ));
        }
        if let Some(r) = rule.resources.iter().find(|r| r.contains('/')) {
            return Err(format!(
                "spec.match.rules[{i}].resources: {r:?} is a subresource, which runs on the webhook"
            ));
        }
    }
    if spec.failure_policy == FailurePolicy::Ignore
        && (reads.guarded || !spec.match_.conditions.is_empty())
    {
        return Err(
            "spec.failurePolicy: Ignore with when guards or match conditions (the generated \
             MutatingAdmissionPolicy fails closed for all its Policies, and these can fail at \
             run time)"
                .to_string(),
        );
    }
    if spec.reinvocation_policy == ReinvocationPolicy::IfNeeded {
        let plain = spec
            .mutate
            .iter()
            .all(|m| m.for_each.is_none() && m.when.is_none() && !m.overwrite);
        if !plain || reads.object || later_overwrites {
            return Err(
                "spec.reinvocationPolicy: IfNeeded runs in-process only for plain merges (no \
                 forEach, when or overwrite), a match that does not read the object, and no \
                 overwrite in a later Policy: the generated policy is never reinvoked, so a \
                 reinvocation must be unable to change what the Policy did"
                    .to_string(),
            );
        }
    }
    // The list runs pass after pass, so every mutation may follow every other.
    for (i, earlier) in footprints.iter().enumerate() {
        for (j, later) in footprints.iter().enumerate() {
            if i != j && interacts(earlier, later) {
                return Err(format!(
                    "spec.mutate[{j}]: it reads or writes what spec.mutate[{i}] \
                     may append or create, and the API server defaults appended elements and \
                     created structs between mutations (the webhook path only after the last)"
                ));
            }
        }
    }
    Ok(())
}

/// Whether `p`'s match depends on the object, which its own mutations may change: an
/// objectSelector, a condition reading `object`, or a namespaceSelector that may judge a
/// Namespace by its own labels.
pub(super) fn match_reads_object(p: &Policy) -> bool {
    let m = &p.spec.match_;
    let conditions = m.conditions.iter().any(|c| {
        cel::compile(&c.expression).map_or(true, |program| cel::reads_variable(&program, "object"))
    });
    let namespaces = m.namespace_selector.is_some()
        && m.rules.iter().any(|r| {
            r.api_groups.iter().any(|g| g.is_empty() || g == "*")
                && r.resources
                    .iter()
                    .any(|res| res == "namespaces" || res == "*")
        });
    m.object_selector.is_some() || conditions || namespaces
}

/// `p`'s match in CEL over the admission variables, with the meaning the webhook matcher gives
/// it ([`gatehouse_engine::matcher`]).
pub fn match_expression(p: &Policy) -> String {
    let m = &p.spec.match_;
    let mut parts = vec![format!(
        "({})",
        m.rules
            .iter()
            .map(rule_expression)
            .collect::<Vec<_>>()
            .join(" || ")
    )];
    if let Some(selector) = &m.namespace_selector {
        parts.push(format!(
            "(request.resource.group == \"\" && request.resource.resource == \"namespaces\" ? {} \
             : request.namespace == \"\" || {})",
            selector_expression(selector, "object"),
            selector_expression(selector, "namespaceObject")
        ));
    }
    if let Some(selector) = &m.object_selector {
        parts.push(format!(
            "({} || (oldObject != null && {}))",
            selector_expression(selector, "object"),
            selector_expression(selector, "oldObject")
        ));
    }
    // In order, as the matcher evaluates them: an error before a false condition is an error
    // (CEL's `&&` would let the false one win).
    if !m.conditions.is_empty() {
        let mut nested = "true".to_string();
        for c in m.conditions.iter().rev() {
            nested = format!("(({}) ? {nested} : false)", c.expression);
        }
        parts.push(nested);
    }
    parts.join(" && ")
}

/// One rule: the operation, the scope, and the resource as converted (`request.resource`) or
/// as asked for (`request.requestResource`), as `matchPolicy: Equivalent` matches.
fn rule_expression(rule: &Rule) -> String {
    let listed = |values: &[String], field: &str| -> String {
        if values.iter().any(|v| v == "*") {
            return "true".to_string();
        }
        let values: Vec<String> = values.iter().map(|v| string_literal(v)).collect();
        format!("{field} in [{}]", values.join(", "))
    };
    let operations: Vec<String> = rule
        .operations
        .iter()
        .flat_map(|o| match o {
            Operation::All => vec!["CREATE", "UPDATE"],
            Operation::Create => vec!["CREATE"],
            Operation::Update => vec!["UPDATE"],
            Operation::Delete | Operation::Connect => vec![],
        })
        .map(string_literal)
        .collect();
    let scope = match rule.scope {
        gatehouse_api::v1alpha1::Scope::All => "true",
        gatehouse_api::v1alpha1::Scope::Namespaced => "request.namespace != \"\"",
        gatehouse_api::v1alpha1::Scope::Cluster => "request.namespace == \"\"",
    };
    let resource = |var: &str| {
        format!(
            "({} && {} && {})",
            listed(&rule.api_groups, &format!("{var}.group")),
            listed(&rule.api_versions, &format!("{var}.version")),
            listed(&rule.resources, &format!("{var}.resource"))
        )
    };
    format!(
        "(request.operation in [{}] && {scope} && ({} || {}))",
        operations.join(", "),
        resource("request.resource"),
        resource("request.requestResource")
    )
}

/// Whether the labels of `var` (an object variable) satisfy `selector`: matchLabels and
/// matchExpressions ANDed, an empty selector true.
fn selector_expression(selector: &LabelSelector, var: &str) -> String {
    let has = |key: &str| {
        format!(
            "(has({var}.metadata.labels) && {} in {var}.metadata.labels)",
            string_literal(key)
        )
    };
    let value = |key: &str| format!("{var}.metadata.labels[{}]", string_literal(key));
    let mut parts: Vec<String> = Vec::new();
    for (k, v) in selector.match_labels.iter().flatten() {
        parts.push(format!(
            "({} && {} == {})",
            has(k),
            value(k),
            string_literal(v)
        ));
    }
    for req in selector.match_expressions.iter().flatten() {
        let values: Vec<String> = req
            .values
            .iter()
            .flatten()
            .map(|v| string_literal(v))
            .collect();
        let listed = format!(
            "({} && {} in [{}])",
            has(&req.key),
            value(&req.key),
            values.join(", ")
        );
        parts.push(match req.operator.as_str() {
            "In" => listed,
            "NotIn" => format!("!{listed}"),
            "Exists" => has(&req.key),
            "DoesNotExist" => format!("!{}", has(&req.key)),
            _ => "false".to_string(),
        });
    }
    if parts.is_empty() {
        return "true".to_string();
    }
    format!("({})", parts.join(" && "))
}
