//! The Policies whose object effects cannot run as written — a kind not served, a namespace on
//! a cluster-scoped kind, a clone source missing, a verb Gatehouse is not granted — as the
//! companions loop last found them. The Policy controller reads them into `Ready=False`, so
//! such a Policy says why and is not wired; the loop tells it when the set changed, so a grant
//! heals it within a pass.
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// Problems by Policy name, shared by the companions loop (writer) and the controller (reader).
#[derive(Clone, Default)]
pub struct BlockedPolicies {
    problems: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    changed: Arc<Notify>,
}

impl BlockedPolicies {
    /// Replaces every Policy's problems; wakes the reader when they differ from before.
    pub fn replace(&self, next: BTreeMap<String, Vec<String>>) {
        let mut problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        if *problems != next {
            *problems = next;
            self.changed.notify_one();
        }
    }

    /// The problems of Policy `name`; empty when it is not blocked.
    pub fn problems_of(&self, name: &str) -> Vec<String> {
        let problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        problems.get(name).cloned().unwrap_or_default()
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
        blocked.replace(one.clone());
        tokio::time::timeout(std::time::Duration::from_secs(1), blocked.changed())
            .await
            .expect("woken");
        assert_eq!(blocked.problems_of("p"), ["may not create x"]);
        assert!(blocked.problems_of("q").is_empty());
        blocked.replace(one);
        let again =
            tokio::time::timeout(std::time::Duration::from_millis(50), blocked.changed()).await;
        assert!(again.is_err(), "the same problems woke the reader");
    }
}
