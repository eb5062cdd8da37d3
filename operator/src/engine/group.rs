//! Which Policies share a webhook entry, and in what order they run: the one place that says so
//! for the wiring, the webhook server and `gatehouse eval`.
//!
//! * **Order**: Policies run by `(priority, name)`, ascending ([`in_order`]).
//! * **Mutating entries** are the maximal runs of consecutive Policies (in that order) that share
//!   `failurePolicy` and `reinvocationPolicy`: the API server calls the entries of one
//!   configuration in list order, so the order across Policies stays exact while the common case
//!   is a single entry.
//! * **Validating entries**: one per `failurePolicy`. The API server calls validating webhooks in
//!   parallel, so their order means nothing.
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

use super::Phase;
use crate::api::v1alpha1::{FailurePolicy, PolicySpec, ReinvocationPolicy};

/// Prefix of the id of a Policy's own entry: `policy/<name>`, path `/mutate/policy/<name>`.
/// Group ids never contain `/`, so the two never collide.
pub const OWN_PREFIX: &str = "policy/";

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
    pub phase: GroupPhase,
    pub failure_policy: FailurePolicy,
    /// Mutating groups only; `Never` for validating ones.
    pub reinvocation_policy: ReinvocationPolicy,
    /// Member Policy names, in the order they run.
    pub members: Vec<String>,
}

/// [`Phase`] in a form that travels in the configurations' membership annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GroupPhase {
    Mutating,
    Validating,
}

impl From<GroupPhase> for Phase {
    fn from(p: GroupPhase) -> Phase {
        match p {
            GroupPhase::Mutating => Phase::Mutating,
            GroupPhase::Validating => Phase::Validating,
        }
    }
}

impl From<Phase> for GroupPhase {
    fn from(p: Phase) -> GroupPhase {
        match p {
            Phase::Mutating => GroupPhase::Mutating,
            Phase::Validating => GroupPhase::Validating,
        }
    }
}

impl Group {
    /// Whether this is a single Policy's own entry, which the API server matched itself.
    pub fn is_own(&self) -> bool {
        self.id.starts_with(OWN_PREFIX)
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

/// `members` sorted by `(priority, name)`.
pub fn in_order<M: Member>(members: &[M]) -> Vec<&M> {
    let mut sorted: Vec<&M> = members.iter().collect();
    sorted.sort_by(|a, b| (a.spec().priority, a.name()).cmp(&(b.spec().priority, b.name())));
    sorted
}

/// Groups `members`; see the module documentation.
pub fn groups<M: Member>(members: &[M]) -> Groups {
    let sorted = in_order(members);
    let mut mutating: Vec<Group> = Vec::new();
    let mut run: Vec<&M> = Vec::new();
    let close = |run: &mut Vec<&M>, out: &mut Vec<Group>| {
        if let Some(first) = run.first() {
            let spec = first.spec();
            out.push(group(
                GroupPhase::Mutating,
                spec.failure_policy,
                spec.reinvocation_policy,
                run.iter().map(|m| m.name().to_string()).collect(),
            ));
        }
        run.clear();
    };
    for m in sorted.iter().filter(|m| super::is_mutating(m.spec())) {
        if m.needs_own_entry() {
            close(&mut run, &mut mutating);
            mutating.push(own(m, GroupPhase::Mutating));
            continue;
        }
        let continues = run.last().is_none_or(|last| {
            (last.spec().failure_policy, last.spec().reinvocation_policy)
                == (m.spec().failure_policy, m.spec().reinvocation_policy)
        });
        if !continues {
            close(&mut run, &mut mutating);
        }
        run.push(m);
    }
    close(&mut run, &mut mutating);

    let validators: Vec<&&M> = sorted
        .iter()
        .filter(|m| !m.spec().validate.is_empty())
        .collect();
    let mut validating: Vec<Group> = validators
        .iter()
        .filter(|m| m.needs_own_entry())
        .map(|m| own(**m, GroupPhase::Validating))
        .collect();
    validating.sort_by(|a, b| a.id.cmp(&b.id));
    for failure_policy in [FailurePolicy::Fail, FailurePolicy::Ignore] {
        let names: Vec<String> = validators
            .iter()
            .filter(|m| !m.needs_own_entry() && m.spec().failure_policy == failure_policy)
            .map(|m| m.name().to_string())
            .collect();
        if !names.is_empty() {
            validating.push(group(
                GroupPhase::Validating,
                failure_policy,
                ReinvocationPolicy::Never,
                names,
            ));
        }
    }
    Groups {
        mutating,
        validating,
    }
}

/// The group of `m` alone, in an entry of its own.
pub fn own<M: Member>(m: &M, phase: GroupPhase) -> Group {
    let spec = m.spec();
    Group {
        id: format!("{OWN_PREFIX}{}", m.name()),
        phase,
        failure_policy: spec.failure_policy,
        reinvocation_policy: match phase {
            GroupPhase::Mutating => spec.reinvocation_policy,
            GroupPhase::Validating => ReinvocationPolicy::Never,
        },
        members: vec![m.name().to_string()],
    }
}

fn group(
    phase: GroupPhase,
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
fn fnv1a(bytes: &[u8]) -> u64 {
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
        let mut spec = crate::api::v1alpha1::sample_spec(priority, mutate, validate);
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
