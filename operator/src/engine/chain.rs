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
use std::borrow::Cow;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::CompiledPolicy;
use super::admission::{
    Phase, Request, Response, Variables, decide, decide_in_place, validating_with,
};
use super::cel::{Activation, Needs};
use super::diff;
use super::matcher::{self, MatchError, Namespace};
use super::merge::Reach;
use crate::api::v1alpha1::{FailurePolicy, ReinvocationPolicy};

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
    /// The Policy, borrowed. Sharing its name through an `Arc` made both workers bump one
    /// reference count per member: `webhook_bench` serving a group of 128 mutating Policies
    /// went from 6980 to 8290 requests a second when that stopped.
    pub policy: &'p CompiledPolicy,
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
pub struct Scope<'a> {
    /// What is known of the request's Namespace, for namespaceSelectors.
    pub namespace: Namespace<'a>,
    /// The API server matched already (a Policy's own entry): evaluate without matching.
    pub matched: bool,
    /// Per member, whether its rules match the request, when the group's
    /// [`RuleTable`](super::rule_table::RuleTable) told already; otherwise each member's rules
    /// are matched as it is offered the request. Rules read nothing a member can change.
    pub rules: Option<&'a [bool]>,
}

impl Scope<'_> {
    /// What [`Scope::rules`] says of member `index`.
    fn rules_of(&self, index: usize) -> Option<bool> {
        self.rules.and_then(|r| r.get(index).copied())
    }
}

/// Runs a mutating group; see the module documentation.
pub fn mutate<'p>(
    req: &Request,
    members: &[&'p CompiledPolicy],
    reinvocation: ReinvocationPolicy,
    scope: Scope<'_>,
) -> Outcome<'p> {
    let mut chain = Chain::new(req);
    chain.reach = shared_reach(req, members);
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
        for (at, &i) in order.iter().enumerate() {
            clock += 1;
            match chain.step(members[i], scope.rules_of(i), scope, at + 1 == order.len()) {
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
///
/// (Running again only those whose reach a later change overlaps saved 2 % of a group-of-eight
/// request in `cargo bench -p gatehouse --bench engine` and nothing visible in
/// `webhook-https.sh`: not worth its proof.)
fn to_run_again(last_ran: &[Option<usize>], last_change: usize) -> Vec<usize> {
    (0..last_ran.len())
        .filter(|&i| last_ran[i].is_some_and(|t| t < last_change))
        .collect()
}

/// The working copy of a mutating group request. Members change one copy of the request in
/// place, and the answer is one diff of the original against it; the copy is only made once a
/// member is about to change the object. When every member only touches a known part of the
/// object and matches without reading it ([`shared_reach`]), the copy is of just that part and
/// the diff stays within it. Otherwise, the last member of a pass that finds the object untouched
/// answers with its own patch, so a lone Policy's review never copies the whole request.
///
/// `benches/webhook-https.sh`, the group of eight mutating Policies, against the fixed-allow
/// server: with a copy of what each member reaches, its own patch and diff, and every patch
/// applied to the working copy in turn, 0.417 of the baseline's throughput (225 µs of server
/// CPU per request); members changing one copy of the whole object in place, 0.53 (175 µs, on a
/// busy machine); a shared copy of just the part they reach, 0.55 (142 µs against the
/// baseline's 71 µs, quiet machine). In-process (parse, the eight, the answer): 228, 145 and
/// 77 µs. A single-Policy review went from 152 to 122 µs of server CPU (throughput 0.56 to 0.66
/// of the baseline) when its answer stopped being a copy of the whole request and a diff of the
/// whole object (749af71 against 8c954a9).
struct Chain<'r, 'p> {
    original: &'r Request,
    /// What the members can touch, when that is all they touch and none of them reads the
    /// object to match: the working copy is then `part`.
    reach: Option<Cow<'p, Reach>>,
    /// The working copy of the reached part of the object ([`Reach::copy`]).
    part: Option<Value>,
    /// The working copy of the whole request, once a member has changed the object (or is
    /// about to), when there is no `reach`.
    working: Option<Request>,
    /// The operations from `original` that `working` does not hold yet: a member's own patch,
    /// recorded while there was no working copy.
    pending: Vec<json_patch::PatchOperation>,
    warnings: Vec<String>,
    evaluated: Vec<Evaluated<'p>>,
}

/// What all `members` can touch of `req`'s object, when each of them only touches what its
/// mutate list reaches (no guard reads `object`, no IPAM mark) and matches without reading the
/// object ([`matcher::reads_object`]): members can then run on a copy of just that, matched
/// against the original request.
fn shared_reach<'p>(req: &Request, members: &[&'p CompiledPolicy]) -> Option<Cow<'p, Reach>> {
    if !matches!(req.object, Some(Value::Object(_))) {
        return None;
    }
    members_reach(req.is_namespace(), members)
}

/// What all `members` can touch of an object, judged before it is decoded, from whether it is a
/// Namespace (all the request tells about it): how far the server needs to decode it
/// ([`parse_request_within`](super::admission::parse_request_within)). [`mutate`] finds the same
/// reach on the request so decoded, and the members then read and write nothing outside it.
pub fn members_reach<'p>(
    namespace_object: bool,
    members: &[&'p CompiledPolicy],
) -> Option<Cow<'p, Reach>> {
    let reach = |policy: &'p CompiledPolicy| {
        let touches_only_its_reach =
            policy.ipam().is_none() && !matcher::reads_object_of(policy, namespace_object);
        policy
            .hints
            .reach
            .as_ref()
            .filter(|_| touches_only_its_reach)
    };
    // A lone Policy's reach serves as it is: no union to build per request.
    if let [only] = members {
        return reach(only).map(Cow::Borrowed);
    }
    let mut shared = Reach::default();
    for policy in members {
        shared.add(reach(policy)?);
    }
    Some(Cow::Owned(shared))
}

impl<'r, 'p> Chain<'r, 'p> {
    fn new(req: &'r Request) -> Self {
        Chain {
            original: req,
            reach: None,
            part: None,
            working: None,
            pending: Vec::new(),
            warnings: Vec::new(),
            evaluated: Vec::new(),
        }
    }

    /// The request as the members so far left it (once [`flush`](Self::flush)ed), for matching
    /// and for the next group. With a `reach`, nothing that matching reads has changed.
    fn current(&self) -> &Request {
        self.working.as_ref().unwrap_or(self.original)
    }

    /// The working copy, made from the original when there is none yet.
    fn working(&mut self) -> &mut Request {
        self.working.get_or_insert_with(|| self.original.clone())
    }

    /// Brings the working copy up to date with the pending operations.
    fn flush(&mut self) -> Result<(), json_patch::PatchError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        if let Some(object) = self.working().object.as_mut() {
            json_patch::patch(object, &pending)?;
        }
        Ok(())
    }

    /// Records `ops`, a patch from the current object: kept as it is while the original is
    /// untouched, applied to the working copy otherwise.
    fn record(
        &mut self,
        ops: Vec<json_patch::PatchOperation>,
    ) -> Result<(), json_patch::PatchError> {
        if ops.is_empty() {
            return Ok(());
        }
        if self.working.is_none() && self.pending.is_empty() {
            self.pending = ops;
            return Ok(());
        }
        self.pending.extend(ops);
        self.flush()
    }

    /// Lets `policy` change the working copy in place: its answer and whether it changed.
    fn mutate_in_place(&mut self, policy: &CompiledPolicy) -> (Response, bool) {
        let original = self.original;
        if let (Some(reach), Some(Value::Object(whole))) = (&self.reach, &original.object) {
            let part = self
                .part
                .get_or_insert_with(|| Value::Object(reach.copy(whole)));
            return decide_in_place(original, part, policy);
        }
        // DELETE and CONNECT carry no object to mutate: no copy of the request for them.
        if original.object.is_none() {
            return (Response::allow(), false);
        }
        let working = self.working();
        let Some(mut object) = working.object.take() else {
            return (Response::allow(), false);
        };
        let decided = decide_in_place(original, &mut object, policy);
        working.object = Some(object);
        decided
    }

    /// Offers the working copy to `policy`; `rules` says whether its rules match, when known.
    fn step(
        &mut self,
        policy: &'p CompiledPolicy,
        rules: Option<bool>,
        scope: Scope<'_>,
        last: bool,
    ) -> Result<Decision, Response> {
        let started = Instant::now();
        let mut over_budget = false;
        let step = mutate_step(self, policy, (rules, scope), last, &mut over_budget);
        self.evaluated.push(Evaluated {
            policy,
            decision: step.as_ref().map_or(Decision::Denied, |d| *d),
            over_budget,
            elapsed: started.elapsed(),
        });
        step
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

    fn finish(mut self) -> Outcome<'p> {
        let mut response = Response::allow();
        response.warnings = distinct(std::mem::take(&mut self.warnings));
        response.patch = match (
            &self.reach,
            &self.part,
            &self.working,
            &self.original.object,
        ) {
            (Some(reach), Some(Value::Object(part)), _, Some(Value::Object(whole))) => {
                diff::diff_within(whole, part, reach)
            }
            (
                _,
                _,
                Some(Request {
                    object: Some(last), ..
                }),
                Some(first),
            ) if self.pending.is_empty() => diff::diff(first, last),
            _ => json_patch::Patch(self.pending),
        };
        Outcome {
            response,
            evaluated: self.evaluated,
        }
    }
}

/// Runs a validating group; see the module documentation.
pub fn validate<'p>(
    req: &Request,
    members: &[&'p CompiledPolicy],
    scope: Scope<'_>,
) -> Outcome<'p> {
    let mut warnings = Vec::new();
    let mut denials: Vec<Response> = Vec::new();
    let mut evaluated = Vec::new();
    // The object does not change here, so members whose validations read the same parts of the
    // request share one conversion of them to CEL values.
    let variables = Variables::new(req, members.iter().map(|p| &p.hints.validation_needs));
    let mut shared = SharedActivations::new(&variables);
    for (i, &policy) in members.iter().enumerate() {
        let started = Instant::now();
        let mut over_budget = false;
        let offer = (scope.rules_of(i), scope);
        let decision = match offered(req, policy, offer, &mut warnings, &mut over_budget) {
            Err(denial) => {
                denials.push(denial);
                Decision::Denied
            }
            Ok(Some(decision)) => decision,
            Ok(None) => {
                let resp = shared.with(&policy.hints.validation_needs, |vars| {
                    validating_with(policy, vars)
                });
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

/// The activations of a validating group's members, one per distinct [`Needs`]: members that
/// read the same parts of the request share their conversion to CEL values. Converting `object`
/// per member was a tenth of Gatehouse's CPU in `tests/bench/admission-load`'s 256-Policy phase
/// (perf); `webhook_bench` serving its 128 validating Policies (one expression alike), three
/// interleaved 6 s wrk runs each: 3550 requests a second with an activation per member, 3995
/// shared (+12.5 %).
struct SharedActivations<'v, 'n> {
    variables: &'v Variables<'v>,
    kept: Vec<(&'n Needs, Activation<'v>)>,
}

impl<'v, 'n> SharedActivations<'v, 'n>
where
    'n: 'v,
{
    /// How many distinct needs are kept: finding one is a scan, and past a few the members
    /// read different things anyway.
    const KEPT: usize = 16;

    fn new(variables: &'v Variables<'v>) -> Self {
        SharedActivations {
            variables,
            kept: Vec::new(),
        }
    }

    /// `f` over an activation of the variables for expressions that read no more than `needs`.
    fn with<R>(&mut self, needs: &'n Needs, f: impl FnOnce(&Activation<'v>) -> R) -> R {
        if let Some((_, vars)) = self.kept.iter().find(|(n, _)| *n == needs) {
            return f(vars);
        }
        let vars = self.variables.activation(needs);
        let result = f(&vars);
        if self.kept.len() < Self::KEPT {
            self.kept.push((needs, vars));
        }
        result
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
    (rules, scope): (Option<bool>, Scope<'_>),
    warnings: &mut Vec<String>,
    over_budget: &mut bool,
) -> Result<Option<Decision>, Response> {
    if scope.matched {
        return Ok(None);
    }
    let matched = match rules {
        Some(false) => return Ok(Some(Decision::Skipped)),
        Some(true) => matcher::matches_beyond_rules(current, policy, scope.namespace),
        None => matcher::matches(current, policy, scope.namespace),
    };
    match matched {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some(Decision::Skipped)),
        Err(e @ (MatchError::Condition { .. } | MatchError::NamespaceUnknown { .. })) => {
            *over_budget |= matches!(
                e,
                MatchError::Condition {
                    error: super::cel::CelError::OverBudget(_),
                    ..
                }
            );
            let message = format!("policy {:?}: {e}", policy.name());
            match policy.spec().failure_policy {
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

/// Offers the working copy to one mutating member and lets it change the copy. The `last`
/// member of a pass that finds the original untouched answers with its own patch instead.
fn mutate_step(
    chain: &mut Chain<'_, '_>,
    policy: &CompiledPolicy,
    offer: (Option<bool>, Scope<'_>),
    last: bool,
    over_budget: &mut bool,
) -> Result<Decision, Response> {
    chain.flush().map_err(|e| {
        Response::deny(
            500,
            "InternalError",
            format!("a patch of an earlier Policy does not apply: {e}"),
        )
    })?;
    if let Some(decision) = offered(
        chain.working.as_ref().unwrap_or(chain.original),
        policy,
        offer,
        &mut chain.warnings,
        over_budget,
    )? {
        return Ok(decision);
    }
    let (resp, changed) = if last && chain.reach.is_none() && chain.working.is_none() {
        let mut resp = decide(chain.original, policy, Phase::Mutating);
        let ops = std::mem::take(&mut resp.patch.0);
        let changed = !ops.is_empty();
        chain.pending = ops;
        (resp, changed)
    } else {
        chain.mutate_in_place(policy)
    };
    *over_budget |= resp.over_budget;
    chain.warnings.extend(resp.warnings.iter().cloned());
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

/// The whole admission chain for `policies`, as the API server runs their entries: the mutating
/// groups in order, each entry once, then once more for an `IfNeeded` entry that ran before a
/// later one changed the object; then every validating group judges the final object, and every
/// denial is reported. `gatehouse eval` plays the cluster with it.
pub fn admit<'p>(
    req: &Request,
    policies: &[&'p CompiledPolicy],
    namespace: Namespace<'_>,
) -> Outcome<'p> {
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
    let scope = Scope {
        namespace,
        matched: false,
        rules: None,
    };
    let mut chain = Chain::new(req);
    let mut invoked: Vec<usize> = Vec::new();
    let mut again = vec![false; groups.mutating.len()];
    let entry =
        |chain: &mut Chain<'_, 'p>, g: &super::group::Group| -> Result<(bool, bool), Response> {
            chain.flush().map_err(|e| {
                Response::deny(500, "InternalError", format!("a patch does not apply: {e}"))
            })?;
            let out = mutate(
                chain.current(),
                &members_of(g),
                g.reinvocation_policy,
                scope,
            );
            let ran = out
                .evaluated
                .iter()
                .any(|e| matches!(e.decision, Decision::Allowed | Decision::Patched));
            chain.evaluated.extend(out.evaluated);
            chain.warnings.extend(out.response.warnings.iter().cloned());
            if !out.response.allowed {
                return Err(out.response);
            }
            let changed = out.response.patched();
            chain.record(out.response.patch.0).map_err(|e| {
                Response::deny(500, "InternalError", format!("a patch does not apply: {e}"))
            })?;
            Ok((ran, changed))
        };
    for (i, g) in groups.mutating.iter().enumerate() {
        let (ran, changed) = match entry(&mut chain, g) {
            Ok(done) => done,
            Err(denial) => return chain.denied(denial),
        };
        if changed {
            for &j in &invoked {
                again[j] = true;
            }
        }
        if ran && g.reinvocation_policy == ReinvocationPolicy::IfNeeded {
            invoked.push(i);
        }
    }
    for (g, _) in groups.mutating.iter().zip(&again).filter(|(_, a)| **a) {
        if let Err(denial) = entry(&mut chain, g) {
            return chain.denied(denial);
        }
    }

    if let Err(e) = chain.flush() {
        let denial = Response::deny(500, "InternalError", format!("a patch does not apply: {e}"));
        return chain.denied(denial);
    }
    let mut denials = Vec::new();
    for g in &groups.validating {
        let out = validate(chain.current(), &members_of(g), scope);
        chain.evaluated.extend(out.evaluated);
        chain.warnings.extend(out.response.warnings.iter().cloned());
        if !out.response.allowed {
            denials.push(out.response);
        }
    }
    match combine(denials) {
        Some(denial) => chain.denied(denial),
        None => chain.finish(),
    }
}
