//! What each Policy makes of each resource, and whether that is what the test expects. Pure:
//! the admission chain is the engine's own ([`chain::admit_judged`]), the one `gatehouse eval`
//! and the webhook run, in (priority, name) order with reinvocation.
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::file::Expected;
use super::listed::{Listed, listed_effects};
use super::suite::{Case, CaseRequest, Suite};
use crate::cli::documents;
use crate::cli::synthetic::{RequestDetails, synthesized};
use gatehouse_api::v1alpha1::{NAMESPACE_NAME_LABEL, Operation};
use gatehouse_engine::chain::{self, Decision, Judged, Matching};
use gatehouse_engine::{CompiledPolicy, Namespace, Request};

/// One case, checked.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Checked {
    pub policy: String,
    pub resource: String,
    pub expected: Expected,
    pub got: Expected,
    /// The Policy's denial, when it denied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The JSON Patch the Policy alone makes of the resource.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<Value>,
    /// Each way the outcome differs from the expectation; empty when the case passes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<String>,
}

impl Checked {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// A test file's cases, checked, and the effects its admitted resources would get.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Checks {
    pub checked: Vec<Checked>,
    pub effects: Vec<Listed>,
}

/// One resource through the chain, by one request.
struct Run<'p> {
    resource: usize,
    request_spec: CaseRequest,
    request: Request,
    judged: Judged<'p>,
    /// The object as it would be stored: `None` when denied.
    stored: Option<Value>,
    /// The labels of the request's Namespace, as the test gives them, with the name label
    /// every Namespace carries.
    labels: BTreeMap<String, String>,
}

impl Run<'_> {
    /// What the test says of the request's Namespace.
    fn labels_namespace(&self) -> Namespace<'_> {
        Namespace::Labels(&self.labels)
    }

    /// How the Policies are offered the run's request.
    fn matching(&self) -> Matching<'_> {
        Matching {
            namespace: self.labels_namespace(),
            matched: false,
        }
    }
}

/// The labels of the Namespace `name` in `suite`: as the test lists them (none when it does
/// not), with `kubernetes.io/metadata.name`, which the API server puts on every Namespace.
fn namespace_labels(suite: &Suite, name: &str) -> BTreeMap<String, String> {
    let mut labels = suite.namespaces.get(name).cloned().unwrap_or_default();
    if !name.is_empty() {
        labels.insert(NAMESPACE_NAME_LABEL.to_string(), name.to_string());
    }
    labels
}

/// Checks every case of `suite`; a resource that cannot become a request fails its cases.
pub fn check(suite: &Suite) -> Checks {
    let policies: Vec<&CompiledPolicy> = suite.policies.iter().collect();
    let mut runs: Vec<Run<'_>> = Vec::new();
    let mut checked = Vec::new();
    for case in &suite.cases {
        let resource = suite.resources[case.resource].key.clone();
        let found = runs
            .iter()
            .position(|r| r.resource == case.resource && r.request_spec == case.request);
        let run = match found {
            Some(i) => &runs[i],
            None => match run(suite, case, &policies) {
                Ok(run) => {
                    runs.push(run);
                    &runs[runs.len() - 1]
                }
                Err(why) => {
                    checked.push(unrunnable(case, resource, why));
                    continue;
                }
            },
        };
        let engine_name = documents::engine_name(&case.policy);
        let Some(policy) = suite.policies.iter().find(|p| p.name() == engine_name) else {
            checked.push(unrunnable(case, resource, "no such Policy".to_string()));
            continue;
        };
        checked.push(judge(case, resource, run, policy));
    }
    let mut effects = Vec::new();
    for run in &runs {
        if let Some(stored) = &run.stored {
            let resource = &suite.resources[run.resource].key;
            effects.extend(listed_effects(
                &suite.policies,
                &run.request,
                stored,
                resource,
                run.labels_namespace(),
            ));
        }
    }
    Checks { checked, effects }
}

/// The chain run for `case`'s resource and request.
fn run<'p>(
    suite: &'p Suite,
    case: &Case,
    policies: &[&'p CompiledPolicy],
) -> Result<Run<'p>, String> {
    let operation = case.request.operation.unwrap_or(Operation::Create);
    let details = RequestDetails {
        operation,
        namespace: case.request.namespace.clone(),
        resource: case.request.resource.clone(),
        user_info: case.request.user_info.clone(),
    };
    let object = suite.resources[case.resource].object.clone();
    // The API server always sends the stored object with an UPDATE.
    let old_object = match (&case.request.old_object, operation) {
        (None, Operation::Update) => Some(object.clone()),
        (old, _) => old.clone(),
    };
    let request = synthesized(object, old_object, &details)?;
    let labels = namespace_labels(suite, &request.namespace);
    let judged = chain::admit_judged(&request, policies, Namespace::Labels(&labels));
    let stored = if judged.outcome.response.allowed() {
        judged.outcome.object(&request)
    } else {
        None
    };
    Ok(Run {
        resource: case.resource,
        request_spec: case.request.clone(),
        request,
        judged,
        stored,
        labels,
    })
}

fn unrunnable(case: &Case, resource: String, why: String) -> Checked {
    Checked {
        policy: case.policy.clone(),
        resource,
        expected: case.expected,
        got: Expected::Skipped,
        message: None,
        warnings: Vec::new(),
        patches: Vec::new(),
        failures: vec![format!("the resource cannot be reviewed: {why}")],
    }
}

/// What `policy` made of the run, against the case.
fn judge(case: &Case, resource: String, run: &Run<'_>, policy: &CompiledPolicy) -> Checked {
    let matching = run.matching();
    let decisions: Vec<Decision> = run
        .judged
        .outcome
        .evaluated
        .iter()
        .filter(|e| e.policy.name() == policy.name())
        .map(|e| e.decision)
        .collect();
    let (mut message, mut warnings) = (None, Vec::new());
    // Alone on the object the validators judged: its own denial and warnings, not the others'.
    if let (true, Some(judged)) = (policy.has_validations(), &run.judged.judged) {
        let own = chain::admit_validating(judged, &[policy], matching).response;
        warnings.extend(own.warnings.iter().cloned());
        message = own.message().map(str::to_string);
    }
    let denied = decisions.contains(&Decision::Denied);
    if denied && message.is_none() {
        message = run.judged.outcome.response.message().map(str::to_string);
    }
    // The chain's warnings that are this Policy's own (an ignored error, a mutation's), each
    // prefixed with its name as the webhook words them.
    let own_prefix = format!("{}:", policy.named());
    let chain_warnings = &run.judged.outcome.response.warnings;
    for warning in chain_warnings.iter().filter(|w| w.starts_with(&own_prefix)) {
        if !warnings.contains(warning) {
            warnings.push(warning.clone());
        }
    }
    let (skipped, why_skipped) = skipped(run, policy, &decisions);
    if message.is_none() {
        message = why_skipped;
    }
    let got = if denied {
        Expected::Denied
    } else if skipped {
        Expected::Skipped
    } else if !warnings.is_empty() {
        Expected::Warned
    } else {
        Expected::Admitted
    };
    let marks = gatehouse_engine::policy::is_mutating(policy.spec());
    let patches = if marks && matches!(got, Expected::Admitted | Expected::Warned) {
        own_patch(&run.request, policy, matching)
    } else {
        Vec::new()
    };
    let mut checked = Checked {
        policy: case.policy.clone(),
        resource,
        expected: case.expected,
        got,
        message,
        warnings,
        patches,
        failures: Vec::new(),
    };
    checked.failures = failures(case, &checked, run.stored.as_ref());
    checked
}

/// Whether `policy` took no part in the run, and why when that is not plain "it does not
/// match": not reached (a mutating Policy denied first), or its match could not be decided.
fn skipped(
    run: &Run<'_>,
    policy: &CompiledPolicy,
    decisions: &[Decision],
) -> (bool, Option<String>) {
    // A Policy of companion objects only is not in the chain: it takes part when it selects
    // the object (its effects are listed).
    if !gatehouse_engine::policy::admits(policy.spec()) {
        return match gatehouse_engine::matches(&run.request, policy, run.labels_namespace()) {
            Ok(selects) => (!selects, None),
            Err(e) => (true, Some(format!("its match could not be decided: {e}"))),
        };
    }
    if !decisions.iter().all(|d| *d == Decision::Skipped) {
        return (false, None);
    }
    let not_reached = decisions.is_empty() && run.judged.judged.is_none();
    let why = not_reached.then(|| {
        format!(
            "not reached: a mutating Policy denied the request first ({})",
            run.judged
                .outcome
                .response
                .message()
                .unwrap_or("no reason given")
        )
    });
    (true, why)
}

/// The JSON Patch `policy` alone makes of the request's object.
fn own_patch(request: &Request, policy: &CompiledPolicy, matching: Matching<'_>) -> Vec<Value> {
    let alone = chain::admit_mutating(
        request,
        &[policy],
        policy.spec().reinvocation_policy,
        matching,
    );
    match serde_json::to_value(&alone.response.patch) {
        Ok(Value::Array(ops)) => ops,
        _ => Vec::new(),
    }
}

/// Each way `checked` (and the stored object) differs from `case`.
fn failures(case: &Case, checked: &Checked, stored: Option<&Value>) -> Vec<String> {
    let mut failures = Vec::new();
    if checked.got != case.expected {
        let why = checked
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default();
        failures.push(format!(
            "expected {}, got {}{why}",
            case.expected.as_str(),
            checked.got.as_str()
        ));
    }
    if let Some(want) = &case.message {
        let found = match case.expected {
            Expected::Denied => checked.message.as_deref().is_some_and(|m| m.contains(want)),
            _ => checked.warnings.iter().any(|w| w.contains(want)),
        };
        if !found {
            failures.push(format!(
                "expected a message containing {want:?}, got {:?}",
                checked
                    .message
                    .iter()
                    .chain(&checked.warnings)
                    .collect::<Vec<_>>()
            ));
        }
    }
    if let Some(want) = &case.patched_resource {
        match stored {
            Some(got) if got == want => {}
            Some(got) => failures.push(format!(
                "the stored object differs from patchedResource; JSON Patch from the expected \
                 object to the one got: {}",
                serde_json::to_string(&json_patch::diff(want, got)).unwrap_or_default()
            )),
            None => failures.push("patchedResource: nothing is stored".to_string()),
        }
    }
    if let Some(want) = &case.patches
        && *want != checked.patches
    {
        failures.push(format!(
            "expected patches {}, got {}",
            serde_json::to_string(want).unwrap_or_default(),
            serde_json::to_string(&checked.patches).unwrap_or_default()
        ));
    }
    failures
}
