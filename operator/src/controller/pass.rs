//! One pass of the Policy controller, a pipeline of named steps:
//!
//! validate → place → check → enforce in-process → write configurations → remove stale →
//! write statuses.
//!
//! Every replica validates (its webhook server serves what it compiles, and must never 404 an
//! entry the API server may still call); only the leader goes on, and each of its writes is
//! fenced by its term. A step that fails is the pass's error variant
//! ([`ReconcileError`]), so the failure metric says which step failed.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::configurations::{check_conditions, owned_wiring, write_configurations};
use super::exceptions::write_exception_statuses;
use super::status::Verdict;
use super::wiring::admission_policy::Placement;
use super::wiring::mutating_policy::InProcessMutation;
use super::wiring::placement::{Served, place_all};
use super::wiring::schema_fit::SchemaFit;
use super::wiring::{self, Wiring};
use super::writes::write_status;
use super::{
    ControllerContext, LeaderMemory, PassInput, PolicyCaches, ReconcileError, Refusal, SpecVersion,
    WriteError, in_process, in_process_mutating, schemas,
};
use crate::runtime::reconcile::Next;
use crate::webhook::PolicyStore;
use gatehouse_api::v1alpha1::{IPPool, Policy, PolicySource};
use gatehouse_engine as engine;
use gatehouse_engine::group::Group;

/// Where the valid Policies run, as the place step decided.
pub(super) struct Placed<'a> {
    /// Each valid Policy the API server had not refused, with where it runs.
    pub placements: Vec<(&'a Policy, Placement)>,
    /// The MutatingAdmissionPolicies of the mutating Policies placed in-process.
    pub generated_mutation: Vec<InProcessMutation>,
    /// Whether each mutating Policy's merges fit its kinds' schemas.
    pub schema_fit: HashMap<String, SchemaFit>,
}

/// Runs the pipeline once. Returns when to look again, if sooner than a resync.
pub(super) async fn reconcile_all(
    input: &PassInput<'_>,
    memory: &mut LeaderMemory,
) -> Result<Next, ReconcileError> {
    let PassInput { ctx, caches, .. } = *input;
    let validated = validate_all(ctx, caches);
    if !input.leading {
        track_wired(ctx, caches, &validated.valid, Vec::new());
        return Ok(Next::Resync);
    }
    let wiring = owned_wiring(ctx, memory).await;
    forget_old_refusals(&mut memory.rejected, &validated.valid);
    let placed = place(input, &validated.valid, &wiring, memory).await;
    let written = enforce_and_write(input, &validated.valid, &placed, &wiring, memory).await;
    track_wired(ctx, caches, &validated.valid, written_groups(memory));
    write_statuses(input, validated.verdicts, &placed, memory, written.is_ok()).await?;
    write_exception_statuses(ctx, &caches.policies, input.leader)
        .await
        .map_err(ReconcileError::WriteStatuses)?;
    written.map(|wake| wake.map_or(Next::Resync, Next::By))
}

/// What the validate step decides of every Policy before any write.
struct Validated {
    /// The Policies to wire, compiled into the server's store.
    valid: Vec<Arc<Policy>>,
    /// Every Policy with its verdict, in order.
    verdicts: Vec<(Arc<Policy>, Verdict)>,
}

/// Step 1, validate: every Policy compiled into this replica's webhook server (or found there) or
/// found invalid; then the server told which Policies the API server enforces (their status
/// says so, for their current spec), so it never evaluates those too.
fn validate_all(ctx: &ControllerContext, caches: &PolicyCaches) -> Validated {
    let all = caches.policies.state();
    let pool = |name: &str| {
        caches
            .pools
            .get(&kube::runtime::reflector::ObjectRef::new(name))
    };
    let validated = validate_each(
        &all,
        |policy| {
            compile(&ctx.policies, policy)?;
            match ctx.blocked.problems_of(&policy.name_any()) {
                blocked if blocked.is_empty() => Ok(()),
                blocked => Err(blocked),
            }
        },
        pool,
    );
    ctx.policies.set_in_process(
        validated
            .valid
            .iter()
            .filter(|p| in_process::enforced_in_process(p))
            .map(|p| p.name_any())
            .collect(),
    );
    ctx.readiness.policies_loaded.store(true, Ordering::Release);
    validated
}

/// Validates every Policy: `compile` compiles one into the server's store (or finds it there) or
/// lists its problems, and an ipam effect needs its IPPool (`pool`) to be wired, and to allow a
/// NamespacedPolicy's namespace, since wired it would hold every Pod it marks at its gate with no
/// pool to serve them.
fn validate_each(
    all: &[Arc<Policy>],
    mut compile: impl FnMut(&Policy) -> Result<(), Vec<String>>,
    pool: impl Fn(&str) -> Option<Arc<IPPool>>,
) -> Validated {
    let mut validated = Validated {
        valid: Vec::new(),
        verdicts: Vec::with_capacity(all.len()),
    };
    for policy in all {
        let problems = match compile(policy) {
            Ok(()) => pool_problems(policy, &pool),
            Err(problems) => problems,
        };
        let verdict = if problems.is_empty() && !engine::policy::admits(&policy.spec) {
            Verdict::EffectsOnly
        } else if problems.is_empty() {
            validated.valid.push(policy.clone());
            Verdict::Wired {
                own_entry: engine::policy::needs_own_entry(&policy.spec),
                // Said once the pass has placed it.
                webhook_because: String::new(),
            }
        } else {
            Verdict::Invalid(problems)
        };
        validated.verdicts.push((policy.clone(), verdict));
    }
    validated
}

/// Compiles `policy` into the server's store unless its spec is there already (the store is
/// the cache: CEL is compiled once per spec, not once per pass), or lists its problems. A
/// Policy is served before the API server is told about it.
fn compile(store: &PolicyStore, policy: &Policy) -> Result<(), Vec<String>> {
    let stored = store
        .get(&policy.name_any())
        .is_some_and(|c| c.spec() == &policy.spec);
    if stored {
        return Ok(());
    }
    match engine::compile(policy) {
        Ok(compiled) => {
            store.upsert(Arc::new(compiled));
            Ok(())
        }
        Err(invalid) => Err(invalid.problems.iter().map(ToString::to_string).collect()),
    }
}

/// A Policy the API server refused runs nowhere, so it neither holds a place in the in-process
/// mutation order nor blocks one; a new spec of it (or of one gone) is tried again.
fn forget_old_refusals(rejected: &mut HashMap<String, Refusal>, valid: &[Arc<Policy>]) {
    rejected.retain(|name, refusal| {
        valid
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == refusal.spec)
    });
}

/// Step 2, place: where each valid Policy the API server has not refused runs, with the
/// generated MutatingAdmissionPolicies of the mutating ones placed in-process.
async fn place<'a>(
    input: &PassInput<'_>,
    valid: &'a [Arc<Policy>],
    wiring: &Wiring,
    memory: &mut LeaderMemory,
) -> Placed<'a> {
    let placeable: Vec<&Policy> = valid
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !memory.rejected.contains_key(&p.name_any()))
        .collect();
    let generated = input.caches.generated.as_ref();
    let served = Served {
        validating: generated.is_some(),
        mutating: generated.is_some_and(|g| g.mutating.is_some()),
    };
    let schema_fit = if served.mutating {
        schemas::schema_fits(&input.ctx.client, &placeable, &mut memory.schemas).await
    } else {
        HashMap::new()
    };
    let (placements, generated_mutation) = place_all(&placeable, wiring, served, &schema_fit);
    Placed {
        placements,
        generated_mutation,
        schema_fit,
    }
}

/// Steps 3 to 6: check the match conditions with the API server, enforce in-process (moved in
/// before the webhook lets go), write both configurations, remove what no Policy stands for.
async fn enforce_and_write(
    input: &PassInput<'_>,
    valid: &[Arc<Policy>],
    placed: &Placed<'_>,
    wiring: &Wiring,
    memory: &mut LeaderMemory,
) -> Result<Option<tokio::time::Instant>, ReconcileError> {
    let PassInput {
        ctx,
        caches,
        bundle,
        leader,
        ..
    } = *input;
    let placements = placed.placements.as_slice();
    check_conditions(ctx, wiring, valid, bundle, memory)
        .await
        .map_err(step(ReconcileError::Check))?;
    let mut probe_wake = None;
    let mut mutating_wake = None;
    if let Some(generated) = &caches.generated {
        probe_wake = in_process::enforce(
            ctx,
            wiring,
            generated,
            placements,
            leader,
            &mut memory.in_process,
            &mut memory.rejected,
        )
        .await
        .map_err(step(ReconcileError::EnforceInProcess))?;
        if let Some(mutating) = &generated.mutating {
            mutating_wake = in_process_mutating::enforce(
                ctx,
                wiring,
                mutating,
                &placed.generated_mutation,
                placements,
                &placed.schema_fit,
                leader,
                &mut memory.in_process.mutating,
                &mut memory.rejected,
            )
            .await
            .map_err(step(ReconcileError::EnforceInProcess))?;
        }
    }
    write_configurations(input, placements, wiring, memory)
        .await
        .map_err(step(ReconcileError::WriteConfigurations))?;
    let stale_wake = match &caches.generated {
        Some(generated) => in_process::remove_stale(
            ctx,
            generated,
            placements,
            &memory.rejected,
            leader,
            &mut memory.in_process,
        )
        .await
        .map_err(step(ReconcileError::RemoveStale))?,
        None => None,
    };
    Ok([probe_wake, mutating_wake, stale_wake]
        .into_iter()
        .flatten()
        .min())
}

/// The pass's error for a failure of one step; leadership lost mid-step is not a step's
/// failure but the end of the pass's writes.
fn step(at: fn(WriteError) -> ReconcileError) -> impl Fn(WriteError) -> ReconcileError {
    move |e| match e {
        WriteError::NotLeading { what } => ReconcileError::NotLeading { what },
        e => at(e),
    }
}

/// Tells the webhook server which entries the API server may still call, as read back and as
/// this replica last wrote them (the watch may not have brought its own write back yet, and the
/// API server may already call it): never a 404 for those, whoever leads. Anything else no
/// longer valid may be forgotten once its grace is over.
fn track_wired(
    ctx: &ControllerContext,
    caches: &PolicyCaches,
    valid: &[Arc<Policy>],
    written: Vec<Group>,
) {
    let mut groups = wiring::wired_groups(
        caches.mutating.state().iter().map(|c| c.as_ref()),
        caches.validating.state().iter().map(|c| c.as_ref()),
    );
    for group in written {
        if !groups.contains(&group) {
            groups.push(group);
        }
    }
    ctx.policies.set_wired(groups);
    let keep: HashSet<String> = valid.iter().map(|p| p.name_any()).collect();
    for name in ctx.policies.names() {
        if !keep.contains(&name) {
            ctx.policies.retire(&name);
        }
    }
}

/// Step 7, write statuses: where each Policy runs, or why it runs nowhere. Written whether or
/// not the configurations were (`wired`), but a Policy is reported wired only once they were.
async fn write_statuses(
    input: &PassInput<'_>,
    verdicts: Vec<(Arc<Policy>, Verdict)>,
    placed: &Placed<'_>,
    memory: &LeaderMemory,
    wired: bool,
) -> Result<(), ReconcileError> {
    let now = Time(Timestamp::now());
    let verdicts = in_process::verdicts(verdicts, &placed.placements, &memory.in_process);
    for (policy, verdict) in statuses(verdicts, &memory.rejected, wired) {
        write_status(input.ctx, &policy, &verdict, now.clone(), input.leader)
            .await
            .map_err(step(ReconcileError::WriteStatuses))?;
    }
    Ok(())
}

/// The statuses a leader writes once the wiring is known: a Policy the API server refused says
/// so with its message, and one is reported wired only once the configurations were written.
fn statuses(
    verdicts: Vec<(Arc<Policy>, Verdict)>,
    rejected: &HashMap<String, Refusal>,
    wired: bool,
) -> Vec<(Arc<Policy>, Verdict)> {
    verdicts
        .into_iter()
        .map(|(policy, verdict)| match rejected.get(&policy.name_any()) {
            Some(refusal) => (policy, Verdict::Rejected(refusal.message.clone())),
            None => (policy, verdict),
        })
        .filter(|(_, verdict)| wired || !matches!(verdict, Verdict::Wired { .. }))
        .collect()
}

/// The groups of the configurations this replica last wrote, from their membership annotation.
fn written_groups(memory: &LeaderMemory) -> Vec<Group> {
    [&memory.mutating, &memory.validating]
        .into_iter()
        .flatten()
        .filter_map(|w| {
            w.body
                .pointer("/metadata/annotations")?
                .get(wiring::GROUPS_ANNOTATION)?
                .as_str()
                .map(str::to_string)
        })
        .flat_map(|text| serde_json::from_str::<Vec<Group>>(&text).unwrap_or_default())
        .collect()
}

/// The ipam effects of `policy` whose IPPool does not exist, or does not list the namespace of
/// the NamespacedPolicy `policy` was written as, as problems.
fn pool_problems(policy: &Policy, pool: impl Fn(&str) -> Option<Arc<IPPool>>) -> Vec<String> {
    let source = PolicySource::of(policy);
    let ipams = policy
        .spec
        .effects
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, e.ipam.as_ref()?)));
    let mut problems = Vec::new();
    for (i, ipam) in ipams {
        let name = &ipam.pool;
        match (pool(name), source.namespace()) {
            (None, _) => problems.push(format!(
                "spec.effects[{i}].ipam.pool: IPPool {name:?} does not exist; the {} is not \
                 wired until it does",
                source.kind()
            )),
            (Some(p), Some(namespace)) if !p.spec.namespaces.iter().any(|n| n == namespace) => {
                problems.push(format!(
                    "spec.effects[{i}].ipam.pool: IPPool {name:?} does not allow namespace \
                     {namespace:?} (its spec.namespaces); the NamespacedPolicy is not wired \
                     until it does"
                ));
            }
            _ => {}
        }
    }
    problems
}

#[cfg(test)]
mod tests;
