//! Calls benchmark on the real API server (numbers for the notes; not a test), one Policy
//! calling a receiver that answers in 10 ms for every Pod of a namespace:
//! 1. PODS (1000) Pods created at once (concurrency 50): time from the last create until every
//!    ExternalCall says Applied;
//! 2. the Pods deleted: time from the last delete until every key was released and no record is
//!    left;
//! 3. calls per key on that healthy receiver (Apply and Release each counted once per key);
//! 4. Gatehouse's RSS with MANY (10000) Pods and their records.
//!
//! `tests/bench/calls` runs it (control plane, release build, environment).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gatehouse_e2e::instance::{Gatehouse, Options, ensure_crds};
use gatehouse_e2e::receiver::{Behaviour, Receiver};
use gatehouse_e2e::{TestNamespace, await_condition, cluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Creates Pods `<prefix>-<i>` for `range` at concurrency 50.
async fn create_pods(
    api: &Api<Pod>,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(range)
        .map(|i| {
            let api = api.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{prefix}-{i}")},
                    "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0"}]},
                }))?;
                api.create(&PostParams::default(), &pod).await?;
                Ok(())
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Deletes every Pod of `api` at concurrency 50.
async fn delete_pods(api: &Api<Pod>) -> anyhow::Result<()> {
    let names: Vec<String> = api
        .list_metadata(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                api.delete(&name, &DeleteParams::default()).await?;
                Ok(())
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    results.into_iter().collect()
}

/// (records, of them Applied) of the bench Policy.
async fn records(client: &kube::Client) -> anyhow::Result<(usize, usize)> {
    let api: Api<gatehouse_api::v1alpha1::ExternalCall> = Api::all(client.clone());
    let list = api.list(&ListParams::default()).await?;
    let applied = list
        .items
        .iter()
        .filter(|r| {
            r.status
                .as_ref()
                .is_some_and(|s| s.state == gatehouse_api::v1alpha1::CallState::Applied)
        })
        .count();
    Ok((list.items.len(), applied))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_usize("PODS", 1000);
    let many = env_usize("MANY", 10_000);
    let cluster = cluster().await;
    ensure_crds(cluster).await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    let ns = TestNamespace::new(cluster, "bench-calls").await?;
    let client = cluster.client().await?;
    let receiver = Receiver::start().await?;
    receiver.behave(Behaviour::AcceptAfter(Duration::from_millis(10)));
    let gh = Gatehouse::start(cluster, home.name(), Options::url().default_logging()).await?;
    let policy = json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "bench-calls"}, "spec": {
        "match": {
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name()}},
        },
        "effects": [{"call": {"url": receiver.url(), "caBundle": receiver.ca_bundle}}],
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
                "policy/bench-calls",
            ],
            None,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    let long = Duration::from_secs(600);

    // 1. A burst of Pods.
    let started = Instant::now();
    create_pods(&pods, "bp", 0..count).await?;
    let created = Instant::now();
    await_condition("every call applied", long, || async {
        let (_, applied) = records(&client).await?;
        Ok((applied == count).then_some(()))
    })
    .await?;
    println!(
        "1. {count} Pods created in {:.1} s; every call Applied {:.1} s after the last create",
        (created - started).as_secs_f64(),
        created.elapsed().as_secs_f64()
    );

    // 2. The Pods deleted.
    delete_pods(&pods).await?;
    let deleted = Instant::now();
    await_condition("every call released", long, || async {
        let (left, _) = records(&client).await?;
        Ok((left == 0).then_some(()))
    })
    .await?;
    println!(
        "2. {count} Pods deleted: every key released, no record left {:.1} s after the last delete",
        deleted.elapsed().as_secs_f64()
    );

    // 3. Calls per key.
    let calls = receiver.calls();
    let keys: BTreeSet<&str> = calls.iter().map(|c| c.key.as_str()).collect();
    let applies = calls.iter().filter(|c| c.action == "Apply").count();
    let releases = calls.iter().filter(|c| c.action == "Release").count();
    println!(
        "3. {} keys: {applies} Apply calls ({:.3} a key), {releases} Release calls ({:.3} a key)",
        keys.len(),
        applies as f64 / keys.len().max(1) as f64,
        releases as f64 / keys.len().max(1) as f64
    );

    // 4. RSS with many records.
    create_pods(&pods, "bm", 0..many).await?;
    await_condition("every call of the many applied", long, || async {
        let (_, applied) = records(&client).await?;
        Ok((applied == many).then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(25)).await;
    let rss = gh.rss_kib().context("no RSS")?;
    let lazy = gh.lazy_free_kib().unwrap_or(0);
    println!(
        "4. {many} Pods and {many} ExternalCall records: Gatehouse RSS {:.1} MiB, of which {:.1} MiB lazily freed",
        rss as f64 / 1024.0,
        lazy as f64 / 1024.0
    );
    delete_pods(&pods).await?;
    await_condition("the many released", long, || async {
        let (left, _) = records(&client).await?;
        Ok((left == 0).then_some(()))
    })
    .await?;
    cluster
        .kubectl_ok(["delete", "policy", "bench-calls", "--timeout=120s"], None)
        .await?;
    Ok(())
}
