//! Per-test namespaces.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::{Cluster, DeleteGuard, await_condition};

/// Label put on every namespace the tests create.
pub const E2E_LABEL: &str = "gatehouse.dev/e2e";

/// How long [`TestNamespace::new`] waits for the namespace's `default` ServiceAccount.
const SERVICE_ACCOUNT_TIMEOUT: Duration = Duration::from_secs(60);

/// A namespace `<prefix>-<random suffix>` labelled `gatehouse.dev/e2e=true`.
///
/// Delete it with [`TestNamespace::cleanup`]; if a test bails out early, dropping it starts a
/// best-effort `kubectl delete namespace --wait=false`. It keeps the client of the runtime it was
/// created in: use it within one test.
pub struct TestNamespace {
    name: String,
    client: Client,
    guard: Option<DeleteGuard>,
}

impl std::fmt::Debug for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNamespace")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl TestNamespace {
    /// Creates the namespace and waits until kube-controller-manager has created its `default`
    /// ServiceAccount (Pods are rejected by the ServiceAccount admission plugin until then).
    pub async fn new(cluster: &Cluster, prefix: &str) -> anyhow::Result<Self> {
        let client = cluster.client().await?;
        let api: Api<Namespace> = Api::all(client.clone());
        // Keep the name a valid DNS label (at most 63 characters).
        let prefix: String = prefix.chars().take(50).collect();
        let prefix = prefix.trim_end_matches('-');
        let mut attempt = 0;
        let name = loop {
            attempt += 1;
            let name = format!("{prefix}-{}", random_suffix(6));
            let ns = Namespace {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some([(E2E_LABEL.to_owned(), "true".to_owned())].into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match api.create(&PostParams::default(), &ns).await {
                Ok(_) => break name,
                Err(kube::Error::Api(status)) if status.is_already_exists() && attempt < 5 => {}
                Err(err) => return Err(err).with_context(|| format!("creating namespace {name}")),
            }
        };
        let guard = cluster.delete_on_drop("namespace", &name, None);
        let this = Self {
            name,
            client,
            guard: Some(guard),
        };
        this.wait_for_default_service_account().await?;
        Ok(this)
    }

    async fn wait_for_default_service_account(&self) -> anyhow::Result<()> {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &self.name);
        await_condition(
            &format!("ServiceAccount default in namespace {}", self.name),
            SERVICE_ACCOUNT_TIMEOUT,
            || {
                let accounts = accounts.clone();
                async move { Ok(accounts.get_opt("default").await?.map(|_| ())) }
            },
        )
        .await
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace (without waiting for it to disappear).
    pub async fn cleanup(mut self) -> anyhow::Result<()> {
        if let Some(guard) = self.guard.take() {
            guard.disarm();
        }
        let api: Api<Namespace> = Api::all(self.client.clone());
        match api.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
            Err(err) => Err(err).with_context(|| format!("deleting namespace {}", self.name)),
        }
    }
}

/// A random string of lowercase letters and digits.
fn random_suffix(len: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    let mut bits = hasher.finish();
    (0..len)
        .map(|_| {
            let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize];
            bits /= ALPHABET.len() as u64;
            c as char
        })
        .collect()
}
