//! The scaffold every scenario with a running Gatehouse stands on: the lock on the cluster's
//! webhook configurations, Gatehouse's home namespace, the namespace its Policies select, the
//! running Gatehouse (and any replicas), and what the scenario made, removed again at the end
//! whatever the outcome.

use std::sync::Mutex;

use anyhow::Context;
use gatehouse_e2e::instance::{self, Gatehouse, Options, remove_pool};
use gatehouse_e2e::{Cluster, TestNamespace, run_disruptive_test, run_test};

use crate::fixtures::delete_policies;

/// Runs `body` in a fresh [`Scene`] (namespace `<prefix>-…`, Gatehouse started with `options`)
/// and fails the test with its error or the cleanup's.
pub(crate) async fn scenario(prefix: &str, options: Options, body: impl Body) {
    run_test(move |cluster| in_scene(cluster, prefix, options, body)).await;
}

/// [`scenario`], alone on the cluster ([`run_disruptive_test`]).
pub(crate) async fn disruptive_scenario(prefix: &str, options: Options, body: impl Body) {
    run_disruptive_test(move |cluster| in_scene(cluster, prefix, options, body)).await;
}

/// What a scenario does in its scene.
pub(crate) trait Body: AsyncFnOnce(&mut Scene) -> anyhow::Result<()> {}

impl<F: AsyncFnOnce(&mut Scene) -> anyhow::Result<()>> Body for F {}

async fn in_scene(
    cluster: &'static Cluster,
    prefix: &str,
    options: Options,
    body: impl Body,
) -> anyhow::Result<()> {
    Scene::start(cluster, prefix, options)
        .await?
        .run(body)
        .await
}

/// The namespaces of a scene, before Gatehouse starts (for scenarios that prepare something it
/// needs, such as its RBAC); [`Stage::start`] makes it a [`Scene`].
pub(crate) struct Stage {
    serial: tokio::sync::MutexGuard<'static, ()>,
    cluster: &'static Cluster,
    home: TestNamespace,
    ns: TestNamespace,
}

impl Stage {
    pub(crate) async fn open(cluster: &'static Cluster, prefix: &str) -> anyhow::Result<Self> {
        let serial = instance::exclusive().await;
        let home = TestNamespace::new(cluster, "gh-home").await?;
        let ns = TestNamespace::new(cluster, prefix).await?;
        Ok(Self {
            serial,
            cluster,
            home,
            ns,
        })
    }

    pub(crate) fn home(&self) -> &str {
        self.home.name()
    }

    /// A suffix unique to this scenario, for cluster-scoped names.
    pub(crate) fn id(&self) -> String {
        unique(&self.ns)
    }

    /// Starts Gatehouse in the home namespace.
    pub(crate) async fn start(self, options: Options) -> anyhow::Result<Scene> {
        let gh = Gatehouse::start(self.cluster, self.home.name(), options).await?;
        Ok(self.into_scene(gh, Vec::new()))
    }

    /// Starts two Gatehouse processes in the home namespace at once: [`Scene::gh`] and the
    /// first of [`Scene::replicas`].
    pub(crate) async fn start_together(self, a: Options, b: Options) -> anyhow::Result<Scene> {
        let (a, b) = tokio::join!(
            Gatehouse::start(self.cluster, self.home.name(), a),
            Gatehouse::start(self.cluster, self.home.name(), b)
        );
        Ok(self.into_scene(a?, vec![b?]))
    }

    fn into_scene(self, gh: Gatehouse, replicas: Vec<Gatehouse>) -> Scene {
        Scene {
            cluster: self.cluster,
            gh,
            replicas,
            policies: Mutex::default(),
            pools: Mutex::default(),
            objects: Mutex::default(),
            namespaces: Mutex::default(),
            stage: self,
        }
    }
}

/// One scenario's world; see the module.
pub(crate) struct Scene {
    stage: Stage,
    pub(crate) cluster: &'static Cluster,
    pub(crate) gh: Gatehouse,
    /// Further Gatehouse processes sharing the home namespace, started by [`Scene::replica`].
    pub(crate) replicas: Vec<Gatehouse>,
    policies: Mutex<Vec<String>>,
    pools: Mutex<Vec<(String, String)>>,
    objects: Mutex<Vec<(String, String)>>,
    namespaces: Mutex<Vec<TestNamespace>>,
}

/// Deletes every NamespacedPolicy and PolicyException, waiting until they are gone.
async fn delete_namespaced_objects(cluster: &Cluster) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(
            [
                "delete",
                "namespacedpolicies,policyexceptions",
                "--all",
                "--all-namespaces",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=60s",
            ],
            None,
        )
        .await?;
    Ok(())
}

/// A unique suffix for cluster-scoped names of one scenario.
pub(crate) fn unique(ns: &TestNamespace) -> String {
    ns.name().rsplit('-').next().unwrap_or("x").to_string()
}

impl Scene {
    pub(crate) async fn start(
        cluster: &'static Cluster,
        prefix: &str,
        options: Options,
    ) -> anyhow::Result<Self> {
        Stage::open(cluster, prefix).await?.start(options).await
    }

    /// Runs `body`, then [`Scene::finish`].
    pub(crate) async fn run(mut self, body: impl Body) -> anyhow::Result<()> {
        let result = body(&mut self).await;
        self.finish(result).await
    }

    pub(crate) fn home(&self) -> &str {
        self.stage.home()
    }

    pub(crate) fn ns(&self) -> &str {
        self.stage.ns.name()
    }

    /// A suffix unique to this scenario, for cluster-scoped names.
    pub(crate) fn id(&self) -> String {
        self.stage.id()
    }

    /// The name `<prefix>-<id>` for a Policy, deleted at the end.
    pub(crate) fn policy(&self, prefix: &str) -> String {
        self.track(format!("{prefix}-{}", self.id()))
    }

    /// `name`, for a Policy deleted at the end.
    pub(crate) fn track(&self, name: String) -> String {
        lock(&self.policies).push(name.clone());
        name
    }

    /// Removes the IPPool `pool` with its Policy `policy` at the end.
    pub(crate) fn track_pool(&self, pool: &str, policy: &str) {
        lock(&self.pools).push((pool.to_string(), policy.to_string()));
    }

    /// `name`, for a cluster-scoped object of `kind` deleted at the end.
    pub(crate) fn track_object(&self, kind: &str, name: String) -> String {
        lock(&self.objects).push((kind.to_string(), name.clone()));
        name
    }

    /// Another namespace, deleted at the end; returns its name.
    pub(crate) async fn namespace(&self, prefix: &str) -> anyhow::Result<String> {
        let ns = TestNamespace::new(self.cluster, prefix).await?;
        let name = ns.name().to_string();
        lock(&self.namespaces).push(ns);
        Ok(name)
    }

    /// Starts another Gatehouse in the home namespace; it is [`Scene::replicas`]' last.
    pub(crate) async fn replica(&mut self, options: Options) -> anyhow::Result<&mut Gatehouse> {
        let gh = Gatehouse::start(self.cluster, self.home(), options).await?;
        self.replicas.push(gh);
        self.replicas.last_mut().context("no replica")
    }

    /// Removes the scenario's pools, objects and Policies, stops every Gatehouse still running (the last
    /// one removing the configurations) and deletes the namespaces; the scenario's own outcome
    /// comes first.
    async fn finish(self, result: anyhow::Result<()>) -> anyhow::Result<()> {
        let Self {
            stage,
            cluster,
            gh,
            replicas,
            policies,
            pools,
            objects,
            namespaces,
        } = self;
        let cleanup = async {
            let pools = pools.into_inner().unwrap_or_else(|e| e.into_inner());
            for (pool, policy) in &pools {
                remove_pool(cluster, pool, policy).await?;
            }
            for (kind, name) in objects.into_inner().unwrap_or_else(|e| e.into_inner()) {
                cluster
                    .kubectl_ok(
                        ["delete", &kind, &name, "--ignore-not-found", "--wait=false"],
                        None,
                    )
                    .await?;
            }
            // The namespaced Gatehouse objects go while Gatehouse runs: a namespace is deleted
            // after it stops, and until then the next scenario's Gatehouse would wire what is
            // left in it (and nobody would release a finalizer). Scenarios take turns, and only
            // they make these: every one there is is this scenario's.
            delete_namespaced_objects(cluster).await?;
            let policies = policies.into_inner().unwrap_or_else(|e| e.into_inner());
            let names: Vec<&str> = policies.iter().map(String::as_str).collect();
            delete_policies(cluster, &names).await?;
            let mut running: Vec<Gatehouse> = std::iter::once(gh)
                .chain(replicas)
                .filter(|g| g.pid().is_some())
                .collect();
            match running.pop() {
                Some(last) => {
                    for mut other in running {
                        // A replica cut off from the API server may not exit cleanly.
                        let _ = other.stop().await;
                    }
                    last.shutdown().await?;
                }
                None => instance::remove_configurations(cluster).await?,
            }
            for ns in namespaces.into_inner().unwrap_or_else(|e| e.into_inner()) {
                ns.cleanup().await?;
            }
            stage.ns.cleanup().await?;
            stage.home.cleanup().await?;
            drop(stage.serial);
            Ok(())
        }
        .await;
        result.and(cleanup)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
