//! Both kinds of Policy, with the PolicyExceptions that exempt from them, as every loop reads
//! and writes them.
//!
//! The loops run Policies: a NamespacedPolicy is read as the Policy it runs as
//! ([`NamespacedPolicy::scoped_policy`]), a Policy with the honoured exceptions that name it
//! written in ([`exception::exempted`]), and whatever is written back about one (status,
//! finalizers, Events) goes to the object it was written as ([`PolicyObject`]).
use std::sync::Arc;

use gatehouse_api::v1alpha1::{NamespacedPolicy, Policy, PolicyException, PolicySource, unmarked};
use gatehouse_engine::exception;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::Notify;

use crate::runtime::reconcile::reflect;

/// The caches of both kinds and of the exceptions.
#[derive(Clone)]
pub struct PolicyStores {
    cluster: Store<Policy>,
    namespaced: Store<NamespacedPolicy>,
    exceptions: Store<PolicyException>,
    /// The namespaces exceptions are honoured from (`--exception-namespaces`).
    exception_namespaces: Arc<[String]>,
}

impl PolicyStores {
    /// Every Policy (with the honoured exceptions that name it written in) and every
    /// NamespacedPolicy (as the Policy it runs as).
    pub fn state(&self) -> Vec<Arc<Policy>> {
        let exceptions = self.exceptions.state();
        let mut honoured: Vec<&PolicyException> = exceptions
            .iter()
            .filter(|e| self.honours(e))
            .map(AsRef::as_ref)
            .collect();
        // One order on every replica and every pass: the exempted spec is the same each time.
        honoured.sort_by_key(|e| (e.metadata.namespace.clone(), e.metadata.name.clone()));
        let mut all: Vec<Arc<Policy>> = self
            .cluster
            .state()
            .into_iter()
            .map(|p| {
                let exemptions = exception::exemptions_of(&p.name_any(), &honoured);
                if exemptions.is_empty() && PolicySource::of(&p).namespace().is_none() {
                    p
                } else {
                    // A Policy is a Policy, whatever it carries.
                    let policy = unmarked(p.as_ref().clone());
                    Arc::new(exception::exempted(&policy, &exemptions))
                }
            })
            .collect();
        all.extend(
            self.namespaced
                .state()
                .iter()
                .map(|np| Arc::new(np.scoped_policy())),
        );
        all
    }

    /// Whether `exception` is in a namespace exceptions are honoured from.
    pub fn honours(&self, exception: &PolicyException) -> bool {
        let namespace = exception.metadata.namespace.as_deref().unwrap_or_default();
        self.exception_namespaces.iter().any(|n| n == namespace)
    }

    /// The namespaces exceptions are honoured from.
    pub fn exception_namespaces(&self) -> &[String] {
        &self.exception_namespaces
    }

    /// Every PolicyException, honoured or not.
    pub fn exceptions(&self) -> Vec<Arc<PolicyException>> {
        self.exceptions.state()
    }

    /// Waits until every cache has listed once.
    pub async fn wait_until_ready(&self) {
        let _ = tokio::join!(
            self.cluster.wait_until_ready(),
            self.namespaced.wait_until_ready(),
            self.exceptions.wait_until_ready()
        );
    }
}

/// Reflectors of both kinds and of the exceptions (honoured from `exception_namespaces`), each
/// change poking `trigger`; the future drives the watches.
pub fn reflect_policies(
    client: &Client,
    trigger: &Arc<Notify>,
    exception_namespaces: &[String],
) -> (PolicyStores, impl Future<Output = ()> + Send + use<>) {
    let (cluster, cluster_watch) =
        reflect::<Policy>(client.clone(), watcher::Config::default(), trigger.clone());
    let (namespaced, namespaced_watch) =
        reflect::<NamespacedPolicy>(client.clone(), watcher::Config::default(), trigger.clone());
    let (exceptions, exceptions_watch) =
        reflect::<PolicyException>(client.clone(), watcher::Config::default(), trigger.clone());
    let watches = async move {
        tokio::join!(cluster_watch, namespaced_watch, exceptions_watch);
    };
    (
        PolicyStores {
            cluster,
            namespaced,
            exceptions,
            exception_namespaces: exception_namespaces.into(),
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
