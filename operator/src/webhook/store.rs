//! The snapshot of compiled Policies the server reads on every request.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::engine::CompiledPolicy;

/// How long a deleted Policy is remembered as deleted. The API server's webhook informer lags a
/// configuration write by a moment; during that moment it may still call the removed entry,
/// and the right answer then is "this Policy no longer applies", not a 404 that its
/// failurePolicy would turn into a rejection.
pub const RETIRED_GRACE: Duration = Duration::from_secs(60);

/// What the store knows of a name.
pub enum Lookup {
    Active(Arc<CompiledPolicy>),
    /// No longer served as a Policy, but the API server may still call its entry (unwired
    /// recently, or still in the configurations this replica reads): admit unchanged.
    Retired,
    Unknown,
}

#[derive(Clone, Default)]
struct State {
    active: HashMap<String, Arc<CompiledPolicy>>,
    retired: HashMap<String, Instant>,
    /// Policies whose entries the live configurations hold. A follower cannot unwire anything,
    /// so while a stuck leader leaves an entry in place its name must never become a 404.
    wired: HashSet<String>,
}

/// Compiled Policies by name. Readers clone an `Arc` and drop the lock at once, so a reload
/// never waits for in-flight reviews and a review never sees half an update.
#[derive(Default)]
pub struct PolicyStore {
    inner: RwLock<Arc<State>>,
}

impl PolicyStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// What is known of the Policy named `name`.
    pub fn lookup(&self, name: &str) -> Lookup {
        let state = self.state();
        if let Some(p) = state.active.get(name) {
            return Lookup::Active(p.clone());
        }
        match state.retired.get(name) {
            Some(at) if at.elapsed() < RETIRED_GRACE => Lookup::Retired,
            _ if state.wired.contains(name) => Lookup::Retired,
            _ => Lookup::Unknown,
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
            s.retired.remove(policy.name());
            s.active.insert(policy.name().to_string(), policy);
        });
    }

    /// Forgets one Policy, remembering for [`RETIRED_GRACE`] that it was unwired.
    pub fn retire(&self, name: &str) {
        self.update(|s| {
            if s.active.remove(name).is_some() {
                s.retired.insert(name.to_string(), Instant::now());
            }
            s.retired.retain(|_, at| at.elapsed() < RETIRED_GRACE);
        });
    }

    /// Records which Policies the live configurations wire (as read back from the API server).
    pub fn set_wired(&self, names: HashSet<String>) {
        if self.state().wired == names {
            return;
        }
        self.update(|s| s.wired = names);
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut guard = match self.inner.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut state = (**guard).clone();
        f(&mut state);
        *guard = Arc::new(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::Policy;

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
        Arc::new(crate::engine::compile(&policy).unwrap())
    }

    #[test]
    fn names_still_wired_are_answered_as_retired_without_a_timer() {
        let store = PolicyStore::new();
        assert!(matches!(store.lookup("p"), Lookup::Unknown));
        // A follower that never compiled `p` (deleted before it started) while a stuck leader
        // still has its entry in the configuration.
        store.set_wired(HashSet::from(["p".to_string()]));
        assert!(matches!(store.lookup("p"), Lookup::Retired));
        store.upsert(compiled("p"));
        assert!(matches!(store.lookup("p"), Lookup::Active(_)));
        store.retire("p");
        assert!(matches!(store.lookup("p"), Lookup::Retired));
        store.set_wired(HashSet::new());
        // Still within the grace after retirement.
        assert!(matches!(store.lookup("p"), Lookup::Retired));
        assert!(matches!(store.lookup("other"), Lookup::Unknown));
    }
}
