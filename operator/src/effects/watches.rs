//! The kinds the companions loop watches change with the Policies: triggers, companions and
//! clone sources of any kind discovery serves. Each is a table of the objects' JSON text,
//! started when a Policy first needs it and stopped when none does; a pass parses one object
//! at a time, so the loop never holds every object as a tree at once.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::runtime::table::{Table, feed};

/// A watched object's JSON text.
pub type StoredJson = Arc<str>;

/// One watch: a kind, optionally one namespace and selectors.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct WatchKey {
    pub api_version: String,
    pub kind: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub labels: Option<String>,
    pub fields: Option<String>,
}

impl WatchKey {
    /// Every object of `resource`, optionally narrowed by a label selector.
    pub fn all(resource: &ApiResource, labels: Option<&str>) -> Self {
        WatchKey {
            api_version: resource.api_version.clone(),
            kind: resource.kind.clone(),
            plural: resource.plural.clone(),
            namespace: None,
            labels: labels.map(str::to_string),
            fields: None,
        }
    }

    /// The one object of `resource` named `name` (in `namespace`, for a namespaced kind).
    pub fn one(resource: &ApiResource, namespace: Option<&str>, name: &str) -> Self {
        WatchKey {
            namespace: namespace.map(str::to_string),
            fields: Some(format!("metadata.name={name}")),
            ..Self::all(resource, None)
        }
    }
}

/// A running watch and its table.
struct Running {
    table: Table<StoredJson>,
    task: JoinHandle<()>,
}

/// The running watches, each poking `trigger` on every change.
pub struct Watches {
    client: Client,
    trigger: Arc<Notify>,
    running: BTreeMap<WatchKey, Running>,
}

impl Watches {
    pub fn new(client: Client, trigger: Arc<Notify>) -> Self {
        Watches {
            client,
            trigger,
            running: BTreeMap::new(),
        }
    }

    /// Starts the watches of `wanted` not running yet and stops those not wanted any more.
    pub fn keep(&mut self, wanted: &BTreeMap<WatchKey, ApiResource>) {
        let stale: BTreeSet<WatchKey> = self
            .running
            .keys()
            .filter(|k| !wanted.contains_key(*k))
            .cloned()
            .collect();
        for key in stale {
            if let Some(running) = self.running.remove(&key) {
                running.task.abort();
            }
        }
        for (key, resource) in wanted {
            if !self.running.contains_key(key) {
                let running = self.start(key, resource);
                self.running.insert(key.clone(), running);
            }
        }
    }

    /// The objects of `key`'s watch, once its first list is in.
    pub fn objects(&self, key: &WatchKey) -> Option<Vec<StoredJson>> {
        let running = self.running.get(key)?;
        running.table.is_listed().then(|| running.table.values())
    }

    fn start(&self, key: &WatchKey, resource: &ApiResource) -> Running {
        let api: Api<DynamicObject> = match &key.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let mut config = watcher::Config::default();
        if let Some(labels) = &key.labels {
            config = config.labels(labels);
        }
        if let Some(fields) = &key.fields {
            config = config.fields(fields);
        }
        let table = Table::default();
        let task = tokio::spawn(feed(
            table.clone(),
            watcher(api, config),
            vec![self.trigger.clone()],
            key.kind.clone(),
            compact,
        ));
        Running { table, task }
    }
}

/// An object as its JSON text without managedFields: a tenth of its size as a tree of maps.
fn compact(mut object: DynamicObject) -> StoredJson {
    object.managed_fields_mut().clear();
    // A DynamicObject is JSON already: writing it out cannot fail.
    serde_json::to_string(&object).map_or_else(|_| Arc::from("null"), Arc::from)
}

impl Drop for Watches {
    fn drop(&mut self) {
        for running in self.running.values() {
            running.task.abort();
        }
    }
}
