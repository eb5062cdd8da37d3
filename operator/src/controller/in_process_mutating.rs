//! In-process mutation, the leader's part: the generated MutatingAdmissionPolicies and their
//! bindings written when what a group of in-process mutating Policies should run changes,
//! confirmed by a probe before the webhook lets go of them, and kept [`LEAVE_GRACE`] after the
//! webhook took a member back.
//!
//! The API server compiles every expression of a policy when it is written and recompiles its
//! policies after each write, so a policy is written only when what it should hold changes, and
//! a Policy's edit rewrites only its own group's policy.
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::confirm::{ProbeKind, Prober};
use super::generated::{LEAVE_GRACE, apply, delete, holds};
use super::isolate::{self, DryRun};
use super::wiring::Wiring;
use super::wiring::admission_policy::Placement;
use super::wiring::mutating_policy::{InProcessMutation, MEMBERS_ANNOTATION, place_mutating};
use super::wiring::schema_fit::SchemaFit;
use super::writes::{dry_run, search_failed};
use super::{ControllerContext, Refusal, SpecVersion, WriteError, record_refusals};
use crate::runtime::lease::Leadership;
use gatehouse_api::v1alpha1::Policy;

/// The generated mutating objects as the watches see them.
pub struct MutatingCaches {
    pub policies: Store<MutatingAdmissionPolicy>,
    pub bindings: Store<MutatingAdmissionPolicyBinding>,
}

/// What the leader remembers of in-process mutation in its term.
pub struct MutatingMemory {
    /// By generated policy: the objects the API server was seen to run, and the spec of each
    /// member then.
    confirmed: HashMap<String, ConfirmedRun>,
    /// Members of the stored policies that went back to the webhook, and since when.
    leaving: HashMap<String, Instant>,
    /// The probe confirming generated MutatingAdmissionPolicies.
    probe: Prober<ConfirmedRun>,
}

impl Default for MutatingMemory {
    fn default() -> Self {
        MutatingMemory {
            confirmed: HashMap::new(),
            leaving: HashMap::new(),
            probe: Prober::new(ProbeKind::Mutating),
        }
    }
}

#[derive(PartialEq)]
struct ConfirmedRun {
    objects: InProcessMutation,
    members: HashMap<String, SpecVersion>,
}

impl MutatingMemory {
    /// Forgets since when members have been leaving: their grace starts again with the next
    /// webhook write (this one failed).
    pub fn restart_grace(&mut self) {
        self.leaving.clear();
    }

    /// Whether the mutating probe is out.
    pub fn probing(&self) -> bool {
        self.probe.is_pending()
    }

    /// Whether the API server runs `p`'s mutations, at its current spec.
    pub fn confirmed(&self, p: &Policy) -> bool {
        let (name, spec) = (p.name_any(), SpecVersion::of(p));
        self.confirmed
            .values()
            .any(|c| c.members.get(&name) == Some(&spec))
    }
}

/// The member Policies a stored generated policy names.
fn stored_members(stored: &MutatingAdmissionPolicy) -> Vec<String> {
    stored
        .annotations()
        .get(MEMBERS_ANNOTATION)
        .map(|m| m.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// Writes each generated policy and binding that should hold something else than the API
/// server has (or than this term confirmed), and confirms them with the probe; then deletes
/// the generated objects no group stands for. Members leaving for the webhook keep every
/// policy unwritten until the webhook has had them [`LEAVE_GRACE`]: then returns when to look
/// again. A policy the API server refuses is bisected to the Policies to blame, which join
/// `rejected`.
#[allow(clippy::too_many_arguments)]
pub async fn enforce(
    ctx: &ControllerContext,
    wiring: &Wiring,
    caches: &MutatingCaches,
    desired: &[InProcessMutation],
    placements: &[(&Policy, Placement)],
    schema_fit: &HashMap<String, SchemaFit>,
    leader: &watch::Receiver<Leadership>,
    memory: &mut MutatingMemory,
    rejected: &mut HashMap<String, Refusal>,
) -> Result<Option<Instant>, WriteError> {
    let stored: Vec<Arc<MutatingAdmissionPolicy>> = caches.policies.state();
    if let Some(wake) = leaving_grace(&stored, placements, memory) {
        return Ok(Some(wake));
    }
    let mut to_confirm = Vec::new();
    let mut refused = false;
    for objects in gaining_first(desired, &stored) {
        // The specs the members have now: a new generation that changes nothing in the policy
        // (a timeout, the enforcement flipped back) is confirmed again, not written again.
        let members: HashMap<String, SpecVersion> = placements
            .iter()
            .filter(|(p, _)| objects.members.contains(&p.name_any()))
            .map(|(p, _)| (p.name_any(), SpecVersion::of(p)))
            .collect();
        let held =
            holds(&caches.policies, &objects.policy) && holds(&caches.bindings, &objects.binding);
        let known = memory
            .confirmed
            .get(objects.name())
            .is_some_and(|c| c.objects == *objects && c.members == members);
        if held && known {
            continue;
        }
        if !held {
            memory.confirmed.remove(objects.name());
            let applied = match apply(ctx, &objects.policy, leader).await? {
                Ok(()) => apply(ctx, &objects.binding, leader).await?,
                refused => refused,
            };
            if let Err(message) = applied {
                warn!(generated = %objects.name(), %message, "the API server refuses a generated MutatingAdmissionPolicy; finding the Policy to blame");
                blame(ctx, wiring, objects, placements, schema_fit, rejected).await?;
                refused = true;
                continue;
            }
        }
        to_confirm.push(ConfirmedRun {
            objects: objects.clone(),
            members,
        });
    }
    let probed = memory
        .probe
        .confirm(ctx, wiring, leader, to_confirm)
        .await?;
    for confirmed in probed.enforced {
        let objects = &confirmed.objects;
        info!(generated = %objects.name(), members = %objects.members.join(","), "mutating in-process");
        memory
            .confirmed
            .insert(objects.name().to_string(), confirmed);
    }
    // A member moving between groups is run by its new group's policy before its old one
    // goes: nothing is removed while a probe is out.
    if probed.look_again.is_some() {
        return Ok(probed.look_again);
    }
    // A refused group's members are placed again next pass: what they leave stays till then.
    if !refused {
        remove_stale(ctx, caches, desired, leader, memory).await?;
    }
    Ok(None)
}

/// When to look again, while a member of a stored generated policy that went back to the
/// webhook has not had [`LEAVE_GRACE`] there yet.
fn leaving_grace(
    stored: &[Arc<MutatingAdmissionPolicy>],
    placements: &[(&Policy, Placement)],
    memory: &mut MutatingMemory,
) -> Option<Instant> {
    let stored_members: Vec<String> = stored.iter().flat_map(|o| stored_members(o)).collect();
    let back_on_webhook: Vec<&str> = placements
        .iter()
        .filter(|(_, placement)| matches!(placement, Placement::Webhook(_)))
        .map(|(p, _)| p.metadata.name.as_deref().unwrap_or_default())
        .filter(|name| stored_members.iter().any(|m| m == name))
        .collect();
    let now = Instant::now();
    memory
        .leaving
        .retain(|name, _| back_on_webhook.contains(&name.as_str()));
    let mut wake: Option<Instant> = None;
    for name in &back_on_webhook {
        let at = *memory.leaving.entry(name.to_string()).or_insert(now) + LEAVE_GRACE;
        if now < at {
            wake = Some(wake.map_or(at, |w| w.min(at)));
        }
    }
    wake
}

/// The desired groups, those that take in a Policy their stored policy does not hold first: a
/// member moving from one group to another is run by its new policy before its old one lets
/// go of it.
fn gaining_first<'d>(
    desired: &'d [InProcessMutation],
    stored: &[Arc<MutatingAdmissionPolicy>],
) -> Vec<&'d InProcessMutation> {
    let gains = |objects: &InProcessMutation| {
        let held: Vec<String> = stored
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some(objects.name()))
            .map(|o| stored_members(o))
            .unwrap_or_default();
        objects.members.iter().any(|m| !held.contains(m))
    };
    let mut ordered: Vec<&InProcessMutation> = desired.iter().collect();
    ordered.sort_by_key(|objects| !gains(objects));
    ordered
}

/// Deletes the generated policies and bindings no desired group stands for.
async fn remove_stale(
    ctx: &ControllerContext,
    caches: &MutatingCaches,
    desired: &[InProcessMutation],
    leader: &watch::Receiver<Leadership>,
    memory: &mut MutatingMemory,
) -> Result<(), WriteError> {
    let wanted = |name: &str| desired.iter().any(|d| d.name() == name);
    let mut stale: Vec<String> = caches
        .policies
        .state()
        .iter()
        .map(|o| o.name_any())
        .chain(caches.bindings.state().iter().map(|o| o.name_any()))
        .filter(|name| !wanted(name))
        .collect();
    stale.sort();
    stale.dedup();
    for name in &stale {
        delete::<MutatingAdmissionPolicyBinding>(ctx, name, leader).await?;
        delete::<MutatingAdmissionPolicy>(ctx, name, leader).await?;
        memory.confirmed.remove(name);
        info!(generated = %name, "removed a generated MutatingAdmissionPolicy: no group of in-process Policies stands for it");
    }
    Ok(())
}

/// Finds, by dry runs of the generated policies for subsets of a refused group's members, the
/// members the API server refuses, and adds them to `rejected` with its message.
async fn blame(
    ctx: &ControllerContext,
    wiring: &Wiring,
    refused: &InProcessMutation,
    placements: &[(&Policy, Placement)],
    schema_fit: &HashMap<String, SchemaFit>,
    rejected: &mut HashMap<String, Refusal>,
) -> Result<(), WriteError> {
    let members: Vec<&Policy> = placements
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| refused.members.contains(&p.name_any()))
        .collect();
    let split = isolate::refused(members, |subset: Vec<&Policy>| async move {
        for generated in place_mutating(&subset, wiring, true, schema_fit).1 {
            let name = generated.name().to_string();
            let judged = dry_run(ctx, generated.policy, &name).await?;
            if judged != DryRun::Accepted {
                return Ok(judged);
            }
        }
        Ok(DryRun::Accepted)
    })
    .await
    .map_err(search_failed)?;
    record_refusals(rejected, split.refused, "generated mutations");
    Ok(())
}
