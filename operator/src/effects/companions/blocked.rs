//! The Policies whose object or call effects cannot run as written — a kind not served, a
//! namespace on a cluster-scoped kind, a clone source missing, a verb Gatehouse is not granted,
//! a receiver's token missing — as the effects loops last found them. The Policy controller reads them into `Ready=False`, so
//! such a Policy says why and is not wired; the loop tells it when the set changed, so a grant
//! heals it within a pass.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Problems by the loop that found them, then by Policy name.
type ByLoop = BTreeMap<&'static str, BTreeMap<String, Vec<String>>>;

/// Problems by loop and Policy name, shared by the effects loops (writers, each of its own
/// share) and the controller (reader).
#[derive(Clone, Default)]
pub struct BlockedPolicies {
    problems: Arc<Mutex<ByLoop>>,
    changed: Arc<Notify>,
}

impl BlockedPolicies {
    /// Replaces every Policy's problems as the loop `found_by` found them; wakes the reader
    /// when they differ from before.
    pub fn replace(&self, found_by: &'static str, next: BTreeMap<String, Vec<String>>) {
        let mut problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        let share = problems.entry(found_by).or_default();
        if *share != next {
            *share = next;
            self.changed.notify_one();
        }
    }

    /// The problems of Policy `name`, of every loop; empty when it is not blocked.
    pub fn problems_of(&self, name: &str) -> Vec<String> {
        let problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        problems
            .values()
            .filter_map(|share| share.get(name))
            .flatten()
            .cloned()
            .collect()
    }

    /// Waits until the problems changed.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_change_wakes_the_reader_and_the_same_set_does_not() {
        let blocked = BlockedPolicies::default();
        let one = BTreeMap::from([("p".to_string(), vec!["may not create x".to_string()])]);
        blocked.replace("companions", one.clone());
        blocked.replace(
            "calls",
            BTreeMap::from([("p".to_string(), vec!["no token".to_string()])]),
        );
        tokio::time::timeout(std::time::Duration::from_secs(1), blocked.changed())
            .await
            .expect("woken");
        assert_eq!(blocked.problems_of("p"), ["no token", "may not create x"]);
        assert!(blocked.problems_of("q").is_empty());
        blocked.replace("companions", one);
        let again =
            tokio::time::timeout(std::time::Duration::from_millis(50), blocked.changed()).await;
        assert!(again.is_err(), "the same problems woke the reader");
    }
}
