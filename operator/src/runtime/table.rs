//! A table fed by a watch, each object reduced to what its readers need: for caches of many
//! objects, where a store of whole objects (a tree of maps each) would cost the process more
//! than everything else it holds.
use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use futures::TryStreamExt;
use kube::Resource;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

/// Where an object is: its namespace (none for a cluster-scoped kind) and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectName {
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectName {
    /// The cluster-scoped object `name`.
    pub fn cluster(name: &str) -> Self {
        ObjectName {
            namespace: None,
            name: name.to_string(),
        }
    }

    fn of<K: Resource>(object: &K) -> Self {
        let meta = object.meta();
        ObjectName {
            namespace: meta.namespace.clone(),
            name: meta.name.clone().unwrap_or_default(),
        }
    }
}

#[derive(Default)]
struct Rows<V> {
    current: HashMap<ObjectName, V>,
    /// The rows of a list under way: they replace `current` when it is done.
    listing: Option<HashMap<ObjectName, V>>,
}

/// The table; its clones share it.
pub struct Table<V> {
    rows: Arc<RwLock<Rows<V>>>,
    listed: Arc<watch::Sender<bool>>,
}

impl<V> Clone for Table<V> {
    fn clone(&self) -> Self {
        Table {
            rows: self.rows.clone(),
            listed: self.listed.clone(),
        }
    }
}

impl<V> Default for Table<V> {
    fn default() -> Self {
        Table {
            rows: Arc::new(RwLock::new(Rows {
                current: HashMap::new(),
                listing: None,
            })),
            listed: Arc::new(watch::Sender::new(false)),
        }
    }
}

impl<V: Clone> Table<V> {
    /// The row of `name`.
    pub fn get(&self, name: &ObjectName) -> Option<V> {
        let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
        rows.current.get(name).cloned()
    }

    /// Every row, in no order.
    pub fn values(&self) -> Vec<V> {
        let rows = self.rows.read().unwrap_or_else(PoisonError::into_inner);
        rows.current.values().cloned().collect()
    }

    /// Whether the first list is in.
    pub fn is_listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Returns once the first list is in.
    pub async fn wait_until_listed(&self) {
        let mut listed = self.listed.subscribe();
        // The sender lives as long as this table: waiting cannot fail.
        let _ = listed.wait_for(|done| *done).await;
    }

    /// Takes one watch event in, each object reduced by `reduce`.
    pub fn take<K: Resource>(&self, event: Event<K>, reduce: impl Fn(K) -> V) {
        let mut rows = self.rows.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            Event::Apply(object) => {
                rows.current.insert(ObjectName::of(&object), reduce(object));
            }
            Event::Delete(object) => {
                rows.current.remove(&ObjectName::of(&object));
            }
            Event::Init => rows.listing = Some(HashMap::new()),
            Event::InitApply(object) => {
                let name = ObjectName::of(&object);
                let row = reduce(object);
                rows.listing
                    .get_or_insert_with(HashMap::new)
                    .insert(name, row);
            }
            Event::InitDone => {
                if let Some(mut listed) = rows.listing.take() {
                    listed.shrink_to_fit();
                    rows.current = listed;
                }
                drop(rows);
                self.listed.send_replace(true);
            }
        }
    }
}

/// Feeds `table` from `stream` (retried with backoff) until it ends, poking each of `triggers`
/// after each event; `kind` names the watch in the log.
pub async fn feed<K: Resource, V: Clone>(
    table: Table<V>,
    stream: impl futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send,
    triggers: Vec<Arc<Notify>>,
    kind: String,
    reduce: impl Fn(K) -> V,
) {
    let mut stream = std::pin::pin!(stream.default_backoff());
    loop {
        match stream.try_next().await {
            Ok(Some(event)) => {
                table.take(event, &reduce);
                for trigger in &triggers {
                    trigger.notify_one();
                }
            }
            Ok(None) => return,
            // The watcher has started over with a fresh list already: no failure.
            Err(watcher::Error::WatchError(status)) if status.code == 410 => {
                debug!(%kind, "resource version too old; relisting");
            }
            Err(e) => warn!(%kind, error = %e, "watch failed; backing off"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn map(name: &str, value: &str) -> ConfigMap {
        let mut map = ConfigMap::default();
        map.metadata.name = Some(name.into());
        map.metadata.namespace = Some("team".into());
        map.data = Some([("v".to_string(), value.to_string())].into());
        map
    }

    fn value_of(map: ConfigMap) -> String {
        map.data
            .and_then(|d| d.get("v").cloned())
            .unwrap_or_default()
    }

    fn name(name: &str) -> ObjectName {
        ObjectName {
            namespace: Some("team".into()),
            name: name.into(),
        }
    }

    #[test]
    fn a_list_replaces_the_rows_only_when_it_is_done() {
        let table = Table::default();
        table.take(Event::Apply(map("old", "1")), value_of);
        table.take(Event::<ConfigMap>::Init, value_of);
        table.take(Event::InitApply(map("new", "2")), value_of);
        // Until the list is done, readers see the rows before it.
        assert_eq!(table.get(&name("old")).as_deref(), Some("1"));
        assert_eq!(table.get(&name("new")), None);
        assert!(!table.is_listed());
        table.take(Event::<ConfigMap>::InitDone, value_of);
        assert_eq!(table.get(&name("old")), None);
        assert_eq!(table.get(&name("new")).as_deref(), Some("2"));
        assert!(table.is_listed());
    }

    #[test]
    fn applies_and_deletes_change_single_rows() {
        let table = Table::default();
        table.take(Event::<ConfigMap>::Init, value_of);
        table.take(Event::<ConfigMap>::InitDone, value_of);
        table.take(Event::Apply(map("a", "1")), value_of);
        table.take(Event::Apply(map("b", "1")), value_of);
        table.take(Event::Apply(map("a", "2")), value_of);
        table.take(Event::Delete(map("b", "1")), value_of);
        assert_eq!(table.get(&name("a")).as_deref(), Some("2"));
        assert_eq!(table.values(), vec!["2".to_string()]);
    }

    #[tokio::test]
    async fn waiting_for_the_list_returns_once_it_is_in() {
        let table = Table::<String>::default();
        let waiting = tokio::spawn({
            let table = table.clone();
            async move { table.wait_until_listed().await }
        });
        table.take(Event::<ConfigMap>::Init, value_of);
        table.take(Event::<ConfigMap>::InitDone, value_of);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the wait ended")
            .expect("the task ran");
    }
}
