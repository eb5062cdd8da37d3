//! Where every Policy runs: validating ones one by one ([`place`]), mutating ones together
//! ([`place_mutating`], their order across Policies decides where they can run), then the
//! cluster-wide cap on generated admission policies ([`cap_in_process`]).

use std::collections::HashMap;

use gatehouse_api::v1alpha1::Policy;

use super::Wiring;
use super::admission_policy::{Placement, place};
use super::in_process_cap::cap_in_process;
use super::mutating_policy::{InProcessMutation, MutatingPlacement, place_mutating};
use super::schema_fit::SchemaFit;

/// Where every Policy runs, in the order given, and the generated MutatingAdmissionPolicies of
/// the mutating ones that run in-process: validating Policies are placed one by one
/// ([`place`]), mutating ones together ([`place_mutating`]), since
/// their order across Policies decides where they can run.
/// `schema_fit` says, by Policy, whether a mutating Policy's merges fit its kinds' schemas.
pub fn place_all<'p>(
    policies: &[&'p Policy],
    wiring: &Wiring,
    served: Served,
    schema_fit: &HashMap<String, SchemaFit>,
) -> (Vec<(&'p Policy, Placement)>, Vec<InProcessMutation>) {
    let (mutating, mut generated) = place_mutating(policies, wiring, served.mutating, schema_fit);
    let mut placements: Vec<(&'p Policy, Placement)> = policies
        .iter()
        .map(|p| {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            let placement = match mutating.iter().find(|(n, _)| n == name) {
                Some((_, MutatingPlacement::InProcess(generated))) => {
                    Placement::InProcessMutating(generated.clone())
                }
                Some((_, MutatingPlacement::Webhook(reason))) => Placement::Webhook(reason.clone()),
                Some((_, MutatingPlacement::Refused(reason))) => Placement::Refused(reason.clone()),
                None => place(p, wiring, served.validating),
            };
            (*p, placement)
        })
        .collect();
    cap_in_process(
        &mut placements,
        &mut generated,
        wiring.max_admission_policies,
    );
    (placements, generated)
}

/// Which admission policies the API server serves in admissionregistration.k8s.io/v1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    pub validating: bool,
    pub mutating: bool,
}
