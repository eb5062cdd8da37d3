//! One request to a shared entry: every member Policy that matches, evaluated as the API server
//! would have called the Policy's own entry.
//!
//! * **Mutating** ([`mutate`]): the members run in order on one working copy, so each sees the
//!   previous one's result (its match conditions and `when` guards included), and the response
//!   carries one JSONPatch from the original to the final object. In an `IfNeeded` group the
//!   members that ran run again while a pass still changes the object (the API server would have
//!   reinvoked their own entries), so the result is a fixed point of the chain and a
//!   reinvocation of the shared entry changes nothing; a chain that does not settle (Policies
//!   overwriting each other) says so in a warning.
//! * **Validating** ([`validate`]): every matching member judges the object; all denials are
//!   reported, each naming its Policy, and all warnings are returned.
//! * A member's run-time error follows that member's failurePolicy: `Ignore` skips it with a
//!   warning, `Fail` denies. One bad Policy never changes what the others decide.
//!
//! Pure: [`Evaluated`] reports what each member did and how long it took, for the caller's
//! per-Policy metrics.
use std::time::{Duration, Instant};

use serde_json::Value;

use super::CompiledPolicy;
use super::admission::{Request, Response, Variables, admit_in_place, validating_with};
use super::matcher::{self, MatchError, Namespace};
use gatehouse_api::v1alpha1::{FailurePolicy, ReinvocationPolicy};

/// What one member did with the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// It does not match.
    Skipped,
    /// It matched and had nothing to change or object to.
    Allowed,
    /// It changed the object.
    Patched,
    /// It denied the request (a validation, or a run-time error under `Fail`).
    Denied,
    /// A run-time error skipped it under `Ignore`.
    Ignored,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Skipped => "skipped",
            Decision::Allowed => "allowed",
            Decision::Patched => "patched",
            Decision::Denied => "denied",
            Decision::Ignored => "ignored",
        }
    }
}

/// One member's part in a request.
#[derive(Clone, Debug)]
pub struct Evaluated<'p> {
    /// The Policy, borrowed from the store's snapshot for the request.
    pub policy: &'p CompiledPolicy,
    /// Its index among the members given.
    pub member: usize,
    pub decision: Decision,
    /// An expression was not evaluated: its cost budget was exceeded.
    pub over_budget: bool,
    /// Matching plus evaluation.
    pub elapsed: Duration,
}

/// The same Policy (by identity) did the same.
impl PartialEq for Evaluated<'_> {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.policy, other.policy)
            && self.member == other.member
            && self.decision == other.decision
            && self.over_budget == other.over_budget
            && self.elapsed == other.elapsed
    }
}

/// The answer to the request and what each member did.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome<'p> {
    pub response: Response,
    pub evaluated: Vec<Evaluated<'p>>,
}

impl Outcome<'_> {
    /// The object of `req` after the chain: its patch applied (an unchanged copy without one).
    pub fn object(&self, req: &Request) -> Option<Value> {
        let mut object = req.object.clone()?;
        if self.response.patched() {
            json_patch::patch(&mut object, &self.response.patch).ok()?;
        }
        Some(object)
    }
}

/// How the members are offered the request.
#[derive(Clone, Copy, Debug)]
pub struct Matching<'a> {
    /// What is known of the request's Namespace, for namespaceSelectors.
    pub namespace: Namespace<'a>,
    /// The API server matched already (a Policy's own entry): evaluate without matching.
    pub matched: bool,
}

/// Runs a mutating group; see the module documentation.
pub fn admit_mutating<'p>(
    req: &Request,
    members: &[&'p CompiledPolicy],
    reinvocation: ReinvocationPolicy,
    matching: Matching<'_>,
) -> Outcome<'p> {
    let mut chain = WorkingCopy::new(req);
    // When (by step count) each member last ran, and when the object last changed.
    let mut last_ran: Vec<Option<usize>> = vec![None; members.len()];
    let mut last_change = 0;
    let mut clock = 0;
    let mut order: Vec<usize> = (0..members.len()).collect();
    // IfNeeded: the API server would call a member's own entry again after a later one changed
    // the object. Doing that until nothing ran before the last change goes further than the
    // API server (which reinvokes once): the result is a fixed point of the whole chain, so a
    // reinvocation of the shared entry changes nothing.
    let bound = match reinvocation {
        ReinvocationPolicy::Never => 1,
        ReinvocationPolicy::IfNeeded => members.len() + 2,
    };
    for _ in 0..bound {
        for &i in &order {
            clock += 1;
            match chain.step(members[i], i, matching) {
                Ok(Decision::Patched) => {
                    last_change = clock;
                    last_ran[i] = Some(clock);
                }
                Ok(Decision::Allowed) => last_ran[i] = Some(clock),
                Ok(_) => {}
                Err(denial) => return chain.denied(denial),
            }
        }
        order = to_run_again(&last_ran, last_change);
        if order.is_empty() {
            return chain.finish();
        }
    }
    if reinvocation == ReinvocationPolicy::IfNeeded {
        chain.warnings.push(format!(
            "the Policies {} did not settle after {bound} passes: one of them undoes what another \
             writes (an overwrite, or a guard reading a field another one writes)",
            order
                .iter()
                .map(|&i| format!("{:?}", members[i].name()))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    chain.finish()
}

/// The members that ran before a later change, in order.
fn to_run_again(last_ran: &[Option<usize>], last_change: usize) -> Vec<usize> {
    (0..last_ran.len())
        .filter(|&i| last_ran[i].is_some_and(|t| t < last_change))
        .collect()
}

/// The working copy of a mutating request: members change one copy of the request in place,
/// each matched against and seeing what the previous ones left, and the answer is one diff of
/// the original object against it.
struct WorkingCopy<'r, 'p> {
    original: &'r Request,
    working: Request,
    /// The request's CEL variable: the same for every member, since it leaves the object out.
    request_variable: Value,
    warnings: Vec<String>,
    evaluated: Vec<Evaluated<'p>>,
}

impl<'r, 'p> WorkingCopy<'r, 'p> {
    fn new(req: &'r Request) -> Self {
        WorkingCopy {
            original: req,
            working: req.clone(),
            request_variable: req.cel_variable(),
            warnings: Vec::new(),
            evaluated: Vec::new(),
        }
    }

    /// Offers the working copy to `policy`, which may change it.
    fn step(
        &mut self,
        policy: &'p CompiledPolicy,
        member: usize,
        matching: Matching<'_>,
    ) -> Result<Decision, Response> {
        let started = Instant::now();
        let mut over_budget = false;
        let step = self.mutate_step(policy, matching, &mut over_budget);
        self.evaluated.push(Evaluated {
            policy,
            member,
            decision: step.as_ref().map_or(Decision::Denied, |d| *d),
            over_budget,
            elapsed: started.elapsed(),
        });
        step
    }

    fn mutate_step(
        &mut self,
        policy: &CompiledPolicy,
        matching: Matching<'_>,
        over_budget: &mut bool,
    ) -> Result<Decision, Response> {
        if let Some(decision) = offered(
            &self.working,
            policy,
            matching,
            &mut self.warnings,
            over_budget,
        )? {
            return Ok(decision);
        }
        // DELETE and CONNECT carry no object to mutate.
        let Some(mut object) = self.working.object.take() else {
            return Ok(Decision::Allowed);
        };
        let (resp, changed) =
            admit_in_place(&self.working, &self.request_variable, &mut object, policy);
        self.working.object = Some(object);
        *over_budget |= resp.over_budget;
        self.warnings.extend(resp.warnings.iter().cloned());
        if !resp.allowed {
            return Err(resp);
        }
        Ok(if changed {
            Decision::Patched
        } else if resp.ignored {
            Decision::Ignored
        } else {
            Decision::Allowed
        })
    }

    fn denied(self, denial: Response) -> Outcome<'p> {
        Outcome {
            response: Response {
                warnings: distinct(self.warnings),
                ..denial
            },
            evaluated: self.evaluated,
        }
    }

    fn finish(self) -> Outcome<'p> {
        let mut response = Response::allow();
        response.warnings = distinct(self.warnings);
        if let (Some(first), Some(last)) = (&self.original.object, &self.working.object) {
            response.patch = json_patch::diff(first, last);
        }
        Outcome {
            response,
            evaluated: self.evaluated,
        }
    }
}

/// Runs a validating group; see the module documentation.
pub fn admit_validating<'p>(
    req: &Request,
    members: &[&'p CompiledPolicy],
    matching: Matching<'_>,
) -> Outcome<'p> {
    let mut warnings = Vec::new();
    let mut denials: Vec<Response> = Vec::new();
    let mut evaluated = Vec::new();
    // The object does not change here: every member reads one conversion of the variables.
    let variables = Variables::new(req);
    let activation = variables.activation();
    for (member, &policy) in members.iter().enumerate() {
        let started = Instant::now();
        let mut over_budget = false;
        let decision = match offered(req, policy, matching, &mut warnings, &mut over_budget) {
            Err(denial) => {
                denials.push(denial);
                Decision::Denied
            }
            Ok(Some(decision)) => decision,
            Ok(None) => {
                let resp = validating_with(policy, &activation);
                over_budget |= resp.over_budget;
                warnings.extend(resp.warnings.iter().cloned());
                if resp.allowed && resp.ignored {
                    Decision::Ignored
                } else if resp.allowed {
                    Decision::Allowed
                } else {
                    denials.push(resp);
                    Decision::Denied
                }
            }
        };
        evaluated.push(Evaluated {
            policy,
            member,
            decision,
            over_budget,
            elapsed: started.elapsed(),
        });
    }
    let mut response = combine(denials).unwrap_or_else(Response::allow);
    response.warnings = distinct(warnings);
    Outcome {
        response,
        evaluated,
    }
}

/// One denial for several: Forbidden when any Policy said no, otherwise the first failure's
/// code; every message, in order.
pub fn combine(denials: Vec<Response>) -> Option<Response> {
    let first = denials.first()?;
    let forbidden = denials
        .iter()
        .find(|d| d.status.as_ref().is_some_and(|s| s.code == 403))
        .unwrap_or(first);
    let (code, reason) = forbidden
        .status
        .as_ref()
        .map_or((403, "Forbidden".to_string()), |s| {
            (s.code, s.reason.clone())
        });
    let messages: Vec<&str> = denials.iter().filter_map(Response::message).collect();
    Some(Response::deny(code, &reason, messages.join("; ")))
}

/// Warnings in first-seen order, each once: a reinvoked Policy repeats its own.
pub fn distinct(warnings: Vec<String>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    warnings
        .into_iter()
        .filter(|w| seen.insert(w.clone()))
        .collect()
}

/// `Ok(None)`: the member applies. `Ok(Some(_))`: it does not (skipped, or ignored after an
/// error). `Err`: a match error under `Fail`.
fn offered(
    current: &Request,
    policy: &CompiledPolicy,
    matching: Matching<'_>,
    warnings: &mut Vec<String>,
    over_budget: &mut bool,
) -> Result<Option<Decision>, Response> {
    if matching.matched {
        return Ok(None);
    }
    match matcher::matches(current, policy, matching.namespace) {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some(Decision::Skipped)),
        Err(e @ (MatchError::Condition { .. } | MatchError::NamespaceUnknown { .. })) => {
            *over_budget |= matches!(
                e,
                MatchError::Condition {
                    error: gatehouse_cel::CelError::OverBudget(_),
                    ..
                }
            );
            let message = format!("{}: {e}", policy.named());
            match policy.spec().effective_failure_policy() {
                FailurePolicy::Fail => Err(Response::deny(500, "InternalError", message)),
                FailurePolicy::Ignore => {
                    warnings.push(format!(
                        "{message} (policy skipped: failurePolicy is Ignore)"
                    ));
                    Ok(Some(Decision::Ignored))
                }
            }
        }
    }
}

/// The whole admission chain for `policies`, as the API server runs their entries: the mutating
/// groups in order, each entry once, then once more for an `IfNeeded` entry that ran before a
/// later one changed the object; then every validating group judges the final object, and every
/// denial is reported. `gatehouse eval` plays the cluster with it.
pub fn admit<'p>(
    req: &Request,
    policies: &[&'p CompiledPolicy],
    namespace: Namespace<'_>,
) -> Outcome<'p> {
    admit_judged(req, policies, namespace).outcome
}

/// The admission chain's outcome and what the validating Policies judged.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged<'p> {
    pub outcome: Outcome<'p>,
    /// The request with every mutation applied, as the validating Policies judged it; `None`
    /// when a mutating entry denied and nothing was judged.
    pub judged: Option<Request>,
}

/// [`admit`], also returning the request the validating Policies judged: `gatehouse test` asks
/// each Policy alone what it says of that object.
pub fn admit_judged<'p>(
    req: &Request,
    policies: &[&'p CompiledPolicy],
    namespace: Namespace<'_>,
) -> Judged<'p> {
    let groups = super::group::groups(policies);
    let by_name: std::collections::HashMap<&str, &CompiledPolicy> =
        policies.iter().map(|p| (p.name(), *p)).collect();
    let members_of = |g: &super::group::Group| -> Vec<&CompiledPolicy> {
        g.members
            .iter()
            .filter_map(|m| by_name.get(m.as_str()).copied())
            .collect()
    };
    // Offline nobody matched before us: own entries are matched here too (where `authorizer`
    // is unavailable, so a condition reading it fails by its failurePolicy).
    let matching = Matching {
        namespace,
        matched: false,
    };
    let mut admission = AdmitState {
        current: req.clone(),
        warnings: Vec::new(),
        evaluated: Vec::new(),
    };
    let mut invoked: Vec<usize> = Vec::new();
    let mut again = vec![false; groups.mutating.len()];
    for (i, g) in groups.mutating.iter().enumerate() {
        let out = admit_mutating(
            &admission.current,
            &members_of(g),
            g.reinvocation_policy,
            matching,
        );
        let entry = match admission.entry(out) {
            Ok(entry) => entry,
            Err(denial) => return admission.unjudged(req, denial),
        };
        if entry.changed {
            for &j in &invoked {
                again[j] = true;
            }
        }
        if entry.ran && g.reinvocation_policy == ReinvocationPolicy::IfNeeded {
            invoked.push(i);
        }
    }
    for (g, _) in groups.mutating.iter().zip(&again).filter(|(_, a)| **a) {
        let out = admit_mutating(
            &admission.current,
            &members_of(g),
            g.reinvocation_policy,
            matching,
        );
        if let Err(denial) = admission.entry(out) {
            return admission.unjudged(req, denial);
        }
    }
    let mut denials = Vec::new();
    for g in &groups.validating {
        let out = admit_validating(&admission.current, &members_of(g), matching);
        admission.evaluated.extend(out.evaluated);
        admission
            .warnings
            .extend(out.response.warnings.iter().cloned());
        if !out.response.allowed {
            denials.push(out.response);
        }
    }
    let judged = admission.current.clone();
    Judged {
        outcome: admission.outcome(req, combine(denials)),
        judged: Some(judged),
    }
}

/// The request as the entries so far left it, in [`admit`].
struct AdmitState<'p> {
    current: Request,
    warnings: Vec<String>,
    evaluated: Vec<Evaluated<'p>>,
}

/// What one mutating entry did in [`admit`].
struct EntryRun {
    /// A member matched and ran.
    ran: bool,
    /// The object changed.
    changed: bool,
}

impl<'p> AdmitState<'p> {
    /// Takes in one mutating entry's outcome: its patch applied to the current object.
    fn entry(&mut self, out: Outcome<'p>) -> Result<EntryRun, Response> {
        let ran = out
            .evaluated
            .iter()
            .any(|e| matches!(e.decision, Decision::Allowed | Decision::Patched));
        self.evaluated.extend(out.evaluated);
        self.warnings.extend(out.response.warnings.iter().cloned());
        if !out.response.allowed {
            return Err(out.response);
        }
        let changed = out.response.patched();
        if let Some(object) = self.current.object.as_mut() {
            json_patch::patch(object, &out.response.patch).map_err(|e| {
                Response::deny(500, "InternalError", format!("a patch does not apply: {e}"))
            })?;
        }
        Ok(EntryRun { ran, changed })
    }

    /// A mutating entry's denial: nothing was judged.
    fn unjudged(self, original: &Request, denial: Response) -> Judged<'p> {
        Judged {
            outcome: self.outcome(original, Some(denial)),
            judged: None,
        }
    }

    /// The answer: `denial`, or the patch from `original`'s object to the final one.
    fn outcome(self, original: &Request, denial: Option<Response>) -> Outcome<'p> {
        let mut response = match denial {
            Some(denial) => denial,
            None => {
                let mut allowed = Response::allow();
                if let (Some(first), Some(last)) = (&original.object, &self.current.object) {
                    allowed.patch = json_patch::diff(first, last);
                }
                allowed
            }
        };
        response.warnings = distinct(self.warnings);
        Outcome {
            response,
            evaluated: self.evaluated,
        }
    }
}
