//! The snapshot of compiled Policies and webhook groups the server reads on every request.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use super::metrics::MemberMeters;
use gatehouse_api::v1alpha1::NAMESPACE_NAME_LABEL;
use gatehouse_engine::CompiledPolicy;
use gatehouse_engine::Phase;
use gatehouse_engine::entry;
use gatehouse_engine::group::{self, Group};

/// How long a group (or Policy) that left the configurations is still answered. The API
/// server's webhook informer lags a configuration write by a moment; during that moment it may
/// still call a removed entry, and the right answer then is what that entry stood for, not a
/// 404 that its failurePolicy would turn into a rejection.
pub const RETIRED_GRACE: Duration = Duration::from_secs(60);

/// What the store knows of an entry's path.
pub enum Lookup {
    /// A group: its members that are active, in order. A member no longer served (deleted or
    /// invalid) is left out; with none left the request is admitted unchanged.
    Group {
        group: Arc<Group>,
        members: Arc<Members>,
        /// The API server matched already (a Policy's own entry).
        matched: bool,
    },
    Unknown,
}

type Key = (Phase, String);

/// The active members of a group, in order (the slice it derefs to), and what a request needs
/// to know of all of them, worked out once when the group's membership changes.
#[derive(Default)]
pub struct Members {
    policies: Vec<Arc<CompiledPolicy>>,
    /// Each one's metric handles, by index.
    pub meters: Vec<MemberMeters>,
    /// One of them is heavy ([`CompiledPolicy::is_heavy`]).
    pub heavy: bool,
    /// One of them has a namespaceSelector.
    pub namespace_selectors: bool,
    /// The members whose namespaceSelector is one Namespace by name (every NamespacedPolicy),
    /// by that namespace, as indexes in order; a request in another namespace never matches
    /// them, so it is not offered them: a review costs the same with one tenant as with 256.
    pinned: HashMap<String, Vec<usize>>,
    /// Every other member's index, in order.
    unpinned: Vec<usize>,
}

impl Members {
    pub fn new(policies: Vec<Arc<CompiledPolicy>>) -> Self {
        let mut pinned: HashMap<String, Vec<usize>> = HashMap::new();
        let mut unpinned = Vec::new();
        for (i, p) in policies.iter().enumerate() {
            match pinned_namespace(p) {
                Some(namespace) => pinned.entry(namespace.to_string()).or_default().push(i),
                None => unpinned.push(i),
            }
        }
        Members {
            meters: policies.iter().map(|_| MemberMeters::default()).collect(),
            heavy: policies.iter().any(|p| p.is_heavy()),
            namespace_selectors: policies
                .iter()
                .any(|p| p.spec().match_.namespace_selector.is_some()),
            pinned,
            unpinned,
            policies,
        }
    }

    /// The members a request in `namespace` can match, as indexes in order: all of them for a
    /// request outside any namespace or of a Namespace itself (judged by its own labels),
    /// otherwise those not pinned to another namespace.
    pub fn offered(&self, namespace: &str, of_a_namespace: bool) -> Vec<usize> {
        if namespace.is_empty() || of_a_namespace || self.pinned.is_empty() {
            return (0..self.policies.len()).collect();
        }
        let Some(own) = self.pinned.get(namespace) else {
            return self.unpinned.clone();
        };
        let mut offered: Vec<usize> = self.unpinned.iter().chain(own).copied().collect();
        offered.sort_unstable();
        offered
    }
}

/// The one Namespace `policy`'s namespaceSelector selects by name, if that is all it selects.
fn pinned_namespace(policy: &CompiledPolicy) -> Option<&str> {
    let selector = policy.spec().match_.namespace_selector.as_ref()?;
    if selector
        .match_labels
        .as_ref()
        .is_some_and(|l| !l.is_empty())
    {
        return None;
    }
    match selector.match_expressions.as_deref()? {
        [only] if only.key == NAMESPACE_NAME_LABEL && only.operator == "In" => {
            match only.values.as_deref()? {
                [namespace] => Some(namespace),
                _ => None,
            }
        }
        _ => None,
    }
}

impl std::ops::Deref for Members {
    type Target = [Arc<CompiledPolicy>];

    fn deref(&self) -> &Self::Target {
        &self.policies
    }
}

#[derive(Clone, Default)]
struct State {
    active: HashMap<String, Arc<CompiledPolicy>>,
    /// The groups of the active Policies: a Policy change takes effect here at once.
    computed: HashMap<Key, Arc<Group>>,
    /// The groups the live configurations hold, from their membership annotation, whoever
    /// wrote them: a follower, or a replica whose view of the Policies lags, still answers
    /// every entry the API server can call.
    wired: HashMap<Key, Arc<Group>>,
    /// Groups that left both, and when.
    retired: HashMap<Key, (Arc<Group>, Instant)>,
    /// Names of Policies removed recently, and when: the API server may still call the own
    /// entry of an earlier configuration.
    retired_policies: HashMap<String, Instant>,
    /// Policies the API server enforces in-process: never a member of a group here, so a
    /// stale entry that still names one does not evaluate it a second time.
    in_process: HashSet<String>,
    /// The active members of every group above, resolved when the state changes rather than
    /// on every request: at 128 members a review looked each name up in `active`.
    members: HashMap<Key, Arc<Members>>,
}

impl State {
    fn known(&self) -> HashSet<Key> {
        self.computed
            .keys()
            .chain(self.wired.keys())
            .cloned()
            .collect()
    }

    /// Moves the groups that `before` knew and the state no longer does to `retired`.
    fn retire_gone(&mut self, before: HashMap<Key, Arc<Group>>) {
        let now = Instant::now();
        let known = self.known();
        for (key, group) in before {
            if !known.contains(&key) {
                self.retired.insert(key, (group, now));
            }
        }
        for key in &known {
            self.retired.remove(key);
        }
        self.retired
            .retain(|_, (_, at)| at.elapsed() < RETIRED_GRACE);
        self.retired_policies
            .retain(|_, at| at.elapsed() < RETIRED_GRACE);
    }

    /// Resolves the members of every known group against `active`.
    fn resolve_members(&mut self) {
        let groups = self
            .computed
            .iter()
            .chain(&self.wired)
            .chain(self.retired.iter().map(|(k, (g, _))| (k, g)));
        let members = groups
            .map(|(key, group)| (key.clone(), self.active_members(group)))
            .collect();
        self.members = members;
    }

    fn active_members(&self, group: &Group) -> Arc<Members> {
        let policies = group
            .members
            .iter()
            .filter(|name| !self.in_process.contains(*name))
            .filter_map(|name| self.active.get(name).cloned())
            .collect();
        Arc::new(Members::new(policies))
    }

    fn recompute(&mut self) {
        let policies: Vec<&Arc<CompiledPolicy>> = self
            .active
            .values()
            .filter(|p| !self.in_process.contains(p.name()))
            .collect();
        let groups = group::groups(&policies);
        let before: HashMap<Key, Arc<Group>> = self
            .computed
            .drain()
            .chain(self.wired.iter().map(|(k, g)| (k.clone(), g.clone())))
            .collect();
        self.computed = keyed(groups.iter().cloned());
        self.retire_gone(before);
    }
}

fn keyed(groups: impl IntoIterator<Item = Group>) -> HashMap<Key, Arc<Group>> {
    groups
        .into_iter()
        .map(|g| ((g.phase, g.id.clone()), Arc::new(g)))
        .collect()
}

/// Compiled Policies by name and their groups. Readers clone an `Arc` and drop the lock at
/// once, so a reload never waits for in-flight reviews and a review never sees half an update.
#[derive(Default)]
pub struct PolicyStore {
    inner: RwLock<Arc<State>>,
}

impl PolicyStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// What is known of the entry `id` (the path after `/mutate/` or `/validate/`).
    ///
    /// Looked up in order: the groups of the active Policies, the groups the live configurations
    /// hold, groups retired within [`RETIRED_GRACE`]. An own entry (`policy/<name>`) that no
    /// configuration holds any more is that Policy alone while it is active or recently
    /// retired, matched by the API server.
    pub fn lookup(&self, phase: Phase, id: &str) -> Lookup {
        let state = self.state();
        let key = (phase, id.to_string());
        let found = state
            .computed
            .get(&key)
            .or_else(|| state.wired.get(&key))
            .or_else(|| {
                state
                    .retired
                    .get(&key)
                    .filter(|(_, at)| at.elapsed() < RETIRED_GRACE)
                    .map(|(g, _)| g)
            });
        let (group, members) = match found {
            Some(group) => {
                let members = state
                    .members
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| state.active_members(group));
                (group.clone(), members)
            }
            None => {
                let Some(name) = id.strip_prefix(entry::OWN_PREFIX) else {
                    return Lookup::Unknown;
                };
                let recently = state
                    .retired_policies
                    .get(name)
                    .is_some_and(|at| at.elapsed() < RETIRED_GRACE);
                if !state.active.contains_key(name) && !recently {
                    return Lookup::Unknown;
                }
                let policy = state.active.get(name);
                let group = Group {
                    id: id.to_string(),
                    phase,
                    failure_policy: policy
                        .map(|p| p.spec().effective_failure_policy())
                        .unwrap_or_default(),
                    reinvocation_policy: policy
                        .map(|p| p.spec().reinvocation_policy)
                        .unwrap_or_default(),
                    members: vec![name.to_string()],
                };
                let members = state.active_members(&group);
                (Arc::new(group), members)
            }
        };
        let matched = group.is_own()
            || !state.computed.contains_key(&key)
                && !state.wired.contains_key(&key)
                && !state.retired.contains_key(&key);
        Lookup::Group {
            group,
            members,
            matched,
        }
    }

    /// The compiled Policy named `name`, if it is active.
    pub fn get(&self, name: &str) -> Option<Arc<CompiledPolicy>> {
        self.state().active.get(name).cloned()
    }

    /// Names of the active Policies.
    pub fn names(&self) -> Vec<String> {
        self.state().active.keys().cloned().collect()
    }

    fn state(&self) -> Arc<State> {
        match self.inner.read() {
            Ok(guard) => guard.clone(),
            // A writer panicked mid-swap; the map itself is always whole, so keep serving it.
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Inserts or replaces one Policy.
    pub fn upsert(&self, policy: Arc<CompiledPolicy>) {
        self.update(|s| {
            s.retired_policies.remove(policy.name());
            s.active.insert(policy.name().to_string(), policy);
            s.recompute();
        });
    }

    /// Forgets one Policy; entries that still name it skip it.
    pub fn retire(&self, name: &str) {
        self.update(|s| {
            if s.active.remove(name).is_some() {
                s.retired_policies.insert(name.to_string(), Instant::now());
                s.recompute();
            }
        });
    }

    /// Records the Policies the API server enforces in-process.
    pub fn set_in_process(&self, names: HashSet<String>) {
        if self.state().in_process == names {
            return;
        }
        self.update(|s| {
            s.in_process = names;
            s.recompute();
        });
    }

    /// Records the groups the live configurations hold (as read back from the API server).
    pub fn set_wired(&self, groups: Vec<Group>) {
        let wired = keyed(groups);
        if self.state().wired == wired {
            return;
        }
        self.update(|s| {
            let before: HashMap<Key, Arc<Group>> = s
                .wired
                .drain()
                .chain(s.computed.iter().map(|(k, g)| (k.clone(), g.clone())))
                .collect();
            s.wired = wired;
            s.retire_gone(before);
        });
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut guard = match self.inner.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut state = (**guard).clone();
        f(&mut state);
        state.resolve_members();
        *guard = Arc::new(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::Policy;

    fn compiled(name: &str) -> Arc<CompiledPolicy> {
        let policy: Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": name},
            "spec": {
                "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
                "validate": [{"expression": "true", "message": "m"}],
            },
        }))
        .unwrap();
        Arc::new(gatehouse_engine::compile(&policy).unwrap())
    }

    fn mutating(name: &str, matching: serde_json::Value) -> Arc<CompiledPolicy> {
        let policy: Policy = serde_json::from_value(serde_json::json!({
            "apiVersion": "gatehouse.dev/v1alpha1",
            "kind": "Policy",
            "metadata": {"name": name},
            "spec": {
                "match": matching,
                "mutate": [{"merge": {"metadata": {"labels": {name: "yes"}}}}],
            },
        }))
        .unwrap();
        Arc::new(gatehouse_engine::compile(&policy).unwrap())
    }

    #[test]
    fn a_request_is_offered_only_the_members_its_namespace_can_match_in_order() {
        let rules = serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*"]}]);
        let pinned = |name: &str, ns: &str| {
            mutating(
                name,
                serde_json::json!({"rules": rules, "namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]}]}}),
            )
        };
        let members = Members::new(vec![
            pinned("t-a", "team-a"),
            mutating("everywhere", serde_json::json!({"rules": rules})),
            pinned("t-b", "team-b"),
            mutating(
                "two",
                serde_json::json!({"rules": rules, "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}]}}),
            ),
            pinned("t-a2", "team-a"),
        ]);
        assert_eq!(members.offered("team-a", false), [0, 1, 3, 4]);
        assert_eq!(members.offered("team-b", false), [1, 2, 3]);
        assert_eq!(members.offered("team-c", false), [1, 3]);
        // Cluster-scoped requests and Namespaces themselves: every member.
        assert_eq!(members.offered("", false), [0, 1, 2, 3, 4]);
        assert_eq!(members.offered("team-c", true), [0, 1, 2, 3, 4]);
    }

    #[test]
    fn members_say_whether_a_request_needs_its_namespace_labels() {
        let rules = serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["*"]}]);
        let plain = mutating("a", serde_json::json!({"rules": rules}));
        let by_namespace = mutating(
            "b",
            serde_json::json!({"rules": rules, "namespaceSelector": {"matchLabels": {"x": "y"}}}),
        );
        let by_object = mutating(
            "c",
            serde_json::json!({"rules": rules, "objectSelector": {"matchLabels": {"x": "y"}}}),
        );
        assert!(Members::new(vec![plain.clone(), by_namespace]).namespace_selectors);
        let without = Members::new(vec![plain, by_object]);
        assert!(!without.namespace_selectors);
        assert!(!without.heavy);
        assert_eq!(without.len(), 2);
    }

    fn members(lookup: Lookup) -> Option<(String, Vec<String>, bool)> {
        match lookup {
            Lookup::Group {
                group,
                members,
                matched,
            } => Some((
                group.id.clone(),
                members.iter().map(|p| p.name().to_string()).collect(),
                matched,
            )),
            Lookup::Unknown => None,
        }
    }

    const V: Phase = Phase::Validating;

    #[test]
    fn a_policy_change_regroups_at_once_and_the_old_group_is_still_answered() {
        let store = PolicyStore::new();
        store.upsert(compiled("a"));
        let (one, _, _) = members(store.lookup(V, &only_group(&store))).unwrap();
        store.upsert(compiled("b"));
        let two = only_group(&store);
        assert_ne!(one, two, "membership changed, so the id did");
        assert_eq!(
            members(store.lookup(V, &two)).unwrap().1,
            ["a", "b"],
            "the new group is served before any configuration names it"
        );
        // The API server may still call the entry of the previous configuration.
        assert_eq!(members(store.lookup(V, &one)).unwrap().1, ["a"]);
        store.retire("a");
        assert_eq!(
            members(store.lookup(V, &one)).unwrap().1,
            Vec::<String>::new(),
            "a retired member is skipped: the request is admitted unchanged"
        );
        assert!(members(store.lookup(V, "fail-00000000")).is_none());
    }

    #[test]
    fn a_policy_the_api_server_enforces_is_in_no_group_and_skipped_in_stale_ones() {
        let store = PolicyStore::new();
        store.upsert(compiled("a"));
        store.upsert(compiled("b"));
        let both = only_group(&store);
        store.set_in_process(HashSet::from(["b".to_string()]));
        let alone = only_group(&store);
        assert_ne!(both, alone, "the groups leave it out");
        assert_eq!(members(store.lookup(V, &alone)).unwrap().1, ["a"]);
        // A stale entry that still names it (the API server's cache lags a configuration
        // write) is answered without it: never evaluated twice.
        assert_eq!(members(store.lookup(V, &both)).unwrap().1, ["a"]);
        // Back on the webhook: evaluated again at once.
        store.set_in_process(HashSet::new());
        assert_eq!(members(store.lookup(V, &both)).unwrap().1, ["a", "b"]);
    }

    #[test]
    fn groups_of_the_live_configurations_are_answered_without_a_timer() {
        // A follower whose view lags: the leader wired {a, c}, this replica only knows a.
        let store = PolicyStore::new();
        store.upsert(compiled("a"));
        let wired = Group {
            id: "fail-12345678".into(),
            phase: V,
            failure_policy: Default::default(),
            reinvocation_policy: Default::default(),
            members: vec!["a".into(), "c".into()],
        };
        store.set_wired(vec![wired]);
        assert_eq!(
            members(store.lookup(V, "fail-12345678")).unwrap(),
            ("fail-12345678".to_string(), vec!["a".to_string()], false)
        );
        store.set_wired(vec![]);
        // Unwired, but within the grace.
        assert!(members(store.lookup(V, "fail-12345678")).is_some());
    }

    #[test]
    fn an_own_entry_no_configuration_holds_is_its_policy_matched_by_the_api_server() {
        let store = PolicyStore::new();
        store.upsert(compiled("p"));
        assert_eq!(
            members(store.lookup(V, "policy/p")).unwrap(),
            ("policy/p".to_string(), vec!["p".to_string()], true)
        );
        // A bare Policy name was never an entry path.
        assert!(members(store.lookup(V, "p")).is_none());
        store.retire("p");
        assert_eq!(
            members(store.lookup(V, "policy/p")).unwrap().1,
            Vec::<String>::new(),
            "retired within the grace: admitted unchanged"
        );
        assert!(members(store.lookup(V, "policy/other")).is_none());
    }

    fn only_group(store: &PolicyStore) -> String {
        let state = store.state();
        let ids: Vec<&String> = state.computed.keys().map(|(_, id)| id).collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        ids[0].clone()
    }
}
