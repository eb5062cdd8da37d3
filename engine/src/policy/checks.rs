//! The checks [`validate`](super::validate) makes: each problem with the field path a user has
//! to edit, and every expression compiled on the way.
use super::*;
use crate::problem::check_k8s_name;

/// The checks, compiling each expression on the way: the programs are only returned when every
/// expression compiled.
///
/// Whatever the wiring copies into a webhook entry (the name, rules, selectors, match conditions,
/// timeout) is held to the API server's own rules for that entry: the API server judges the
/// configuration as a whole, so one Policy it would refuse would take every Policy's entry down.
pub(super) fn analyse(policy: &Policy) -> (Vec<Problem>, Option<Programs>) {
    let spec = &policy.spec;
    let mut problems = Vec::new();
    check_name(
        policy.metadata.name.as_deref().unwrap_or_default(),
        &mut problems,
    );
    super::tenant::check_source(policy, &mut problems);
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

    // Every part is checked, each problem reported, before any result is dropped.
    let conditions = check_conditions(spec, &mut problems);
    let whens = check_mutations(spec, &mut problems);
    let validations = check_validations(spec, &mut problems);
    let programs = match (conditions, whens, validations) {
        (Some(conditions), Some(whens), Some(validations)) => Some(Programs {
            conditions,
            whens,
            validations,
        }),
        _ => None,
    };
    (problems, programs)
}

/// Checks `spec.match.conditions`; their programs when every one compiles.
fn check_conditions(spec: &PolicySpec, problems: &mut Vec<Problem>) -> Option<Vec<Program>> {
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
            check_qualified_name(&format!("{path}.name"), &condition.name, problems);
            if !names.insert(condition.name.as_str()) {
                problems.push(Problem::new(
                    format!("{path}.name"),
                    format!("duplicate condition name {:?}", condition.name),
                ));
            }
        }
        let path = format!("{path}.expression");
        match check_expression(&path, &condition.expression, Site::MatchCondition, problems) {
            Some(p) => conditions.push(p),
            None => all_compiled = false,
        }
    }

    all_compiled.then_some(conditions)
}

/// Checks `spec.mutate`; the programs of its `when` guards when every one compiles.
fn check_mutations(spec: &PolicySpec, problems: &mut Vec<Problem>) -> Option<Vec<Option<Program>>> {
    let mut all_compiled = true;
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
                match check_expression(&format!("{path}.when"), when, site, problems) {
                    Some(p) => whens.push(Some(p)),
                    None => all_compiled = false,
                }
            }
        }
    }

    all_compiled.then_some(whens)
}

/// Checks `spec.validate`; the programs of its rules when every one compiles.
fn check_validations(spec: &PolicySpec, problems: &mut Vec<Problem>) -> Option<Vec<Program>> {
    let mut all_compiled = true;
    let mut validations = Vec::new();
    for (i, rule) in spec.validate.iter().enumerate() {
        let path = format!("spec.validate[{i}]");
        if rule.message.trim().is_empty() {
            problems.push(Problem::new(format!("{path}.message"), "must not be empty"));
        }
        let path = format!("{path}.expression");
        match check_expression(&path, &rule.expression, Site::Validation, problems) {
            Some(p) => validations.push(p),
            None => all_compiled = false,
        }
    }

    all_compiled.then_some(validations)
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
            match cel::refusals(&program, site) {
                Ok(reasons) => {
                    problems.extend(reasons.into_iter().map(|reason| Problem::new(path, reason)))
                }
                Err(e) => problems.push(Problem::new(path, e.to_string())),
            }
            if let Err(too_costly) = gatehouse_cel::cost::check(&program) {
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
        let ipam = match (&effect.ipam, &effect.object, &effect.call) {
            (Some(ipam), None, None) => ipam,
            (None, Some(object), None) => {
                let path = format!("{path}.object");
                crate::companion::check(&path, object, problems);
                check_trigger_rules(spec, &path, problems);
                check_gate(spec, object.gate, &path, problems);
                continue;
            }
            (None, None, Some(call)) => {
                let path = format!("{path}.call");
                crate::call::check(&path, call, problems);
                if let Some(annotation) = &call.result_annotation {
                    check_qualified_name(&format!("{path}.resultAnnotation"), annotation, problems);
                }
                check_trigger_rules(spec, &path, problems);
                check_gate(spec, call.gate, &path, problems);
                continue;
            }
            _ => {
                problems.push(Problem::new(
                    path,
                    "must set exactly one effect (ipam, object or call)",
                ));
                continue;
            }
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
        if !creates_pods(spec) {
            problems.push(Problem::new(
                format!("{path}.ipam"),
                "allocates to Pods on CREATE, but no rule of spec.match.rules matches Pod creation",
            ));
        }
    }
}

/// A gate (`gate: true` at `path`) needs a rule that matches Pod creation.
fn check_gate(spec: &PolicySpec, gate: bool, path: &str, problems: &mut Vec<Problem>) {
    if gate && !creates_pods(spec) {
        problems.push(Problem::new(
            format!("{path}.gate"),
            "gates Pods on CREATE (the only time a scheduling gate can be added), \
             but no rule of spec.match.rules matches Pod creation",
        ));
    }
}

/// Whether a rule of `spec` matches the creation of Pods.
fn creates_pods(spec: &PolicySpec) -> bool {
    spec.match_.rules.iter().any(|r| {
        r.operations
            .iter()
            .any(|o| matches!(o, Operation::Create | Operation::All))
            && r.api_groups.iter().any(|g| g.is_empty() || g == "*")
            && r.resources.iter().any(|res| res == "pods" || res == "*")
    })
}

/// An object or call effect's triggers are the stored objects its rules name: each rule must name
/// its kinds exactly (no `*`, no subresource) and admit CREATE or UPDATE, the operations that
/// store them.
fn check_trigger_rules(spec: &PolicySpec, path: &str, problems: &mut Vec<Problem>) {
    for (r, rule) in spec.match_.rules.iter().enumerate() {
        let named =
            |list: &[String]| !list.is_empty() && list.iter().all(|x| x != "*" && !x.contains('/'));
        if !(named(&rule.api_groups) && named(&rule.api_versions) && named(&rule.resources)) {
            problems.push(Problem::new(
                format!("spec.match.rules[{r}]"),
                format!(
                    "{path} acts on the stored objects the rules name: name apiGroups, \
                     apiVersions and resources without `*` or subresources"
                ),
            ));
        }
        let stores = rule
            .operations
            .iter()
            .any(|o| matches!(o, Operation::All | Operation::Create | Operation::Update));
        if !stores {
            problems.push(Problem::new(
                format!("spec.match.rules[{r}].operations"),
                format!(
                    "{path} needs CREATE or UPDATE: those are the operations that store a trigger"
                ),
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
pub(super) fn is_valid_resource(resource: &str) -> bool {
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
