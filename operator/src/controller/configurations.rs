//! The leader's writes of the webhook configurations: the API server's check of new match
//! conditions (step 3 of the pass) and both configurations, leaving out the Policies the API
//! server refuses (step 5).
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, warn};

use super::isolate::{self, DryRun, Split};
use super::wiring::admission_policy::Placement;
use super::wiring::{self, Wiring};
use super::writes::{apply_both, dry_run, dry_run_both, search_failed};
use super::{ControllerContext, LeaderMemory, PassInput, SpecVersion, WriteError, record_refusals};
use crate::runtime::error_chain::chain;
use gatehouse_api::v1alpha1::Policy;

/// The valid Policies the webhook enforces: placed there, or placed in-process and not yet
/// confirmed enforced by the API server; never one the API server refused.
fn on_webhook<'a>(
    placements: &[(&'a Policy, Placement)],
    memory: &LeaderMemory,
) -> Vec<&'a Policy> {
    placements
        .iter()
        .filter(|(p, _)| !memory.rejected.contains_key(&p.name_any()))
        .filter(|(p, placement)| match placement {
            Placement::Webhook(_) => true,
            Placement::InProcess(_) => !memory.in_process.confirmed.contains_key(&p.name_any()),
            Placement::InProcessMutating(_) => !memory.in_process.mutating.confirmed(p),
            Placement::Refused(_) => false,
        })
        .map(|(p, _)| *p)
        .collect()
}

/// Step 5, write configurations: both configurations from the Policies left on the webhook,
/// leaving out the ones the API server refuses (found by bisecting with dry runs when a write
/// is refused as invalid; they join `memory.rejected`).
pub(super) async fn write_configurations(
    input: &PassInput<'_>,
    placements: &[(&Policy, Placement)],
    wiring: &Wiring,
    memory: &mut LeaderMemory,
) -> Result<(), WriteError> {
    let PassInput {
        ctx,
        caches,
        bundle,
        leader,
        ..
    } = *input;
    let candidates = on_webhook(placements, memory);
    let desired = wiring::desired(&candidates, wiring, bundle);
    let first = apply_both(ctx, caches, desired, memory, leader).await;
    // Members leaving the generated policy count their grace from a webhook write that took
    // them: while the writes fail, they stay in it.
    if first.is_err() {
        memory.in_process.mutating.restart_grace();
    }
    let refused_as_invalid = matches!(&first, Err(WriteError::ApplyConfiguration { source: kube::Error::Api(e), .. }) if e.code == 422);
    if !refused_as_invalid {
        return first;
    }
    if let Err(e) = &first {
        warn!(error = %chain(e), "the API server refused the configurations; finding the Policy to blame");
    }
    let split = isolate::refused(candidates, |subset: Vec<&Policy>| {
        let desired = wiring::desired(&subset, wiring, bundle);
        dry_run_both(ctx, desired)
    })
    .await
    .map_err(search_failed)?;
    record_refusals(&mut memory.rejected, split.refused, "entries");
    let kept = on_webhook(placements, memory);
    let desired = wiring::desired(&kept, wiring, bundle);
    let written = apply_both(ctx, caches, desired, memory, leader).await;
    if written.is_err() {
        memory.in_process.mutating.restart_grace();
    }
    written
}

/// The wiring with its owner: the installation's ClusterRole, read once (and again each pass
/// until it is found). Without it (not installed with `config/default`, or not readable) the
/// configurations have no owner.
pub(super) async fn owned_wiring(ctx: &ControllerContext, memory: &mut LeaderMemory) -> Wiring {
    let mut wiring = ctx.wiring.clone();
    if memory.owner.is_none()
        && let Some(name) = &wiring.owner_cluster_role
    {
        let api: Api<ClusterRole> = Api::all(ctx.client.clone());
        match api.get_opt(name).await {
            Ok(Some(role)) => {
                memory.owner = role.controller_owner_ref(&()).map(|mut o| {
                    // An owner, not a controller: nothing else manages the configurations.
                    o.controller = None;
                    o
                });
            }
            Ok(None) => debug!(%name, "owner ClusterRole not found; configurations have no owner"),
            Err(e) => {
                debug!(%name, error = %e, "owner ClusterRole not readable; configurations have no owner")
            }
        }
    }
    wiring.owner = memory.owner.clone();
    wiring
}

/// Step 3, check: has the API server check the match conditions of every Policy it has not
/// checked yet (in this term, at this generation), with one dry run, bisecting only when it
/// refuses some; refused Policies join `memory.rejected` with the API server's message.
pub(super) async fn check_conditions(
    ctx: &ControllerContext,
    wiring: &Wiring,
    valid: &[Arc<Policy>],
    bundle: &str,
    memory: &mut LeaderMemory,
) -> Result<(), WriteError> {
    memory.conditions_checked.retain(|name, checked| {
        valid
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == *checked)
    });
    let unchecked: Vec<&Policy> = valid
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !p.spec.match_.conditions.is_empty())
        .filter(|p| !memory.conditions_checked.contains_key(&p.name_any()))
        .filter(|p| !memory.rejected.contains_key(&p.name_any()))
        .collect();
    if unchecked.is_empty() {
        return Ok(());
    }
    let accepted = |subset: Vec<&Policy>| {
        let check = wiring::condition_check(&subset, wiring, bundle);
        dry_run(ctx, check, wiring::CONDITION_CHECK_NAME)
    };
    let split = match accepted(unchecked.clone()).await? {
        DryRun::Accepted => Split {
            accepted: unchecked,
            refused: Vec::new(),
        },
        DryRun::Refused(_) => isolate::refused(unchecked, accepted)
            .await
            .map_err(search_failed)?,
    };
    for p in split.accepted {
        memory
            .conditions_checked
            .insert(p.name_any(), SpecVersion::of(p));
    }
    record_refusals(&mut memory.rejected, split.refused, "match conditions");
    Ok(())
}
