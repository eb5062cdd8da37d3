//! Applying a Policy's `mutate` list to an object.
//!
//! Mutations run in order, each on the output of the previous one. A single
//! [`merge`](super::merge::merge) is
//! idempotent, but a list is not necessarily: a `forEach` over `spec.containers` followed by a
//! merge that appends a sidecar container leaves the sidecar without what the `forEach` gave the
//! others, and a second run (the API server's reinvocation) would add it. So the list is applied
//! until the object stops changing: the result is a fixed point, and applying the Policy again
//! (reinvocation, or `eval` twice) changes nothing. An object that is already a fixed point costs a
//! single pass, detected by [`merge_changed`] without keeping a copy to compare with; a list that
//! settles in one pass costs a second, which confirms it. (Proving from the list's shape that one
//! pass always settles it, and skipping that second pass, saved 1–4 % of a single-Policy review
//! in `cargo bench -p gatehouse --bench engine`, and nothing measurable for the group of eight
//! of `benches/fixtures/chain-8.yaml`: not worth its proof.) Unguarded lists settle
//! within a few passes; a
//! `when` guard that reads a field a later mutation writes may not settle, in which case the last
//! pass is kept and a warning says so (the bound is `mutate.len() + 2` passes).
//!
//! The webhook needs the change as a JSONPatch, not the object: [`patch`] works on a copy of only
//! what the list can reach ([`Reach`](super::merge::Reach)) when no guard reads `object`, and
//! diffs just that.
//!
//! Guards see the object as it was before their own mutation; a `forEach` guard is evaluated for
//! every element first, then the merges are applied.
//!
//! Two rules keep unguarded lists settling (see the property tests): `forEach` only merges into
//! elements that are objects, and a `forEach` merge may not mention `name` (validation rejects
//! it), since renaming or un-naming elements would let a named merge append them again on every
//! pass.
use json_patch::Patch;
use serde_json::Value;

use super::cel::{Activation, CelError};
use super::diff::{diff, diff_within};
use super::merge::{array_at, array_at_mut, merge_changed};
use super::policy::CompiledPolicy;
use crate::api::v1alpha1::FailurePolicy;

/// A `when` guard that failed at run time.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum MutateError {
    /// `spec.mutate[index].when` raised an error or did not return a bool. The message is a
    /// whole line of an admission response, so the CEL error is part of it (`error`, not a
    /// `source` that a chain would print a second time).
    #[error("spec.mutate[{index}].when: {error}")]
    When { index: usize, error: CelError },
}

impl MutateError {
    /// Whether the guard was not evaluated for exceeding its cost budget.
    pub fn is_over_budget(&self) -> bool {
        matches!(
            self,
            MutateError::When {
                error: CelError::OverBudget(_),
                ..
            }
        )
    }
}

/// What running a `mutate` list did, whatever it was run on.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// Guard failures skipped under `failurePolicy: Ignore`, each once.
    pub ignored: Vec<MutateError>,
    /// Whether the list reached a fixed point within the pass bound.
    pub settled: bool,
}

/// The mutated object, a fixed point of the list when `run.settled`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutated {
    pub object: Value,
    pub run: Run,
}

/// Applies `policy`'s mutations to a copy of `object`. A guard failure under
/// `failurePolicy: Fail` is an error; under `Ignore` that mutation (or element) is skipped.
pub fn apply(
    policy: &CompiledPolicy,
    object: &Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Mutated, MutateError> {
    let mut object = object.clone();
    let run = settle(policy, &mut object, old_object, request)?.run;
    Ok(Mutated { object, run })
}

/// What [`apply_in_place`] did: whether the object differs from what it was before.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    pub changed: bool,
    pub run: Run,
}

/// [`apply`] on `object` itself: what a member of a mutating group does to the group's working
/// copy, so that a chain of Policies copies the object once and diffs it once, not once per
/// Policy. On an error under `failurePolicy: Fail`, `object` may be half-mutated: the request is
/// denied then, and the copy is thrown away.
pub fn apply_in_place(
    policy: &CompiledPolicy,
    object: &mut Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Settled, MutateError> {
    // With `overwrite`, a pass can change a field and a later mutation change it back: only a
    // comparison tells whether the object changed.
    let before = policy.hints.overwrites.then(|| object.clone());
    let mut settled = settle(policy, object, old_object, request)?;
    if let Some(before) = before {
        settled.changed = *object != before;
    }
    Ok(settled)
}

/// What [`apply`] does to `object`, as a JSONPatch: always `diff(object, apply(object).object)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Patched {
    pub patch: Patch,
    pub run: Run,
}

/// [`apply`] followed by [`diff`], which is what a webhook answers. When no guard reads `object`,
/// only the parts of it the list can reach are copied, mutated and compared (a sidecar Policy
/// touches `spec.containers`, not the metadata, volumes or status around it).
pub fn patch(
    policy: &CompiledPolicy,
    object: &Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Patched, MutateError> {
    if let (Some(reach), Value::Object(whole)) = (&policy.hints.reach, object) {
        let mut part = Value::Object(reach.copy(whole));
        let run = settle(policy, &mut part, old_object, request)?.run;
        // A merge into an object leaves an object: the fallback below is only a safety net.
        if let Value::Object(part) = &part {
            let patch = diff_within(whole, part, reach);
            return Ok(Patched { patch, run });
        }
    }
    let mutated = apply(policy, object, old_object, request)?;
    Ok(Patched {
        patch: diff(object, &mutated.object),
        run: mutated.run,
    })
}

/// Applies the list to `object` (a working copy) until it settles. `changed` is whether some
/// pass changed something, which is whether the object changed unless a mutation overwrites.
fn settle(
    policy: &CompiledPolicy,
    object: &mut Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Settled, MutateError> {
    let mut ignored = Vec::new();
    let done = |changed, ignored, settled| {
        Ok(Settled {
            changed,
            run: Run { ignored, settled },
        })
    };
    if !pass(policy, object, old_object, request, &mut ignored)? {
        return done(false, ignored, true);
    }
    for _ in 1..max_passes(policy) {
        if !policy.hints.overwrites {
            // Without `overwrite`, a merge only adds keys and elements or fills nulls, and no
            // later merge can take that back: "something changed" is "the pass changed the
            // object", so no snapshot is needed.
            if !pass(policy, object, old_object, request, &mut ignored)? {
                return done(true, ignored, true);
            }
            continue;
        }
        // Mutations may undo each other within a pass, so "something changed" is not "the pass
        // changed the object": compare with a snapshot when the cheap test is not conclusive.
        let before = object.clone();
        if !pass(policy, object, old_object, request, &mut ignored)? || *object == before {
            return done(true, ignored, true);
        }
    }
    done(true, ignored, false)
}

/// How many passes [`apply`] makes at most before it gives up on settling.
pub fn max_passes(policy: &CompiledPolicy) -> usize {
    policy.spec().mutate.len() + 2
}

/// The elements `forEach` merges into: the objects of the array at `path`. Other elements
/// (scalars, nulls, nested arrays) are left alone: merging an object into them could only replace
/// them, and a later union or named merge would then append them again, pass after pass.
fn elements_mut<'a>(object: &'a mut Value, path: &str) -> impl Iterator<Item = &'a mut Value> {
    array_at_mut(object, path)
        .into_iter()
        .flatten()
        .filter(|e| e.is_object())
}

fn pass(
    policy: &CompiledPolicy,
    object: &mut Value,
    old_object: Option<&Value>,
    request: &Value,
    ignored: &mut Vec<MutateError>,
) -> Result<bool, MutateError> {
    let spec = policy.spec();
    let mut changed = false;
    let mut failed = |index: usize, error: CelError| {
        let e = MutateError::When { index, error };
        match spec.failure_policy {
            FailurePolicy::Fail => Err(e),
            FailurePolicy::Ignore => {
                if !ignored.contains(&e) {
                    ignored.push(e);
                }
                Ok(())
            }
        }
    };
    let guards = policy.whens.iter().zip(&policy.hints.when_needs);
    for (index, (mutation, (when, needs))) in spec.mutate.iter().zip(guards).enumerate() {
        match (&mutation.for_each, when) {
            (None, None) => changed |= merge_changed(object, &mutation.merge, mutation.overwrite),
            (None, Some(guard)) => {
                let decision = guard.eval_bool(&Activation::with_needs(
                    Some(object),
                    old_object,
                    request,
                    needs,
                ));
                match decision {
                    Ok(true) => {
                        changed |= merge_changed(object, &mutation.merge, mutation.overwrite)
                    }
                    Ok(false) => {}
                    Err(e) => failed(index, e)?,
                }
            }
            (Some(path), None) => {
                for element in elements_mut(object, path) {
                    changed |= merge_changed(element, &mutation.merge, mutation.overwrite);
                }
            }
            (Some(path), Some(guard)) => {
                let decisions: Vec<Result<bool, CelError>> = match array_at(object, path) {
                    None => continue,
                    Some(elements) => {
                        let vars = Activation::with_needs(Some(object), old_object, request, needs);
                        elements
                            .iter()
                            .filter(|e| e.is_object())
                            .map(|e| guard.eval_bool(&vars.with_element_need(e, needs.element())))
                            .collect()
                    }
                };
                for (element, decision) in elements_mut(object, path).zip(decisions) {
                    match decision {
                        Ok(true) => {
                            changed |= merge_changed(element, &mutation.merge, mutation.overwrite);
                        }
                        Ok(false) => {}
                        Err(e) => failed(index, e)?,
                    }
                }
            }
        }
    }
    Ok(changed)
}
