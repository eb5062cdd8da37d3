//! Companions benchmark on the real API server (numbers for the notes; not a test), one Policy
//! with two companions per Namespace (a ConfigMap from its template, a Secret cloned from a
//! source):
//! 1. NAMESPACES (1000) Namespaces created at once (concurrency 50): time until all 2×N
//!    companions exist;
//! 2. the clone source changed: time until every copy follows;
//! 3. a resync with nothing changed: companion writes in 25 s (the resync is 20 s);
//! 4. the N Namespaces deleted: time until none of their companions is left;
//! 5. Gatehouse's RSS with MANY (10000) labelled Namespaces, without the Policy and with it and
//!    their companions.
//!
//! `tests/bench/companions` runs it (control plane, release build, environment).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gatehouse_e2e::instance::{Gatehouse, Options, ensure_crds};
use gatehouse_e2e::{TestNamespace, await_condition, cluster};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const LABEL: &str = "bench.gatehouse.dev/companions";
const POLICY_LABEL: &str = "gatehouse.dev/companion-of-policy";

/// Creates Namespaces `<prefix>-<i>` for `range`, labelled, at `concurrency`.
async fn create_namespaces(
    api: &Api<Namespace>,
    prefix: &str,
    range: std::ops::Range<usize>,
    concurrency: usize,
) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(range)
        .map(|i| {
            let api = api.clone();
            async move {
                let ns: Namespace = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": format!("{prefix}-{i}"), "labels": {LABEL: prefix}},
                }))?;
                api.create(&PostParams::default(), &ns).await?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// The companions of the bench Policy: (ConfigMaps, Secrets) and how many Secrets hold `token`.
async fn counted(client: &kube::Client, token: &str) -> anyhow::Result<(usize, usize, usize)> {
    let selector = ListParams::default().labels(POLICY_LABEL);
    let maps = Api::<k8s_openapi::api::core::v1::ConfigMap>::all(client.clone())
        .list_metadata(&selector)
        .await?;
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::all(client.clone())
        .list(&selector)
        .await?;
    let following = secrets
        .items
        .iter()
        .filter(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get("token"))
                .is_some_and(|t| t.0 == token.as_bytes())
        })
        .count();
    Ok((maps.items.len(), secrets.items.len(), following))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_usize("NAMESPACES", 1000);
    let many = env_usize("MANY", 10_000);
    let cluster = cluster().await;
    ensure_crds(cluster).await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    let client = cluster.client().await?;
    let gh = Gatehouse::start(cluster, home.name(), Options::url().default_logging()).await?;
    let source = |token: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bench-source", "namespace": home.name()},
               "type": "Opaque", "stringData": {"token": token}})
        .to_string()
    };
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&source("one")))
        .await?;
    let policy = json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "bench-companions"}, "spec": {
        "match": {
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
            "objectSelector": {"matchExpressions": [{"key": LABEL, "operator": "Exists"}]},
        },
        "effects": [
            {"object": {"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}, "data": {"a": "b"}},
                        "fields": [{"path": "data.namespace", "expression": "object.metadata.name"}]}},
            {"object": {"template": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull"}},
                        "cloneFrom": {"namespace": home.name(), "name": "bench-source"}}},
        ],
    }});
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&policy.to_string()))
        .await?;
    cluster
        .kubectl_ok(
            [
                "wait",
                "--for=condition=Ready",
                "--timeout=60s",
                "policy/bench-companions",
            ],
            None,
        )
        .await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let long = Duration::from_secs(600);

    // 1. A burst of Namespaces.
    let started = Instant::now();
    create_namespaces(&namespaces, "bc", 0..count, 50).await?;
    let created = started.elapsed();
    await_condition("every companion", long, || async {
        let (maps, secrets, _) = counted(&client, "one").await?;
        Ok((maps == count && secrets == count).then_some(()))
    })
    .await?;
    let in_place = started.elapsed();
    println!(
        "1. {count} Namespaces created in {:.1} s; all {} companions in place after {:.1} s",
        created.as_secs_f64(),
        2 * count,
        in_place.as_secs_f64()
    );

    // 2. The clone source changes.
    let started = Instant::now();
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&source("two")))
        .await?;
    await_condition("every copy following", long, || async {
        let (_, _, following) = counted(&client, "two").await?;
        Ok((following == count).then_some(()))
    })
    .await?;
    println!(
        "2. clone source changed: {count} copies updated after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // 3. A quiet resync.
    let before = gh.metric_sum("gatehouse_companions_applied", "").await?;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = gh.metric_sum("gatehouse_companions_applied", "").await?;
    println!(
        "3. quiet for 25 s (a resync is 20 s): {} companion writes",
        after - before
    );

    // 4. The Namespaces deleted.
    let started = Instant::now();
    let deletes: Vec<anyhow::Result<()>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = namespaces.clone();
            async move {
                api.delete(&format!("bc-{i}"), &DeleteParams::default())
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    deletes.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    await_condition("every companion gone", long, || async {
        let (maps, secrets, _) = counted(&client, "two").await?;
        Ok((maps == 0 && secrets == 0).then_some(()))
    })
    .await?;
    println!(
        "4. {count} Namespaces deleted: their companions gone after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // 5. RSS with many Namespaces: first without the Policy (what they cost every cache of
    //    Gatehouse), then with it and their companions.
    cluster
        .kubectl_ok(
            ["delete", "policy", "bench-companions", "--timeout=120s"],
            None,
        )
        .await?;
    create_namespaces(&namespaces, "bm", 0..many, 50).await?;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let without = gh.rss_kib().context("no RSS")?;
    let started = Instant::now();
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&policy.to_string()))
        .await?;
    await_condition("every companion of the many", long, || async {
        let (maps, secrets, _) = counted(&client, "two").await?;
        Ok((maps == many && secrets == many).then_some(()))
    })
    .await?;
    let in_place = started.elapsed();
    tokio::time::sleep(Duration::from_secs(25)).await;
    let with = gh.rss_kib().context("no RSS")?;
    let lazy = gh.lazy_free_kib().unwrap_or(0);
    println!(
        "5. {many} Namespaces: Gatehouse RSS {:.1} MiB without the Policy; with it ({} companions, in place after {:.0} s) {:.1} MiB, of which {:.1} MiB lazily freed",
        without as f64 / 1024.0,
        2 * many,
        in_place.as_secs_f64(),
        with as f64 / 1024.0,
        lazy as f64 / 1024.0
    );
    Ok(())
}
