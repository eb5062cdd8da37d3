//! In-process enforcement, the leader's part: where each valid Policy runs (pure), then the
//! writes that move a Policy between the webhook and the API server with no gap.
//!
//! Moving in: the generated ValidatingAdmissionPolicy and binding are applied, the probe
//! ([`wiring::probe::probe`]) confirms the API server enforces them, and only then
//! does the webhook write leave the Policy out (and its status say `InProcess`, which makes
//! every replica's webhook server skip it). Moving back: the webhook write takes the Policy in
//! first, and its generated objects are deleted [`LEAVE_GRACE`] later, once the API server's
//! webhook cache has the new entry.
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use super::confirm::{ProbeKind, Prober};
use super::generated::{LEAVE_GRACE, apply, delete, holds};
use super::in_process_mutating::{MutatingCaches, MutatingMemory};
use super::status::Verdict;
use super::wiring::Wiring;
use super::wiring::admission_policy::{self, InProcess, POLICY_ANNOTATION, Placement};
use super::wiring::mutating_policy::MUTATING_GENERATED_LABEL;
use super::wiring::placement::Served;
use super::{ControllerContext, Refusal, SpecVersion, WriteError};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::reflect;
use gatehouse_api::v1alpha1::{EnforcementPoint, Policy};

/// Whether `p`'s status says the API server enforces it, for its current spec.
pub fn enforced_in_process(p: &Policy) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.enforcement == Some(EnforcementPoint::InProcess)
            && s.observed_generation == p.metadata.generation
    })
}

/// The verdicts of the wired Policies once placed: in-process where the API server was seen to
/// enforce them, on the webhook with the reason, or nowhere when they must run in-process and
/// cannot. A Policy placed in-process while a probe is out has none: its status stays as it was
/// until the probe answers, never saying "on the webhook" only because the answer is pending.
pub fn verdicts(
    verdicts: Vec<(Arc<Policy>, Verdict)>,
    placements: &[(&Policy, Placement)],
    memory: &InProcessMemory,
) -> Vec<(Arc<Policy>, Verdict)> {
    let probing = memory.probing();
    verdicts
        .into_iter()
        .filter_map(|(policy, verdict)| {
            let Verdict::Wired { own_entry, .. } = verdict else {
                return Some((policy, verdict));
            };
            let name = policy.name_any();
            let placement = placements
                .iter()
                .find(|(p, _)| p.name_any() == name)
                .map(|(_, placement)| placement);
            let verdict = match placement {
                Some(Placement::InProcess(objects))
                    if memory.confirmed.get(&name) == Some(objects) =>
                {
                    Verdict::InProcess {
                        generated: format!(
                            "ValidatingAdmissionPolicy {} and its binding",
                            objects.policy.name_any()
                        ),
                        type_warnings: memory.type_warnings.get(&name).cloned(),
                    }
                }
                Some(Placement::InProcessMutating(generated))
                    if memory.mutating.confirmed(&policy) =>
                {
                    Verdict::InProcess {
                        generated: format!(
                            "MutatingAdmissionPolicy {generated} and its binding, in (priority, \
                             name) order with the in-process mutating Policies that can match \
                             the same requests"
                        ),
                        type_warnings: None,
                    }
                }
                Some(Placement::Refused(reason)) => Verdict::NotInProcess(reason.clone()),
                Some(Placement::Webhook(reason)) => Verdict::Wired {
                    own_entry,
                    webhook_because: reason.clone(),
                },
                Some(Placement::InProcess(_) | Placement::InProcessMutating(_)) if probing => {
                    return None;
                }
                _ => Verdict::Wired {
                    own_entry,
                    webhook_because: "not yet confirmed in-process".to_string(),
                },
            };
            Some((policy, verdict))
        })
        .collect()
}

/// What the leader remembers of in-process enforcement in its term.
pub struct InProcessMemory {
    /// Policies whose generated objects, as given, the API server was seen to enforce.
    pub confirmed: HashMap<String, InProcess>,
    /// Generated objects whose Policy went back to the webhook, by name, and since when.
    leaving: HashMap<String, Instant>,
    /// What the API server's type checking says of a Policy's generated policy, by Policy.
    type_warnings: HashMap<String, String>,
    /// The generated MutatingAdmissionPolicy.
    pub mutating: MutatingMemory,
    /// The probe confirming generated ValidatingAdmissionPolicies, by Policy.
    probe: Prober<(String, InProcess)>,
}

impl InProcessMemory {
    /// Whether a probe of either kind is out.
    pub fn probing(&self) -> bool {
        self.probe.is_pending() || self.mutating.probing()
    }
}

impl Default for InProcessMemory {
    fn default() -> Self {
        InProcessMemory {
            confirmed: HashMap::new(),
            leaving: HashMap::new(),
            type_warnings: HashMap::new(),
            mutating: MutatingMemory::default(),
            probe: Prober::new(ProbeKind::Validating),
        }
    }
}

/// The generated objects as the watches see them.
pub struct GeneratedCaches {
    pub policies: Store<ValidatingAdmissionPolicy>,
    pub bindings: Store<ValidatingAdmissionPolicyBinding>,
    /// The generated MutatingAdmissionPolicy and binding, when the API server serves them.
    pub mutating: Option<MutatingCaches>,
}

/// Watches of the generated ValidatingAdmissionPolicies and bindings (and of the mutating ones)
/// when the API server serves them, as `served` says.
pub fn watch(
    client: &Client,
    trigger: &Arc<Notify>,
    served: Served,
) -> (
    Option<GeneratedCaches>,
    futures::future::BoxFuture<'static, ()>,
) {
    let Served {
        validating: served,
        mutating: mutating_served,
    } = served;
    if !served {
        info!(
            "the API server does not serve ValidatingAdmissionPolicy v1: every Policy runs on the webhook"
        );
        return (None, Box::pin(std::future::pending()));
    }
    let labelled = watcher::Config::default().labels(&format!(
        "{}={}",
        admission_policy::GENERATED_LABEL.0,
        admission_policy::GENERATED_LABEL.1
    ));
    let (policies, policies_watch) =
        reflect::<ValidatingAdmissionPolicy>(client.clone(), labelled.clone(), trigger.clone());
    let (bindings, bindings_watch) =
        reflect::<ValidatingAdmissionPolicyBinding>(client.clone(), labelled, trigger.clone());
    let (mutating, mutating_watch): (_, futures::future::BoxFuture<'static, ()>) =
        if mutating_served {
            let labelled = watcher::Config::default().labels(&format!(
                "{}={}",
                MUTATING_GENERATED_LABEL.0, MUTATING_GENERATED_LABEL.1
            ));
            let (policies, policies_watch) = reflect::<MutatingAdmissionPolicy>(
                client.clone(),
                labelled.clone(),
                trigger.clone(),
            );
            let (bindings, bindings_watch) = reflect::<MutatingAdmissionPolicyBinding>(
                client.clone(),
                labelled,
                trigger.clone(),
            );
            let watches = Box::pin(async move {
                tokio::join!(policies_watch, bindings_watch);
            });
            (Some(MutatingCaches { policies, bindings }), watches)
        } else {
            info!(
                "the API server does not serve MutatingAdmissionPolicy v1: every mutating Policy runs on the webhook"
            );
            (None, Box::pin(std::future::pending()))
        };
    let watches = Box::pin(async move {
        tokio::join!(policies_watch, bindings_watch, mutating_watch);
    });
    (
        Some(GeneratedCaches {
            policies,
            bindings,
            mutating,
        }),
        watches,
    )
}

/// Whether the API server serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy and
/// MutatingAdmissionPolicy.
pub async fn admission_policies_served(client: &Client) -> Result<Served, kube::Error> {
    let resources = client
        .list_api_group_resources("admissionregistration.k8s.io/v1")
        .await?;
    let served = |name: &str| resources.resources.iter().any(|r| r.name == name);
    Ok(Served {
        validating: served("validatingadmissionpolicies"),
        mutating: served("mutatingadmissionpolicies"),
    })
}

/// Applies the generated objects of every Policy placed in-process that the API server does not
/// hold as generated, or whose enforcement this term has not confirmed, then confirms them with
/// one probe. Policies whose objects the API server refuses join `rejected`.
pub async fn enforce(
    ctx: &ControllerContext,
    wiring: &Wiring,
    caches: &GeneratedCaches,
    placements: &[(&Policy, Placement)],
    leader: &watch::Receiver<Leadership>,
    memory: &mut InProcessMemory,
    rejected: &mut HashMap<String, Refusal>,
) -> Result<Option<Instant>, WriteError> {
    let mut to_confirm = Vec::new();
    for (p, placement) in placements {
        let Placement::InProcess(objects) = placement else {
            continue;
        };
        let name = p.name_any();
        if rejected.contains_key(&name) {
            continue;
        }
        let stored =
            holds(&caches.policies, &objects.policy) && holds(&caches.bindings, &objects.binding);
        // Reported, not refused: the type checking warns of fields it cannot resolve that the
        // objects do have (it warns `undefined field 'limits'` of a container's resources), and
        // the API server enforces the policy whatever it says.
        let type_checked = caches
            .policies
            .state()
            .into_iter()
            .find(|o| o.metadata.name == objects.policy.metadata.name)
            .filter(|_| stored)
            .and_then(|o| admission_policy::type_check_warnings(&o));
        match type_checked {
            Some(warning) => memory.type_warnings.insert(name.clone(), warning),
            None => memory.type_warnings.remove(&name),
        };
        if stored && memory.confirmed.get(&name) == Some(objects) {
            continue;
        }
        if !stored {
            // Written again (deleted by hand, or never stored): not known to run until the
            // probe says so, so the webhook takes the Policy back meanwhile.
            memory.confirmed.remove(&name);
            let applied = match apply(ctx, &objects.policy, leader).await? {
                Ok(()) => apply(ctx, &objects.binding, leader).await?,
                refused => refused,
            };
            if let Err(message) = applied {
                warn!(policy = %name, %message, "the API server refuses this Policy's generated ValidatingAdmissionPolicy; leaving it out");
                rejected.insert(
                    name,
                    Refusal {
                        spec: SpecVersion::of(p),
                        message,
                    },
                );
                continue;
            }
        }
        to_confirm.push((name, objects.as_ref().clone()));
    }
    let probed = memory
        .probe
        .confirm(ctx, wiring, leader, to_confirm)
        .await?;
    for (name, objects) in probed.enforced {
        info!(policy = %name, "enforced in-process");
        memory.confirmed.insert(name, objects);
    }
    Ok(probed.look_again)
}

/// Deletes the generated objects no Policy placed in-process stands for: at once when their
/// Policy is gone, invalid or refused, [`LEAVE_GRACE`] after the webhook took it back when it
/// moved there. Call only after the webhook write. Returns when to look again, if ever.
pub async fn remove_stale(
    ctx: &ControllerContext,
    caches: &GeneratedCaches,
    placements: &[(&Policy, Placement)],
    rejected: &HashMap<String, Refusal>,
    leader: &watch::Receiver<Leadership>,
    memory: &mut InProcessMemory,
) -> Result<Option<Instant>, WriteError> {
    let keep: HashMap<String, String> = placements
        .iter()
        .filter(|(p, _)| !rejected.contains_key(&p.name_any()))
        .filter_map(|(p, placement)| match placement {
            Placement::InProcess(objects) => Some((p.name_any(), objects.policy.name_any())),
            _ => None,
        })
        .collect();
    let on_webhook: Vec<String> = placements
        .iter()
        .filter(|(_, placement)| matches!(placement, Placement::Webhook(_)))
        .map(|(p, _)| p.name_any())
        .collect();
    memory.confirmed.retain(|name, _| keep.contains_key(name));
    memory
        .type_warnings
        .retain(|name, _| keep.contains_key(name));
    let now = Instant::now();
    let mut wake: Option<Instant> = None;
    let mut stale: Vec<String> = Vec::new();
    let names = caches
        .policies
        .state()
        .iter()
        .map(|o| {
            (
                o.name_any(),
                o.annotations().get(POLICY_ANNOTATION).cloned(),
            )
        })
        .chain(caches.bindings.state().iter().map(|o| {
            (
                o.name_any(),
                o.annotations().get(POLICY_ANNOTATION).cloned(),
            )
        }))
        .collect::<Vec<_>>();
    for (generated, policy) in names {
        let policy = policy.unwrap_or_default();
        if keep.get(&policy) == Some(&generated) || stale.contains(&generated) {
            continue;
        }
        if on_webhook.contains(&policy) {
            let since = *memory.leaving.entry(generated.clone()).or_insert(now);
            if now < since + LEAVE_GRACE {
                let at = since + LEAVE_GRACE;
                wake = Some(wake.map_or(at, |w| w.min(at)));
                continue;
            }
        }
        stale.push(generated);
    }
    for name in &stale {
        delete::<ValidatingAdmissionPolicyBinding>(ctx, name, leader).await?;
        delete::<ValidatingAdmissionPolicy>(ctx, name, leader).await?;
        memory.leaving.remove(name);
        info!(generated = %name, "removed generated ValidatingAdmissionPolicy and binding");
    }
    memory
        .leaving
        .retain(|name, _| !keep.values().any(|k| k == name));
    Ok(wake)
}
