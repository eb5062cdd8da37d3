//! The leader's writes of one pass, in order: the API server's judgement of new match
//! conditions, in-process enforcement moved in, both webhook configurations (leaving out the
//! Policies the API server refuses), then generated objects no Policy stands for.
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::{Api, Resource, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::isolate::{self, Culprit, DryRun, Split};
use super::wiring::admission_policy::Placement;
use super::wiring::mutating_policy::InProcessMutation;
use super::wiring::schema_fit::SchemaFit;
use super::wiring::{self, Wiring};
use super::writes::*;
use super::{Applied, ControllerContext, PolicyCaches, ReconcileError, Refusal, SpecVersion};
use super::{in_process, in_process_mutating};
use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use gatehouse_api::v1alpha1::Policy;

/// The valid Policies the webhook enforces: placed there, or placed in-process and not yet
/// confirmed enforced by the API server; never one the API server refused.
fn on_webhook<'a>(placements: &[(&'a Policy, Placement)], applied: &Applied) -> Vec<&'a Policy> {
    placements
        .iter()
        .filter(|(p, _)| !applied.rejected.contains_key(&p.name_any()))
        .filter(|(p, placement)| match placement {
            Placement::Webhook(_) => true,
            Placement::InProcess(_) => !applied.in_process.confirmed.contains_key(&p.name_any()),
            Placement::InProcessMutating(_) => !applied.in_process.mutating.confirmed(p),
            Placement::Refused(_) => false,
        })
        .map(|(p, _)| *p)
        .collect()
}

/// What a leader's pass decided before its writes.
pub(super) struct Decided<'a> {
    /// The valid Policies.
    pub valid: &'a [Arc<Policy>],
    /// Where each of them runs (the ones the API server refused left out).
    pub placements: &'a [(&'a Policy, Placement)],
    /// The MutatingAdmissionPolicies of the mutating Policies placed in-process.
    pub generated_mutation: &'a [InProcessMutation],
    /// Whether each mutating Policy's merges fit its kinds' schemas.
    pub schema_fit: &'a HashMap<String, SchemaFit>,
    /// The wiring, with its owner.
    pub wiring: &'a Wiring,
    /// The CA bundle the entries carry.
    pub bundle: &'a str,
}

/// Moves Policies in-process (confirmed before the webhook lets go of them), writes both
/// configurations from the Policies left on the webhook, leaving out the ones the API server
/// refuses (found by bisecting with dry runs when a write is refused as invalid), then removes
/// generated objects no Policy stands for. Returns when to look again, if sooner than a resync.
pub(super) async fn wire(
    ctx: &ControllerContext,
    caches: &PolicyCaches,
    decided: &Decided<'_>,
    leader: &watch::Receiver<Leadership>,
    applied: &mut Applied,
) -> Result<Option<Instant>, ReconcileError> {
    let Decided {
        valid,
        placements,
        generated_mutation,
        schema_fit,
        wiring,
        bundle,
    } = decided;
    let (valid, placements, wiring, bundle) = (*valid, *placements, *wiring, *bundle);
    applied.rejected.retain(|name, refusal| {
        valid
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == refusal.spec)
    });
    check_conditions(ctx, wiring, valid, bundle, applied).await?;
    if let Some(generated) = &caches.generated {
        in_process::enforce(
            ctx,
            wiring,
            generated,
            placements,
            leader,
            &mut applied.in_process,
            &mut applied.rejected,
        )
        .await?;
    }
    let mut mutating_wake = None;
    if let Some(mutating) = caches.generated.as_ref().and_then(|g| g.mutating.as_ref()) {
        mutating_wake = in_process_mutating::enforce(
            ctx,
            wiring,
            mutating,
            generated_mutation,
            placements,
            schema_fit,
            leader,
            &mut applied.in_process.mutating,
            &mut applied.rejected,
        )
        .await?;
    }
    let candidates = on_webhook(placements, applied);
    let desired = wiring::desired(&candidates, wiring, bundle);
    let first = apply_both(ctx, caches, desired, applied, leader).await;
    // Members leaving the generated policy count their grace from a webhook write that took
    // them: while the writes fail, they stay in it.
    if first.is_err() {
        applied.in_process.mutating.restart_grace();
    }
    if matches!(&first, Err(ReconcileError::ApplyConfiguration { source: kube::Error::Api(e), .. }) if e.code == 422)
    {
        if let Err(e) = &first {
            warn!(error = %chain(e), "the API server refused the configurations; finding the Policy to blame");
        }
        let split = isolate::refused(candidates, |subset: Vec<&Policy>| {
            let desired = wiring::desired(&subset, wiring, bundle);
            dry_run_both(ctx, desired)
        })
        .await
        .map_err(search_failed)?;
        for Culprit {
            candidate: policy,
            reason,
        } in split.refused
        {
            warn!(policy = %policy.name_any(), %reason, "the API server refuses this Policy's entries; leaving it out");
            applied.rejected.insert(
                policy.name_any(),
                Refusal {
                    spec: SpecVersion::of(policy),
                    message: reason,
                },
            );
        }
        let kept = on_webhook(placements, applied);
        let desired = wiring::desired(&kept, wiring, bundle);
        if let Err(e) = apply_both(ctx, caches, desired, applied, leader).await {
            applied.in_process.mutating.restart_grace();
            return Err(e);
        }
    } else {
        first?;
    }
    let stale_wake = match &caches.generated {
        Some(generated) => {
            in_process::remove_stale(
                ctx,
                generated,
                placements,
                &applied.rejected,
                leader,
                &mut applied.in_process,
            )
            .await?
        }
        None => None,
    };
    Ok([mutating_wake, stale_wake].into_iter().flatten().min())
}

/// The wiring with its owner: the installation's ClusterRole, read once (and again each pass
/// until it is found). Without it (not installed with `config/default`, or not readable) the
/// configurations have no owner.
pub(super) async fn owned_wiring(ctx: &ControllerContext, applied: &mut Applied) -> Wiring {
    let mut wiring = ctx.wiring.clone();
    if applied.owner.is_none()
        && let Some(name) = &wiring.owner_cluster_role
    {
        let api: Api<ClusterRole> = Api::all(ctx.client.clone());
        match api.get_opt(name).await {
            Ok(Some(role)) => {
                applied.owner = role.controller_owner_ref(&()).map(|mut o| {
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
    wiring.owner = applied.owner.clone();
    wiring
}

/// Has the API server judge the match conditions of every Policy it has not judged yet (in this
/// term, at this generation), with one dry run, bisecting only when it refuses some; refused
/// Policies join `applied.rejected` with the API server's message.
async fn check_conditions(
    ctx: &ControllerContext,
    wiring: &Wiring,
    valid: &[Arc<Policy>],
    bundle: &str,
    applied: &mut Applied,
) -> Result<(), ReconcileError> {
    applied.conditions_checked.retain(|name, checked| {
        valid
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == *checked)
    });
    let unchecked: Vec<&Policy> = valid
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !p.spec.match_.conditions.is_empty())
        .filter(|p| !applied.conditions_checked.contains_key(&p.name_any()))
        .filter(|p| !applied.rejected.contains_key(&p.name_any()))
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
        applied
            .conditions_checked
            .insert(p.name_any(), SpecVersion::of(p));
    }
    for Culprit {
        candidate: p,
        reason,
    } in split.refused
    {
        warn!(policy = %p.name_any(), %reason, "the API server refuses this Policy's match conditions; leaving it out");
        applied.rejected.insert(
            p.name_any(),
            Refusal {
                spec: SpecVersion::of(p),
                message: reason,
            },
        );
    }
    Ok(())
}
