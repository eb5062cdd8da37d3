//! Scope before order, and the cost of in-process mutation: how the in-process mutating
//! Policies are parted into generated MutatingAdmissionPolicies ([`groups`]), what each is
//! named ([`generated_name`]), and when `Auto` keeps a group's Policies on the webhook because
//! a request would pay more mutations than one webhook call costs ([`past_crossover`]).
use k8s_openapi::api::admissionregistration::v1::Mutation;

use gatehouse_api::v1alpha1::{Enforcement, Policy};
use gatehouse_engine::coverage::Coverage;

/// Name prefix of the generated MutatingAdmissionPolicies and their bindings; each is named
/// after its first member ([`generated_name`]).
pub const MUTATING_NAME: &str = "gatehouse-mutating";

/// The most mutations a request may pay in one generated MutatingAdmissionPolicy under `Auto`.
/// The API server decodes, converts and defaults the object for every mutation of a policy it
/// calls, even one whose guard is false; one call of Gatehouse's webhook (which matches every
/// Policy itself and answers with one patch) costs a request about what one such mutation does
/// and less than two (`BLOCK=crossover tests/bench/admission-load`, figures in
/// operator/benches/README.md). One mutation stays in-process: it also keeps working while
/// Gatehouse is unreachable.
pub const CROSSOVER_MUTATIONS: usize = 1;

/// One in-process Policy and its generated mutations.
pub(super) struct InProcessMember<'p> {
    pub policy: &'p Policy,
    pub mutations: Vec<Mutation>,
}

/// The members (in order) parted into groups no request can reach two of: two members that
/// can select one request ([`disjoint_matches`]) are in one group, in their order; each group
/// becomes one generated policy, so a request runs only the mutations of the group it can
/// reach. Groups come in the order of their first members.
pub(super) fn groups(members: Vec<InProcessMember<'_>>) -> Vec<Vec<InProcessMember<'_>>> {
    // Union-find over the members' indexes.
    let mut parent: Vec<usize> = (0..members.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    for i in 0..members.len() {
        for j in 0..i {
            if !disjoint_matches(members[i].policy, members[j].policy) {
                let (ri, rj) = (root(&mut parent, i), root(&mut parent, j));
                parent[ri.max(rj)] = ri.min(rj);
            }
        }
    }
    let mut grouped: Vec<(usize, Vec<InProcessMember<'_>>)> = Vec::new();
    for (i, member) in members.into_iter().enumerate() {
        let r = root(&mut parent, i);
        match grouped.iter_mut().find(|(g, _)| *g == r) {
            Some((_, group)) => group.push(member),
            None => grouped.push((r, vec![member])),
        }
    }
    grouped.into_iter().map(|(_, group)| group).collect()
}

/// The name of the generated policy whose first member is `first`: `gatehouse-mutating-` and
/// the Policy's name, so a Policy's edit rewrites only its own group's policy. A name too long
/// for an object is cut and ends in a digest of the whole.
pub fn generated_name(first: &str) -> String {
    const MAX: usize = 253;
    let full = format!("{MUTATING_NAME}-{first}");
    if full.len() <= MAX {
        return full;
    }
    // FNV-1a: stable across releases, unlike the standard library's hasher.
    let digest = full.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let cut = full[..MAX - 17].trim_end_matches(['-', '.']);
    format!("{cut}-{digest:016x}")
}

/// Whether no request can match both `a` and `b` ([`Coverage::disjoint`]).
pub(super) fn disjoint_matches(a: &Policy, b: &Policy) -> bool {
    Coverage::of(&a.spec).disjoint(&Coverage::of(&b.spec))
}

pub(super) fn name(p: &Policy) -> &str {
    p.metadata.name.as_deref().unwrap_or_default()
}

/// The `Auto` members of a generated policy (`members`, in order, holding `paid` mutations)
/// that go back to the webhook, with the reason, when a request would pay more than
/// [`CROSSOVER_MUTATIONS`]: those after its last member whose `enforcement` is `InProcess` (what
/// a user forces in-process stays, and so does every member before it, which it needs
/// in-process).
pub(super) fn past_crossover(
    members: &[String],
    paid: usize,
    policies: &[&Policy],
) -> Vec<(String, String)> {
    if paid <= CROSSOVER_MUTATIONS {
        return Vec::new();
    }
    let enforcement = |member: &str| {
        policies
            .iter()
            .find(|p| name(p) == member)
            .map(|p| p.spec.enforcement)
    };
    let forced = members
        .iter()
        .rposition(|m| enforcement(m) == Some(Enforcement::InProcess))
        .map_or(0, |i| i + 1);
    members[forced..]
        .iter()
        .filter(|m| enforcement(m) == Some(Enforcement::Auto))
        .map(|m| {
            let reason = format!(
                "Auto: in-process, a request would pay the {paid} mutations of the generated \
                 MutatingAdmissionPolicy it shares with the Policies that can match the same \
                 requests, and past {CROSSOVER_MUTATIONS} one webhook call costs less \
                 (enforcement: InProcess forces it)"
            );
            (m.clone(), reason)
        })
        .collect()
}

#[cfg(test)]
mod tests;
