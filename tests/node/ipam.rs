//! The address Gatehouse allocates is the address the Pod gets: the node's bridge calls
//! `gatehouse-ipam` (installed by config/cni's DaemonSet), which answers a Pod with the address
//! allocated to its UID and hands every other Pod to host-local.
use std::collections::BTreeSet;

use anyhow::{Context, ensure};
use gatehouse_e2e::{Cluster, TestNamespace, await_condition};
use serde_json::{Value, json};

use super::{BUSYBOX, NODE, WAIT, await_running, get_json, stderr};

/// Whether `ip` is in host-local's range of the node's subnet (the fallback: 10.244.0.2-127).
fn from_fallback(ip: &str) -> bool {
    last_octet(ip).is_some_and(|o| (2..128).contains(&o))
}

/// Whether `ip` is in the node's pods-v4 (`ippool.yaml` of `up --node`: 10.244.0.128/27).
fn from_pool(ip: &str) -> bool {
    last_octet(ip).is_some_and(|o| (128..160).contains(&o))
}

fn last_octet(ip: &str) -> Option<u8> {
    ip.strip_prefix("10.244.0.")?.parse().ok()
}

/// A Pod's address as its status reports it.
fn pod_ip(pod: &Value) -> &str {
    pod["status"]["podIP"].as_str().unwrap_or_default()
}

/// The address of the IPAllocation whose owner is the Pod of `uid`.
async fn allocated_to(cluster: &Cluster, uid: &str) -> anyhow::Result<Option<String>> {
    let list = get_json(
        cluster,
        &[
            "ipallocations",
            "-l",
            &format!("gatehouse.dev/owner-uid={uid}"),
        ],
    )
    .await?
    .context("listing IPAllocations")?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    ensure!(
        items.len() <= 1,
        "{} allocations for UID {uid}",
        items.len()
    );
    Ok(items.first().and_then(|a| {
        (a["spec"]["owner"]["uid"] == uid)
            .then(|| a["spec"]["address"].as_str().map(str::to_string))
            .flatten()
    }))
}

fn uid_of(pod: &Value) -> anyhow::Result<&str> {
    pod["metadata"]["uid"]
        .as_str()
        .context("a Pod without a UID")
}

/// A small busybox Pod: the node has 2 CPUs, and the pool's 32 addresses are all handed out.
fn pod(name: &str, namespace: &str) -> String {
    shell_pod(name, namespace, "exec sleep 3600", "Always")
}

/// A busybox Pod running `script` under `sh -c`.
fn shell_pod(name: &str, namespace: &str, script: &str, restart: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "restartPolicy": restart,
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"cpu": "10m", "memory": "16Mi"}},
            }],
        },
    })
    .to_string()
}

/// Creates `count` Pods named `<prefix>-<i>` at once.
async fn create_pods(
    cluster: &Cluster,
    namespace: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i}")).collect();
    let items: Vec<Value> = names
        .iter()
        .map(|n| serde_json::from_str(&pod(n, namespace)))
        .collect::<Result<_, _>>()?;
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    cluster
        .kubectl_ok(["create", "-f", "-"], Some(&list.to_string()))
        .await?;
    Ok(names)
}

/// Every test of the issue on the node, in one flow that shares the installation: run by the
/// node test once Gatehouse and the samples are in.
pub async fn addresses_are_the_pods_own(
    cluster: &Cluster,
    ipam: &TestNamespace,
    plain: &TestNamespace,
) -> anyhow::Result<()> {
    // 1. Twenty Pods: each runs with the address allocated to its UID, all distinct.
    let names = create_pods(cluster, ipam.name(), "many", 20).await?;
    let mut seen = BTreeSet::new();
    for name in &names {
        let running = await_running(cluster, ipam.name(), name).await?;
        let ip = pod_ip(&running);
        let allocated = allocated_to(cluster, uid_of(&running)?).await?;
        ensure!(
            allocated.as_deref() == Some(ip),
            "{name} runs with {ip:?}, but its IPAllocation says {allocated:?}"
        );
        ensure!(from_pool(ip), "{name} got {ip}, not an address of pods-v4");
        ensure!(seen.insert(ip.to_string()), "{ip} given twice");
    }
    eprintln!("20 Pods run with their allocated addresses: {seen:?}");
    // A Pod outside: host-local's address; Gatehouse's own replicas too.
    let outside = await_running(cluster, plain.name(), "web").await?;
    ensure!(
        from_fallback(pod_ip(&outside)),
        "a Pod Gatehouse does not allocate to got {}",
        pod_ip(&outside)
    );
    for replica in super::gatehouse_pods(cluster).await? {
        ensure!(
            from_fallback(pod_ip(&replica)),
            "a Gatehouse replica runs with {}",
            pod_ip(&replica)
        );
    }

    // 2. Two IPAM Pods reach each other at their allocated addresses.
    let server = "http";
    cluster
        .kubectl_ok(
            ["create", "-f", "-"],
            Some(&shell_pod(
                server,
                ipam.name(),
                "echo served-by-http > /tmp/index.html && exec busybox httpd -f -p 8080 -h /tmp",
                "Always",
            )),
        )
        .await?;
    let served = await_running(cluster, ipam.name(), server).await?;
    let server_ip = pod_ip(&served).to_string();
    ensure!(
        allocated_to(cluster, uid_of(&served)?).await?.as_deref() == Some(server_ip.as_str()),
        "the server runs with {server_ip}, not its allocation"
    );
    let client = "fetch";
    // busybox-static's wget crashes without the image's missing NSS files: a plain request
    // through nc instead, and applets the image does not link by name through `busybox`.
    let script = format!(
        "i=0; while [ $i -lt 30 ]; do printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {server_ip} 8080 > /tmp/got; busybox grep -q served-by-{server} /tmp/got && exit 0; i=$((i+1)); sleep 1; done; exit 1"
    );
    cluster
        .kubectl_ok(
            ["create", "-f", "-"],
            Some(&shell_pod(client, ipam.name(), &script, "Never")),
        )
        .await?;
    let fetched = await_condition("the client Pod finished", WAIT, || async {
        let p = get_json(cluster, &["pod", client, "-n", ipam.name()]).await?;
        Ok(p.filter(|p| p["status"]["phase"] == "Succeeded" || p["status"]["phase"] == "Failed"))
    })
    .await?;
    ensure!(
        fetched["status"]["phase"] == "Succeeded",
        "{client} ({}) could not fetch from {server} at {server_ip}",
        pod_ip(&fetched)
    );
    ensure!(
        from_pool(pod_ip(&fetched)),
        "the client got {}",
        pod_ip(&fetched)
    );

    // 3. The sandbox killed: the kubelet makes a new one, with the same address.
    let victim = await_running(cluster, ipam.name(), "many-0").await?;
    let before = pod_ip(&victim).to_string();
    let uid = uid_of(&victim)?.to_string();
    let sandbox = kill_sandbox(cluster, &uid).await?;
    let recreated = await_condition("many-0 in a new sandbox", WAIT, || async {
        let p = get_json(cluster, &["pod", "many-0", "-n", ipam.name()]).await?;
        let restarted = |p: &Value| {
            p["status"]["containerStatuses"][0]["restartCount"]
                .as_u64()
                .is_some_and(|c| c > 0)
        };
        Ok(p.filter(|p| restarted(p) && p["status"]["phase"] == "Running"))
    })
    .await?;
    let now = sandbox_of(cluster, &uid).await?;
    ensure!(
        now.is_some() && now.as_deref() != Some(sandbox.as_str()),
        "no new sandbox: {now:?}"
    );
    ensure!(
        pod_ip(&recreated) == before,
        "the new sandbox has {}, the Pod had {before}",
        pod_ip(&recreated)
    );

    // 4. Another Pod's address annotations copied in: never that address.
    let copied = get_json(cluster, &["pod", "many-1", "-n", ipam.name()])
        .await?
        .context("many-1")?;
    let stolen = pod_ip(&copied).to_string();
    let mut annotations = serde_json::Map::new();
    for key in ["gatehouse.dev/ip", "gatehouse.dev/ipam-address"] {
        annotations.insert(key.into(), copied["metadata"]["annotations"][key].clone());
    }
    for (namespace, expected) in [
        (ipam.name(), from_pool as fn(&str) -> bool),
        (plain.name(), from_fallback),
    ] {
        let mut thief: Value = serde_json::from_str(&pod("copy", namespace))?;
        thief["metadata"]["annotations"] = Value::Object(annotations.clone());
        cluster
            .kubectl_ok(["create", "-f", "-"], Some(&thief.to_string()))
            .await?;
        let running = await_running(cluster, namespace, "copy").await?;
        let ip = pod_ip(&running);
        ensure!(
            ip != stolen && expected(ip),
            "a Pod with many-1's annotations copied in ({namespace}) runs with {ip} (many-1: {stolen})"
        );
    }
    Ok(())
}

/// The sandbox of the Pod of `uid` in the node's containerd, if it has one running.
async fn sandbox_of(cluster: &Cluster, uid: &str) -> anyhow::Result<Option<String>> {
    let out = ctr(
        cluster,
        &[
            "containers",
            "ls",
            "-q",
            &format!(
                "labels.\"io.kubernetes.pod.uid\"=={uid},labels.\"io.cri-containerd.kind\"==sandbox"
            ),
        ],
    )
    .await?;
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let tasks = ctr(cluster, &["tasks", "ls"]).await?;
    let running = String::from_utf8_lossy(&tasks.stdout).to_string();
    Ok(ids.into_iter().find(|id| {
        running
            .lines()
            .any(|l| l.starts_with(id.as_str()) && l.contains("RUNNING"))
    }))
}

/// Kills the running sandbox of the Pod of `uid`, as a crash would; returns its ID.
async fn kill_sandbox(cluster: &Cluster, uid: &str) -> anyhow::Result<String> {
    let sandbox = sandbox_of(cluster, uid)
        .await?
        .context("the Pod has no running sandbox")?;
    let out = ctr(cluster, &["tasks", "kill", "-s", "SIGKILL", &sandbox]).await?;
    ensure!(
        out.status.success(),
        "killing sandbox {sandbox}: {}",
        stderr(&out)
    );
    Ok(sandbox)
}

async fn ctr(cluster: &Cluster, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let socket = cluster.state_dir().join("node/containerd.sock");
    let out = tokio::process::Command::new("ctr")
        .arg("--address")
        .arg(&socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .await
        .context("running ctr")?;
    Ok(out)
}

/// Test 5: the pool (32 addresses on the node) filled: the next Pod stays gated, with its Event,
/// until a Pod is deleted; then it gets exactly the freed address and runs with it.
pub async fn a_full_pool_is_reused(cluster: &Cluster, ipam: &TestNamespace) -> anyhow::Result<()> {
    let pool = get_json(cluster, &["ippool", "pods-v4"])
        .await?
        .context("pods-v4")?;
    let capacity = pool["status"]["capacity"]
        .as_u64()
        .context("pods-v4 has no capacity")?;
    let held = get_json(
        cluster,
        &["ipallocations", "-l", "gatehouse.dev/pool=pods-v4"],
    )
    .await?
    .context("listing IPAllocations")?;
    let held = held["items"].as_array().map_or(0, Vec::len) as u64;
    let free = usize::try_from(capacity.saturating_sub(held))?;
    let names = create_pods(cluster, ipam.name(), "fill", free).await?;
    let mut addresses = Vec::new();
    for name in &names {
        let running = await_running(cluster, ipam.name(), name).await?;
        ensure!(
            from_pool(pod_ip(&running)),
            "{name} got {}",
            pod_ip(&running)
        );
        addresses.push(pod_ip(&running).to_string());
    }
    cluster
        .kubectl_ok(["create", "-f", "-"], Some(&pod("waiting", ipam.name())))
        .await?;
    await_condition("the next Pod told the pool is exhausted", WAIT, || async {
        let events = get_json(
            cluster,
            &[
                "events",
                "-n",
                ipam.name(),
                "--field-selector",
                "involvedObject.name=waiting",
            ],
        )
        .await?;
        let told = events.is_some_and(|e| {
            e["items"]
                .as_array()
                .is_some_and(|items| items.iter().any(|i| i["reason"] == "PoolExhausted"))
        });
        Ok(told.then_some(()))
    })
    .await?;
    let waiting = get_json(cluster, &["pod", "waiting", "-n", ipam.name()])
        .await?
        .context("the waiting Pod")?;
    ensure!(
        waiting["spec"]["schedulingGates"]
            .as_array()
            .is_some_and(|g| !g.is_empty()),
        "the Pod over the pool's capacity is not gated: {}",
        waiting["spec"]
    );
    let (victim, freed) = names
        .first()
        .zip(addresses.first())
        .context("the pool was full already")?;
    cluster
        .kubectl_ok(
            ["delete", "pod", victim, "-n", ipam.name(), "--wait=true"],
            None,
        )
        .await?;
    let running = await_running(cluster, ipam.name(), "waiting").await?;
    ensure!(
        pod_ip(&running) == freed,
        "the waiting Pod runs with {}, the freed address was {freed}",
        pod_ip(&running)
    );
    ensure!(
        allocated_to(cluster, uid_of(&running)?).await?.as_deref() == Some(freed.as_str()),
        "the reused address is not allocated to the new Pod"
    );
    eprintln!("pods-v4 full at {capacity}: the next Pod waited, then got {freed} once freed");
    Ok(())
}

/// The DaemonSet of config/cni is Ready on the node: the plugin is installed there.
pub async fn the_plugin_is_installed(cluster: &Cluster) -> anyhow::Result<()> {
    await_condition("gatehouse-cni Ready on the node", WAIT, || async {
        let pods = get_json(
            cluster,
            &[
                "pods",
                "-n",
                "kube-system",
                "-l",
                "app.kubernetes.io/name=gatehouse-cni",
            ],
        )
        .await?;
        let ready = pods.is_some_and(|p| {
            p["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|i| i["spec"]["nodeName"] == NODE && super::is_ready(i))
            })
        });
        Ok(ready.then_some(()))
    })
    .await?;
    let installed = cluster.state_dir().join("node/cni-bin/gatehouse-ipam");
    ensure!(installed.is_file(), "{} is missing", installed.display());
    Ok(())
}
