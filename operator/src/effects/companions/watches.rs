//! The kinds the companions loop watches change with the Policies: triggers, companions and
//! clone sources of any kind discovery serves. Each is a reflector of [`DynamicObject`]s,
//! started when a Policy first needs it and stopped when none does.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::TryStreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::warn;

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

/// A running watch and whether its first list is in.
struct Running {
    store: Store<DynamicObject>,
    ready: Arc<AtomicBool>,
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
    pub fn objects(&self, key: &WatchKey) -> Option<Vec<Arc<DynamicObject>>> {
        let running = self.running.get(key)?;
        running
            .ready
            .load(Ordering::Acquire)
            .then(|| running.store.state())
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
        let writer = reflector::store::Writer::new(resource.clone());
        let store = writer.as_reader();
        let ready = Arc::new(AtomicBool::new(false));
        let stream = reflector::reflector(writer, watcher(api, config))
            .modify(|o| o.managed_fields_mut().clear())
            .default_backoff();
        let trigger = self.trigger.clone();
        let kind = key.kind.clone();
        let (readiness, reader) = (ready.clone(), store.clone());
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            let waiting = async {
                // The writer lives in the stream: it is dropped only when the task ends.
                let _ = reader.wait_until_ready().await;
                readiness.store(true, Ordering::Release);
                trigger.notify_one();
                std::future::pending::<()>().await;
            };
            let events = async {
                loop {
                    match stream.try_next().await {
                        Ok(Some(_)) => trigger.notify_one(),
                        Ok(None) => return,
                        Err(e) => warn!(%kind, error = %e, "companions watch failed; backing off"),
                    }
                }
            };
            tokio::select! {
                () = waiting => {}
                () = events => {}
            }
        });
        Running { store, ready, task }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for running in self.running.values() {
            running.task.abort();
        }
    }
}
