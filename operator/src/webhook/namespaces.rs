//! Namespace labels for the members' namespaceSelectors: Gatehouse matches them itself, since
//! shared entries carry only the system exclusion.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;

use crate::runtime::table::{ObjectName, Table, feed};

/// The labels of every Namespace by name: all the process keeps of them.
pub type NamespaceLabels = Table<Arc<CompactLabels>>;

/// A Namespace's labels as a sorted slice: a map of two labels would cost a whole tree node
/// (~0.5 KiB), and the process holds one per Namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactLabels(Box<[(Box<str>, Box<str>)]>);

impl CompactLabels {
    pub fn of(labels: BTreeMap<String, String>) -> Self {
        CompactLabels(
            labels
                .into_iter()
                .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
                .collect(),
        )
    }

    /// The labels as the matchers take them.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// Why the labels of a Namespace that does not exist are unknown.
pub const NO_SUCH_NAMESPACE: &str = "no such Namespace";

/// Where the labels come from.
#[derive(Clone)]
pub enum Namespaces {
    /// The labels of the cluster's Namespaces from a metadata watch (a label change is seen
    /// within the watch's latency), and a client to read one created after the last event, as
    /// the API server's own matcher does when its informer has not seen a Namespace yet.
    Cluster {
        labels: NamespaceLabels,
        client: Client,
    },
    /// Fixed labels by Namespace name (in-process tests and benchmarks).
    Fixed(Arc<HashMap<String, BTreeMap<String, String>>>),
}

impl Default for Namespaces {
    fn default() -> Self {
        Namespaces::Fixed(Arc::default())
    }
}

impl Namespaces {
    /// The labels of every Namespace, and the future that drives their watch, poking each of
    /// `triggers` on every change.
    pub fn watch(
        client: Client,
        triggers: Vec<Arc<Notify>>,
    ) -> (Self, impl Future<Output = ()> + Send) {
        let labels = NamespaceLabels::default();
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
        let stream = watcher(api, watcher::Config::default());
        let watch = feed(labels.clone(), stream, triggers, "Namespace".into(), |ns| {
            Arc::new(CompactLabels::of(ns.metadata.labels.unwrap_or_default()))
        });
        (Namespaces::Cluster { labels, client }, watch)
    }

    /// The labels table, shared with the loops that read Namespaces too.
    pub fn table(&self) -> Option<NamespaceLabels> {
        match self {
            Namespaces::Cluster { labels, .. } => Some(labels.clone()),
            Namespaces::Fixed(_) => None,
        }
    }

    /// The labels of the Namespace `name`; an error says why they are unknown.
    pub async fn labels(&self, name: &str) -> Result<BTreeMap<String, String>, String> {
        match self {
            Namespaces::Fixed(map) => map
                .get(name)
                .cloned()
                .ok_or_else(|| NO_SUCH_NAMESPACE.to_string()),
            Namespaces::Cluster { labels, client } => {
                if let Some(found) = labels.get(&ObjectName::cluster(name)) {
                    return Ok(found.to_map());
                }
                let api: Api<Namespace> = Api::all(client.clone());
                match api.get_metadata_opt(name).await {
                    Ok(Some(ns)) => Ok(ns.labels().clone()),
                    Ok(None) => Err(NO_SUCH_NAMESPACE.to_string()),
                    Err(e) => Err(format!("reading it failed: {e}")),
                }
            }
        }
    }
}
