//! PolicyExceptions as the engine applies them.
//!
//! An honoured exception is written into the spec of each Policy it names ([`exempted`]): a
//! whole-Policy exemption becomes a match condition that is false for the requests it matches,
//! a rule exemption turns that rule into `exempted || rule`. The exempted Policy then runs the
//! same wherever it runs: Gatehouse's webhook evaluates its conditions, and the generated
//! admission policies carry them as their own `matchConditions` and validations. The audit
//! judges the Policy as written and asks [`CompiledExemption::holds`] which results are `skip`.
use gatehouse_api::v1alpha1::{ExceptionMatch, MatchCondition, Policy, PolicyException};
use gatehouse_cel::Expression;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::Request;
use crate::admission::Variables;

/// Names of the match conditions exemptions add: `gatehouse-exception-<hash of the exception>`.
pub const EXCEPTION_CONDITION_PREFIX: &str = "gatehouse-exception-";

/// What one honoured PolicyException says of one Policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exemption {
    /// `<namespace>/<name>` of the PolicyException.
    pub source: String,
    /// The `validate` rules exempted; empty: the whole Policy.
    pub rules: Vec<usize>,
    /// CEL over `request`, `object` and `oldObject`: true for an exempted request.
    pub expression: String,
}

/// The exemptions `exceptions` (honoured ones) make from the Policy named `policy`, in the
/// exceptions' order.
pub fn exemptions_of(policy: &str, exceptions: &[&PolicyException]) -> Vec<Exemption> {
    exceptions
        .iter()
        .filter(|e| e.spec.policies.iter().any(|p| p == policy))
        .map(|e| Exemption {
            source: format!(
                "{}/{}",
                e.metadata.namespace.as_deref().unwrap_or_default(),
                e.metadata.name.as_deref().unwrap_or_default()
            ),
            rules: e
                .spec
                .rules
                .iter()
                .filter_map(|&r| usize::try_from(r).ok())
                .collect(),
            expression: match_expression(&e.spec.match_),
        })
        .collect()
}

/// `policy` with `exemptions` written into its spec (see the module): the whole-Policy ones as
/// one match condition, whatever their number; rules past the end of `validate` exempt nothing.
pub fn exempted(policy: &Policy, exemptions: &[Exemption]) -> Policy {
    let mut policy = policy.clone();
    let whole: Vec<&Exemption> = exemptions.iter().filter(|e| e.rules.is_empty()).collect();
    if !whole.is_empty() {
        let sources: Vec<&str> = whole.iter().map(|e| e.source.as_str()).collect();
        let any: Vec<String> = whole
            .iter()
            .map(|e| format!("({})", e.expression))
            .collect();
        policy.spec.match_.conditions.push(MatchCondition {
            name: condition_name(&sources.join(",")),
            expression: format!("!({})", any.join(" || ")),
        });
    }
    for exemption in exemptions.iter().filter(|e| !e.rules.is_empty()) {
        for &index in &exemption.rules {
            if let Some(rule) = policy.spec.validate.get_mut(index) {
                rule.expression = format!("({}) || ({})", exemption.expression, rule.expression);
            }
        }
    }
    policy
}

/// The match condition name of the exception `source`: unique to it, a qualified name of at
/// most 63 characters whatever the exception's name.
fn condition_name(source: &str) -> String {
    let hash = crate::group::fnv1a(source.as_bytes());
    format!("{EXCEPTION_CONDITION_PREFIX}{hash:016x}")
}

/// The CEL form of `m`: every field given must match.
pub fn match_expression(m: &ExceptionMatch) -> String {
    let mut terms = Vec::new();
    if !m.namespaces.is_empty() {
        terms.push(format!("request.namespace in {}", list(&m.namespaces)));
    }
    if !m.names.is_empty() {
        terms.push(format!("request.name in {}", list(&m.names)));
    }
    if let Some(selector) = &m.object_selector {
        terms.extend(selector_terms(selector));
    }
    if terms.is_empty() {
        return "true".to_string();
    }
    terms.join(" && ")
}

/// The labels a selector judges: the new object's, or on DELETE the old one's (none for an object
/// without metadata, such as the options of a CONNECT).
const LABELS: &str = "(object != null \
    ? (has(object.metadata) && has(object.metadata.labels) ? object.metadata.labels : {}) \
    : (oldObject != null && has(oldObject.metadata) && has(oldObject.metadata.labels) \
        ? oldObject.metadata.labels : {}))";

fn selector_terms(selector: &LabelSelector) -> Vec<String> {
    let mut terms = Vec::new();
    for (key, value) in selector.match_labels.iter().flatten() {
        let key = quoted(key);
        terms.push(format!(
            "({key} in {LABELS} && {LABELS}[{key}] == {})",
            quoted(value)
        ));
    }
    for requirement in selector.match_expressions.iter().flatten() {
        let key = quoted(&requirement.key);
        let values = list(requirement.values.as_deref().unwrap_or_default());
        let has = format!("{key} in {LABELS}");
        terms.push(match requirement.operator.as_str() {
            "In" => format!("({has} && {LABELS}[{key}] in {values})"),
            "NotIn" => format!("(!({has}) || !({LABELS}[{key}] in {values}))"),
            "Exists" => format!("({has})"),
            "DoesNotExist" => format!("!({has})"),
            // An operator Kubernetes does not know selects nothing: it exempts nothing.
            _ => "false".to_string(),
        });
    }
    terms
}

fn quoted(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

fn list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| quoted(s)).collect();
    format!("[{}]", quoted.join(", "))
}

/// An exemption with its expression compiled, for the audit.
#[derive(Debug)]
pub struct CompiledExemption {
    pub exemption: Exemption,
    program: Expression,
}

impl CompiledExemption {
    /// Compiles the exemption's expression; `None` if it does not compile (it never fails for
    /// an expression [`match_expression`] wrote).
    pub fn new(exemption: Exemption) -> Option<Self> {
        let program = gatehouse_cel::compile(&exemption.expression).ok()?;
        Some(CompiledExemption {
            exemption,
            program: Expression::new(program),
        })
    }

    /// Whether `req` is exempted: an expression that fails to evaluate exempts nothing.
    pub fn holds(&self, req: &Request) -> bool {
        let variables = Variables::new(req);
        self.program
            .eval_bool(&variables.activation())
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests;
