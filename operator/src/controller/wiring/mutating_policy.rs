//! Mutating Policies → MutatingAdmissionPolicies (and their bindings) the API server runs
//! in-process, holding the mutations of every Policy that can run there exactly, in mutation
//! order (NamespacedPolicies, then Policies, each by priority and name); the others stay on the
//! webhook with the reason.
//!
//! Scope before order: the API server runs MutatingAdmissionPolicies in no defined order among
//! themselves, and only the mutations inside one run in order. Policies that can select one
//! request together need that order, so they share a generated policy; Policies no request can
//! reach two of need none, so each such group has a policy of its own, called only for what its
//! members select — a request pays the mutations of the Policies that can match it, not of every
//! Policy in the cluster. Why a prefix: in-process mutations run before every mutating webhook,
//! so a Policy can move in only while no Policy before it in the order that can match the same
//! requests stays on the webhook.
//!
//! Each Policy's `mutate[]` entries become [`jsonpatch_cel`] mutations, repeated as many passes
//! as the engine makes at most (a settled pass is a no-op), each guarded by the Policy's match
//! (rules, namespaceSelector, objectSelector, conditions) written in CEL. The API server
//! evaluates every mutation on the previous one's output, where the webhook matches a Policy
//! once before its mutations; so a Policy whose match reads the object runs in-process only when
//! it yields one mutation.
//!
//! What keeps a Policy on the webhook, besides what [`jsonpatch_cel`] refuses:
//! - the policy has one `failurePolicy` (`Fail`): an `Ignore` Policy may join only when nothing of
//!   it can fail at run time (no `when` guard, no match condition);
//! - the policy is never reinvoked (`reinvocationPolicy: Never`, since reinvoking it would rerun
//!   `Never` Policies): an `IfNeeded` Policy joins only when a reinvocation could not change
//!   what it did — plain merges (no `forEach`, `when` or `overwrite`), a match that does not read
//!   the object, and no `overwrite` in any Policy after it;
//! - validations (they run after every mutation), effects (their marking stays on the webhook),
//!   subresources and CONNECT.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::admissionregistration::v1::{
    JSONPatch, MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    MutatingAdmissionPolicyBindingSpec, MutatingAdmissionPolicySpec, Mutation,
    NamedRuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use super::mutating_footprints::footprints_of;
use super::mutating_footprints::{Appended, defaulted_after, defaulted_before};
pub use super::mutating_groups::{CROSSOVER_MUTATIONS, MUTATING_NAME, generated_name};
use super::mutating_groups::{InProcessMember, disjoint_matches, groups, name, past_crossover};
use super::mutating_join::joined_mutate;
use super::mutating_translation::match_reads_object;
pub use super::mutating_translation::{match_expression, policy_mutations};
use super::schema_fit::SchemaFit;
use super::{MANAGED_BY_LABEL, MATCH_POLICY, Wiring, namespace_selector};
use crate::controller::wiring::defaulting::{Footprint, independent};
use gatehouse_api::v1alpha1::is_namespaced_stem;
use gatehouse_api::v1alpha1::{Enforcement, Policy, PolicySpec, Rule};
use gatehouse_engine::coverage::Coverage;
use gatehouse_engine::group::order_key;
use gatehouse_engine::policy::is_mutating;

/// Label on the generated mutating objects, so a watch can select them.
pub const MUTATING_GENERATED_LABEL: (&str, &str) = ("gatehouse.dev/generated", "mutating");
/// Annotation on a generated policy: its member Policies, in order, comma-separated.
pub const MEMBERS_ANNOTATION: &str = "gatehouse.dev/policies";

/// The generated objects that run a group of in-process mutating Policies.
#[derive(Clone, Debug, PartialEq)]
pub struct InProcessMutation {
    pub policy: MutatingAdmissionPolicy,
    pub binding: MutatingAdmissionPolicyBinding,
    /// The member Policies, in order.
    pub members: Vec<String>,
}

impl InProcessMutation {
    /// The name of the generated policy and binding.
    pub fn name(&self) -> &str {
        self.policy.metadata.name.as_deref().unwrap_or_default()
    }
}

/// Where one mutating Policy runs.
#[derive(Clone, Debug, PartialEq)]
pub enum MutatingPlacement {
    /// A member of the generated MutatingAdmissionPolicy of this name.
    InProcess(String),
    /// On the webhook, and why not in-process.
    Webhook(String),
    /// Nowhere: `enforcement: InProcess` and this is why it cannot be.
    Refused(String),
}

/// The placement of every mutating Policy (by name) and the generated objects of those that
/// run in-process, one policy per group of members that can select one request together
/// ([`groups`]). `served`: whether the API server serves admissionregistration.k8s.io/v1
/// MutatingAdmissionPolicy.
///
/// `schema_fit`: by Policy, whether its merges fit the schemas of the kinds it matches
/// ([`super::schema_fit`]); a Policy missing there stays out.
pub fn place_mutating(
    policies: &[&Policy],
    wiring: &Wiring,
    served: bool,
    schema_fit: &HashMap<String, SchemaFit>,
) -> (Vec<(String, MutatingPlacement)>, Vec<InProcessMutation>) {
    // Auto weighs the cost: the members of a generated policy a request would pay more
    // mutations of than one webhook call costs go back to the webhook, and the rest is placed
    // again (fewer members, smaller groups) until no group is past the crossover.
    let mut costly: HashMap<String, String> = HashMap::new();
    loop {
        let (placements, generated) = place_in_order(policies, wiring, served, schema_fit, &costly);
        let before = costly.len();
        for objects in &generated {
            let paid = objects
                .policy
                .spec
                .as_ref()
                .and_then(|s| s.mutations.as_ref())
                .map_or(0, Vec::len);
            costly.extend(past_crossover(&objects.members, paid, policies));
        }
        if costly.len() == before {
            return (placements, generated);
        }
    }
}

/// [`place_mutating`] with the Policies of `costly` (by name, with the reason) on the webhook.
fn place_in_order(
    policies: &[&Policy],
    wiring: &Wiring,
    served: bool,
    schema_fit: &HashMap<String, SchemaFit>,
    costly: &HashMap<String, String>,
) -> (Vec<(String, MutatingPlacement)>, Vec<InProcessMutation>) {
    let mut ordered: Vec<&Policy> = policies
        .iter()
        .copied()
        .filter(|p| is_mutating(&p.spec))
        .collect();
    ordered.sort_by(|a, b| {
        order_key(name(a), a.spec.priority).cmp(&order_key(name(b), b.spec.priority))
    });
    let mut placements = Vec::new();
    let mut members: Vec<InProcessMember<'_>> = Vec::new();
    // The Policies so far that run on the webhook: a later one that can select a request with
    // one of them must run there too.
    let mut on_webhook: Vec<&Policy> = Vec::new();
    // What the in-process Policies so far may append or create, by Policy and mutation.
    let mut appended: Vec<Appended<'_>> = Vec::new();
    // Every mutating Policy's footprints, once.
    let footprints: HashMap<&str, Vec<Footprint>> = ordered
        .iter()
        .map(|p| (name(p), footprints_of(p, schema_fit.get(name(p)))))
        .collect();
    for (i, p) in ordered.iter().enumerate() {
        if let Some(reason) = sent_to_webhook(p, costly) {
            placements.push((name(p).to_string(), MutatingPlacement::Webhook(reason)));
            on_webhook.push(p);
            continue;
        }
        let required = p.spec.enforcement == Enforcement::InProcess;
        let fit = schema_fit.get(name(p)).cloned().unwrap_or_else(|| {
            SchemaFit::Unread("the schemas of the kinds it matches are not read yet".to_string())
        });
        // A NamespacedPolicy on the webhook never holds a Policy back from running in-process
        // (a tenant must not move or stop the platform's Policies): it is refused instead, below.
        let blocking: Vec<&Policy> = on_webhook
            .iter()
            .copied()
            .filter(|w| is_namespaced_stem(name(p)) || !is_namespaced_stem(name(w)))
            .collect();
        let so_far = SoFar {
            footprints: &footprints,
            on_webhook: &blocking,
            appended: &appended,
            served,
        };
        let translated = so_far.translate(p, &ordered[i + 1..], &fit);
        let own_footprints = footprints.get(name(p)).map_or(&[][..], Vec::as_slice);
        // Schemas not read this time say nothing about the Policy: it stays enforced, on the
        // webhook, until they are.
        let unread = matches!(fit, SchemaFit::Unread(_));
        match translated {
            Ok(mutations) => {
                for (i, fp) in own_footprints.iter().enumerate() {
                    appended.push(Appended {
                        policy: p,
                        mutation: i,
                        footprint: fp.clone(),
                    });
                }
                members.push(InProcessMember {
                    policy: p,
                    mutations,
                });
            }
            Err(reason) if required && !unread => {
                placements.push((name(p).to_string(), MutatingPlacement::Refused(reason)));
            }
            Err(reason) => {
                on_webhook.push(p);
                placements.push((name(p).to_string(), MutatingPlacement::Webhook(reason)));
            }
        }
    }
    refuse_tenants_before_the_platform(&on_webhook, &members, &mut placements);
    let generated = generate(members, wiring, &mut placements);
    (placements, generated)
}

/// Refuses each NamespacedPolicy on the webhook that can select a request with a Policy that
/// runs in-process: the API server runs the generated policies before any webhook, so the
/// tenant's mutation would come last, and the platform has the last word.
fn refuse_tenants_before_the_platform(
    on_webhook: &[&Policy],
    members: &[InProcessMember<'_>],
    placements: &mut [(String, MutatingPlacement)],
) {
    for tenant in on_webhook.iter().filter(|w| is_namespaced_stem(name(w))) {
        let Some(platform) = members
            .iter()
            .map(|m| m.policy)
            .find(|m| !is_namespaced_stem(name(m)) && !disjoint_matches(tenant, m))
        else {
            continue;
        };
        let reason = format!(
            "on the webhook it would mutate after the Policy {}, which runs in-process on the \
             same requests (the API server runs in-process mutations first), and the platform's \
             Policies mutate last: it must run in-process too (enforcement Auto or InProcess, \
             with mutations the API server can run)",
            name(platform)
        );
        for (placed, placement) in placements.iter_mut() {
            if placed.as_str() == name(tenant) {
                *placement = MutatingPlacement::Refused(reason.clone());
            }
        }
    }
}

/// Why `p` runs on the webhook whatever its mutations are: Auto found it too costly in-process
/// (`costly`, by name), or its spec says so.
fn sent_to_webhook(p: &Policy, costly: &HashMap<String, String>) -> Option<String> {
    if let Some(reason) = costly.get(name(p)) {
        return Some(reason.clone());
    }
    (p.spec.enforcement == Enforcement::Webhook).then(|| "spec.enforcement is Webhook".to_string())
}

/// The generated MutatingAdmissionPolicies of the in-process `members`, one per group, each
/// member's placement added to `placements`.
fn generate(
    members: Vec<InProcessMember<'_>>,
    wiring: &Wiring,
    placements: &mut Vec<(String, MutatingPlacement)>,
) -> Vec<InProcessMutation> {
    let generated: Vec<InProcessMutation> = groups(members)
        .into_iter()
        .map(|group| generated_objects(group, wiring))
        .collect();
    for objects in &generated {
        for member in &objects.members {
            placements.push((
                member.clone(),
                MutatingPlacement::InProcess(objects.name().to_string()),
            ));
        }
    }
    generated
}

/// What the Policies placed before one tell it.
struct SoFar<'s, 'p> {
    /// Every mutating Policy's footprints, once.
    footprints: &'s HashMap<&'p str, Vec<Footprint>>,
    /// The Policies so far that run on the webhook: a later one that can select a request
    /// with one of them must run there too.
    on_webhook: &'s [&'p Policy],
    /// What the in-process Policies so far may append or create.
    appended: &'s [Appended<'p>],
    /// Whether the API server serves MutatingAdmissionPolicy.
    served: bool,
}

impl<'p> SoFar<'_, 'p> {
    fn footprints_of(&self, p: &Policy) -> &[Footprint] {
        self.footprints.get(name(p)).map_or(&[][..], Vec::as_slice)
    }

    /// The mutations `p` runs as in-process, `later` the Policies after it in order; or why it
    /// cannot run there.
    fn translate(
        &self,
        p: &'p Policy,
        later: &[&'p Policy],
        fit: &SchemaFit,
    ) -> Result<Vec<Mutation>, String> {
        if !self.served {
            return Err(
                "the API server does not serve admissionregistration.k8s.io/v1 \
                 MutatingAdmissionPolicy"
                    .to_string(),
            );
        }
        if let Some(first) = self.on_webhook.iter().find(|w| !disjoint_matches(w, p)) {
            return Err(format!(
                "Policy {} comes before it in mutation order, can match the same \
                 requests and runs on the webhook, and in-process mutations run before every \
                 webhook",
                name(first)
            ));
        }
        let own = self.footprints_of(p);
        let later_overwrites = later
            .iter()
            .any(|q| q.spec.mutate.iter().any(|m| m.overwrite));
        let later: Vec<(&Policy, &[Footprint])> =
            later.iter().map(|q| (*q, self.footprints_of(q))).collect();
        defaulted_before(p, own, self.appended)
            .and_then(|()| defaulted_after(p, own, &later))
            .and_then(|()| policy_mutations(p, own, later_overwrites))
            .and_then(|mutations| match fit {
                SchemaFit::Fits(_) => Ok(mutations),
                SchemaFit::Unfit(reason) | SchemaFit::Unread(reason) => Err(reason.clone()),
            })
    }
}

/// The mutations of a group, in order, as few as they can be written exactly: a request pays
/// each mutation of a policy the API server calls, whatever it writes.
/// - Consecutive members that share one match are written as one mutation where their merges
///   join into one ([`joined_mutate`]) that the translation makes one mutation of (one pass,
///   entries writing apart).
/// - Consecutive single mutations are then concatenated (their guarded patches computed on the
///   same object, `(a) + (b)`) where the later one's match does not read the object and all their
///   entries, together, settle in one pass and write apart ([`independent`]): each then computes
///   on the object what it would compute after the others, as one Policy's independent merges
///   already are.
fn joined_mutations(group: Vec<InProcessMember<'_>>) -> Vec<Mutation> {
    let mut out = Vec::new();
    let mut current: Option<Unit> = None;
    for unit in same_match_units(group) {
        current = match current.take() {
            None => Some(unit),
            Some(earlier) => match concatenated(&earlier, &unit) {
                Some(both) => Some(both),
                None => {
                    out.extend(earlier.mutations);
                    Some(unit)
                }
            },
        };
    }
    out.extend(current.into_iter().flat_map(|u| u.mutations));
    out
}

/// Consecutive members as the generated policy runs them: their mutations, the footprints of
/// what those do, and whether the first's match reads the object.
struct Unit {
    mutations: Vec<Mutation>,
    footprints: Vec<Footprint>,
    reads_object: bool,
}

/// The group with every run of consecutive members of one match joined where it can be.
fn same_match_units(group: Vec<InProcessMember<'_>>) -> Vec<Unit> {
    let mut out = Vec::new();
    // The run being joined: its members, and their joined Policy and mutation so far.
    let mut run: Vec<InProcessMember<'_>> = Vec::new();
    let mut run_joined: Option<(Policy, Mutation)> = None;
    for member in group {
        let joined = run
            .first()
            .filter(|first| same_match(first.policy, member.policy))
            .and_then(|_| {
                let lists: Vec<&[gatehouse_api::v1alpha1::Mutation]> = run
                    .iter()
                    .chain(std::iter::once(&member))
                    .map(|m| m.policy.spec.mutate.as_slice())
                    .collect();
                one_mutation(member.policy, &lists)
            });
        match joined {
            Some(joined) => {
                run.push(member);
                run_joined = Some(joined);
            }
            None => {
                out.extend(close_run(std::mem::take(&mut run), run_joined.take()));
                run.push(member);
            }
        }
    }
    out.extend(close_run(run, run_joined));
    out
}

/// A run as a unit: the joined Policy's one mutation, or its one member's own.
fn close_run(run: Vec<InProcessMember<'_>>, joined: Option<(Policy, Mutation)>) -> Option<Unit> {
    match joined {
        Some((policy, mutation)) => Some(Unit {
            mutations: vec![mutation],
            footprints: footprints_of(&policy, None),
            reads_object: match_reads_object(&policy),
        }),
        None => run.into_iter().next().map(|m| Unit {
            footprints: footprints_of(m.policy, None),
            reads_object: match_reads_object(m.policy),
            mutations: m.mutations,
        }),
    }
}

/// `earlier` and `later` as one mutation computing both patches on the same object, where that
/// is what running them one after the other does (see [`joined_mutations`]).
fn concatenated(earlier: &Unit, later: &Unit) -> Option<Unit> {
    let ([first], [second]) = (earlier.mutations.as_slice(), later.mutations.as_slice()) else {
        return None;
    };
    if later.reads_object {
        return None;
    }
    let footprints: Vec<Footprint> = earlier
        .footprints
        .iter()
        .chain(&later.footprints)
        .cloned()
        .collect();
    if !independent(&footprints) {
        return None;
    }
    let expression = |m: &Mutation| m.json_patch.as_ref()?.expression.clone();
    let both = format!("({}) + ({})", expression(first)?, expression(second)?);
    Some(Unit {
        mutations: vec![Mutation {
            json_patch: Some(JSONPatch {
                expression: Some(both),
            }),
            ..first.clone()
        }],
        footprints,
        reads_object: earlier.reads_object,
    })
}

/// Whether two members are matched alike: the same match, failure and reinvocation policies.
fn same_match(a: &Policy, b: &Policy) -> bool {
    a.spec.match_ == b.spec.match_
        && a.spec.failure_policy == b.spec.failure_policy
        && a.spec.reinvocation_policy == b.spec.reinvocation_policy
}

/// The Policy that runs `lists` (the mutate lists of members matched like `like`) and its one
/// mutation, if their merges join and the translation makes one mutation of them.
fn one_mutation(
    like: &Policy,
    lists: &[&[gatehouse_api::v1alpha1::Mutation]],
) -> Option<(Policy, Mutation)> {
    let mut joined = like.clone();
    joined.spec.mutate = joined_mutate(lists)?;
    let footprints = footprints_of(&joined, None);
    let mut mutations = policy_mutations(&joined, &footprints, false).ok()?;
    (mutations.len() == 1).then(|| (joined, mutations.remove(0)))
}

/// The generated policy and binding. Every mutation is guarded by its Policy's match, so the
/// policy's own match only has to cover its members': but the API server applies each mutation
/// of a policy it calls (even an empty patch costs a decode and defaulting), so it is called only
/// for what some member selects: the union of their rules, and selectors covering theirs, with
/// the system exclusion ANDed in.
fn generated_objects(group: Vec<InProcessMember<'_>>, wiring: &Wiring) -> InProcessMutation {
    let members: Vec<String> = group.iter().map(|m| name(m.policy).to_string()).collect();
    let member_specs: Vec<&PolicySpec> = group.iter().map(|m| &m.policy.spec).collect();
    let generated = generated_name(members.first().map(String::as_str).unwrap_or_default());
    let mutations = joined_mutations(group);
    let rules: Vec<&Rule> = member_specs
        .iter()
        .flat_map(|s| s.match_.rules.iter())
        .collect();
    let coverage = Coverage::of_members(member_specs.iter().copied());
    let metadata = ObjectMeta {
        name: Some(generated.clone()),
        owner_references: wiring.owner.as_ref().map(|o| vec![o.clone()]),
        labels: Some(BTreeMap::from([
            (
                MANAGED_BY_LABEL.0.to_string(),
                MANAGED_BY_LABEL.1.to_string(),
            ),
            (
                MUTATING_GENERATED_LABEL.0.to_string(),
                MUTATING_GENERATED_LABEL.1.to_string(),
            ),
        ])),
        annotations: Some(BTreeMap::from([(
            MEMBERS_ANNOTATION.to_string(),
            members.join(","),
        )])),
        ..ObjectMeta::default()
    };
    let resource_rules = mutating_rules(rules);
    let policy = MutatingAdmissionPolicy {
        metadata: metadata.clone(),
        spec: Some(MutatingAdmissionPolicySpec {
            failure_policy: Some("Fail".to_string()),
            reinvocation_policy: Some("Never".to_string()),
            match_constraints: Some(MatchResources {
                exclude_resource_rules: None,
                match_policy: Some(MATCH_POLICY.to_string()),
                namespace_selector: Some(namespace_selector(
                    coverage.namespace_selector().as_ref(),
                    &wiring.excluded_namespaces,
                )),
                object_selector: Some(coverage.object_selector().unwrap_or_default()),
                resource_rules: Some(resource_rules),
            }),
            mutations: Some(mutations),
            ..MutatingAdmissionPolicySpec::default()
        }),
    };
    let binding = MutatingAdmissionPolicyBinding {
        metadata,
        spec: Some(MutatingAdmissionPolicyBindingSpec {
            match_resources: None,
            param_ref: None,
            policy_name: Some(generated),
        }),
    };
    InProcessMutation {
        policy,
        binding,
        members,
    }
}

/// The members' rules as one generated policy's: their union, with the operations a
/// MutatingAdmissionPolicy acts on (CREATE and UPDATE; `*` is both).
fn mutating_rules(rules: Vec<&Rule>) -> Vec<NamedRuleWithOperations> {
    super::union_of_rules(rules)
        .into_iter()
        .filter_map(|r| {
            let operations: Vec<String> = r
                .operations
                .unwrap_or_default()
                .into_iter()
                .flat_map(|o| match o.as_str() {
                    "*" => vec!["CREATE".to_string(), "UPDATE".to_string()],
                    "CREATE" | "UPDATE" => vec![o],
                    _ => vec![],
                })
                .collect();
            (!operations.is_empty()).then_some(NamedRuleWithOperations {
                api_groups: r.api_groups,
                api_versions: r.api_versions,
                operations: Some(dedup(operations)),
                resource_names: None,
                resources: r.resources,
                scope: r.scope,
            })
        })
        .collect()
}

fn dedup(mut values: Vec<String>) -> Vec<String> {
    let mut seen = Vec::new();
    values.retain(|v| {
        let new = !seen.contains(v);
        if new {
            seen.push(v.clone());
        }
        new
    });
    values
}

#[cfg(test)]
pub(super) mod tests;
