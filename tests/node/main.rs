//! Gatehouse installed the way users install it, on the control plane with a node
//! (`tests/cluster/up --node`, image from `tests/cluster/image`): `kubectl apply -k` of
//! config/default with the config/cni component (the overlay `up --node` writes, which points the
//! DaemonSet at the node's CNI binary directory),
//! two replicas running as the ServiceAccount of `config/rbac` on the node, the API server calling
//! them through the `gatehouse-webhook` Service, the samples admitting and rejecting Pods that then
//! run, a replica deleted under load without a failed review, and `kubectl delete -k` leaving no
//! webhook behind; and the same with Helm (`helm.rs`). The tests install into the same namespace,
//! so `tests/run` runs them one at a time (`--test-threads=1`; the Helm test first, by name).
//!
//! Not part of plain `cargo test` (it needs the node); `tests/run` runs it as
//! `cargo test -p gatehouse-e2e --test node -- --test-threads=1` against the node cluster.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::documented::documented;
use gatehouse_e2e::{Cluster, TestNamespace, await_condition, run_test};
use serde_json::{Value, json};

mod companions;
mod helm;
mod ipam;

const NAMESPACE: &str = "gatehouse-system";
const SERVICE: &str = "gatehouse-webhook";
/// The node `tests/cluster/up --node` registers.
const NODE: &str = "gatehouse-node";
/// A busybox image the node harness imports (no registry is reachable).
const BUSYBOX: &str = "docker.io/library/gatehouse-test-busybox:1";
const SAMPLE_POLICIES: [&str; 4] = ["drop-bpf", "inject-proxy", "require-limits", "ipam"];
const WAIT: Duration = Duration::from_secs(120);

/// The kustomize install as docs/operations/install.md shows it (the README shows the same
/// lines).
const INSTALL_DOC: &str = "docs/operations/install.md";

/// A documented kubectl command (without `kubectl`) as this node runs it: `config/default` is
/// the overlay `tests/cluster/up --node` wrote (config/default with config/cni, pointed at this
/// node's CNI directory: the one thing a cluster adds), every other path the repository's.
fn on_this_node(cluster: &Cluster, command: &str) -> anyhow::Result<Vec<String>> {
    let words = documented(INSTALL_DOC, command)?;
    let overlay = cluster
        .state_dir()
        .join("node/install")
        .to_string_lossy()
        .into_owned();
    Ok(words
        .into_iter()
        .skip(1)
        .map(|w| match w.as_str() {
            "config/default" => overlay.clone(),
            path if path.starts_with("config/") => dir(cluster, path),
            _ => w,
        })
        .collect())
}

fn dir(cluster: &Cluster, relative: &str) -> String {
    cluster
        .repo_root()
        .join(relative)
        .to_string_lossy()
        .into_owned()
}

async fn get_json(cluster: &Cluster, args: &[&str]) -> anyhow::Result<Option<Value>> {
    let mut full = vec!["get"];
    full.extend_from_slice(args);
    full.extend_from_slice(&["-o", "json"]);
    let out = cluster.kubectl_output(&full, None).await?;
    if out.status.success() {
        return Ok(Some(serde_json::from_slice(&out.stdout)?));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("NotFound") || err.contains("not found") {
        return Ok(None);
    }
    bail!("kubectl get {}: {}", args.join(" "), err.trim())
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_owned()
}

/// A Pod of the node's busybox image; `gated` ones carry a scheduling gate of the test's own and
/// never reach the node (for load that only exercises admission).
fn pod(name: &str, namespace: &str, gated: bool) -> String {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "resources": {"limits": {"cpu": "100m", "memory": "32Mi"}},
            }],
        },
    });
    if gated {
        pod["spec"]["schedulingGates"] = json!([{"name": "e2e.gatehouse.dev/hold"}]);
    }
    pod.to_string()
}

fn dropped_capabilities(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"]
        .as_array()
        .map(|drop| {
            drop.iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

async fn gatehouse_pods(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    let list = get_json(
        cluster,
        &[
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=gatehouse",
        ],
    )
    .await?
    .context("listing Gatehouse Pods")?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Waits for `pod` in `namespace` to run on the node.
async fn await_running(cluster: &Cluster, namespace: &str, pod: &str) -> anyhow::Result<Value> {
    await_condition(
        &format!("Pod {namespace}/{pod} running on {NODE}"),
        WAIT,
        || async {
            let p = get_json(cluster, &["pod", pod, "-n", namespace]).await?;
            Ok(p.filter(|p| p["status"]["phase"] == "Running" && p["spec"]["nodeName"] == NODE))
        },
    )
    .await
}

/// The caBundle of the configurations verifies the certificate each replica serves, under every
/// name of the Service.
async fn check_serving_certificate(cluster: &Cluster, ca_bundle: &str) -> anyhow::Result<()> {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.decode(ca_bundle)?;
    let ca_file: PathBuf = cluster.state_dir().join("node-e2e-ca.pem");
    std::fs::write(&ca_file, ca)?;
    for p in gatehouse_pods(cluster)
        .await?
        .iter()
        .filter(|p| is_ready(p))
    {
        let ip = p["status"]["podIP"]
            .as_str()
            .context("a Gatehouse Pod without an IP")?;
        for name in [
            format!("{SERVICE}.{NAMESPACE}.svc"),
            format!("{SERVICE}.{NAMESPACE}"),
            SERVICE.to_owned(),
        ] {
            let out = tokio::process::Command::new("openssl")
                .args([
                    "s_client",
                    "-connect",
                    &format!("{ip}:8443"),
                    "-servername",
                    &name,
                ])
                .args(["-verify_hostname", &name, "-verify_return_error", "-CAfile"])
                .arg(&ca_file)
                .stdin(std::process::Stdio::null())
                .output()
                .await
                .context("running openssl s_client")?;
            let text = String::from_utf8_lossy(&out.stdout);
            ensure!(
                out.status.success() && text.contains("Verify return code: 0 (ok)"),
                "the certificate served at {ip}:8443 does not verify for {name} with the caBundle: {}{}",
                text.lines()
                    .filter(|l| l.contains("erify"))
                    .collect::<Vec<_>>()
                    .join("; "),
                stderr(&out)
            );
        }
    }
    Ok(())
}

/// Creates gated Pods in `namespace` at a steady rate for `duration`, counting refused ones.
async fn steady_creates(
    cluster: &'static Cluster,
    namespace: String,
    per_second: u32,
    duration: Duration,
    failures: Arc<AtomicUsize>,
) -> anyhow::Result<Vec<String>> {
    let stop = Arc::new(AtomicBool::new(false));
    let timer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(duration).await;
            stop.store(true, Ordering::SeqCst);
        })
    };
    let names = creates_until(cluster, namespace, per_second, stop, failures).await;
    timer.abort();
    names
}

/// Creates gated Pods in `namespace` at a steady rate until `stop` is set, counting refused ones.
async fn creates_until(
    cluster: &'static Cluster,
    namespace: String,
    per_second: u32,
    stop: Arc<AtomicBool>,
    failures: Arc<AtomicUsize>,
) -> anyhow::Result<Vec<String>> {
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / per_second);
    let mut creates = tokio::task::JoinSet::new();
    let mut i = 0;
    while !stop.load(Ordering::SeqCst) {
        ticker.tick().await;
        let (ns, failures, name) = (namespace.clone(), failures.clone(), format!("load-{i}"));
        i += 1;
        creates.spawn(async move {
            let out = cluster
                .kubectl_output(["create", "-f", "-"], Some(&pod(&name, &ns, true)))
                .await?;
            if !out.status.success() {
                failures.fetch_add(1, Ordering::SeqCst);
                eprintln!("create {name} failed: {}", stderr(&out));
            }
            anyhow::Ok(name)
        });
    }
    let mut names = Vec::new();
    while let Some(done) = creates.join_next().await {
        names.push(done??);
    }
    Ok(names)
}

#[tokio::test]
async fn the_installation_admits_pods_from_the_node_and_uninstalls_cleanly() {
    run_test(|cluster| async move {
        let node = get_json(cluster, &["node", NODE]).await?.with_context(|| {
            format!("no node {NODE}: run against `tests/cluster/up --node` (see tests/run)")
        })?;
        ensure!(
            node["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")),
            "node {NODE} is not Ready"
        );
        let samples = dir(cluster, "config/samples");
        // config/default with config/cni, as `tests/cluster/up --node` wrote it for this node.
        let default = cluster.state_dir().join("node/install").to_string_lossy().into_owned();

        // Install, as documented. A server dry run needs the namespace to exist (the dry-run
        // Namespace is not stored), as on any cluster.
        cluster.kubectl_ok(&on_this_node(cluster, "kubectl apply -f config/default/namespace.yaml")?, None).await?;
        let dry = cluster.kubectl_output(&on_this_node(cluster, "kubectl apply -k config/default --dry-run=server")?, None).await?;
        ensure!(dry.status.success(), "server dry run of config/default with config/cni: {}", stderr(&dry));
        ensure!(
            get_json(cluster, &["deployment", "gatehouse", "-n", NAMESPACE]).await?.is_none(),
            "the dry run stored the Deployment"
        );
        cluster.kubectl_ok(&on_this_node(cluster, "kubectl apply -k config/default")?, None).await?;
        // The bridge's IPAM is gatehouse-ipam: no Pod gets a network before it is installed.
        ipam::the_plugin_is_installed(cluster).await?;
        let mut rollout = on_this_node(cluster, "kubectl -n gatehouse-system rollout status deployment/gatehouse")?;
        rollout.push("--timeout=180s".to_string());
        cluster.kubectl_ok(&rollout, None).await?;
        let pods = await_condition("two Ready Gatehouse replicas on the node", WAIT, || async {
            let pods = gatehouse_pods(cluster).await?;
            let ready: Vec<Value> = pods.into_iter().filter(is_ready).collect();
            Ok((ready.len() == 2).then_some(ready))
        })
        .await?;
        for p in &pods {
            ensure!(p["spec"]["nodeName"] == NODE, "a replica is not on {NODE}: {}", p["spec"]);
            ensure!(p["spec"]["serviceAccountName"] == "gatehouse", "a replica runs as {}", p["spec"]["serviceAccountName"]);
        }

        // The configurations Gatehouse wrote point at the Service, and their caBundle verifies
        // what the replicas serve.
        let validating = await_condition("the validating configuration", WAIT, || async {
            let cfg = get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"]).await?;
            Ok(cfg.filter(|c| c["webhooks"].as_array().is_some_and(|w| !w.is_empty())))
        })
        .await?;
        let entry = &validating["webhooks"][0];
        let service = &entry["clientConfig"]["service"];
        ensure!(
            service["name"] == SERVICE && service["namespace"] == NAMESPACE && service["port"] == 443,
            "the configuration does not point at {SERVICE}.{NAMESPACE}.svc:443: {}",
            entry["clientConfig"]
        );
        let ca_bundle = entry["clientConfig"]["caBundle"].as_str().context("no caBundle")?;
        check_serving_certificate(cluster, ca_bundle).await?;

        // The samples, and Pods of users: mutated, rejected, given an address; all run on the node.
        cluster.kubectl_ok(&on_this_node(cluster, "kubectl apply -k config/samples")?, None).await?;
        // pods-v4 as this node routes it: on the bridge's subnet, beside host-local's range.
        let node_pool = cluster.state_dir().join("node/ippool.yaml");
        cluster.kubectl_ok(["apply", "-f", &node_pool.to_string_lossy()], None).await?;
        let mut wait = vec!["wait", "--for=condition=Ready", "--timeout=120s"];
        let names: Vec<String> = SAMPLE_POLICIES.iter().map(|p| format!("policy/{p}")).collect();
        wait.extend(names.iter().map(String::as_str));
        cluster.kubectl_ok(&wait, None).await?;
        let mutating = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"]).await?.context("no mutating configuration")?;
        for entry in mutating["webhooks"].as_array().context("no mutating entries")? {
            ensure!(entry["clientConfig"]["service"]["name"] == SERVICE, "an entry bypasses the Service: {entry}");
        }

        let plain = TestNamespace::new(cluster, "node-plain").await?;
        let injected = TestNamespace::new(cluster, "node-injected").await?;
        let ipam = TestNamespace::new(cluster, "node-ipam").await?;
        cluster.kubectl_ok(["label", "namespace", injected.name(), "inject=enabled"], None).await?;
        cluster.kubectl_ok(["label", "namespace", ipam.name(), "ipam=enabled"], None).await?;

        let created = cluster.kubectl_ok(["create", "-o", "json", "-f", "-"], Some(&pod("web", plain.name(), false))).await?;
        let created: Value = serde_json::from_str(&created)?;
        ensure!(
            dropped_capabilities(&created) == ["BPF"],
            "drop-bpf did not mutate the Pod: {}",
            created["spec"]["containers"][0]
        );
        let refused = cluster.kubectl_output(["create", "-f", "-"], Some(&pod("web", injected.name(), false))).await?;
        ensure!(
            !refused.status.success() && stderr(&refused).contains("every container must declare resource limits"),
            "the Pod with an injected sidecar without limits was not refused: {}",
            stderr(&refused)
        );
        // The namespace label reaches the replicas' Namespace caches a moment after it is set.
        // A Pod created before they have: unmarked, so removed and created again.
        await_condition("a Pod given an address", WAIT, || async {
            let _ = cluster.kubectl_output(["create", "-f", "-"], Some(&pod("web", ipam.name(), false))).await?;
            let p = get_json(cluster, &["pod", "web", "-n", ipam.name()]).await?;
            if p.as_ref().is_some_and(|p| p["metadata"]["labels"]["gatehouse.dev/ipam-pool"].is_null()) {
                cluster.kubectl_ok(["delete", "pod", "web", "-n", ipam.name(), "--wait=true"], None).await?;
                return Ok(None);
            }
            Ok(p.filter(|p| p["metadata"]["annotations"]["gatehouse.dev/ip"].is_string()))
        })
        .await?;
        await_running(cluster, plain.name(), "web").await?;
        let placed = await_running(cluster, ipam.name(), "web").await?;
        let ip = placed["metadata"]["annotations"]["gatehouse.dev/ip"].as_str().unwrap_or_default();
        ensure!(ip.starts_with("10.244.0.1"), "web got {ip}, not an address of the node's pods-v4 (10.244.0.128/27)");
        ensure!(placed["status"]["podIP"] == ip, "web runs with {}, its address is {ip}", placed["status"]["podIP"]);
        ipam::addresses_are_the_pods_own(cluster, &ipam, &plain).await?;
        ipam::a_full_pool_is_reused(cluster, &ipam).await?;
        companions::the_provisioning_sample_fills_a_team_namespace(cluster, &plain).await?;
        companions::gated_pods_start_with_their_config(cluster, 10).await?;

        // RBAC: all of the above ran under the ServiceAccount; what it must not do is forbidden.
        let kubeconfig = cluster.service_account_kubeconfig(NAMESPACE, "gatehouse", "kubeconfig-node-sa").await?;
        let foreign = "node-e2e-foreign";
        let _foreign = cluster.delete_on_drop("validatingwebhookconfiguration", foreign, None);
        cluster
            .kubectl_ok(["apply", "-f", "-"], Some(&json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": foreign}, "webhooks": []}).to_string()))
            .await?;
        for (what, args) in [
            ("reading Secrets of another namespace", vec!["get", "secrets", "-n", "kube-system"]),
            ("patching a webhook configuration it does not own", vec!["patch", "validatingwebhookconfiguration", foreign, "--type=merge", "-p", r#"{"metadata":{"labels":{"taken":"yes"}}}"#]),
            ("deleting a Pod", vec!["delete", "pod", "web", "-n", plain.name()]),
        ] {
            let out = cluster.kubectl_as(&kubeconfig, &args).await?;
            ensure!(!out.status.success() && stderr(&out).contains("Forbidden"), "{what} was not forbidden: {}", stderr(&out));
        }
        let allowed = cluster.kubectl_as(&kubeconfig, &["get", "policies"]).await?;
        ensure!(allowed.status.success(), "the ServiceAccount cannot list Policies: {}", stderr(&allowed));

        // A replica deleted while Pods are created at a steady rate: no review fails.
        let load = TestNamespace::new(cluster, "node-load").await?;
        let failures = Arc::new(AtomicUsize::new(0));
        let creating = tokio::spawn(steady_creates(cluster, load.name().to_owned(), 5, Duration::from_secs(25), failures.clone()));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let victim = pods[0]["metadata"]["name"].as_str().context("a replica without a name")?.to_owned();
        cluster.kubectl_ok(["delete", "pod", &victim, "-n", NAMESPACE, "--wait=false"], None).await?;
        let names = creating.await??;
        ensure!(
            failures.load(Ordering::SeqCst) == 0,
            "{} of {} Pod creates failed while replica {victim} was deleted",
            failures.load(Ordering::SeqCst),
            names.len()
        );
        let stored = get_json(cluster, &["pods", "-n", load.name()]).await?.context("listing load Pods")?;
        let items = stored["items"].as_array().cloned().unwrap_or_default();
        ensure!(items.len() == names.len(), "{} Pods stored of {} created", items.len(), names.len());
        for p in &items {
            ensure!(dropped_capabilities(p) == ["BPF"], "a Pod created under load was not mutated: {}", p["metadata"]["name"]);
        }
        eprintln!("{} Pods created at 5/s while {victim} was deleted: none refused, all mutated", names.len());
        cluster.kubectl_ok(["rollout", "status", "deployment/gatehouse", "-n", NAMESPACE, "--timeout=180s"], None).await?;

        // Uninstall: users' Pods and the samples go while Gatehouse still runs (it releases the
        // pool's addresses), then the installation.
        for ns in [plain, injected, ipam, load] {
            ns.cleanup().await?;
        }
        cluster.kubectl_ok(["delete", "-k", &samples, "--timeout=120s"], None).await?;
        cluster.kubectl_ok(["delete", "-k", &default, "--timeout=180s"], None).await?;
        await_condition("no Gatehouse webhook configuration", WAIT, || async {
            let m = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"]).await?;
            let v = get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"]).await?;
            Ok((m.is_none() && v.is_none()).then_some(()))
        })
        .await?;
        let after = TestNamespace::new(cluster, "node-after").await?;
        let out = cluster.kubectl_output(["create", "-o", "json", "-f", "-"], Some(&pod("after", after.name(), false))).await?;
        ensure!(out.status.success(), "a Pod after uninstalling: {}", stderr(&out));
        let created: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(dropped_capabilities(&created).is_empty(), "mutated after uninstalling: {}", created["spec"]);
        await_running(cluster, after.name(), "after").await?;
        after.cleanup().await?;
        Ok(())
    })
    .await;
}
