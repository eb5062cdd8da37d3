//! Whether a request reaches a Policy at all: what the API server would decide from a webhook
//! entry of the Policy's own. Policies share entries ([`super::group`]), so Gatehouse matches each
//! member itself, exactly as the API server would have: rules (with matchPolicy Equivalent),
//! namespaceSelector, objectSelector and match conditions. `gatehouse eval` uses the same code.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::admission::{GroupVersionResource, Request, Variables};
use super::policy::CompiledPolicy;
use gatehouse_api::v1alpha1::{NAMESPACE_NAME_LABEL, Operation, Rule, Scope};
use gatehouse_cel::CelError;
use gatehouse_cel::cost::CallBudget;

/// A match condition that could not be decided.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MatchError {
    /// `spec.match.conditions[index]` (named `name`) raised an error or returned a non-bool. The
    /// API server then follows the failurePolicy: Fail rejects the request, Ignore skips the
    /// webhook. `authorizer` is not available outside the API server, so a condition using it
    /// ends up here offline (in the cluster such a Policy has an entry of its own).
    ///
    /// The message is a whole line of an admission response, so the CEL error is part of it
    /// (`error`, not a `source` that a chain would print a second time).
    #[error("spec.match.conditions[{index}] ({name:?}): {error}")]
    Condition {
        index: usize,
        name: String,
        error: CelError,
    },
    /// The request's Namespace could not be read, so the namespaceSelector cannot be decided.
    #[error(
        "spec.match.namespaceSelector: the labels of namespace {namespace:?} are unknown: {reason}"
    )]
    NamespaceUnknown { namespace: String, reason: String },
}

/// What is known of the request's Namespace.
#[derive(Clone, Copy, Debug)]
pub enum Namespace<'a> {
    /// The labels of `request.namespace`, as the Namespace reflector (or a read) has them.
    Labels(&'a BTreeMap<String, String>),
    /// Offline (`gatehouse eval`): there are no Namespace objects, every selector matches but
    /// on the label every Namespace has, its name (`kubernetes.io/metadata.name`), which the
    /// request gives.
    Assumed,
    /// The Namespace could not be read, with the reason.
    Unknown(&'a str),
}

/// Whether `req` matches `policy`'s rules, namespaceSelector, objectSelector and match
/// conditions.
pub fn matches(
    req: &Request,
    policy: &CompiledPolicy,
    namespace: Namespace<'_>,
) -> Result<bool, MatchError> {
    let spec = &policy.spec().match_;
    if !spec.rules.iter().any(|rule| rule_matches(rule, req)) {
        return Ok(false);
    }
    if let Some(selector) = &spec.namespace_selector
        && !namespace_selector_matches(selector, req, namespace)?
    {
        return Ok(false);
    }
    if let Some(selector) = &spec.object_selector
        && !object_selector_matches(selector, req)
    {
        return Ok(false);
    }
    if spec.conditions.is_empty() {
        return Ok(true);
    }
    let variables = Variables::new(req);
    let vars = variables.activation();
    let mut budget = CallBudget::match_conditions();
    for (index, (condition, program)) in spec.conditions.iter().zip(&policy.conditions).enumerate()
    {
        let decided = program
            .eval_bool_within(&vars, &mut budget)
            .map_err(|error| MatchError::Condition {
                index,
                name: condition.name.clone(),
                error,
            })?;
        if !decided {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One `RuleWithOperations`, with the API server's meaning: `*` wildcards, `res/sub` resources
/// where `res/*` covers a resource and all its subresources and plain `res` only the resource.
///
/// Entries use `matchPolicy: Equivalent`: the API server calls a shared entry with the request
/// converted to a version one of its rules names, and reports the original as `requestResource`.
/// A Policy's rule matches when it names either, as it would have for an entry of its own.
pub fn rule_matches(rule: &Rule, req: &Request) -> bool {
    let converted = (&req.resource, req.sub_resource());
    let original = req
        .request_resource
        .as_ref()
        .map(|r| (r, req.request_sub_resource.as_deref().unwrap_or_default()));
    std::iter::once(converted)
        .chain(original)
        .any(|(resource, sub_resource)| rule_matches_resource(rule, req, resource, sub_resource))
}

fn rule_matches_resource(
    rule: &Rule,
    req: &Request,
    resource: &GroupVersionResource,
    sub_resource: &str,
) -> bool {
    let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
    let operation = rule
        .operations
        .iter()
        .any(|op| *op == Operation::All || *op == req.operation);
    // The API server sets `request.namespace` of a Namespace object to its own name, yet the
    // object is cluster-scoped: rules decide by the resource, as the API server's matcher does.
    let namespace_object =
        resource.group.is_empty() && resource.version == "v1" && resource.resource == "namespaces";
    let scope = match rule.scope {
        Scope::All => true,
        Scope::Namespaced => !namespace_object && !req.namespace.is_empty(),
        Scope::Cluster => namespace_object || req.namespace.is_empty(),
    };
    let names = rule.resources.iter().any(|entry| {
        let (res, sub) = entry.split_once('/').unwrap_or((entry, ""));
        (res == "*" || res == resource.resource) && (sub == "*" || sub == sub_resource)
    });
    operation
        && scope
        && names
        && any(&rule.api_groups, &resource.group)
        && any(&rule.api_versions, &resource.version)
}

/// As the API server does: a Namespace object is judged by its own labels (the old object's on
/// DELETE), any other cluster-scoped object always matches, and a namespaced object is judged
/// by its Namespace's labels.
fn namespace_selector_matches(
    selector: &LabelSelector,
    req: &Request,
    namespace: Namespace<'_>,
) -> Result<bool, MatchError> {
    if req.is_namespace() {
        let own = req.object.as_ref().or(req.old_object.as_ref());
        return Ok(selector_matches(selector, |key| {
            own.and_then(|o| label(o, key))
        }));
    }
    if req.namespace.is_empty() {
        return Ok(true);
    }
    match namespace {
        Namespace::Labels(map) => Ok(selector_matches(selector, |key| {
            map.get(key).map(String::as_str)
        })),
        Namespace::Assumed => Ok(name_requirements_hold(selector, &req.namespace)),
        Namespace::Unknown(reason) => Err(MatchError::NamespaceUnknown {
            namespace: req.namespace.clone(),
            reason: reason.to_string(),
        }),
    }
}

/// Whether the requirements of `selector` on the name label hold for the Namespace `name` (the
/// others are assumed to).
fn name_requirements_hold(selector: &LabelSelector, name: &str) -> bool {
    let on_name = LabelSelector {
        match_labels: selector.match_labels.as_ref().map(|labels| {
            labels
                .iter()
                .filter(|(k, _)| *k == NAMESPACE_NAME_LABEL)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        }),
        match_expressions: selector.match_expressions.as_ref().map(|requirements| {
            requirements
                .iter()
                .filter(|r| r.key == NAMESPACE_NAME_LABEL)
                .cloned()
                .collect()
        }),
    };
    selector_matches(&on_name, |key| {
        (key == NAMESPACE_NAME_LABEL).then_some(name)
    })
}

/// As the API server does: the selector is matched against the labels of the new object and of
/// the old one, and matches when either does (so a DELETE is judged by the object deleted).
fn object_selector_matches(selector: &LabelSelector, req: &Request) -> bool {
    match (req.object.as_ref(), req.old_object.as_ref()) {
        (None, None) => selector_matches(selector, |_| None),
        (object, old_object) => [object, old_object]
            .into_iter()
            .flatten()
            .any(|o| selector_matches(selector, |key| label(o, key))),
    }
}

/// The value of the label `key` of `object`.
fn label<'o>(object: &'o Value, key: &str) -> Option<&'o str> {
    object.get("metadata")?.get("labels")?.get(key)?.as_str()
}

/// `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist); an empty selector
/// matches everything. An unknown operator matches nothing (validation reports it).
///
/// `label` looks a label up by key: the labels are read where they are, never collected.
pub fn selector_matches<'l>(
    selector: &LabelSelector,
    label: impl Fn(&str) -> Option<&'l str>,
) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| label(k) == Some(v.as_str()));
    let by_expressions = selector.match_expressions.iter().flatten().all(|req| {
        let value = label(&req.key);
        let values = req.values.as_deref().unwrap_or_default();
        let listed = value.is_some_and(|v| values.iter().any(|x| x == v));
        match req.operator.as_str() {
            "In" => listed,
            "NotIn" => !listed,
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::policy;
    use gatehouse_api::v1alpha1::Policy;

    fn scoped(scope: &str) -> CompiledPolicy {
        let p: Policy = serde_json::from_value(json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": "scoped"},
            "spec": {
                "match": {"rules": [{"operations": ["CREATE"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": scope}]},
                "validate": [{"expression": "true", "message": "m"}],
            },
        }))
        .expect("policy");
        policy::compile(&p).expect("compiles")
    }

    fn request(resource: &str, kind: &str, namespace: &str) -> Request {
        serde_json::from_value(json!({
            "uid": "u", "operation": "CREATE", "name": "x", "namespace": namespace,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "userInfo": {}, "object": {"metadata": {"name": "x"}},
        }))
        .expect("request")
    }

    #[test]
    fn a_namespace_object_is_cluster_scoped_though_its_request_names_a_namespace() {
        // As the API server sends it: request.namespace is the Namespace's own name.
        let namespace = request("namespaces", "Namespace", "x");
        let pod = request("pods", "Pod", "x");
        let node = request("nodes", "Node", "");
        let judged = |scope: &str, req: &Request| {
            matches(req, &scoped(scope), Namespace::Assumed).expect("decided")
        };
        assert!(judged("Cluster", &namespace));
        assert!(!judged("Namespaced", &namespace));
        assert!(judged("Namespaced", &pod));
        assert!(!judged("Cluster", &pod));
        assert!(judged("Cluster", &node));
        assert!(judged("*", &namespace));
    }
}
