//! Applying a Policy's `mutate` list to an object.
//!
//! Mutations run in order, each on the output of the previous one. A single
//! [`merge`](super::merge::merge) is idempotent, but a list is not necessarily: a `forEach` over
//! `spec.containers` followed by a merge that appends a sidecar container leaves the sidecar
//! without what the `forEach` gave the others, and a second run (the API server's reinvocation)
//! would add it. So the list is applied until a pass leaves the object as it found it: the result
//! is a fixed point, and applying the Policy again (reinvocation, or `eval` twice) changes
//! nothing. Unguarded lists settle within a few passes; a `when` guard that reads a field a later
//! mutation writes may not settle, in which case the last pass is kept and a warning says so (the
//! bound is `mutate.len() + 2` passes).
//!
//! Guards see the object as it was before their own mutation; a `forEach` guard is evaluated for
//! every element first, then the merges are applied.
//!
//! Two rules keep unguarded lists settling (see the property tests): `forEach` only merges into
//! elements that are objects, and a `forEach` merge may not mention `name` (validation rejects
//! it), since renaming or un-naming elements would let a named merge append them again on every
//! pass.
use serde_json::Value;

use super::merge::{array_at, array_at_mut, merge_changed};
use super::policy::CompiledPolicy;
use gatehouse_api::v1alpha1::FailurePolicy;
use gatehouse_cel::{Activation, CelError};

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

/// What [`settle`] did to the object: whether it differs from what it was before.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutated {
    pub changed: bool,
    pub run: Run,
}

/// Applies `policy`'s mutations to `object` until it settles. A guard failure under
/// `failurePolicy: Fail` is an error, and `object` may be half-mutated then (the request is
/// denied and the copy thrown away); under `Ignore` that mutation (or element) is skipped.
///
/// A pass that changes nothing is the fixed point. Without `overwrite`, a merge only adds keys
/// and elements or fills nulls, which no later merge can take back, so a pass changed the object
/// exactly when one of its merges did ([`merge_changed`]): no copy of the object is needed. With
/// `overwrite`, a later mutation may set back what an earlier one changed, so each pass is
/// compared with a snapshot.
pub fn settle(
    policy: &CompiledPolicy,
    object: &mut Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Mutated, MutateError> {
    let overwrites = policy.spec().mutate.iter().any(|m| m.overwrite);
    let original = overwrites.then(|| object.clone());
    let mut ignored = Vec::new();
    let mut changed = false;
    let mut settled = false;
    for _ in 0..max_passes(policy) {
        let before = overwrites.then(|| object.clone());
        let merged = settle_pass(policy, object, old_object, request, &mut ignored)?;
        let pass_changed = match &before {
            Some(before) => object != before,
            None => merged,
        };
        if !pass_changed {
            settled = true;
            break;
        }
        changed = true;
    }
    if let Some(original) = original {
        changed = *object != original;
    }
    Ok(Mutated {
        changed,
        run: Run { ignored, settled },
    })
}

/// How many passes [`settle`] makes at most before it gives up on settling.
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

fn settle_pass(
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
    for (index, (mutation, when)) in spec.mutate.iter().zip(&policy.whens).enumerate() {
        match (&mutation.for_each, when) {
            (None, None) => changed |= merge_changed(object, &mutation.merge, mutation.overwrite),
            (None, Some(guard)) => {
                let decision = guard.eval_bool(&Activation::new(Some(object), old_object, request));
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
                        let vars = Activation::new(Some(object), old_object, request);
                        elements
                            .iter()
                            .filter(|e| e.is_object())
                            .map(|e| guard.eval_bool(&vars.with_element(e)))
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
