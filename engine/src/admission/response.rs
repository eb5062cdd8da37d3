//! The decision for one request and one Policy.
use serde_json::Value;

use super::request::{Request, Variables};
use crate::policy::{self, CompiledPolicy};
use crate::{mark, mutate};
use gatehouse_api::v1alpha1::{FailurePolicy, Policy, ValidationAction};
use gatehouse_cel as cel;
use gatehouse_cel::cost::CallBudget;

/// Which webhook configuration the request came through (and a group's entry is in; the
/// configurations' membership annotation carries it by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    Mutating,
    Validating,
}

impl Phase {
    /// For paths, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Mutating => "mutating",
            Phase::Validating => "validating",
        }
    }
}

/// `metav1.Status` of a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// The decision for one request. The uid is not part of it: [`encoded_review`](super::encoded_review) echoes the
/// request's.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub allowed: bool,
    /// Set when denied.
    pub status: Option<Status>,
    /// RFC 6902 operations from the original object to the mutated one; empty for none.
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
    /// A run-time error was skipped because the failurePolicy is `Ignore` (a warning says
    /// which); not part of the wire response, for the per-Policy metrics.
    pub ignored: bool,
    /// An expression was not evaluated because its cost budget was exceeded (for the metric).
    pub over_budget: bool,
}

impl Response {
    /// Admit unchanged.
    pub fn allow() -> Self {
        Response {
            allowed: true,
            status: None,
            patch: json_patch::Patch::default(),
            warnings: Vec::new(),
            ignored: false,
            over_budget: false,
        }
    }

    /// Reject with a `metav1.Status`.
    pub fn deny(code: u16, reason: &str, message: String) -> Self {
        Response {
            allowed: false,
            status: Some(Status {
                code,
                reason: reason.to_string(),
                message,
            }),
            ..Response::allow()
        }
    }

    /// For tracing and metrics.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the response carries a patch.
    pub fn patched(&self) -> bool {
        !self.patch.0.is_empty()
    }

    /// The denial message, if denied.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref().map(|s| s.message.as_str())
    }
}

/// Decides `req` for one Policy in one phase. The API server only sends requests the Policy's
/// webhook entry matches (rules, selectors, match conditions), so this does not match again.
pub fn admit_one(req: &Request, policy: &CompiledPolicy, phase: Phase) -> Response {
    match phase {
        Phase::Mutating => mutating(req, policy),
        Phase::Validating => validating(req, policy),
    }
}

fn prefix(policy: &CompiledPolicy) -> String {
    policy.named()
}

fn mutating(req: &Request, policy: &CompiledPolicy) -> Response {
    // DELETE and CONNECT carry no object to mutate.
    let Some(object) = req.object.as_ref().filter(|_| policy.is_mutating()) else {
        return Response::allow();
    };
    let mut mutated = object.clone();
    let (mut resp, changed) = admit_in_place(req, &req.cel_variable(), &mut mutated, policy);
    if changed && resp.allowed {
        resp.patch = json_patch::diff(object, &mutated);
    }
    resp
}

/// The denial for a `when` guard that failed under `failurePolicy: Fail`.
fn guard_failed(policy: &CompiledPolicy, e: &mutate::MutateError) -> Response {
    let mut denial = Response::deny(500, "InternalError", format!("{}: {e}", prefix(policy)));
    denial.over_budget = e.is_over_budget();
    denial
}

/// The answer of a mutating Policy whose mutations ran, without its patch: the warnings for
/// the guards `ignored` under `failurePolicy: Ignore`, and for a list that did not settle.
fn mutated_answer(policy: &CompiledPolicy, run: &mutate::Run) -> Response {
    let mut resp = Response::allow();
    resp.ignored = !run.ignored.is_empty();
    resp.over_budget = run.ignored.iter().any(mutate::MutateError::is_over_budget);
    resp.warnings = run
        .ignored
        .iter()
        .map(|e| format!("{}: {e} (skipped: failurePolicy is Ignore)", prefix(policy)))
        .collect();
    if !run.settled {
        resp.warnings.push(format!(
            "{}: mutations did not settle after {} passes; a when guard probably reads a \
             field another mutation writes",
            prefix(policy),
            mutate::max_passes(policy)
        ));
    }
    resp
}

/// [`admit_one`] for a mutating Policy that changes `object` (a working copy of the request's
/// object) itself, as a member of a mutating group does to the group's working copy: the answer
/// (never with a patch) and whether the object changed. `request` is the request's CEL variable
/// ([`Request::cel_variable`]). A denial may leave the object half-mutated.
pub fn admit_in_place(
    req: &Request,
    request: &Value,
    object: &mut Value,
    policy: &CompiledPolicy,
) -> (Response, bool) {
    if !policy.is_mutating() {
        return (Response::allow(), false);
    }
    let (resp, mut changed) = if policy.has_mutations() {
        match mutate::settle(policy, object, req.old_object.as_ref(), request) {
            Ok(mutated) => (mutated_answer(policy, &mutated.run), mutated.changed),
            Err(e) => return (guard_failed(policy, &e), false),
        }
    } else {
        (Response::allow(), false)
    };
    if let Some(ipam) = policy.ipam().filter(|_| mark::marks(req)) {
        changed |= mark::mark_for_ipam(object, &ipam.pool, ipam.annotation());
    }
    if policy.gates_companions() && mark::marks(req) {
        changed |= mark::gate_for_companions(object);
    }
    if policy.gates_calls() && mark::marks(req) {
        changed |= mark::gate_for_calls(object);
    }
    (resp, changed)
}

fn validating(req: &Request, policy: &CompiledPolicy) -> Response {
    if !policy.has_validations() {
        return Response::allow();
    }
    validating_with(policy, &Variables::new(req).activation())
}

/// What one `validate[]` rule made of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuleEvaluation {
    /// Its expression held.
    Held,
    /// Its expression was false: its action applies, with its message.
    Violated(ValidationAction),
    /// Its expression could not be evaluated: why, and whether the budget ran out.
    Failed { error: String, over_budget: bool },
}

/// Each `validate[]` rule's outcome, by index, in order. As the API server, no rule runs once
/// the call's budget is spent: the rules after it are missing.
pub fn evaluate_rules(policy: &CompiledPolicy, vars: &cel::Activation<'_>) -> Vec<RuleEvaluation> {
    let mut outcomes = Vec::new();
    let mut budget = CallBudget::validations();
    for program in &policy.validations {
        match program.eval_bool_within(vars, &mut budget) {
            Ok(true) => outcomes.push(RuleEvaluation::Held),
            Ok(false) => {
                let action = policy
                    .spec()
                    .validate
                    .get(outcomes.len())
                    .map_or(ValidationAction::Deny, |rule| rule.action);
                outcomes.push(RuleEvaluation::Violated(action));
            }
            Err(e) => {
                outcomes.push(RuleEvaluation::Failed {
                    over_budget: matches!(e, cel::CelError::OverBudget(_)),
                    error: e.to_string(),
                });
                if budget.ran_out() {
                    break;
                }
            }
        }
    }
    outcomes
}

/// The validating [`admit_one`] with the request's variables bound already.
pub fn validating_with(policy: &CompiledPolicy, vars: &cel::Activation<'_>) -> Response {
    if !policy.has_validations() {
        return Response::allow();
    }
    let (mut denials, mut failures, mut warnings) = (Vec::new(), Vec::new(), Vec::new());
    let mut ignored = false;
    let mut over_budget = false;
    for (i, (rule, outcome)) in policy
        .spec()
        .validate
        .iter()
        .zip(evaluate_rules(policy, vars))
        .enumerate()
    {
        match outcome {
            RuleEvaluation::Held => {}
            RuleEvaluation::Violated(action) => {
                let message = format!("{}: {}", prefix(policy), rule.message);
                match action {
                    ValidationAction::Deny => denials.push(message),
                    ValidationAction::Warn => warnings.push(message),
                }
            }
            RuleEvaluation::Failed {
                error,
                over_budget: spent,
            } => {
                over_budget |= spent;
                let message = format!("{}: spec.validate[{i}].expression: {error}", prefix(policy));
                // A Warn rule never refuses: as under the API server's Warn action, its
                // failure is a warning.
                if rule.action == ValidationAction::Warn {
                    warnings.push(message);
                    continue;
                }
                match policy.spec().failure_policy {
                    FailurePolicy::Fail => failures.push(message),
                    FailurePolicy::Ignore => {
                        warnings.push(format!("{message} (ignored: failurePolicy is Ignore)"));
                        ignored = true;
                    }
                }
            }
        }
    }
    let mut resp = if !denials.is_empty() {
        denials.extend(failures);
        Response::deny(403, "Forbidden", denials.join("; "))
    } else if !failures.is_empty() {
        Response::deny(500, "InternalError", failures.join("; "))
    } else {
        Response::allow()
    };
    resp.warnings = warnings;
    resp.ignored = ignored;
    resp.over_budget = over_budget;
    resp
}

/// Gatehouse's own validating webhook for Policy and NamespacedPolicy objects: denies one that
/// [`policy::validate`] (or [`policy::validate_namespaced`]) finds problems with, listing every
/// one, so `kubectl apply` fails the way the controller's status would otherwise report later.
pub fn admit_policy_object(req: &Request) -> Response {
    let Some(object) = &req.object else {
        return Response::allow();
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(&req.name);
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("Policy");
    let invalid = |message: String| {
        Response::deny(
            422,
            "Invalid",
            format!("{kind} {name:?} is invalid: {message}"),
        )
    };
    let problems = if kind == gatehouse_api::v1alpha1::NAMESPACED_POLICY_KIND {
        serde_json::from_value::<gatehouse_api::v1alpha1::NamespacedPolicy>(object.clone())
            .map(|p| policy::validate_namespaced(&p))
    } else {
        serde_json::from_value::<Policy>(object.clone())
            .map(|p| policy::validate(&gatehouse_api::v1alpha1::unmarked(p)))
    };
    match problems {
        Err(e) => invalid(format!("spec: {e}")),
        Ok(problems) if problems.is_empty() => Response::allow(),
        Ok(problems) => {
            let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
            invalid(list.join("; "))
        }
    }
}
