//! IPAM benchmark on the real API server (numbers for the notes; not a test):
//! 1. the raw rate at which this client creates PODS Pods in a namespace no Policy matches;
//! 2. end-to-end allocation of PODS Pods (create → gate removed) in a namespace the ipam Policy
//!    matches, with the same client and concurrency, and the ratio of the two rates;
//! 3. the time to collect the PODS orphans after they were deleted while Gatehouse was down;
//! 4. Gatehouse's RSS with ALLOCATIONS IPAllocations in its caches.
//!
//! `tests/bench/ipam-load` runs it (control plane, release build, environment).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use gatehouse_e2e::cpu::{cpu_snapshot, processes};
use gatehouse_e2e::gatehouse::{Gatehouse, Options, ensure_crds, remove_pool};
use gatehouse_e2e::pods::{delete_all, ipam_gated};
use gatehouse_e2e::{TestNamespace, await_condition, cluster};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0"}]},
    }))?)
}

/// Creates `count` Pods at `concurrency`; returns the wall time.
async fn create_pods(
    api: &Api<Pod>,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let name = format!("{prefix}-{i}");
                api.create(&PostParams::default(), &pod(&name)?)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(started.elapsed())
}

async fn ungated(api: &Api<Pod>) -> anyhow::Result<usize> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| !ipam_gated(p))
        .count())
}

async fn allocations(cluster: &gatehouse_e2e::Cluster, pool: &str) -> anyhow::Result<usize> {
    let out = cluster
        .kubectl_ok(
            [
                "get",
                "ipallocations",
                "-l",
                &format!("gatehouse.dev/pool={pool}"),
                "-o",
                "name",
            ],
            None,
        )
        .await?;
    Ok(out.lines().filter(|l| !l.trim().is_empty()).count())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let pods = env_usize("PODS", 1000);
    let concurrency = env_usize("CONCURRENCY", 50);
    let many = env_usize("ALLOCATIONS", 10_000);
    let cluster = cluster().await;
    ensure_crds(cluster).await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    let raw_ns = TestNamespace::new(cluster, "bench-raw").await?;
    let ipam_ns = TestNamespace::new(cluster, "bench-ipam").await?;
    let client = cluster.client().await?;
    let options = || {
        Options::url()
            .arg("--gc-interval", "1s")
            .arg("--gc-grace", "5s")
    };
    let mut gh = Gatehouse::start(cluster, home.name(), options()).await?;

    let (pool, policy) = ("bench-pool", "bench-ipam");
    cluster
        .kubectl_ok(
            ["apply", "-f", "-"],
            Some(
                &json!({
                    "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPPool",
                    "metadata": {"name": pool}, "spec": {"cidr": "10.40.0.0/16"},
                })
                .to_string(),
            ),
        )
        .await?;
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": policy},
            "spec": {
                "match": {
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ipam_ns.name()}},
                },
                "effects": [{"ipam": {"pool": pool}}],
            },
        }).to_string()))
        .await?;
    cluster
        .kubectl_ok(
            [
                "wait",
                "--for=condition=Ready",
                &format!("policy/{policy}"),
                "--timeout=60s",
            ],
            None,
        )
        .await?;
    // Until the API server calls the new entry, Pods arrive unmarked: probe with a dry run.
    let ipam_api: Api<Pod> = Api::namespaced(client.clone(), ipam_ns.name());
    await_condition("marking live", Duration::from_secs(60), || async {
        let p = ipam_api
            .create(
                &PostParams {
                    dry_run: true,
                    ..PostParams::default()
                },
                &pod("probe")?,
            )
            .await?;
        Ok(p.spec
            .and_then(|s| s.scheduling_gates)
            .is_some()
            .then_some(()))
    })
    .await?;

    let procs = processes(cluster.state_dir(), gh.pid());
    // 1. Raw creates.
    let raw_api: Api<Pod> = Api::namespaced(client.clone(), raw_ns.name());
    let cpu0 = cpu_snapshot(&procs);
    let raw = create_pods(&raw_api, "raw", pods, concurrency).await?;
    let cpu1 = cpu_snapshot(&procs);
    // 2. Allocation end to end.
    let started = Instant::now();
    let created = create_pods(&ipam_api, "web", pods, concurrency).await?;
    await_condition("all Pods placed", Duration::from_secs(600), || async {
        Ok((ungated(&ipam_api).await? >= pods).then_some(()))
    })
    .await?;
    let placed = started.elapsed();
    let cpu2 = cpu_snapshot(&procs);
    let raw_rate = pods as f64 / raw.as_secs_f64();
    let alloc_rate = pods as f64 / placed.as_secs_f64();
    println!("| phase | {pods} Pods | rate |");
    println!("| --- | --- | --- |");
    println!(
        "| raw creates (no Policy) | {:.2}s | {raw_rate:.0}/s |",
        raw.as_secs_f64()
    );
    println!(
        "| creates with the ipam Policy | {:.2}s | |",
        created.as_secs_f64()
    );
    println!(
        "| placed (create → gate removed) | {:.2}s | {alloc_rate:.0}/s |",
        placed.as_secs_f64()
    );
    for (i, (name, _)) in procs.iter().enumerate() {
        println!(
            "CPU seconds of {name}: raw phase {:.2}, allocation phase {:.2}",
            cpu1[i] - cpu0[i],
            cpu2[i] - cpu1[i]
        );
    }
    println!(
        "allocation rate / raw write rate = {:.3} (goal >= 0.4); placed in {:.1}s (goal <= 30s)",
        alloc_rate / raw_rate,
        placed.as_secs_f64()
    );

    // 3. Orphans: the Pods go while Gatehouse is down.
    gh.stop().await?;
    delete_all(&ipam_api).await?;
    // Every allocation is past the 5s grace before Gatehouse comes back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    gh.restart().await?;
    let started = Instant::now();
    await_condition("orphans collected", Duration::from_secs(300), || async {
        Ok((allocations(cluster, pool).await? == 0).then_some(()))
    })
    .await?;
    println!(
        "{pods} orphans collected {:.2}s after Gatehouse was ready (grace already over; goal <= 10s)",
        started.elapsed().as_secs_f64()
    );

    // 4. Memory with many allocations (owners that never exist; GC grace long enough to keep them).
    gh.stop().await?;
    let gh = Gatehouse::start(cluster, home.name(), Options::url().arg("--gc-grace", "1h")).await?;
    let rss_before = gh.rss_kib().unwrap_or(0);
    let allocs: Api<gatehouse::api::v1alpha1::IPAllocation> = Api::all(client.clone());
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..many)
        .map(|i| {
            let allocs = allocs.clone();
            async move {
                let addr = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 40, 0, 0)) + 1 + i as u32);
                let body: gatehouse::api::v1alpha1::IPAllocation = serde_json::from_value(json!({
                    "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPAllocation",
                    "metadata": {"name": format!("{pool}-{}", addr.to_string().replace('.', "-")), "labels": {"gatehouse.dev/pool": pool, "gatehouse.dev/owner-uid": format!("uid-{i}")}},
                    "spec": {"pool": pool, "address": addr.to_string(), "owner": {"apiVersion": "v1", "kind": "Pod", "namespace": "nowhere", "name": format!("ghost-{i}"), "uid": format!("uid-{i}")}},
                }))?;
                allocs.create(&PostParams::default(), &body).await?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_after = gh.rss_kib().unwrap_or(0);
    println!(
        "Gatehouse RSS: {rss_before} KiB idle, {rss_after} KiB with {many} IPAllocations cached (goal <= 65536 KiB)"
    );

    gh.shutdown().await?;
    remove_pool(cluster, pool, policy).await?;
    raw_ns.cleanup().await?;
    ipam_ns.cleanup().await?;
    home.cleanup().await?;
    Ok(())
}
