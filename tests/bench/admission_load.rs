//! Load benchmark in the shape of Kyverno's published load tests, on the real API server: create
//! Pods at a fixed concurrency with no Policies, then with 16 matching Policies (8 mutating,
//! 8 validating), and compare create latency. A benchmark, not a test: it prints numbers.
//!
//! `tests/bench/admission-load` runs it (control plane, release build, environment).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use gatehouse_e2e::cpu::{cpu_snapshot, processes};
use gatehouse_e2e::gatehouse::{Gatehouse, Options};
use gatehouse_e2e::pods::delete_all;
use gatehouse_e2e::{TestNamespace, TestWebhook, allow, await_condition, cluster};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn pod(name: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{
            "name": "app",
            "image": "example.com/app:1.0",
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}
        }]}
    }))?)
}

struct Stats {
    avg: Duration,
    p95: Duration,
    p99: Duration,
    wall: Duration,
}

fn stats(mut latencies: Vec<Duration>, wall: Duration) -> Stats {
    latencies.sort();
    let pick = |q: f64| {
        let idx = ((latencies.len() as f64) * q).ceil() as usize;
        latencies[idx.clamp(1, latencies.len()) - 1]
    };
    let total: Duration = latencies.iter().sum();
    Stats {
        avg: total / latencies.len() as u32,
        p95: pick(0.95),
        p99: pick(0.99),
        wall,
    }
}

async fn create_pods(
    api: &Api<Pod>,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Stats> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i}");
            async move {
                let pod = pod(&name)?;
                let t = Instant::now();
                api.create(&PostParams::default(), &pod)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                Ok(t.elapsed())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let wall = started.elapsed();
    let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok(stats(latencies, wall))
}

/// Cumulative webhook admission-duration buckets of the API server for Gatehouse's entries,
/// summed over entries: upper bound (seconds) → count.
async fn webhook_buckets(client: &kube::Client) -> anyhow::Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if !line.starts_with("apiserver_admission_webhook_admission_duration_seconds_bucket{")
            || !line.contains(".gatehouse.dev\"")
        {
            continue;
        }
        let Some(le) = line.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
            continue;
        };
        *out.entry(le.to_string()).or_insert(0.0) += value;
    }
    Ok(out)
}

/// p99 upper bound from the difference of two cumulative bucket snapshots.
fn bucket_p99(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Option<String> {
    let mut rows: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, v)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            (bound, v - before.get(le).copied().unwrap_or(0.0))
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = rows.last()?.1;
    if total <= 0.0 {
        return None;
    }
    rows.iter()
        .find(|(_, c)| *c >= total * 0.99)
        .map(|(b, _)| format!("<= {b}s (of {total} calls)"))
}

fn policy(name: &str, ns: &str, body: Value) -> Value {
    let mut spec = json!({
        "match": {
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}
        }
    });
    if let (Some(spec), Some(body)) = (spec.as_object_mut(), body.as_object()) {
        spec.extend(body.clone());
    }
    json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec})
}

/// Name of the webhook configurations of the floor phase.
const FLOOR: &str = "bench-floor";

/// 8 mutating and 8 validating entries, shaped like Gatehouse's (same rules, namespace,
/// failurePolicy and sideEffects), that all call `hook` by URL.
fn floor_configurations(hook: &TestWebhook, ns: &str) -> String {
    let entries = |kind: &str| -> Vec<Value> {
        (0..8)
            .map(|i| {
                json!({
                    "name": format!("{kind}-{i}.bench.gatehouse.test"),
                    "clientConfig": {"url": hook.url(&format!("/{kind}/{i}")), "caBundle": hook.ca_bundle()},
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 10
                })
            })
            .collect()
    };
    let config = |kind: &str, webhooks: Vec<Value>| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": FLOOR},
            "webhooks": webhooks,
        })
    };
    format!(
        "---\n{}\n---\n{}\n",
        config("MutatingWebhookConfiguration", entries("mutate")),
        config("ValidatingWebhookConfiguration", entries("validate"))
    )
}

/// How many reviews `hook` receives for one server-dry-run Pod create.
async fn reviews_per_create(api: &Api<Pod>, hook: &TestWebhook) -> anyhow::Result<usize> {
    let before = hook.reviews().len();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&dry_run, &pod("probe-floor")?).await?;
    Ok(hook.reviews().len() - before)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let count = env_usize("PODS", 500);
    let concurrency = env_usize("CONCURRENCY", 50);
    let cluster = cluster().await;
    let client = cluster.client().await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    let ns = TestNamespace::new(cluster, "bench-load").await?;
    let gh = Gatehouse::start(cluster, home.name(), Options::service()).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns.name());

    // Warm the API server's paths once so neither phase pays first-use costs.
    create_pods(&api, "warm", 20, concurrency).await?;
    delete_all(&api).await?;

    let procs = processes(cluster.state_dir(), gh.pid());
    let cpu0 = cpu_snapshot(&procs);
    let baseline = create_pods(&api, "base", count, concurrency).await?;
    let cpu1 = cpu_snapshot(&procs);
    delete_all(&api).await?;

    // The floor: the same number of entries answered by a server that does no work (a fixed
    // allow, no patch). What they add is the API server's own cost of calling 16 webhooks per
    // create on this machine, which no webhook implementation can get under.
    let hook = TestWebhook::start(&["127.0.0.1"], allow())?;
    cluster
        .kubectl_ok(
            ["apply", "-f", "-"],
            Some(&floor_configurations(&hook, ns.name())),
        )
        .await?;
    await_condition(
        "16 floor entries in effect",
        Duration::from_secs(60),
        || async { Ok((reviews_per_create(&api, &hook).await? == 16).then_some(())) },
    )
    .await?;
    create_pods(&api, "warm-floor", 20, concurrency).await?;
    delete_all(&api).await?;
    let cpu_floor0 = cpu_snapshot(&procs);
    let floor = create_pods(&api, "floor", count, concurrency).await?;
    let cpu_floor1 = cpu_snapshot(&procs);
    delete_all(&api).await?;
    cluster
        .kubectl_ok(
            [
                "delete",
                "mutatingwebhookconfiguration,validatingwebhookconfiguration",
                FLOOR,
            ],
            None,
        )
        .await?;
    await_condition("floor entries gone", Duration::from_secs(60), || async {
        Ok((reviews_per_create(&api, &hook).await? == 0).then_some(()))
    })
    .await?;
    hook.shutdown();

    let mut names = Vec::new();
    let mut docs = String::new();
    for i in 0..8 {
        let m = format!("bench-mutate-{i}");
        let v = format!("bench-validate-{i}");
        docs.push_str(&format!("---\n{}\n", serde_json::to_string(&policy(&m, ns.name(), json!({
            "mutate": [
                {"merge": {"metadata": {"labels": {format!("bench-{i}"): "yes"}}}},
                {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
            ]
        })))?));
        docs.push_str(&format!("---\n{}\n", serde_json::to_string(&policy(&v, ns.name(), json!({
            "validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}]
        })))?));
        names.push(m);
        names.push(v);
    }
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs))
        .await?;
    // In effect: a server dry run shows all eight labels.
    let probe = pod("probe")?;
    await_condition(
        "16 Policies in effect",
        Duration::from_secs(120),
        || async {
            let p = api
                .create(
                    &PostParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &probe,
                )
                .await?;
            let labels = p.metadata.labels.unwrap_or_default();
            Ok(((0..8).all(|i| labels.contains_key(&format!("bench-{i}")))).then_some(()))
        },
    )
    .await?;
    create_pods(&api, "warm2", 20, concurrency).await?;
    delete_all(&api).await?;

    let before = webhook_buckets(&client).await?;
    let cpu2 = cpu_snapshot(&procs);
    let with = create_pods(&api, "pol", count, concurrency).await?;
    let cpu3 = cpu_snapshot(&procs);
    let after = webhook_buckets(&client).await?;
    let rss = gh.rss_kib();
    delete_all(&api).await?;

    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!("{count} Pod creates at concurrency {concurrency}");
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>10}",
        "", "avg", "p95", "p99", "wall"
    );
    for (label, s) in [
        ("no policies", &baseline),
        ("16 fixed-allow", &floor),
        ("16 policies", &with),
    ] {
        println!(
            "{:<16} {:>10} {:>10} {:>10} {:>10}",
            label,
            ms(s.avg),
            ms(s.p95),
            ms(s.p99),
            ms(s.wall)
        );
    }
    println!(
        "ratio (16 / none): avg {:.2}x, p95 {:.2}x, p99 {:.2}x (goal p99 <= 1.15x)",
        with.avg.as_secs_f64() / baseline.avg.as_secs_f64(),
        with.p95.as_secs_f64() / baseline.p95.as_secs_f64(),
        with.p99.as_secs_f64() / baseline.p99.as_secs_f64()
    );
    println!(
        "floor (16 fixed-allow / none): avg {:.2}x, p95 {:.2}x, p99 {:.2}x; Gatehouse over the floor: p99 {:.2}x",
        floor.avg.as_secs_f64() / baseline.avg.as_secs_f64(),
        floor.p95.as_secs_f64() / baseline.p95.as_secs_f64(),
        floor.p99.as_secs_f64() / baseline.p99.as_secs_f64(),
        with.p99.as_secs_f64() / floor.p99.as_secs_f64()
    );
    println!(
        "API server apiserver_admission_webhook_admission_duration_seconds p99 for Gatehouse entries: {}",
        bucket_p99(&before, &after).unwrap_or_else(|| "no samples".into())
    );
    println!("CPU seconds used during each phase (2-core machine, everything on it):");
    for (i, (name, _)) in procs.iter().enumerate() {
        println!(
            "  {:<16} no policies {:>6.2} s   16 fixed-allow {:>6.2} s   16 policies {:>6.2} s",
            name,
            cpu1[i] - cpu0[i],
            cpu_floor1[i] - cpu_floor0[i],
            cpu3[i] - cpu2[i]
        );
    }
    println!(
        "Gatehouse RSS after the run: {} KiB",
        rss.map(|r| r.to_string()).unwrap_or("?".into())
    );

    let mut delete = vec!["delete", "policies", "--wait=false"];
    delete.extend(names.iter().map(String::as_str));
    cluster.kubectl_ok(delete, None).await?;
    gh.shutdown().await?;
    ns.cleanup().await?;
    home.cleanup().await?;
    if with.p99.is_zero() {
        bail!("no samples");
    }
    Ok(())
}
