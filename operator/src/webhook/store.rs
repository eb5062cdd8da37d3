//! The snapshot of compiled Policies the server reads on every request.
use std::collections::HashMap;
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
    /// Unwired recently; admit unchanged.
    Retired,
    Unknown,
}

#[derive(Clone, Default)]
struct State {
    active: HashMap<String, Arc<CompiledPolicy>>,
    retired: HashMap<String, Instant>,
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
