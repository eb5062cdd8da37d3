//! Audit benchmark on the real API server (numbers for the notes; not a test): CONFIGMAPS
//! (default 10,000) stored ConfigMaps and POLICIES (16) validating Policies naming them, at
//! `--audit-max-results` MAX_RESULTS (default 100, Gatehouse's). Reported:
//! one audit pass's duration, Gatehouse's largest RSS during it (goal <= 96 MiB), the CPU seconds
//! of the API server, etcd and Gatehouse over the pass, and the p99 of Pod creates admitted
//! through Gatehouse's mutating webhook during the pass against the same loop with no pass.
//!
//! `tests/bench/audit-load` runs it (control plane, release build, environment).

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use futures::StreamExt;
use gatehouse_e2e::cpu::{cpu_snapshot, processes};
use gatehouse_e2e::instance::{Gatehouse, Options, ensure_crds, ensure_report_crds};
use gatehouse_e2e::latency::p99;
use gatehouse_e2e::{TestNamespace, await_condition, cluster};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Concurrent creates of the admission loop.
const WORKERS: usize = 8;

/// Dry-run Pod creates in `ns`, `rate` per second over `WORKERS` workers, until `done` says so:
/// each latency. A fixed rate below what the machine can do, so that the latency measures
/// contention, not the queue of a saturated API server.
async fn create_until(
    api: &Api<Pod>,
    prefix: &str,
    rate: usize,
    done: impl Fn() -> bool + Clone,
) -> anyhow::Result<Vec<Duration>> {
    let period = Duration::from_secs_f64(WORKERS as f64 / rate.max(1) as f64);
    let workers = (0..WORKERS).map(|w| {
        let (api, done) = (api.clone(), done.clone());
        async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !done() {
                ticks.tick().await;
                let pod: Pod = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": format!("{prefix}-{w}-{i}")},
                    "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]},
                }))?;
                let params = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                let started = Instant::now();
                api.create(&params, &pod).await.context("a Pod create")?;
                latencies.push(started.elapsed());
                i += 1;
            }
            anyhow::Ok(latencies)
        }
    });
    Ok(futures::future::try_join_all(workers)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config_maps = env_usize("CONFIGMAPS", 10_000);
    let policies = env_usize("POLICIES", 16);
    let rate = env_usize("RATE", 100);
    // Gatehouse's default unless MAX_RESULTS says otherwise.
    let max_results = env_usize("MAX_RESULTS", 100);
    let cluster = cluster().await;
    ensure_crds(cluster).await?;
    ensure_report_crds(cluster).await?;
    let home = TestNamespace::new(cluster, "bench-home").await?;
    let stored = TestNamespace::new(cluster, "bench-audit").await?;
    let admitted = TestNamespace::new(cluster, "bench-admit").await?;
    let client = cluster.client().await?;

    // The stored objects, before Gatehouse runs.
    let started = Instant::now();
    let cm_api: Api<ConfigMap> = Api::namespaced(client.clone(), stored.name());
    let created: Vec<anyhow::Result<()>> = futures::stream::iter(0..config_maps)
        .map(|i| {
            let api = cm_api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("cm-{i:05}"), "labels": {"tier": if i % 2 == 0 { "web" } else { "db" }}},
                    "data": {"index": i.to_string(), "owner": if i % 10 == 0 { "" } else { "team-a" }},
                }))?;
                api.create(&PostParams::default(), &cm).await?;
                Ok(())
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    created.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    eprintln!("{config_maps} ConfigMaps stored in {:?}", started.elapsed());

    let gh = Gatehouse::start(
        cluster,
        home.name(),
        Options::url()
            .default_logging()
            .arg("--audit-interval", "1h")
            .arg("--audit-max-results", &max_results.to_string()),
    )
    .await?;
    // What admission runs during the pass: a mutating Policy on Pods, on the webhook.
    let label = json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": "bench-audit-label"},
        "spec": {
            "enforcement": "Webhook",
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": admitted.name()}},
            },
            "mutate": [{"merge": {"metadata": {"labels": {"team": "platform"}}}}],
        },
    });
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&label.to_string()))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), admitted.name());
    await_condition(
        "the mutating webhook live",
        Duration::from_secs(60),
        || async {
            let p = pods
                .create(
                    &PostParams {
                        dry_run: true,
                        ..PostParams::default()
                    },
                    &serde_json::from_value(json!({
                        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]},
                    }))?,
                )
                .await?;
            Ok(p.metadata
                .labels
                .unwrap_or_default()
                .contains_key("team")
                .then_some(()))
        },
    )
    .await?;

    // Without a pass: the same loop for 20 s; the CPU it costs, per second.
    let procs = processes(cluster.state_dir(), gh.pid());
    let rss_idle = gh.rss_kib().unwrap_or(0);
    let quiet_started = Instant::now();
    let cpu_quiet_before = cpu_snapshot(&procs);
    let quiet_until = quiet_started + Duration::from_secs(20);
    let mut without =
        create_until(&pods, "quiet", rate, move || Instant::now() >= quiet_until).await?;
    let cpu_quiet_after = cpu_snapshot(&procs);
    let quiet_seconds = quiet_started.elapsed().as_secs_f64();

    let passes = || async {
        gh.metric_sum("gatehouse_audit_duration_seconds_count", "")
            .await
    };
    let seconds = || async {
        gh.metric_sum("gatehouse_audit_duration_seconds_sum", "")
            .await
    };
    let (passes_before, seconds_before) = (passes().await?, seconds().await?);
    let cpu_before = cpu_snapshot(&procs);
    // The Policies: each warns on a tenth of the ConfigMaps (no owner), some by tier too.
    let mut docs = String::new();
    for i in 0..policies {
        let expression = if i % 2 == 0 {
            format!(
                "has(object.data) && object.data.owner != '' || object.metadata.name == 'none-{i}'"
            )
        } else {
            "!has(object.metadata.labels) || object.metadata.labels.tier != 'web' || object.data.owner != ''".to_string()
        };
        let policy = json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": format!("bench-audit-{i:02}")},
            "spec": {
                "enforcement": "Webhook",
                "match": {
                    "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": stored.name()}},
                },
                "validate": [{"expression": expression, "message": format!("rule {i}: a ConfigMap names its owner"), "action": "Warn"}],
            },
        });
        docs.push_str(&format!("---\n{policy}\n"));
    }
    let applied = Instant::now();
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs))
        .await?;
    // During the pass (it starts a few seconds after the Policies): creates, and Gatehouse's
    // RSS sampled.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished = done.clone();
    let watch_pass = async {
        let mut rss_max = 0;
        loop {
            rss_max = rss_max.max(gh.rss_kib().unwrap_or(0));
            if passes().await? > passes_before {
                finished.store(true, std::sync::atomic::Ordering::Release);
                return anyhow::Ok(rss_max);
            }
            ensure!(
                applied.elapsed() < Duration::from_secs(900),
                "no audit pass within 15 minutes"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let flag = done.clone();
    let (rss_max, during) = tokio::join!(
        watch_pass,
        create_until(&pods, "busy", rate, move || flag
            .load(std::sync::atomic::Ordering::Acquire))
    );
    let (rss_max, mut during) = (rss_max?, during?);
    let cpu_after = cpu_snapshot(&procs);
    let pass_seconds = seconds().await? - seconds_before;
    let window = applied.elapsed();
    let (quiet, busy) = (p99(&mut without), p99(&mut during));
    println!(
        "audit benchmark: {config_maps} ConfigMaps x {policies} validating Policies, \
         --audit-max-results {max_results}, admission loop {rate}/s"
    );
    println!(
        "  one pass: {pass_seconds:.2} s (window from applying the Policies to the pass's end: {window:.2?})"
    );
    println!(
        "  Gatehouse RSS: {rss_idle} KiB before, largest during the window {rss_max} KiB \
         ({:.1} MiB; goal <= 96 MiB)",
        rss_max as f64 / 1024.0
    );
    let window_seconds = window.as_secs_f64();
    for (i, (name, _)) in procs.iter().enumerate() {
        let quiet_rate = (cpu_quiet_after[i] - cpu_quiet_before[i]) / quiet_seconds;
        let spent = cpu_after[i] - cpu_before[i];
        println!(
            "  {name} CPU over the window: {spent:.2} s; the same loop without a pass costs \
             {quiet_rate:.2} s/s, so the pass {:.2} s",
            spent - quiet_rate * window_seconds
        );
    }
    println!(
        "  admission p99 (dry-run Pod creates through the mutating webhook, {rate}/s): \
         {quiet:?} without a pass ({} creates), {busy:?} during it ({} creates): {:.2}x",
        without.len(),
        during.len(),
        busy.as_secs_f64() / quiet.as_secs_f64().max(1e-9)
    );
    let report: serde_json::Value = serde_json::from_str(
        &cluster
            .kubectl_ok(
                [
                    "get",
                    "policyreport",
                    "gatehouse-bench-audit-00",
                    "-n",
                    stored.name(),
                    "-o",
                    "json",
                ],
                None,
            )
            .await?,
    )?;
    println!("  report of bench-audit-00: summary {}", report["summary"]);
    let mut names = vec!["bench-audit-label".to_string()];
    names.extend((0..policies).map(|i| format!("bench-audit-{i:02}")));
    cluster
        .kubectl_ok(
            ["delete", "policy", "--wait=false"]
                .into_iter()
                .chain(names.iter().map(String::as_str)),
            None,
        )
        .await?;
    Ok(())
}
