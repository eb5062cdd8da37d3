//! Namespace labels for the members' namespaceSelectors: Gatehouse matches them itself, since
//! shared entries carry only the system exclusion.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;

use crate::runtime::reconcile::reflect;

/// Why the labels of a Namespace that does not exist are unknown.
pub const NO_SUCH_NAMESPACE: &str = "no such Namespace";

/// Where the labels come from.
#[derive(Clone)]
pub enum Namespaces {
    /// A reflector of the cluster's Namespaces (a label change is seen within the watch's
    /// latency), and a client to read one created after the last event, as the API server's
    /// own matcher does when its informer has not seen a Namespace yet.
    Cluster {
        store: Store<Namespace>,
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
    /// The reflector of every Namespace, and the future that drives its watch.
    pub fn watch(client: Client) -> (Self, impl Future<Output = ()> + Send) {
        // Nothing waits on changes: each request reads the store.
        let (store, watch) = reflect::<Namespace>(
            client.clone(),
            watcher::Config::default(),
            Arc::new(Notify::new()),
        );
        (Namespaces::Cluster { store, client }, watch)
    }

    /// The reflector's store, shared with the loops that read Namespaces too.
    pub fn store(&self) -> Option<Store<Namespace>> {
        match self {
            Namespaces::Cluster { store, .. } => Some(store.clone()),
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
            Namespaces::Cluster { store, client } => {
                if let Some(ns) = store.get(&ObjectRef::new(name)) {
                    return Ok(ns.labels().clone());
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
