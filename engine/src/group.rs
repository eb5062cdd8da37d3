//! Which Policies share a webhook entry, and in what order they run: the one place that says so
//! for the wiring, the webhook server and `gatehouse eval`.
//!
//! * **Order**: Policies run by `(priority, name)`, ascending ([`in_order`]).
//! * **Scope**: members share an entry only where the union of their rules and selectors is
//!   exact ([`super::coverage`]): the entry carries that union, so the API server calls it —
//!   and, while Gatehouse is unreachable, fails its `Fail` requests — only for requests some
//!   member could match. An outage's blast radius is the Policies' scope, not every namespace.
//! * **Mutating entries** are the maximal runs of consecutive Policies (in that order) that share
//!   `failurePolicy` and `reinvocationPolicy` and whose coverages union exactly: the API server
//!   calls the entries of one configuration in list order, so the order across Policies stays
//!   exact while the common case (one scope) is a single entry.
//! * **Validating entries**: per `failurePolicy`, as few as exact unions allow. The API server
//!   calls validating webhooks in parallel, so their order means nothing.
//! * A Policy whose match conditions use `authorizer` keeps an entry of its own: only the API
//!   server can evaluate `authorizer`, so it must match that Policy itself. It also ends a
//!   mutating run, which keeps the order exact.
//!
//! A group's id names its entry (`<id>.mutate.gatehouse.dev`) and its path (`/mutate/<id>`). It
//! is derived from the group's kind and its members, so it stays the same exactly as long as the
//! membership does: the API server, which may call an entry of the previous configuration for a
//! moment after a rewrite, reaches the membership that entry was written for.
use std::fmt;

use serde::{Deserialize, Serialize};

use super::coverage::Coverage;
use super::{Phase, entry};
use gatehouse_api::v1alpha1::{FailurePolicy, PolicySpec, ReinvocationPolicy};

/// What grouping needs of a Policy.
pub trait Member {
    fn name(&self) -> &str;
    fn spec(&self) -> &PolicySpec;
    /// Whether the Policy needs an entry of its own (its conditions use `authorizer`).
    fn needs_own_entry(&self) -> bool;
}

/// One webhook entry's worth of Policies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// `fail-<hash>` / `ignore-<hash>`, or `policy/<name>` for a Policy's own entry.
    pub id: String,
    pub phase: Phase,
    pub failure_policy: FailurePolicy,
    /// Mutating groups only; `Never` for validating ones.
    pub reinvocation_policy: ReinvocationPolicy,
    /// Member Policy names, in the order they run.
    pub members: Vec<String>,
}

impl Group {
    /// Its entry's name: its own Policy's entry name, or `<id>.mutate.gatehouse.dev` /
    /// `<id>.validate.gatehouse.dev`.
    pub fn entry_name(&self) -> String {
        match self.id.strip_prefix(entry::OWN_PREFIX) {
            Some(policy) => entry::entry_name(policy),
            None => {
                let phase = match self.phase {
                    Phase::Mutating => "mutate",
                    Phase::Validating => "validate",
                };
                format!("{}.{phase}{}", self.id, entry::ENTRY_SUFFIX)
            }
        }
    }

    /// The path of its entry: `/mutate/<id>` or `/validate/<id>`.
    pub fn path(&self) -> String {
        let prefix = match self.phase {
            Phase::Mutating => entry::MUTATE_PREFIX,
            Phase::Validating => entry::VALIDATE_PREFIX,
        };
        format!("{prefix}{}", self.id)
    }

    /// Whether this is a single Policy's own entry, which the API server matched itself.
    pub fn is_own(&self) -> bool {
        self.id.starts_with(entry::OWN_PREFIX)
    }
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.id, self.members.join(", "))
    }
}

/// The entries both configurations need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Groups {
    /// In the order the API server must call them.
    pub mutating: Vec<Group>,
    /// Own entries first (by Policy name), then `fail-…`, then `ignore-…`.
    pub validating: Vec<Group>,
}

impl Groups {
    /// Every group, mutating first.
    pub fn iter(&self) -> impl Iterator<Item = &Group> {
        self.mutating.iter().chain(&self.validating)
    }
}

/// Where a Policy named `name` runs among the others: NamespacedPolicies before every Policy (the
/// platform's mutations come last and win), then by `priority`, then by name.
pub fn order_key(name: &str, priority: i32) -> (bool, i32, &str) {
    (
        !gatehouse_api::v1alpha1::is_namespaced_stem(name),
        priority,
        name,
    )
}

/// `members` in [`order_key`] order.
pub fn in_order<M: Member>(members: &[M]) -> Vec<&M> {
    let mut sorted: Vec<&M> = members.iter().collect();
    sorted.sort_by(member_order);
    sorted
}

fn member_order<M: Member>(a: &M, b: &M) -> std::cmp::Ordering {
    order_key(a.name(), a.spec().priority).cmp(&order_key(b.name(), b.spec().priority))
}

/// Groups `members`; see the module documentation.
pub fn groups<M: Member>(members: &[M]) -> Groups {
    let sorted = in_order(members);
    let mut mutating: Vec<Group> = Vec::new();
    let mut run: Forming<'_, M> = Forming::default();
    for m in sorted.iter().filter(|m| super::is_mutating(m.spec())) {
        if m.needs_own_entry() {
            run.close_into(Phase::Mutating, &mut mutating);
            mutating.push(own(*m, Phase::Mutating));
            continue;
        }
        let coverage = Coverage::of(m.spec());
        let union = match run.members.last() {
            Some(last)
                if (
                    last.spec().effective_failure_policy(),
                    last.spec().reinvocation_policy,
                ) == (
                    m.spec().effective_failure_policy(),
                    m.spec().reinvocation_policy,
                ) =>
            {
                run.coverage.as_ref().and_then(|c| c.union(&coverage))
            }
            _ => None,
        };
        match union {
            Some(union) => run.push(*m, union),
            None => {
                run.close_into(Phase::Mutating, &mut mutating);
                run.push(*m, coverage);
            }
        }
    }
    run.close_into(Phase::Mutating, &mut mutating);

    let validators: Vec<&M> = sorted
        .iter()
        .copied()
        .filter(|m| !m.spec().validate.is_empty())
        .collect();
    let mut validating: Vec<Group> = validators
        .iter()
        .filter(|m| m.needs_own_entry())
        .map(|m| own(*m, Phase::Validating))
        .collect();
    validating.sort_by(|a, b| a.id.cmp(&b.id));
    for failure_policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
        let shared = validators.iter().copied().filter(|m| {
            !m.needs_own_entry() && m.spec().effective_failure_policy() == failure_policy
        });
        for mut forming in validating_sets(shared) {
            forming.close_into(Phase::Validating, &mut validating);
        }
    }
    Groups {
        mutating,
        validating,
    }
}

/// Members (in run order) that will share an entry, with the exact union of their coverages.
struct Forming<'m, M> {
    members: Vec<&'m M>,
    coverage: Option<Coverage>,
}

impl<M> Default for Forming<'_, M> {
    fn default() -> Self {
        Self {
            members: Vec::new(),
            coverage: None,
        }
    }
}

impl<'m, M: Member> Forming<'m, M> {
    fn push(&mut self, m: &'m M, coverage: Coverage) {
        self.members.push(m);
        self.coverage = Some(coverage);
    }

    /// Adds the group formed so far to `out` and starts anew.
    fn close_into(&mut self, phase: Phase, out: &mut Vec<Group>) {
        if let Some(first) = self.members.first() {
            let spec = first.spec();
            let reinvocation_policy = match phase {
                Phase::Mutating => spec.reinvocation_policy,
                Phase::Validating => ReinvocationPolicy::Never,
            };
            out.push(group(
                phase,
                spec.effective_failure_policy(),
                reinvocation_policy,
                self.members.iter().map(|m| m.name().to_string()).collect(),
            ));
        }
        *self = Self::default();
    }
}

/// Validating members of one failurePolicy in as few sets as exact unions allow: each joins
/// the first set it unions with exactly, then sets that now union are joined, until none do.
/// Their order means nothing to the API server; members keep run order within a set.
fn validating_sets<'m, M: Member>(members: impl Iterator<Item = &'m M>) -> Vec<Forming<'m, M>> {
    let mut sets: Vec<Forming<'m, M>> = Vec::new();
    for m in members {
        let coverage = Coverage::of(m.spec());
        let joined = sets.iter_mut().find_map(|set| {
            let union = set.coverage.as_ref()?.union(&coverage)?;
            Some((set, union))
        });
        match joined {
            Some((set, union)) => set.push(m, union),
            None => {
                let mut set = Forming::default();
                set.push(m, coverage);
                sets.push(set);
            }
        }
    }
    while let Some((i, j, union)) = mergeable_pair(&sets) {
        let later = sets.remove(j);
        let set = &mut sets[i];
        set.members.extend(later.members);
        set.members.sort_by(member_order);
        set.coverage = Some(union);
    }
    sets
}

/// The first two sets (`i < j`) whose coverages union exactly, with the union.
fn mergeable_pair<M>(sets: &[Forming<'_, M>]) -> Option<(usize, usize, Coverage)> {
    for (i, a) in sets.iter().enumerate() {
        for (j, b) in sets.iter().enumerate().skip(i + 1) {
            if let (Some(ca), Some(cb)) = (&a.coverage, &b.coverage)
                && let Some(union) = ca.union(cb)
            {
                return Some((i, j, union));
            }
        }
    }
    None
}

/// The group of `m` alone, in an entry of its own.
pub fn own<M: Member>(m: &M, phase: Phase) -> Group {
    let spec = m.spec();
    Group {
        id: format!("{}{}", entry::OWN_PREFIX, m.name()),
        phase,
        failure_policy: spec.effective_failure_policy(),
        reinvocation_policy: match phase {
            Phase::Mutating => spec.reinvocation_policy,
            Phase::Validating => ReinvocationPolicy::Never,
        },
        members: vec![m.name().to_string()],
    }
}

fn group(
    phase: Phase,
    failure_policy: FailurePolicy,
    reinvocation_policy: ReinvocationPolicy,
    members: Vec<String>,
) -> Group {
    let kind = match failure_policy {
        FailurePolicy::Fail => "fail",
        FailurePolicy::Ignore => "ignore",
    };
    let mut key = format!(
        "{phase:?}/{}/{}",
        failure_policy.as_str(),
        reinvocation_policy.as_str()
    );
    for m in &members {
        key.push('/');
        key.push_str(m);
    }
    Group {
        id: format!("{kind}-{:08x}", fnv1a(key.as_bytes()) as u32),
        phase,
        failure_policy,
        reinvocation_policy,
        members,
    }
}

/// FNV-1a, 64 bits: stable across builds and platforms (std's hasher is not), which ids need,
/// since every replica must derive the same one.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    struct P {
        name: String,
        spec: PolicySpec,
        own: bool,
    }

    impl Member for P {
        fn name(&self) -> &str {
            &self.name
        }
        fn spec(&self) -> &PolicySpec {
            &self.spec
        }
        fn needs_own_entry(&self) -> bool {
            self.own
        }
    }

    fn p(name: &str, priority: i32, fail: bool, mutate: bool, validate: bool) -> P {
        let mut spec = gatehouse_api::v1alpha1::sample_spec(priority, mutate, validate);
        if !fail {
            spec.failure_policy = FailurePolicy::Ignore;
        }
        P {
            name: name.into(),
            spec,
            own: false,
        }
    }

    fn members(groups: &[Group]) -> Vec<Vec<&str>> {
        groups
            .iter()
            .map(|g| g.members.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn sixteen_alike_policies_make_one_mutating_and_one_validating_group() {
        let all: Vec<P> = (0..16)
            .map(|i| p(&format!("p{i:02}"), 100, true, true, true))
            .collect();
        let g = groups(&all);
        assert_eq!(g.mutating.len(), 1);
        assert_eq!(g.validating.len(), 1);
        assert_eq!(g.mutating[0].members.len(), 16);
        assert!(
            g.mutating[0].id.starts_with("fail-"),
            "{}",
            g.mutating[0].id
        );
    }

    #[test]
    fn a_policy_that_only_warns_is_called_with_ignore() {
        let mut warns = p("warns", 100, true, false, true);
        warns.spec.validate[0].action = gatehouse_api::v1alpha1::ValidationAction::Warn;
        let denies = p("denies", 100, true, false, true);
        let g = groups(&[warns, denies]);
        let by_member = |name: &str| {
            g.validating
                .iter()
                .find(|g| g.members.iter().any(|m| m == name))
                .map(|g| g.failure_policy)
        };
        assert_eq!(by_member("warns"), Some(FailurePolicy::Ignore));
        assert_eq!(by_member("denies"), Some(FailurePolicy::Fail));
    }

    #[test]
    fn namespaced_policies_mutate_before_every_policy_whatever_their_priority() {
        let all = vec![
            p("platform", -100, true, true, false),
            p("late.team-a.namespaced", 1000, true, true, false),
            p("early.team-b.namespaced", 1, true, true, false),
        ];
        let order: Vec<&str> = in_order(&all).into_iter().map(|m| m.name()).collect();
        assert_eq!(
            order,
            [
                "early.team-b.namespaced",
                "late.team-a.namespaced",
                "platform"
            ]
        );
        assert_eq!(
            members(&groups(&all).mutating),
            [vec![
                "early.team-b.namespaced",
                "late.team-a.namespaced",
                "platform"
            ]]
        );
    }

    #[test]
    fn mutating_runs_follow_priority_and_break_where_the_failure_policy_changes() {
        let all = vec![
            p("d", 30, true, true, false),
            p("a", 10, true, true, false),
            p("c", 20, false, true, false),
            p("b", 10, true, true, false),
            p("e", 30, true, true, true),
            p("v", 5, false, false, true),
        ];
        let g = groups(&all);
        assert_eq!(
            members(&g.mutating),
            [vec!["a", "b"], vec!["c"], vec!["d", "e"]]
        );
        assert_eq!(
            g.mutating
                .iter()
                .map(|g| g.failure_policy)
                .collect::<Vec<_>>(),
            [
                FailurePolicy::Fail,
                FailurePolicy::Ignore,
                FailurePolicy::Fail
            ]
        );
        assert_eq!(members(&g.validating), [vec!["e"], vec!["v"]]);
    }

    #[test]
    fn reinvocation_policy_splits_runs_too() {
        let mut b = p("b", 2, true, true, false);
        b.spec.reinvocation_policy = ReinvocationPolicy::IfNeeded;
        let all = vec![
            p("a", 1, true, true, false),
            b,
            p("c", 3, true, true, false),
        ];
        assert_eq!(
            members(&groups(&all).mutating),
            [vec!["a"], vec!["b"], vec!["c"]]
        );
    }

    #[test]
    fn an_authorizer_policy_keeps_its_own_entry_and_ends_the_run() {
        let mut own = p("own", 2, true, true, true);
        own.own = true;
        let all = vec![
            p("a", 1, true, true, true),
            own,
            p("c", 3, true, true, true),
        ];
        let g = groups(&all);
        assert_eq!(members(&g.mutating), [vec!["a"], vec!["own"], vec!["c"]]);
        assert_eq!(g.mutating[1].id, "policy/own");
        assert!(g.mutating[1].is_own());
        assert_eq!(members(&g.validating), [vec!["own"], vec!["a", "c"]]);
    }

    fn in_namespaces(mut member: P, team: &str) -> P {
        member.spec.match_.namespace_selector = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("team".to_string(), team.to_string())].into()),
                match_expressions: None,
            },
        );
        member
    }

    fn with_rules(mut member: P, resource: &str) -> P {
        member.spec.match_.rules = vec![gatehouse_api::v1alpha1::Rule {
            operations: vec![gatehouse_api::v1alpha1::Operation::Create],
            api_groups: vec!["".into()],
            api_versions: vec!["v1".into()],
            resources: vec![resource.into()],
            scope: gatehouse_api::v1alpha1::Scope::Namespaced,
        }];
        member
    }

    #[test]
    fn mutating_runs_break_where_the_scope_cannot_be_joined_exactly() {
        // pods in team a, services in team b: a union entry would be called for pods in team b.
        let all = vec![
            in_namespaces(with_rules(p("a", 1, true, true, false), "pods"), "a"),
            in_namespaces(with_rules(p("b", 2, true, true, false), "services"), "b"),
            in_namespaces(with_rules(p("c", 3, true, true, false), "pods"), "a"),
        ];
        assert_eq!(
            members(&groups(&all).mutating),
            [vec!["a"], vec!["b"], vec!["c"]]
        );
        // The same rules in two teams: one entry, `team In [a, b]`.
        let all = vec![
            in_namespaces(with_rules(p("a", 1, true, true, false), "pods"), "a"),
            in_namespaces(with_rules(p("b", 2, true, true, false), "pods"), "b"),
        ];
        assert_eq!(members(&groups(&all).mutating), [vec!["a", "b"]]);
    }

    #[test]
    fn validating_members_gather_by_scope_whatever_their_order() {
        let all = vec![
            in_namespaces(with_rules(p("a", 1, true, false, true), "pods"), "a"),
            in_namespaces(with_rules(p("b", 2, true, false, true), "services"), "b"),
            in_namespaces(with_rules(p("c", 3, true, false, true), "services"), "a"),
            in_namespaces(with_rules(p("d", 4, true, false, true), "services"), "b"),
            in_namespaces(with_rules(p("e", 5, false, false, true), "services"), "b"),
        ];
        // a and c share team a (rules listed together); b and d share team b; e is Ignore.
        assert_eq!(
            members(&groups(&all).validating),
            [vec!["a", "c"], vec!["b", "d"], vec!["e"]]
        );
        // A Policy for everything takes in every narrower one with the same rules.
        let mut all = vec![
            in_namespaces(with_rules(p("a", 1, true, false, true), "pods"), "a"),
            in_namespaces(with_rules(p("b", 2, true, false, true), "pods"), "b"),
            with_rules(p("z", 9, true, false, true), "pods"),
        ];
        all[1].spec.match_.object_selector = all[0].spec.match_.namespace_selector.clone();
        assert_eq!(members(&groups(&all).validating), [vec!["a", "b", "z"]]);
    }

    #[test]
    fn ids_change_with_membership_and_only_with_it() {
        let two = vec![p("a", 1, true, true, false), p("b", 1, true, true, false)];
        let same = vec![p("b", 1, true, true, false), p("a", 1, true, true, false)];
        let three = vec![
            p("a", 1, true, true, false),
            p("b", 1, true, true, false),
            p("c", 1, true, true, false),
        ];
        let id = |ps: &[P]| groups(ps).mutating[0].id.clone();
        assert_eq!(id(&two), id(&same));
        assert_ne!(id(&two), id(&three));
        // Known value: ids must not depend on the build (every replica derives the same).
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
    }
}
