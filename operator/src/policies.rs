//! Both kinds of Policy as every loop reads and writes them.
//!
//! The loops run Policies: a NamespacedPolicy is read as the Policy it runs as
//! ([`NamespacedPolicy::scoped_policy`]), and whatever is written back about it (status,
//! finalizers, Events) goes to the NamespacedPolicy itself ([`PolicyObject`]).
use std::sync::Arc;

use gatehouse_api::v1alpha1::{NamespacedPolicy, Policy, PolicySource};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::Notify;

use crate::runtime::reconcile::reflect;

/// The caches of both kinds.
#[derive(Clone)]
pub struct PolicyStores {
    cluster: Store<Policy>,
    namespaced: Store<NamespacedPolicy>,
}

impl PolicyStores {
    /// Every Policy and every NamespacedPolicy (as the Policy it runs as).
    pub fn state(&self) -> Vec<Arc<Policy>> {
        let mut all = self.cluster.state();
        all.extend(
            self.namespaced
                .state()
                .iter()
                .map(|np| Arc::new(np.scoped_policy())),
        );
        all
    }

    /// Waits until both caches have listed once.
    pub async fn wait_until_ready(&self) {
        let _ = tokio::join!(
            self.cluster.wait_until_ready(),
            self.namespaced.wait_until_ready()
        );
    }
}

/// Reflectors of both kinds, each change poking `trigger`; the future drives both watches.
pub fn reflect_policies(
    client: &Client,
    trigger: &Arc<Notify>,
) -> (PolicyStores, impl Future<Output = ()> + Send + use<>) {
    let (cluster, cluster_watch) =
        reflect::<Policy>(client.clone(), watcher::Config::default(), trigger.clone());
    let (namespaced, namespaced_watch) =
        reflect::<NamespacedPolicy>(client.clone(), watcher::Config::default(), trigger.clone());
    let watches = async move {
        tokio::join!(cluster_watch, namespaced_watch);
    };
    (
        PolicyStores {
            cluster,
            namespaced,
        },
        watches,
    )
}

/// The stored object a Policy the loops run was written as: where its status, finalizers and
/// Events go.
pub struct PolicyObject {
    api: Api<DynamicObject>,
    source: PolicySource,
}

impl PolicyObject {
    /// The object `policy` was written as.
    pub fn of(client: &Client, policy: &Policy) -> Self {
        let source = PolicySource::of(policy);
        let api = match source.namespace() {
            Some(namespace) => Api::namespaced_with(
                client.clone(),
                namespace,
                &ApiResource::erase::<NamespacedPolicy>(&()),
            ),
            None => Api::all_with(client.clone(), &ApiResource::erase::<Policy>(&())),
        };
        PolicyObject { api, source }
    }

    /// What it is: `Policy name` or `NamespacedPolicy namespace/name`, for messages.
    pub fn source(&self) -> &PolicySource {
        &self.source
    }

    /// JSON merge `patch` of its status.
    pub async fn patch_status(&self, patch: &serde_json::Value) -> Result<(), kube::Error> {
        self.api
            .patch_status(
                self.source.name(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map(drop)
    }

    /// JSON merge `patch` of the object (its metadata: finalizers).
    pub async fn patch(&self, patch: &serde_json::Value) -> Result<(), kube::Error> {
        self.api
            .patch(
                self.source.name(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
            .map(drop)
    }
}

/// The reference Events about `policy` name: the NamespacedPolicy it was written as, if it was
/// one.
pub fn event_reference(policy: &Policy) -> ObjectReference {
    let mut reference = policy.object_ref(&());
    if let PolicySource::Namespaced { namespace, name } = PolicySource::of(policy) {
        reference.kind = Some(NamespacedPolicy::kind(&()).into_owned());
        reference.namespace = Some(namespace);
        reference.name = Some(name);
    }
    reference
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::sample_spec;

    #[test]
    fn events_about_a_namespaced_policy_name_it() {
        let mut np = NamespacedPolicy::new("team-a", "labels", sample_spec(1, true, false));
        np.metadata.uid = Some("u-1".into());
        let reference = event_reference(&np.scoped_policy());
        assert_eq!(reference.kind.as_deref(), Some("NamespacedPolicy"));
        assert_eq!(reference.namespace.as_deref(), Some("team-a"));
        assert_eq!(reference.name.as_deref(), Some("labels"));
        assert_eq!(reference.uid.as_deref(), Some("u-1"));
        let policy = Policy::new("p", sample_spec(1, true, false));
        assert_eq!(event_reference(&policy).kind.as_deref(), Some("Policy"));
    }
}
