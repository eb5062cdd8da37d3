//! What the mutations of in-process mutating Policies may append or create (their footprints),
//! and the orders the API server's defaulting between mutations forbids: a Policy runs
//! in-process only where no mutation before or after it reads what the API server would default
//! in between.
use super::defaulting::{Footprint, footprint, interacts};
use super::derived_defaults::add_derived_defaults;
use super::mutating_groups::{disjoint_matches, name};
use super::schema_fit::SchemaFit;
use gatehouse_api::v1alpha1::Policy;

/// What a mutation of an in-process Policy may append or create.
pub(super) struct Appended<'p> {
    pub policy: &'p Policy,
    /// Its `mutate[]` index.
    pub mutation: usize,
    pub footprint: Footprint,
}

/// The footprint of each of `p`'s mutations, with what the API server may default after it
/// counted as appended: the structs its schema fit says it may create, and the fields of the
/// derived defaults of the kinds it matches that it writes near
/// ([`crate::controller::wiring::derived_defaults`]).
pub fn footprints_of(p: &Policy, fit: Option<&SchemaFit>) -> Vec<Footprint> {
    let optional = match fit {
        Some(SchemaFit::Fits(optional)) => optional.as_slice(),
        _ => &[],
    };
    let kinds: Vec<(&str, &str)> = p
        .spec
        .match_
        .rules
        .iter()
        .flat_map(|r| {
            r.api_groups.iter().flat_map(move |g| {
                r.resources
                    .iter()
                    .map(move |res| (g.as_str(), res.as_str()))
            })
        })
        .collect();
    p.spec
        .mutate
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut fp = footprint(m);
            fp.appends.extend(
                optional
                    .iter()
                    .filter(|o| o.mutation == i)
                    .map(|o| o.path.clone()),
            );
            add_derived_defaults(&mut fp, &kinds);
            fp
        })
        .collect()
}

/// Whether a mutation of `p` depends on what an earlier in-process Policy may append or create:
/// the API server defaults what one mutation appends or creates before the next runs, the
/// webhook path only after the last ([`crate::controller::wiring::defaulting`]).
pub(super) fn defaulted_before(
    p: &Policy,
    own: &[Footprint],
    earlier: &[Appended<'_>],
) -> Result<(), String> {
    for (j, later) in own.iter().enumerate() {
        let found = earlier
            .iter()
            .find(|e| interacts(&e.footprint, later) && !disjoint_matches(e.policy, p));
        if let Some(e) = found {
            return Err(format!(
                "spec.mutate[{j}]: it reads or writes what Policy {}'s mutate[{}] may append \
                 or create, and the API server defaults appended elements and created structs \
                 between mutations (the webhook path only after the last)",
                name(e.policy),
                e.mutation
            ));
        }
    }
    Ok(())
}

/// Whether a later mutating Policy (in-process or not) reads or writes what a mutation of `p`
/// may append or create: in-process, the API server defaults it before that Policy runs; on
/// the webhook path the same entry may run both on one undefaulted copy.
pub(super) fn defaulted_after(
    p: &Policy,
    own: &[Footprint],
    later: &[(&Policy, &[Footprint])],
) -> Result<(), String> {
    for (i, earlier) in own.iter().enumerate() {
        if earlier.appends.is_empty() {
            continue;
        }
        for (q, theirs) in later.iter().filter(|(q, _)| !disjoint_matches(p, q)) {
            if let Some(j) = theirs.iter().position(|n| interacts(earlier, n)) {
                return Err(format!(
                    "spec.mutate[{i}]: Policy {}'s mutate[{j}], later in the order, reads or \
                     writes what it may append or create, and the API server would default \
                     that in between",
                    name(q)
                ));
            }
        }
    }
    Ok(())
}
