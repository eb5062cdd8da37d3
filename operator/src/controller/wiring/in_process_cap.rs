//! Auto weighs the cluster, not only the request: how many generated admission policies it
//! keeps in-process.
//!
//! The API server matches **every** ValidatingAdmissionPolicy and MutatingAdmissionPolicy
//! against every namespaced request, selected or not, and parses each one's selectors again
//! each time; a webhook entry's selectors are parsed once per configuration. So each generated
//! policy taxes every request of the cluster by a few microseconds of the API server's CPU,
//! and hundreds of tenants' Policies in-process would make every request slower than the
//! webhook would (operator/benches/README.md, issue 39). Past the cap, `Auto` keeps the
//! Policies of the later generated policies, in (Policies before NamespacedPolicies, priority,
//! name) order of their first member, on the webhook, and says why; `enforcement: InProcess`
//! still forces its own.

use super::admission_policy::Placement;
use super::mutating_policy::InProcessMutation;
use super::policy_name;
use gatehouse_api::v1alpha1::{Enforcement, Policy};

/// The default of `--max-admission-policies`.
pub const DEFAULT_MAX_ADMISSION_POLICIES: usize = 32;

/// One generated admission policy and the Policies it stands for.
struct Generated<'p> {
    /// The [`cap_key`] of its first member: the order the cap is given out in.
    first: (bool, i32, &'p str),
    /// The generated MutatingAdmissionPolicy's name; `None` for a validating Policy's own
    /// ValidatingAdmissionPolicy.
    mutating: Option<String>,
    members: Vec<&'p Policy>,
}

/// Puts on the webhook, with the reason, the `Auto` Policies of every generated admission
/// policy past the first `cap`, and drops those generated MutatingAdmissionPolicies from
/// `generated`. A generated policy with an `enforcement: InProcess` member stays and counts.
///
/// Dropping a whole generated MutatingAdmissionPolicy changes no other: its members can meet
/// no other in-process Policy (those would share it), so no order between them is lost.
pub fn cap_in_process(
    placements: &mut [(&Policy, Placement)],
    generated: &mut Vec<InProcessMutation>,
    cap: usize,
) {
    let mut units = generated_policies(placements);
    units.sort_by(|a, b| a.first.cmp(&b.first));
    let mut kept = 0;
    let mut demoted: Vec<String> = Vec::new();
    let mut dropped: Vec<String> = Vec::new();
    for unit in units {
        let forced = unit
            .members
            .iter()
            .any(|p| p.spec.enforcement != Enforcement::Auto);
        if kept < cap || forced {
            kept += 1;
            continue;
        }
        demoted.extend(unit.members.iter().map(|p| policy_name(p).to_string()));
        dropped.extend(unit.mutating);
    }
    if demoted.is_empty() {
        return;
    }
    let reason = format!(
        "past the {cap} generated admission policies Auto keeps in-process \
         (--max-admission-policies, in (Policies before NamespacedPolicies, priority, name) order): the API server matches \
         every admission policy against every namespaced request, so more would tax \
         requests that match none of them"
    );
    for (p, placement) in placements.iter_mut() {
        if demoted.iter().any(|d| d == policy_name(p)) {
            *placement = Placement::Webhook(reason.clone());
        }
    }
    generated.retain(|g| !dropped.iter().any(|d| d == g.name()));
}

/// Where a Policy's claim on the cap comes: the platform's Policies before NamespacedPolicies
/// (however many tenants write theirs, the platform's keep their place in-process), then by
/// (priority, name).
fn cap_key(p: &Policy) -> (bool, i32, &str) {
    (
        gatehouse_api::v1alpha1::is_namespaced_stem(policy_name(p)),
        p.spec.priority,
        policy_name(p),
    )
}

/// The generated admission policies `placements` stand for.
fn generated_policies<'p>(placements: &[(&'p Policy, Placement)]) -> Vec<Generated<'p>> {
    let mut units: Vec<Generated<'p>> = Vec::new();
    for (p, placement) in placements {
        let key = cap_key(p);
        match placement {
            Placement::InProcess(_) => units.push(Generated {
                first: key,
                mutating: None,
                members: vec![*p],
            }),
            Placement::InProcessMutating(name) => {
                match units
                    .iter_mut()
                    .find(|u| u.mutating.as_deref() == Some(name.as_str()))
                {
                    Some(unit) => {
                        unit.first = unit.first.min(key);
                        unit.members.push(*p);
                    }
                    None => units.push(Generated {
                        first: key,
                        mutating: Some(name.clone()),
                        members: vec![*p],
                    }),
                }
            }
            Placement::Webhook(_) | Placement::Refused(_) => {}
        }
    }
    units
}

#[cfg(test)]
mod tests;
