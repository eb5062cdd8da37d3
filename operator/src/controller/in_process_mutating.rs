//! In-process mutation, the leader's part: the one generated MutatingAdmissionPolicy and its
//! binding written when the set of in-process mutating Policies changes, confirmed by a probe
//! before the webhook lets go of them, and kept [`LEAVE_GRACE`] after the webhook took a member
//! back.
//!
//! The API server compiles every expression of a policy when it is written and recompiles its
//! policies after each write, so the policy is written only when what it should hold changes.
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::in_process::{LEAVE_GRACE, apply, delete, holds};
use super::isolate::{self, Culprit, DryRun};
use super::wiring::Wiring;
use super::wiring::admission_policy::{PROBE_LABEL, Placement};
use super::wiring::mutating_policy::{
    InProcessMutation, MEMBERS_ANNOTATION, MUTATING_NAME, MUTATING_PROBE_ANNOTATION,
    mutating_probe, place_mutating,
};
use super::wiring::schema_fit::SchemaFit;
use super::writes::{dry_run, search_failed};
use super::{ControllerContext, ReconcileError, Refusal, SpecVersion};
use crate::api::v1alpha1::Policy;
use crate::lease::Leadership;

const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// The generated mutating objects as the watches see them.
pub struct MutatingCaches {
    pub policies: Store<MutatingAdmissionPolicy>,
    pub bindings: Store<MutatingAdmissionPolicyBinding>,
}

/// What the leader remembers of in-process mutation in its term.
#[derive(Default)]
pub struct MutatingMemory {
    /// The generated objects the API server was seen to run, and the spec of each member then.
    confirmed: Option<Confirmed>,
    /// Members of the stored policy that went back to the webhook, and since when.
    leaving: HashMap<String, Instant>,
}

struct Confirmed {
    objects: InProcessMutation,
    members: HashMap<String, SpecVersion>,
}

impl MutatingMemory {
    /// Forgets since when members have been leaving: their grace starts again with the next
    /// webhook write (this one failed).
    pub fn restart_grace(&mut self) {
        self.leaving.clear();
    }

    /// Whether the API server runs `p`'s mutations, at its current spec.
    pub fn confirmed(&self, p: &Policy) -> bool {
        self.confirmed
            .as_ref()
            .and_then(|c| c.members.get(&p.name_any()))
            .is_some_and(|spec| *spec == SpecVersion::of(p))
    }
}

/// Writes the generated policy and binding when they should hold something else than the API
/// server has (or than this term confirmed), and confirms them with the probe; deletes them
/// when no Policy runs in-process. Members leaving for the webhook keep it unwritten until the
/// webhook has had them [`LEAVE_GRACE`]: then returns when to look again. A policy the API
/// server refuses is bisected to the Policies to blame, which join `rejected`.
#[allow(clippy::too_many_arguments)]
pub async fn enforce(
    ctx: &ControllerContext,
    wiring: &Wiring,
    caches: &MutatingCaches,
    desired: Option<&InProcessMutation>,
    placements: &[(&Policy, Placement)],
    schema_fit: &HashMap<String, SchemaFit>,
    leader: &watch::Receiver<Leadership>,
    memory: &mut MutatingMemory,
    rejected: &mut HashMap<String, Refusal>,
) -> Result<Option<Instant>, ReconcileError> {
    let stored = caches
        .policies
        .state()
        .into_iter()
        .find(|o| o.metadata.name.as_deref() == Some(MUTATING_NAME));
    let stored_members: Vec<String> = stored
        .as_ref()
        .and_then(|o| o.annotations().get(MEMBERS_ANNOTATION).cloned())
        .map(|m| m.split(',').map(str::to_string).collect())
        .unwrap_or_default();
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
    if wake.is_some() {
        return Ok(wake);
    }
    let Some(desired) = desired else {
        if stored.is_some() || !caches.bindings.state().is_empty() {
            delete::<MutatingAdmissionPolicyBinding>(ctx, MUTATING_NAME, leader).await?;
            delete::<MutatingAdmissionPolicy>(ctx, MUTATING_NAME, leader).await?;
            info!("removed the generated MutatingAdmissionPolicy: no Policy mutates in-process");
        }
        memory.confirmed = None;
        return Ok(None);
    };
    // The specs the members have now: a new generation that changes nothing in the policy (a
    // timeout, the enforcement flipped back) is confirmed again, not written again.
    let members: HashMap<String, SpecVersion> = placements
        .iter()
        .filter(|(p, _)| desired.members.contains(&p.name_any()))
        .map(|(p, _)| (p.name_any(), SpecVersion::of(p)))
        .collect();
    let held =
        holds(&caches.policies, &desired.policy) && holds(&caches.bindings, &desired.binding);
    if held
        && memory
            .confirmed
            .as_ref()
            .is_some_and(|c| c.objects == *desired && c.members == members)
    {
        return Ok(None);
    }
    if !held {
        let applied = match apply(ctx, &desired.policy, leader).await? {
            Ok(()) => apply(ctx, &desired.binding, leader).await?,
            refused => refused,
        };
        if let Err(message) = applied {
            warn!(%message, "the API server refuses the generated MutatingAdmissionPolicy; finding the Policy to blame");
            blame(ctx, wiring, desired, placements, schema_fit, rejected).await?;
            memory.confirmed = None;
            return Ok(None);
        }
    }
    confirm_enforced(ctx, wiring, leader).await?;
    info!(members = %desired.members.join(","), "mutating in-process");
    memory.confirmed = Some(Confirmed {
        objects: desired.clone(),
        members,
    });
    Ok(None)
}

/// Finds, by dry runs of the generated policy for subsets of the members, the members the API
/// server refuses, and adds them to `rejected` with its message.
async fn blame(
    ctx: &ControllerContext,
    wiring: &Wiring,
    desired: &InProcessMutation,
    placements: &[(&Policy, Placement)],
    schema_fit: &HashMap<String, SchemaFit>,
    rejected: &mut HashMap<String, Refusal>,
) -> Result<(), ReconcileError> {
    let members: Vec<&Policy> = placements
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| desired.members.contains(&p.name_any()))
        .collect();
    let split = isolate::refused(members, |subset: Vec<&Policy>| async move {
        let Some(generated) = place_mutating(&subset, wiring, true, schema_fit).1 else {
            return Ok(DryRun::Accepted);
        };
        dry_run(ctx, generated.policy, MUTATING_NAME).await
    })
    .await
    .map_err(search_failed)?;
    for Culprit {
        candidate: policy,
        reason,
    } in split.refused
    {
        warn!(policy = %policy.name_any(), %reason, "the API server refuses this Policy's generated mutations; leaving it out");
        rejected.insert(
            policy.name_any(),
            Refusal {
                spec: SpecVersion::of(policy),
                message: reason,
            },
        );
    }
    Ok(())
}

/// Writes the mutating probe with a new token and waits until the API server annotates its
/// Lease: then the generated objects written before it are run.
async fn confirm_enforced(
    ctx: &ControllerContext,
    wiring: &Wiring,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), ReconcileError> {
    let token = format!(
        "gatehouse-probe-mutating-{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let probe = mutating_probe(&token, &wiring.home_namespace, wiring);
    for refused in [
        apply(ctx, &probe.policy, leader).await?,
        apply(ctx, &probe.binding, leader).await?,
    ] {
        if let Err(reason) = refused {
            return Err(ReconcileError::Probe { reason });
        }
    }
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(token.clone()),
            labels: Some([(PROBE_LABEL.to_string(), token.clone())].into()),
            ..Default::default()
        },
        spec: None,
    };
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &wiring.home_namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + PROBE_TIMEOUT;
    loop {
        match leases.create(&dry_run, &lease).await {
            Ok(created) if created.annotations().get(MUTATING_PROBE_ANNOTATION) == Some(&token) => {
                return Ok(());
            }
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code < 500 && e.code != 429 => {
                return Err(ReconcileError::Probe { reason: e.message });
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(ReconcileError::Probe {
                reason: format!(
                    "the API server did not run the mutating probe within {}s",
                    PROBE_TIMEOUT.as_secs()
                ),
            });
        }
        tokio::time::sleep(PROBE_INTERVAL).await;
    }
}
