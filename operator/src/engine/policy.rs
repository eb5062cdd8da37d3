//! Validation and compilation of Policies.
//!
//! [`validate`] is the single judge of what a valid Policy is: the Policy admission webhook, the
//! controller (which writes the problems into status) and `gatehouse eval` all call it, so a
//! Policy is never accepted by one and rejected by another. It reports every problem at once,
//! each with the field path a user has to edit.
use std::collections::BTreeSet;
use std::fmt;

use ::cel::Program;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;

use super::cel::{self, Expression, Site};
use super::entry::ENTRY_SUFFIX;
use super::k8s_names::{
    DNS1123_SUBDOMAIN_MAX_LENGTH, dns1123_subdomain_form_error, has_dns1123_subdomain_form,
    is_dns1123_subdomain, is_label_value, is_qualified_name,
};
use super::merge::is_valid_path;
use crate::api::v1alpha1::{
    DEFAULT_IPAM_ANNOTATION, IpamEffect, Operation, Policy, PolicySpec, ReinvocationPolicy,
};
use gatehouse_ipam::annotation::{IPAM_ADDRESS_ANNOTATION, IPAM_POOL_ANNOTATION};

/// The API server refuses a webhook entry with more match conditions than this.
pub const MAX_MATCH_CONDITIONS: usize = 64;

/// One thing wrong with a Policy, at a field path such as `spec.validate[0].expression`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl Problem {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        Problem {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// A Policy that [`compile`] refused, with every problem [`validate`] found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPolicy {
    pub problems: Vec<Problem>,
}

impl fmt::Display for InvalidPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid Policy: ")?;
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                write!(f, "; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// A valid Policy with its CEL compiled, shared by every review of its generation.
///
/// `Send + Sync` (asserted in the tests): `cel::Program` is plain AST data, and the CEL
/// environment lives in a process-wide static, so the webhook server can hand
/// `Arc<CompiledPolicy>` to any task.
#[derive(Debug)]
pub struct CompiledPolicy {
    name: String,
    generation: Option<i64>,
    spec: PolicySpec,
    /// `spec.match.conditions[i]`.
    pub(crate) conditions: Vec<Expression>,
    /// `spec.mutate[i].when`.
    pub(crate) whens: Vec<Option<Expression>>,
    /// `spec.validate[i].expression`.
    pub(crate) validations: Vec<Expression>,
    /// A match condition reads `authorizer`: see [`needs_own_entry`].
    own_entry: bool,
    /// The largest write-time cost estimate among its expressions ([`super::cost`]).
    heaviest: u64,
}

impl CompiledPolicy {
    /// `metadata.name`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `metadata.generation` this was compiled from.
    pub fn generation(&self) -> Option<i64> {
        self.generation
    }

    /// The spec this was compiled from.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// Whether the Policy has a `mutate` list.
    pub fn has_mutations(&self) -> bool {
        !self.spec.mutate.is_empty()
    }

    /// The IPAM effect, if any (validation allows at most one).
    pub fn ipam(&self) -> Option<&IpamEffect> {
        self.spec.effects.iter().find_map(|e| e.ipam.as_ref())
    }

    /// Whether the Policy belongs in the MutatingWebhookConfiguration: it mutates, or it marks
    /// objects for the effects loop.
    pub fn is_mutating(&self) -> bool {
        is_mutating(&self.spec)
    }

    /// Whether the Policy belongs in the ValidatingWebhookConfiguration.
    pub fn has_validations(&self) -> bool {
        !self.spec.validate.is_empty()
    }

    /// Whether one of its expressions may cost more than [`super::cost::HEAVY`] at the assumed
    /// collection size: its reviews take turns on a few threads, so that cheap ones never wait
    /// for a CPU behind them.
    pub fn is_heavy(&self) -> bool {
        self.heaviest > super::cost::HEAVY
    }
}

/// Whether a Policy with this spec needs a mutating entry.
pub fn is_mutating(spec: &PolicySpec) -> bool {
    !spec.mutate.is_empty() || !spec.effects.is_empty()
}

/// The match-condition variable only the API server can evaluate.
pub const AUTHORIZER: &str = "authorizer";

/// Whether `spec` needs a webhook entry of its own: a match condition reads `authorizer`, which
/// only the API server can evaluate, so the API server must match this Policy itself instead of
/// Gatehouse matching it inside a shared entry ([`super::group`]).
pub fn needs_own_entry(spec: &PolicySpec) -> bool {
    spec.match_
        .conditions
        .iter()
        .any(|c| cel::compile(&c.expression).is_ok_and(|p| cel::reads_variable(&p, AUTHORIZER)))
}

impl super::group::Member for CompiledPolicy {
    fn name(&self) -> &str {
        &self.name
    }
    fn spec(&self) -> &PolicySpec {
        &self.spec
    }
    fn needs_own_entry(&self) -> bool {
        self.own_entry
    }
}

impl super::group::Member for Policy {
    fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
    fn spec(&self) -> &PolicySpec {
        &self.spec
    }
    fn needs_own_entry(&self) -> bool {
        needs_own_entry(&self.spec)
    }
}

/// References and `Arc`s of members are members.
impl<T> super::group::Member for T
where
    T: std::ops::Deref,
    T::Target: super::group::Member,
{
    fn name(&self) -> &str {
        (**self).name()
    }
    fn spec(&self) -> &PolicySpec {
        (**self).spec()
    }
    fn needs_own_entry(&self) -> bool {
        (**self).needs_own_entry()
    }
}

/// Every problem of `policy`; empty means valid.
pub fn validate(policy: &Policy) -> Vec<Problem> {
    analyse(policy).0
}

/// Validates `policy` and compiles its CEL once.
pub fn compile(policy: &Policy) -> Result<CompiledPolicy, InvalidPolicy> {
    match analyse(policy) {
        (problems, Some(programs)) if problems.is_empty() => Ok(CompiledPolicy {
            name: policy.name_any(),
            generation: policy.metadata.generation,
            spec: policy.spec.clone(),
            own_entry: programs
                .conditions
                .iter()
                .any(|p| cel::reads_variable(p, AUTHORIZER)),
            heaviest: programs
                .conditions
                .iter()
                .chain(programs.whens.iter().flatten())
                .chain(&programs.validations)
                .map(|p| super::cost::estimate(p, super::cost::ASSUMED_COLLECTION_SIZE))
                .max()
                .unwrap_or(0),
            conditions: expressions(programs.conditions),
            whens: programs
                .whens
                .into_iter()
                .map(|when| when.map(Expression::new))
                .collect(),
            validations: expressions(programs.validations),
        }),
        // An expression that does not compile always leaves a problem behind.
        (problems, _) => Err(InvalidPolicy { problems }),
    }
}

fn expressions(programs: Vec<Program>) -> Vec<Expression> {
    programs.into_iter().map(Expression::new).collect()
}

struct Programs {
    conditions: Vec<Program>,
    whens: Vec<Option<Program>>,
    validations: Vec<Program>,
}

/// The checks, compiling each expression on the way: the programs are only returned when every
/// expression compiled.
///
/// Whatever the wiring copies into a webhook entry (the name, rules, selectors, match conditions,
/// timeout) is held to the API server's own rules for that entry: the API server judges the
/// configuration as a whole, so one Policy it would refuse would take every Policy's entry down.
fn analyse(policy: &Policy) -> (Vec<Problem>, Option<Programs>) {
    let spec = &policy.spec;
    let mut problems = Vec::new();
    check_name(
        policy.metadata.name.as_deref().unwrap_or_default(),
        &mut problems,
    );
    if spec.mutate.is_empty() && spec.validate.is_empty() && spec.effects.is_empty() {
        problems.push(Problem::new(
            "spec",
            "at least one of mutate, validate or effects must be set",
        ));
    }
    check_effects(spec, &mut problems);
    if !(1..=30).contains(&spec.timeout_seconds) {
        problems.push(Problem::new(
            "spec.timeoutSeconds",
            format!("must be between 1 and 30, got {}", spec.timeout_seconds),
        ));
    }
    if spec.reinvocation_policy == ReinvocationPolicy::IfNeeded && spec.mutate.is_empty() {
        problems.push(Problem::new(
            "spec.reinvocationPolicy",
            "IfNeeded is only meaningful for mutating policies (spec.mutate is empty)",
        ));
    }
    check_rules(spec, &mut problems);
    for (field, selector) in [
        ("namespaceSelector", &spec.match_.namespace_selector),
        ("objectSelector", &spec.match_.object_selector),
    ] {
        if let Some(selector) = selector {
            check_selector(&format!("spec.match.{field}"), selector, &mut problems);
        }
    }

    let mut all_compiled = true;
    let mut names = BTreeSet::new();
    let mut conditions = Vec::new();
    if spec.match_.conditions.len() > MAX_MATCH_CONDITIONS {
        problems.push(Problem::new(
            "spec.match.conditions",
            format!(
                "must have at most {MAX_MATCH_CONDITIONS} items, got {}",
                spec.match_.conditions.len()
            ),
        ));
    }
    for (i, condition) in spec.match_.conditions.iter().enumerate() {
        let path = format!("spec.match.conditions[{i}]");
        if condition.name.trim().is_empty() {
            problems.push(Problem::new(format!("{path}.name"), "must not be empty"));
        } else {
            check_qualified_name(&format!("{path}.name"), &condition.name, &mut problems);
            if !names.insert(condition.name.as_str()) {
                problems.push(Problem::new(
                    format!("{path}.name"),
                    format!("duplicate condition name {:?}", condition.name),
                ));
            }
        }
        let path = format!("{path}.expression");
        match check_expression(
            &path,
            &condition.expression,
            Site::MatchCondition,
            &mut problems,
        ) {
            Some(p) => conditions.push(p),
            None => all_compiled = false,
        }
    }

    let mut whens = Vec::new();
    for (i, mutation) in spec.mutate.iter().enumerate() {
        let path = format!("spec.mutate[{i}]");
        if !mutation.merge.is_object() {
            problems.push(Problem::new(
                format!("{path}.merge"),
                format!("must be a JSON object, got {}", json_type(&mutation.merge)),
            ));
        }
        if let Some(for_each) = &mutation.for_each {
            if mutation.merge.get("name").is_some() {
                problems.push(Problem::new(
                    format!("{path}.merge.name"),
                    "a forEach merge must not set or remove name: array elements are merged by \
                     name, so renaming them would never settle",
                ));
            }
            if !is_valid_path(for_each) {
                problems.push(Problem::new(
                    format!("{path}.forEach"),
                    format!(
                        "{for_each:?} is not a dotted path of non-empty [A-Za-z0-9_-] segments, \
                         e.g. spec.containers"
                    ),
                ));
            }
        }
        match &mutation.when {
            None => whens.push(None),
            Some(when) => {
                let site = Site::When {
                    for_each: mutation.for_each.is_some(),
                };
                match check_expression(&format!("{path}.when"), when, site, &mut problems) {
                    Some(p) => whens.push(Some(p)),
                    None => all_compiled = false,
                }
            }
        }
    }

    let mut validations = Vec::new();
    for (i, rule) in spec.validate.iter().enumerate() {
        let path = format!("spec.validate[{i}]");
        if rule.message.trim().is_empty() {
            problems.push(Problem::new(format!("{path}.message"), "must not be empty"));
        }
        let path = format!("{path}.expression");
        match check_expression(&path, &rule.expression, Site::Validation, &mut problems) {
            Some(p) => validations.push(p),
            None => all_compiled = false,
        }
    }

    let programs = all_compiled.then_some(Programs {
        conditions,
        whens,
        validations,
    });
    (problems, programs)
}

/// Compiles one expression and checks its variables; `None` when it does not compile.
fn check_expression(
    path: &str,
    source: &str,
    site: Site,
    problems: &mut Vec<Problem>,
) -> Option<Program> {
    if source.trim().is_empty() {
        problems.push(Problem::new(path, "must not be empty"));
        return None;
    }
    match cel::compile(source) {
        Ok(program) => {
            for unknown in cel::unknown_variables(&program, site) {
                let hint = if unknown == "element" {
                    " (element is only bound in the when of a mutation with forEach)".to_string()
                } else {
                    format!(" (known: {})", site.variables().join(", "))
                };
                problems.push(Problem::new(
                    path,
                    format!("unknown variable {unknown:?}{hint}"),
                ));
            }
            match cel::unknown_functions(&program, site) {
                Ok(unknown) => {
                    for name in unknown {
                        problems.push(Problem::new(
                            path,
                            format!(
                                "unknown function {name:?}: Gatehouse's CEL environment does not declare it, so the expression would fail on every request"
                            ),
                        ));
                    }
                }
                Err(e) => problems.push(Problem::new(path, e.to_string())),
            }
            for invalid in cel::regex::invalid_constant_patterns(&program) {
                problems.push(Problem::new(path, invalid));
            }
            for type_error in cel::types::type_errors(&program) {
                problems.push(Problem::new(path, type_error));
            }
            if let Err(too_costly) = super::cost::check(&program) {
                let shown: String = source.chars().take(120).collect();
                let ellipsis = if shown.len() < source.len() {
                    "…"
                } else {
                    ""
                };
                problems.push(Problem::new(
                    path,
                    format!("{too_costly}: {shown}{ellipsis}"),
                ));
            }
            Some(program)
        }
        Err(e) => {
            problems.push(Problem::new(path, e.to_string()));
            None
        }
    }
}

/// The Policy name becomes the webhook entry name `<name>.gatehouse.dev` (and a path segment of
/// the webhook URL), which the API server requires to be a DNS-1123 subdomain of at most 253
/// characters. The suffix is such a subdomain itself, so the entry name is valid exactly when the
/// Policy name is one and leaves room for the suffix; judging the name keeps the message about
/// what the user wrote. The API server already holds a Policy name to the form, but not to the
/// shorter length.
fn check_name(name: &str, problems: &mut Vec<Problem>) {
    const PATH: &str = "metadata.name";
    if name.is_empty() {
        problems.push(Problem::new(PATH, "must not be empty"));
        return;
    }
    let max = DNS1123_SUBDOMAIN_MAX_LENGTH - ENTRY_SUFFIX.len();
    if name.len() > max {
        problems.push(Problem::new(
            PATH,
            format!(
                "must be no more than {max} characters, got {}: the webhook entry name \
                 <name>{ENTRY_SUFFIX} must be no more than {DNS1123_SUBDOMAIN_MAX_LENGTH} \
                 characters",
                name.len()
            ),
        ));
    }
    if !has_dns1123_subdomain_form(name) {
        problems.push(Problem::new(
            PATH,
            format!(
                "{name:?} would make the webhook entry name {name}{ENTRY_SUFFIX} invalid: {}",
                dns1123_subdomain_form_error()
            ),
        ));
    }
}

/// Effects: each names exactly one kind; IPAM at most once, from a pool with a valid object
/// name, to a valid annotation key, and only where a rule can match Pod creation (the only
/// request admission marks).
fn check_effects(spec: &PolicySpec, problems: &mut Vec<Problem>) {
    let mut ipams = 0;
    for (i, effect) in spec.effects.iter().enumerate() {
        let path = format!("spec.effects[{i}]");
        let Some(ipam) = &effect.ipam else {
            problems.push(Problem::new(path, "must set one effect (ipam)"));
            continue;
        };
        ipams += 1;
        if ipams == 2 {
            problems.push(Problem::new(
                format!("{path}.ipam"),
                "a Policy allocates at most one address: only one ipam effect is allowed",
            ));
        }
        if let Err(messages) = is_dns1123_subdomain(&ipam.pool) {
            for message in messages {
                problems.push(Problem::new(
                    format!("{path}.ipam.pool"),
                    format!("{:?} is not an IPPool name: {message}", ipam.pool),
                ));
            }
        }
        if let Some(annotation) = &ipam.annotation {
            check_qualified_name(&format!("{path}.ipam.annotation"), annotation, problems);
            if [IPAM_ADDRESS_ANNOTATION, IPAM_POOL_ANNOTATION].contains(&annotation.as_str()) {
                problems.push(Problem::new(
                    format!("{path}.ipam.annotation"),
                    format!(
                        "{annotation:?} is Gatehouse's own (what the node's CNI plugin reads): \
                         name another annotation, or leave it out for {DEFAULT_IPAM_ANNOTATION}"
                    ),
                ));
            }
        }
        let creates_pods = spec.match_.rules.iter().any(|r| {
            r.operations
                .iter()
                .any(|o| matches!(o, Operation::Create | Operation::All))
                && r.api_groups.iter().any(|g| g.is_empty() || g == "*")
                && r.resources.iter().any(|res| res == "pods" || res == "*")
        });
        if !creates_pods {
            problems.push(Problem::new(
                format!("{path}.ipam"),
                "allocates to Pods on CREATE, but no rule of spec.match.rules matches Pod creation",
            ));
        }
    }
}

/// A label key or match-condition name; the caller has already refused an empty one.
fn check_qualified_name(path: &str, name: &str, problems: &mut Vec<Problem>) {
    check_k8s_name(path, name, "qualified name", is_qualified_name, problems);
}

fn check_label_value(path: &str, value: &str, problems: &mut Vec<Problem>) {
    check_k8s_name(path, value, "label value", is_label_value, problems);
}

/// One problem at `path` for each message the Kubernetes validator `validate` gives `value`,
/// saying which kind of name (`what`) it is not.
fn check_k8s_name(
    path: &str,
    value: &str,
    what: &str,
    validate: fn(&str) -> Result<(), Vec<String>>,
    problems: &mut Vec<Problem>,
) {
    if let Err(messages) = validate(value) {
        for message in messages {
            problems.push(Problem::new(
                path,
                format!("{value:?} is not a valid {what}: {message}"),
            ));
        }
    }
}

fn check_rules(spec: &PolicySpec, problems: &mut Vec<Problem>) {
    if spec.match_.rules.is_empty() {
        problems.push(Problem::new("spec.match.rules", "must not be empty"));
    }
    for (i, rule) in spec.match_.rules.iter().enumerate() {
        let path = format!("spec.match.rules[{i}]");
        if rule.operations.is_empty() {
            problems.push(Problem::new(
                format!("{path}.operations"),
                "must not be empty",
            ));
        } else if rule.operations.contains(&Operation::All) && rule.operations.len() > 1 {
            problems.push(Problem::new(
                format!("{path}.operations"),
                "\"*\" already means every operation: list nothing else",
            ));
        }
        for (field, list) in [
            ("apiGroups", &rule.api_groups),
            ("apiVersions", &rule.api_versions),
        ] {
            if list.is_empty() {
                problems.push(Problem::new(format!("{path}.{field}"), "must not be empty"));
            } else if list.iter().any(|s| s == "*") && list.len() > 1 {
                problems.push(Problem::new(
                    format!("{path}.{field}"),
                    "\"*\" already means all: list nothing else",
                ));
            }
        }
        for (j, version) in rule.api_versions.iter().enumerate() {
            if version.trim().is_empty() {
                problems.push(Problem::new(
                    format!("{path}.apiVersions[{j}]"),
                    "must not be empty",
                ));
            }
        }
        if rule.resources.is_empty() {
            problems.push(Problem::new(
                format!("{path}.resources"),
                "must not be empty",
            ));
        }
        for (j, resource) in rule.resources.iter().enumerate() {
            if resource.is_empty() {
                problems.push(Problem::new(
                    format!("{path}.resources[{j}]"),
                    "must not be empty",
                ));
            } else if !is_valid_resource(resource) {
                problems.push(Problem::new(
                    format!("{path}.resources[{j}]"),
                    format!(
                        "{resource:?} is not a resource: want \"*\", \"res\", \"res/sub\", \
                         \"*/sub\", \"res/*\" or \"*/*\" (lowercase)"
                    ),
                ));
            }
        }
        check_resource_wildcards(&format!("{path}.resources"), &rule.resources, problems);
    }
}

/// The API server's `validateResources`: a list must not name what one of its wildcards already
/// covers. The API server judges the list in order, so there some overlaps pass when the wildcard
/// comes last (`pods`, `*` passes, `*`, `pods` does not); judging every pair here refuses both
/// orders, which is stricter but never lets through a list the API server would refuse.
fn check_resource_wildcards(path: &str, resources: &[String], problems: &mut Vec<Problem>) {
    let split: Vec<Option<(&str, &str)>> = resources.iter().map(|r| r.split_once('/')).collect();
    for (j, (resource, this)) in resources.iter().zip(&split).enumerate() {
        let Some((res, sub)) = this else { continue };
        let mut covered_by = BTreeSet::new();
        for (i, other) in split.iter().enumerate() {
            match other {
                Some((other_res, "*")) if i != j && other_res == res => {
                    covered_by.insert(format!("{other_res}/*"));
                }
                Some(("*", other_sub)) if i != j && other_sub == sub => {
                    covered_by.insert(format!("*/{other_sub}"));
                }
                _ => {}
            }
        }
        for wildcard in covered_by {
            problems.push(Problem::new(
                format!("{path}[{j}]"),
                format!("if '{wildcard}' is present, must not specify {resource}"),
            ));
        }
    }
    if resources.len() > 1 && resources.iter().any(|r| r == "*/*") {
        problems.push(Problem::new(
            path,
            "if '*/*' is present, must not specify other resources",
        ));
    }
    let without_subresource = |r: &String| !r.is_empty() && r != "*" && !r.contains('/');
    if resources.iter().any(|r| r == "*") && resources.iter().any(without_subresource) {
        problems.push(Problem::new(
            path,
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
}

/// `*`, `res`, `res/sub`, `*/sub`, `res/*`, `*/*`, with lowercase DNS-ish names.
fn is_valid_resource(resource: &str) -> bool {
    let part = |s: &str| {
        s == "*"
            || (!s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'))
    };
    match resource.split_once('/') {
        None => part(resource),
        Some((res, sub)) => part(res) && part(sub),
    }
}

/// The API server's `ValidateLabelSelector`, strict about values: the API server only tolerates
/// invalid values when updating a configuration that already had them, which Gatehouse cannot
/// count on.
fn check_selector(path: &str, selector: &LabelSelector, problems: &mut Vec<Problem>) {
    for (key, value) in selector.match_labels.iter().flatten() {
        let path = format!("{path}.matchLabels[{key:?}]");
        if key.is_empty() {
            problems.push(Problem::new(&path, "key must not be empty"));
        } else {
            check_qualified_name(&path, key, problems);
        }
        check_label_value(&path, value, problems);
    }
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let path = format!("{path}.matchExpressions[{i}]");
        if req.key.is_empty() {
            problems.push(Problem::new(format!("{path}.key"), "must not be empty"));
        } else {
            check_qualified_name(&format!("{path}.key"), &req.key, problems);
        }
        let values = req.values.as_deref().unwrap_or_default();
        for (j, value) in values.iter().enumerate() {
            check_label_value(&format!("{path}.values[{j}]"), value, problems);
        }
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => problems.push(Problem::new(
                format!("{path}.values"),
                format!("must not be empty for operator {}", req.operator),
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => problems.push(Problem::new(
                format!("{path}.values"),
                format!("must be empty for operator {}", req.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => problems.push(Problem::new(
                format!("{path}.operator"),
                format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
            )),
        }
    }
}

fn json_type(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a bool",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: serde_json::Value) -> Policy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": "p", "generation": 3},
            "spec": spec,
        }))
        .unwrap()
    }

    const RULES: &str = r#"{"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]}"#;

    fn rules() -> serde_json::Value {
        serde_json::from_str(RULES).unwrap()
    }

    fn named(name: &str, spec: serde_json::Value) -> Policy {
        let mut p = policy(spec);
        p.metadata.name = Some(name.to_string());
        p
    }

    #[test]
    fn expressions_over_the_cost_budget_are_refused_with_their_estimate() {
        let list: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let l = format!("[{}]", list.join(","));
        let four = format!("{l}.all(a, {l}.all(b, {l}.all(c, {l}.all(d, a+b+c+d >= 0))))");
        let three = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
        let two = "object.spec.containers.all(a, object.spec.containers.all(b, a.name != b.name || a == b))";
        let p = policy(serde_json::json!({
            "match": {"rules": rules()["rules"], "conditions": [{"name": "heavy", "expression": three}]},
            "validate": [{"expression": four, "message": "m"}, {"expression": two, "message": "fine"}],
            "mutate": [{"when": three, "merge": {"metadata": {"labels": {"a": "b"}}}}],
        }));
        let problems: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(
            problems[0].starts_with("spec.match.conditions[0].expression: estimated cost"),
            "{problems:?}"
        );
        assert!(
            problems.iter().any(
                |m| m.starts_with("spec.validate[0].expression: estimated cost")
                    && m.contains("exceeds the budget of 1000000")
                    && m.contains("[0,1,2")
            ),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|m| m.starts_with("spec.mutate[0].when: estimated cost")),
            "{problems:?}"
        );
        assert!(
            !problems.iter().any(|m| m.contains("validate[1]")),
            "{problems:?}"
        );
    }

    /// A valid Policy with `match_` (which should hold `rules`) as its match.
    fn problems_of_match(match_: serde_json::Value) -> Vec<String> {
        let p = policy(serde_json::json!({
            "match": match_,
            "validate": [{"expression": "true", "message": "m"}],
        }));
        validate(&p).iter().map(ToString::to_string).collect()
    }

    fn problems_of_conditions(conditions: serde_json::Value) -> Vec<String> {
        let mut match_ = rules();
        match_["conditions"] = conditions;
        problems_of_match(match_)
    }

    fn problems_of_resources(resources: &[&str]) -> Vec<String> {
        let mut match_ = rules();
        match_["rules"][0]["resources"] = serde_json::json!(resources);
        problems_of_match(match_)
    }

    #[test]
    fn compiled_policy_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<CompiledPolicy>();
        assert_send_sync::<std::sync::Arc<CompiledPolicy>>();
    }

    #[test]
    fn a_valid_policy_compiles() {
        let p = policy(serde_json::json!({
            "match": rules(),
            "mutate": [{"forEach": "spec.containers", "when": "element.name != 'x'", "merge": {"a": 1}}],
            "validate": [{"expression": "object.spec.containers.all(c, has(c.resources))", "message": "m"}],
        }));
        assert_eq!(validate(&p), vec![]);
        let c = compile(&p).unwrap();
        assert_eq!(c.name(), "p");
        assert_eq!(c.generation(), Some(3));
        assert!(c.has_mutations() && c.has_validations());
        assert_eq!(c.whens.len(), 1);
        assert_eq!(c.validations.len(), 1);
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let p = policy(serde_json::json!({
            "match": {
                "rules": [{"operations": [], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/a/b", "Pods"]}],
                "conditions": [
                    {"name": "c", "expression": "objct.x == 1"},
                    {"name": "c", "expression": "authorizer.requestResource.check('get').allowed()"},
                ],
                "objectSelector": {"matchExpressions": [{"key": "k", "operator": "Maybe"}]},
            },
            "timeoutSeconds": 31,
            "reinvocationPolicy": "IfNeeded",
            "mutate": [],
            "validate": [{"expression": "object.spec.(", "message": " "}],
        }));
        let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
        let want = [
            "spec.timeoutSeconds: must be between 1 and 30, got 31",
            "spec.reinvocationPolicy: IfNeeded is only meaningful for mutating policies (spec.mutate is empty)",
            "spec.match.rules[0].operations: must not be empty",
            "spec.match.rules[0].resources[0]: ",
            "spec.match.rules[0].resources[1]: ",
            "spec.match.objectSelector.matchExpressions[0].operator: ",
            "spec.match.conditions[0].expression: unknown variable \"objct\"",
            "spec.match.conditions[1].name: duplicate condition name \"c\"",
            "spec.validate[0].message: must not be empty",
            "spec.validate[0].expression: does not compile: ",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for w in want {
            assert!(
                got.iter().any(|g| g.starts_with(w)),
                "missing {w:?} in {got:#?}"
            );
        }
        let err = compile(&p).unwrap_err();
        assert_eq!(err.problems.len(), want.len());
        assert!(err.to_string().contains("spec.timeoutSeconds"));
    }

    #[test]
    fn mutation_problems() {
        let p = policy(serde_json::json!({
            "match": rules(),
            "mutate": [
                {"merge": [1]},
                {"forEach": "spec..containers", "merge": {}},
                {"forEach": "spec.containers", "merge": {"name": null}},
                {"when": "element.name == 'a'", "merge": {}},
            ],
        }));
        let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
        assert_eq!(got.len(), 4, "{got:#?}");
        assert!(got[0].starts_with("spec.mutate[0].merge: must be a JSON object, got an array"));
        assert!(got[1].starts_with("spec.mutate[1].forEach: \"spec..containers\""));
        assert!(got[2].starts_with("spec.mutate[2].merge.name: a forEach merge must not"));
        assert!(got[3].starts_with("spec.mutate[3].when: unknown variable \"element\""));
    }

    #[test]
    fn empty_policy() {
        let p = policy(serde_json::json!({"match": {"rules": []}}));
        let got: Vec<String> = validate(&p).iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "spec: at least one of mutate, validate or effects must be set",
                "spec.match.rules: must not be empty"
            ]
        );
    }

    #[test]
    fn condition_names_are_qualified_names() {
        let got = problems_of_conditions(serde_json::json!([
            {"name": "has space", "expression": "true"}
        ]));
        assert_eq!(
            got,
            [
                "spec.match.conditions[0].name: \"has space\" is not a valid qualified name: name \
              part must consist of alphanumeric characters, '-', '_' or '.', and must start and \
              end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex \
              used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
            ]
        );

        let ok = serde_json::json!([
            {"name": "in-shop", "expression": "true"},
            {"name": "example.com/My_Name.1", "expression": "true"},
            {"name": "a".repeat(63), "expression": "true"},
        ]);
        assert_eq!(problems_of_conditions(ok), Vec::<String>::new());

        let got = problems_of_conditions(serde_json::json!([
            {"name": "a/b/c", "expression": "true"},
            {"name": "Example.com/x", "expression": "true"},
            {"name": "-x", "expression": "true"},
            {"name": "a".repeat(64), "expression": "true"},
            {"name": "", "expression": "true"},
            {"name": "ok", "expression": " "},
            {"name": "x_", "expression": "true"},
            {"name": "x_", "expression": "true"},
        ]));
        let want = [
            "spec.match.conditions[0].name: \"a/b/c\" is not a valid qualified name: a qualified \
             name must consist of",
            "spec.match.conditions[1].name: \"Example.com/x\" is not a valid qualified name: \
             prefix part a lowercase RFC 1123 subdomain must consist of",
            "spec.match.conditions[2].name: \"-x\" is not a valid qualified name: name part must \
             consist of",
            "spec.match.conditions[3].name: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
             aaaaaaaa\" is not a valid qualified name: name part must be no more than 63 characters",
            "spec.match.conditions[4].name: must not be empty",
            "spec.match.conditions[5].expression: must not be empty",
            "spec.match.conditions[6].name: \"x_\" is not a valid qualified name: name part must \
             consist of",
            "spec.match.conditions[7].name: \"x_\" is not a valid qualified name: name part must \
             consist of",
            "spec.match.conditions[7].name: duplicate condition name \"x_\"",
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (got, want) in got.iter().zip(want) {
            assert!(
                got.starts_with(want),
                "{got:?} does not start with {want:?}"
            );
        }
    }

    #[test]
    fn at_most_64_match_conditions() {
        let conditions = |n: usize| {
            let list: Vec<serde_json::Value> = (0..n)
                .map(|i| serde_json::json!({"name": format!("c{i}"), "expression": "true"}))
                .collect();
            problems_of_conditions(serde_json::Value::Array(list))
        };
        assert_eq!(conditions(64), Vec::<String>::new());
        assert_eq!(
            conditions(65),
            ["spec.match.conditions: must have at most 64 items, got 65"]
        );
    }

    #[test]
    fn selectors_follow_the_api_server_label_rules() {
        let mut match_ = rules();
        match_["namespaceSelector"] = serde_json::json!({
            "matchLabels": {
                "kubernetes.io/metadata.name": "shop",
                "app.kubernetes.io/name": "",
                "tier": "v".repeat(63),
            },
            "matchExpressions": [
                {"key": "example.com/team", "operator": "In", "values": ["a", "B_2"]},
                {"key": "env", "operator": "Exists"},
            ],
        });
        match_["objectSelector"] = serde_json::json!({"matchLabels": {"app": "web"}});
        assert_eq!(problems_of_match(match_.clone()), Vec::<String>::new());

        match_["objectSelector"] = serde_json::json!({
            "matchLabels": {
                "app": "x y",
                "has space": "ok",
                "long": "v".repeat(64),
                "": "v",
            },
            "matchExpressions": [
                {"key": "a/b/c", "operator": "Exists"},
                {"key": "tier", "operator": "NotIn", "values": ["ok", "-bad", ""]},
                {"key": "tier", "operator": "In", "values": []},
            ],
        });
        let got = problems_of_match(match_);
        let path = "spec.match.objectSelector";
        let want = [
            format!("{path}.matchLabels[\"\"]: key must not be empty"),
            format!(
                "{path}.matchLabels[\"app\"]: \"x y\" is not a valid label value: a valid label \
                     must be an empty string or consist of"
            ),
            format!(
                "{path}.matchLabels[\"has space\"]: \"has space\" is not a valid qualified \
                     name: name part must consist of"
            ),
            format!(
                "{path}.matchLabels[\"long\"]: \"{}\" is not a valid label value: must be no \
                     more than 63 characters",
                "v".repeat(64)
            ),
            format!(
                "{path}.matchExpressions[0].key: \"a/b/c\" is not a valid qualified name: a \
                     qualified name must consist of"
            ),
            format!(
                "{path}.matchExpressions[1].values[1]: \"-bad\" is not a valid label value: a \
                     valid label must be an empty string or consist of"
            ),
            format!("{path}.matchExpressions[2].values: must not be empty for operator In"),
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for (got, want) in got.iter().zip(&want) {
            assert!(
                got.starts_with(want),
                "{got:?} does not start with {want:?}"
            );
        }
    }

    #[test]
    fn the_policy_name_must_leave_room_for_the_entry_suffix() {
        let spec = || serde_json::json!({"match": rules(), "validate": [{"expression": "true", "message": "m"}]});
        let longest = format!("{}.x", "a".repeat(237));
        assert_eq!(longest.len(), 239);
        for ok in [
            "p",
            "my-policy",
            "team.example.com",
            "0abc",
            longest.as_str(),
        ] {
            assert_eq!(validate(&named(ok, spec())), vec![], "{ok:?}");
            let entry = crate::engine::entry::entry_name(ok);
            assert_eq!(
                super::super::k8s_names::is_dns1123_subdomain(&entry),
                Ok(()),
                "{entry}"
            );
        }

        let too_long = "a".repeat(240);
        let got: Vec<String> = validate(&named(&too_long, spec()))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                "metadata.name: must be no more than 239 characters, got 240: the webhook entry \
              name <name>.gatehouse.dev must be no more than 253 characters"
            ]
        );
        assert!(
            super::super::k8s_names::is_dns1123_subdomain(&crate::engine::entry::entry_name(
                &too_long
            ))
            .is_err()
        );

        for bad in ["My-Policy", "a_b", "-a", "a.", "a..b"] {
            let got = validate(&named(bad, spec()));
            assert_eq!(got.len(), 1, "{bad:?}: {got:#?}");
            assert_eq!(got[0].path, "metadata.name");
            assert!(
                got[0].message.starts_with(&format!(
                    "{bad:?} would make the webhook entry name {bad}.gatehouse.dev invalid: a \
                     lowercase RFC 1123 subdomain must consist of"
                )),
                "{}",
                got[0]
            );
        }
        let got: Vec<String> = validate(&named("", spec()))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["metadata.name: must not be empty"]);
    }

    #[test]
    fn resource_wildcard_conflicts() {
        let r = "spec.match.rules[0].resources";
        let cases: &[(&[&str], &[&str])] = &[
            (&["*"], &[]),
            (&["*/*"], &[]),
            (&["*", "*/scale"], &[]),
            (&["*", "pods/status"], &[]),
            (&["pods", "pods/status", "deployments/scale"], &[]),
            (&["pods/*", "deployments/*", "*/scale"], &[]),
            (
                &["*", "pods"],
                &["if '*' is present, must not specify other resources without subresources"],
            ),
            // The API server lets this order through; refusing it too costs nothing.
            (
                &["pods", "*"],
                &["if '*' is present, must not specify other resources without subresources"],
            ),
            (
                &["*/*", "pods"],
                &["if '*/*' is present, must not specify other resources"],
            ),
            (
                &["*/*", "*"],
                &["if '*/*' is present, must not specify other resources"],
            ),
            (
                &["pods/status", "*/*"],
                &["if '*/*' is present, must not specify other resources"],
            ),
            (
                &["*/*", "pods/*"],
                &[
                    "[1]: if '*/*' is present, must not specify pods/*",
                    "if '*/*' is present, must not specify other resources",
                ],
            ),
            (
                &["*/scale", "deployments/scale"],
                &["[1]: if '*/scale' is present, must not specify deployments/scale"],
            ),
            (
                &["deployments/scale", "*/scale"],
                &["[0]: if '*/scale' is present, must not specify deployments/scale"],
            ),
            (
                &["pods/*", "pods/status", "pods/log"],
                &[
                    "[1]: if 'pods/*' is present, must not specify pods/status",
                    "[2]: if 'pods/*' is present, must not specify pods/log",
                ],
            ),
            (
                &["pods/status", "pods/*"],
                &["[0]: if 'pods/*' is present, must not specify pods/status"],
            ),
            (
                &["pods/*", "*/status", "pods/status"],
                &[
                    "[2]: if '*/status' is present, must not specify pods/status",
                    "[2]: if 'pods/*' is present, must not specify pods/status",
                ],
            ),
            (&["", "pods"], &["[0]: must not be empty"]),
        ];
        for (resources, want) in cases {
            let got = problems_of_resources(resources);
            let want: Vec<String> = want
                .iter()
                .map(|w| {
                    if w.starts_with('[') {
                        format!("{r}{w}")
                    } else {
                        format!("{r}: {w}")
                    }
                })
                .collect();
            assert_eq!(got, want, "{resources:?}");
        }
    }

    #[test]
    fn resource_forms() {
        for ok in [
            "*",
            "pods",
            "pods/status",
            "*/scale",
            "pods/*",
            "*/*",
            "foos.example.com",
        ] {
            assert!(is_valid_resource(ok), "{ok}");
        }
        for bad in ["", "/", "pods/", "/status", "a/b/c", "Pods", "pods status"] {
            assert!(!is_valid_resource(bad), "{bad}");
        }
    }
}
