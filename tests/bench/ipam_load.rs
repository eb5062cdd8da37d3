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
use futures::{StreamExt, TryStreamExt};
use gatehouse_e2e::cpu::{cpu_snapshot, processes};
use gatehouse_e2e::instance::{Gatehouse, Options, ensure_crds, remove_pool};
use gatehouse_e2e::lease::{Impostor, leader_gauge};
use gatehouse_e2e::pods::{delete_all, ipam_gated};
use gatehouse_e2e::{TestNamespace, await_condition, cluster};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Label telling the phase that created a Pod.
const PHASE: &str = "bench.gatehouse.dev/phase";

fn pod(name: &str, phase: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {PHASE: phase}},
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
                api.create(&PostParams::default(), &pod(&name, prefix)?)
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

/// Watches `api` (a watch, not polling: a list of 1000 Pods every 200 ms is API-server CPU the
/// measured phase would pay for) and resolves when `count` Pods are past the IPAM gate.
fn all_placed(api: &Api<Pod>, count: usize) -> tokio::task::JoinHandle<anyhow::Result<Instant>> {
    let api = api.clone();
    tokio::spawn(async move {
        let mut placed = std::collections::HashSet::new();
        let events = watcher(api, watcher::Config::default()).applied_objects();
        let mut events = std::pin::pin!(events);
        while let Some(pod) = events.try_next().await? {
            if !ipam_gated(&pod) {
                placed.insert(pod.name_any());
                if placed.len() >= count {
                    return Ok(Instant::now());
                }
            }
        }
        anyhow::bail!(
            "the Pod watch ended with {} of {count} placed",
            placed.len()
        )
    })
}

/// Runs `write` for every item at `concurrency`; returns the wall time.
async fn timed<'a, T, F, Fut>(
    items: &'a [T],
    concurrency: usize,
    write: F,
) -> anyhow::Result<Duration>
where
    F: Fn(usize, &'a T) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(items.iter().enumerate())
        .map(|(i, item)| write(i, item))
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    Ok(started.elapsed())
}

/// The `i`-th IPAllocation of `pool` (10.40.0.0/16 from .1 up), owned by Pod `namespace/name`.
fn allocation(
    pool: &str,
    i: usize,
    namespace: &str,
    name: &str,
    uid: &str,
) -> anyhow::Result<gatehouse_api::v1alpha1::IPAllocation> {
    let addr =
        std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 40, 0, 0)) + 1 + i as u32);
    Ok(serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPAllocation",
        "metadata": {"name": format!("{pool}-{}", addr.to_string().replace('.', "-")), "labels": {"gatehouse.dev/pool": pool, "gatehouse.dev/owner-uid": uid}},
        "spec": {"pool": pool, "address": addr.to_string(), "owner": {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": name, "uid": uid}},
    }))?)
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
            .default_logging()
            .arg("--gc-interval", "1s")
            .arg("--gc-grace", "5s")
    };
    // No collection until phase 3: the raw allocations of phase 1b have no owner.
    let mut gh = Gatehouse::start(
        cluster,
        home.name(),
        Options::url().default_logging().arg("--gc-interval", "1h"),
    )
    .await?;

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
                &pod("probe", "probe")?,
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
    let cpu_raw = cpu_snapshot(&procs);
    // 1b. The loop's two writes, done by this client without the loop: an IPAllocation create
    // and a JSON patch of a Pod, per Pod. Their combined rate is what the loop could reach at best.
    let raw_pool = "bench-raw";
    let raw_pods = raw_api.list(&ListParams::default()).await?.items;
    let allocs: Api<gatehouse_api::v1alpha1::IPAllocation> = Api::all(client.clone());
    let raw_allocations = timed(&raw_pods, concurrency, |i, p| {
        let allocs = allocs.clone();
        let owner = (p.name_any(), p.uid().unwrap_or_default());
        async move {
            let body = allocation(raw_pool, i, "bench-raw", &owner.0, &owner.1)?;
            allocs.create(&PostParams::default(), &body).await?;
            Ok(())
        }
    })
    .await?;
    let raw_patches = timed(&raw_pods, concurrency, |i, p| {
        let api = raw_api.clone();
        let (name, uid) = (p.name_any(), p.uid().unwrap_or_default());
        async move {
            let patch: json_patch::Patch = serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/uid", "value": uid},
                {"op": "add", "path": "/metadata/annotations", "value": {"gatehouse.dev/ip": format!("raw-{i}")}},
            ]))?;
            api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
            Ok(())
        }
    })
    .await?;
    allocs
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&format!("gatehouse.dev/pool={raw_pool}")),
        )
        .await?;
    // 2. Allocation end to end.
    let cpu1 = cpu_snapshot(&procs);
    let started = Instant::now();
    let placed_at = all_placed(&ipam_api, pods);
    let created = create_pods(&ipam_api, "web", pods, concurrency).await?;
    let placed = placed_at.await?? - started;
    let cpu2 = cpu_snapshot(&procs);
    // 2b. The loop alone: the same number of Pods, created (marked and gated) while an impostor
    // holds the Lease, so Gatehouse serves the webhook but allocates nothing; the clock runs
    // from the moment it leads again. These are the two writes per Pod the 0.5 ceiling
    // counts, without the creates through the webhook competing for the API server.
    let impostor = Impostor::start(cluster, home.name()).await?;
    await_condition(
        "gatehouse follows the impostor",
        Duration::from_secs(60),
        || async { Ok((leader_gauge(&gh).await? == 0.0).then_some(())) },
    )
    .await?;
    let placed_at = all_placed(&ipam_api, 2 * pods);
    create_pods(&ipam_api, "queued", pods, concurrency).await?;
    drop(impostor);
    let leading = await_condition("gatehouse leads again", Duration::from_secs(60), || async {
        Ok((leader_gauge(&gh).await? == 1.0).then(Instant::now))
    })
    .await?;
    let cpu3 = cpu_snapshot(&procs);
    let drained = placed_at.await?? - leading;
    let cpu4 = cpu_snapshot(&procs);
    let raw_rate = pods as f64 / raw.as_secs_f64();
    let alloc_rate = pods as f64 / placed.as_secs_f64();
    let loop_rate = pods as f64 / drained.as_secs_f64();
    let ceiling = pods as f64 / (raw_allocations + raw_patches).as_secs_f64();
    println!("| phase | {pods} Pods | rate | vs raw |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| raw creates (no Policy) | {:.2}s | {raw_rate:.0}/s | 1 |",
        raw.as_secs_f64()
    );
    println!(
        "| raw IPAllocation creates | {:.2}s | {:.0}/s | {:.3} |",
        raw_allocations.as_secs_f64(),
        pods as f64 / raw_allocations.as_secs_f64(),
        (pods as f64 / raw_allocations.as_secs_f64()) / raw_rate
    );
    println!(
        "| raw Pod JSON patches | {:.2}s | {:.0}/s | {:.3} |",
        raw_patches.as_secs_f64(),
        pods as f64 / raw_patches.as_secs_f64(),
        (pods as f64 / raw_patches.as_secs_f64()) / raw_rate
    );
    println!(
        "| both writes, one after the other (the loop's ceiling) | {:.2}s | {ceiling:.0}/s | {:.3} |",
        (raw_allocations + raw_patches).as_secs_f64(),
        ceiling / raw_rate
    );
    println!(
        "| creates with the ipam Policy | {:.2}s | | |",
        created.as_secs_f64()
    );
    println!(
        "| placed end to end (create → gate removed) | {:.2}s | {alloc_rate:.0}/s | {:.3} |",
        placed.as_secs_f64(),
        alloc_rate / raw_rate
    );
    println!(
        "| allocated by the loop (Pods waiting; leading → last gate removed) | {:.2}s | {loop_rate:.0}/s | {:.3} |",
        drained.as_secs_f64(),
        loop_rate / raw_rate
    );
    for (i, (name, _)) in procs.iter().enumerate() {
        println!(
            "CPU seconds of {name}: raw phase {:.2}, end-to-end phase {:.2}, loop phase {:.2}",
            cpu_raw[i] - cpu0[i],
            cpu2[i] - cpu1[i],
            cpu4[i] - cpu3[i]
        );
    }
    println!(
        "placed end to end in {:.1}s (goal <= 30s); allocation rate / raw write rate = {:.3} (loop alone) (goal >= 0.4); the loop reaches {:.0}% of its two writes' raw rate",
        placed.as_secs_f64(),
        loop_rate / raw_rate,
        100.0 * loop_rate / ceiling
    );

    // The loop phase's Pods go while Gatehouse runs (released at once), so that the next phase
    // has as many orphans as the others have Pods.
    ipam_api
        .delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels(&format!("{PHASE}=queued")),
        )
        .await?;
    await_condition("queued Pods released", Duration::from_secs(300), || async {
        Ok((allocations(cluster, pool).await? == pods).then_some(()))
    })
    .await?;
    // 3. Orphans: the Pods go while Gatehouse is down.
    gh.stop().await?;
    delete_all(&ipam_api).await?;
    // Every allocation is past the 5s grace before Gatehouse comes back.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut gh = Gatehouse::start(cluster, home.name(), options()).await?;
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
    let gh = Gatehouse::start(
        cluster,
        home.name(),
        Options::url().default_logging().arg("--gc-grace", "1h"),
    )
    .await?;
    let rss_before = gh.rss_kib().unwrap_or(0);
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(0..many)
        .map(|i| {
            let allocs = allocs.clone();
            async move {
                let body = allocation(
                    pool,
                    i,
                    "nowhere",
                    &format!("ghost-{i}"),
                    &format!("uid-{i}"),
                )?;
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
