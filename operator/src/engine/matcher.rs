//! Whether a request reaches a Policy at all: what the API server decides from the webhook entry
//! before calling Gatehouse. The server never needs it (the API server already matched); `gatehouse
//! eval` does, to play the API server offline.
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use super::cel::{self, Activation, CelError};
use super::policy::CompiledPolicy;
use super::review::Request;
use crate::api::v1alpha1::{Operation, Rule, Scope};

/// A match condition that could not be decided.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MatchError {
    /// `spec.match.conditions[index]` (named `name`) raised an error or returned a non-bool. The
    /// API server then follows the failurePolicy: Fail rejects the request, Ignore skips the
    /// webhook. `authorizer` is not available offline, so a condition using it ends up here.
    #[error("spec.match.conditions[{index}] ({name:?}): {source}")]
    Condition {
        index: usize,
        name: String,
        source: CelError,
    },
}

/// Whether `req` matches `policy`'s rules, objectSelector and match conditions. The
/// namespaceSelector is taken as matching: offline there are no Namespace labels to read.
pub fn matches(req: &Request, policy: &CompiledPolicy) -> Result<bool, MatchError> {
    let spec = &policy.spec().match_;
    if !spec.rules.iter().any(|rule| rule_matches(rule, req)) {
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
    let needs = &policy.condition_needs;
    let request = if needs.reads_request() {
        req.cel_variable()
    } else {
        serde_json::Value::Null
    };
    let vars = Activation::with_needs(
        req.object.as_ref(),
        req.old_object.as_ref(),
        &request,
        needs,
    );
    for (index, (condition, program)) in spec.conditions.iter().zip(&policy.conditions).enumerate()
    {
        let decided = cel::eval_bool(program, &vars).map_err(|source| MatchError::Condition {
            index,
            name: condition.name.clone(),
            source,
        })?;
        if !decided {
            return Ok(false);
        }
    }
    Ok(true)
}

/// One `RuleWithOperations`, with the API server's meaning: `*` wildcards, `res/sub` resources
/// where `res/*` covers a resource and all its subresources and plain `res` only the resource.
pub fn rule_matches(rule: &Rule, req: &Request) -> bool {
    let any = |list: &[String], value: &str| list.iter().any(|v| v == "*" || v == value);
    let operation = rule
        .operations
        .iter()
        .any(|op| *op == Operation::All || *op == req.operation);
    let scope = match rule.scope {
        Scope::All => true,
        Scope::Namespaced => !req.namespace.is_empty(),
        Scope::Cluster => req.namespace.is_empty(),
    };
    let resource = rule.resources.iter().any(|entry| {
        let (res, sub) = entry.split_once('/').unwrap_or((entry, ""));
        (res == "*" || res == req.resource.resource) && (sub == "*" || sub == req.sub_resource())
    });
    operation
        && scope
        && resource
        && any(&rule.api_groups, &req.resource.group)
        && any(&rule.api_versions, &req.resource.version)
}

/// As the API server does: the selector is matched against the labels of the new object and of
/// the old one, and matches when either does (so a DELETE is judged by the object deleted).
fn object_selector_matches(selector: &LabelSelector, req: &Request) -> bool {
    let objects: Vec<&Value> = [req.object.as_ref(), req.old_object.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    if objects.is_empty() {
        return selector_matches(selector, &BTreeMap::new());
    }
    objects
        .into_iter()
        .any(|o| selector_matches(selector, &labels(o)))
}

fn labels(object: &Value) -> BTreeMap<&str, &str> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.as_str(), v.as_str()?)))
        .collect()
}

/// `matchLabels` and `matchExpressions` (In, NotIn, Exists, DoesNotExist); an empty selector
/// matches everything. An unknown operator matches nothing (validation reports it).
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<&str, &str>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k.as_str()) == Some(&v.as_str()));
    let by_expressions = selector.match_expressions.iter().flatten().all(|req| {
        let value = labels.get(req.key.as_str());
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
