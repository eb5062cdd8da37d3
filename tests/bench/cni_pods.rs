//! CNI benchmark on the node (numbers for the notes; not a test):
//! 1. PODS (50) Pods from create to Running, alternating rounds (ROUNDS, 3) of
//!    - host-local alone: the node's bridge configured with host-local as its IPAM, Pods in a
//!      namespace no Policy matches;
//!    - gatehouse-ipam with its effects loop: the bridge configured with gatehouse-ipam, Pods in
//!      a namespace the sample `ipam` Policy matches (gate, allocation, annotation, plugin);
//!
//!    Reported: the median and p90 of each Pod's create-to-Running time, and the ratio of the
//!    medians;
//! 2. the plugin's own ADD, process start to result, over ADD_RUNS (1000) runs: p50 and p99.
//!
//! `tests/bench/cni-pods` runs it against `tests/cluster/up --node` with the image imported.
// A benchmark's helpers may unwrap: a panic is how it stops.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_e2e::{Cluster, TestNamespace, await_condition, cluster};
use serde_json::{Value, json};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const BUSYBOX: &str = "docker.io/library/gatehouse-test-busybox:1";

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": {"cpu": "10m", "memory": "16Mi"}},
            }],
        },
    })
}

/// The node's network configuration with `ipam` as the bridge's IPAM.
fn conflist(original: &Value, ipam: Value) -> String {
    let mut conf = original.clone();
    conf["plugins"][0]["ipam"] = ipam;
    serde_json::to_string_pretty(&conf).unwrap()
}

/// Writes the network configuration and waits for containerd to have read it.
async fn configure(path: &Path, content: &str) -> anyhow::Result<()> {
    std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    // containerd watches its configuration directory and reloads within a moment.
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(())
}

/// Creates `count` Pods in `namespace` at once and returns each one's create-to-Running time.
async fn round(cluster: &Cluster, namespace: &str, count: usize) -> anyhow::Result<Vec<Duration>> {
    let items: Vec<Value> = (0..count).map(|i| pod(&format!("p-{i}"))).collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let started = Instant::now();
    cluster
        .kubectl_ok(
            ["create", "-n", namespace, "-f", "-"],
            Some(&list.to_string()),
        )
        .await?;
    let mut running: BTreeMap<String, Duration> = BTreeMap::new();
    while running.len() < count {
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "only {} of {count} Pods ran within 300 s",
            running.len()
        );
        let out = cluster
            .kubectl_ok(["get", "pods", "-n", namespace, "-o", "json"], None)
            .await?;
        let pods: Value = serde_json::from_str(&out)?;
        for p in pods["items"].as_array().into_iter().flatten() {
            if p["status"]["phase"] == "Running" {
                let name = p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                running.entry(name).or_insert_with(|| started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster
        .kubectl_ok(
            [
                "delete",
                "pods",
                "--all",
                "-n",
                namespace,
                "--wait=true",
                "--timeout=300s",
            ],
            None,
        )
        .await?;
    Ok(running.into_values().collect())
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(at).copied().unwrap_or_default()
}

/// Runs the plugin's ADD for an allocated Pod `runs` times; each run's process start to result.
fn plugin_add_times(plugin: &Path, runs: usize) -> anyhow::Result<Vec<Duration>> {
    let uid = "6a1f4c2e-0000-4000-8000-000000000001";
    let address = json!({
        "pool": "pods-v4", "address": "10.20.0.4/24", "gateway": "10.20.0.1",
        "routes": [{"dst": "0.0.0.0/0"}], "ownerUID": uid,
    });
    let stdin = json!({
        "cniVersion": "1.0.0", "name": "bench", "type": "bridge",
        "ipam": {"type": "gatehouse-ipam", "fallback": {"type": "host-local"}},
        "runtimeConfig": {"io.kubernetes.cri.pod-annotations": {
            "gatehouse.dev/ipam-pool": "pods-v4",
            "gatehouse.dev/ipam-address": address.to_string(),
            "kubernetes.io/config.source": "api",
        }},
    })
    .to_string();
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let mut child = Command::new(plugin)
            .env_clear()
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "c0ffee")
            .env("CNI_NETNS", "/var/run/netns/bench")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/nonexistent")
            .env("CNI_ARGS", format!("K8S_POD_UID={uid}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("stdin")?
            .write_all(stdin.as_bytes())?;
        let out = child.wait_with_output()?;
        times.push(started.elapsed());
        ensure!(out.status.success(), "ADD failed: {out:?}");
    }
    times.sort();
    Ok(times)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let pods = env_usize("PODS", 50);
    let rounds = env_usize("ROUNDS", 3);
    let add_runs = env_usize("ADD_RUNS", 1000);
    let cluster = cluster().await;
    let state = cluster.state_dir().to_path_buf();
    let conf_path = state.join("node/cni/10-gatehouse.conflist");
    let original_text = std::fs::read_to_string(&conf_path)?;
    let original: Value = serde_json::from_str(&original_text)?;
    let fallback = original["plugins"][0]["ipam"]["fallback"].clone();
    ensure!(
        fallback.is_object(),
        "the node is not configured with gatehouse-ipam"
    );
    let host_local_alone = conflist(&original, fallback);

    // Gatehouse as the node test installs it, with the sample pool and Policy.
    let install = state.join("node/install");
    cluster
        .kubectl_ok(
            [
                "apply",
                "-f",
                &repo(cluster, "config/default/namespace.yaml"),
            ],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(["apply", "-k", &install.to_string_lossy()], None)
        .await?;
    cluster
        .kubectl_ok(
            [
                "rollout",
                "status",
                "deployment/gatehouse",
                "-n",
                "gatehouse-system",
                "--timeout=300s",
            ],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(
            ["apply", "-f", &repo(cluster, "config/samples/ipam.yaml")],
            None,
        )
        .await?;
    // pods-v4 where the node's bridge routes it: the upper half of its subnet (host-local has
    // the lower half), 127 addresses.
    let pool = json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": "pods-v4"},
        "spec": {"cidr": "10.244.0.0/24", "exclude": ["10.244.0.0/25"], "gateway": "10.244.0.1", "routes": [{"dst": "0.0.0.0/0"}]},
    });
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&pool.to_string()))
        .await?;
    cluster
        .kubectl_ok(
            [
                "wait",
                "--for=condition=Ready",
                "policy/ipam",
                "--timeout=120s",
            ],
            None,
        )
        .await?;
    let plain = TestNamespace::new(cluster, "bench-host-local").await?;
    let ipam = TestNamespace::new(cluster, "bench-gatehouse").await?;
    cluster
        .kubectl_ok(["label", "namespace", ipam.name(), "ipam=enabled"], None)
        .await?;
    // Gatehouse marks Pods in the namespace once its replicas have seen the label.
    await_condition(
        "a Pod marked in the ipam namespace",
        Duration::from_secs(60),
        || async {
            let out = cluster
                .kubectl_output(
                    [
                        "create",
                        "--dry-run=server",
                        "-n",
                        ipam.name(),
                        "-o",
                        "json",
                        "-f",
                        "-",
                    ],
                    Some(&pod("probe").to_string()),
                )
                .await?;
            let created: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            Ok(
                (created["metadata"]["labels"]["gatehouse.dev/ipam-pool"] == "pods-v4")
                    .then_some(()),
            )
        },
    )
    .await?;

    let (mut alone, mut gatehouse) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        configure(&conf_path, &host_local_alone).await?;
        let times = round(cluster, plain.name(), pods).await?;
        eprintln!("round {r} host-local alone: median {:?}", median(&times));
        alone.extend(times);
        configure(&conf_path, &original_text).await?;
        let times = round(cluster, ipam.name(), pods).await?;
        eprintln!("round {r} gatehouse-ipam: median {:?}", median(&times));
        gatehouse.extend(times);
    }
    configure(&conf_path, &original_text).await?;
    alone.sort();
    gatehouse.sort();

    let plugin = plugin_binary(cluster);
    let add = plugin_add_times(&plugin, add_runs)?;

    println!("\n## cni-pods: {pods} Pods × {rounds} rounds, create → Running");
    println!("| IPAM | median | p90 |");
    println!("| --- | --- | --- |");
    println!(
        "| host-local alone | {:.2} s | {:.2} s |",
        quantile(&alone, 0.5).as_secs_f64(),
        quantile(&alone, 0.9).as_secs_f64()
    );
    println!(
        "| gatehouse-ipam + effects loop | {:.2} s | {:.2} s |",
        quantile(&gatehouse, 0.5).as_secs_f64(),
        quantile(&gatehouse, 0.9).as_secs_f64()
    );
    println!(
        "ratio of the medians: {:.2}x (goal ≤ 1.15x)",
        quantile(&gatehouse, 0.5).as_secs_f64() / quantile(&alone, 0.5).as_secs_f64()
    );
    println!(
        "\n## the plugin's ADD ({add_runs} runs, process start to result): p50 {:.2} ms, p99 {:.2} ms (goal p99 ≤ 10 ms)",
        quantile(&add, 0.5).as_secs_f64() * 1000.0,
        quantile(&add, 0.99).as_secs_f64() * 1000.0
    );

    plain.cleanup().await?;
    ipam.cleanup().await?;
    cluster
        .kubectl_ok(
            [
                "delete",
                "-f",
                &repo(cluster, "config/samples/ipam.yaml"),
                "--timeout=120s",
            ],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(
            ["delete", "-k", &install.to_string_lossy(), "--timeout=180s"],
            None,
        )
        .await?;
    Ok(())
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    quantile(&sorted, 0.5)
}

fn repo(cluster: &Cluster, relative: &str) -> String {
    cluster
        .repo_root()
        .join(relative)
        .to_string_lossy()
        .into_owned()
}

fn plugin_binary(cluster: &Cluster) -> PathBuf {
    cluster.repo_root().join("target/release/gatehouse-ipam")
}
