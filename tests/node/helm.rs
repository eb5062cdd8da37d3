//! Gatehouse installed with Helm, as most users of the peers install theirs: `helm install` of
//! charts/gatehouse into gatehouse-system (`--create-namespace`) with the CNI DaemonSet and the
//! samples, a `helm upgrade` that rolls both replicas while Pods are created at a steady rate, and
//! `helm uninstall` leaving no webhook configuration or generated admission policy behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use gatehouse_e2e::documented::documented;
use gatehouse_e2e::{Cluster, TestNamespace, await_condition, run_test};
use serde_json::Value;

use super::{
    INSTALL_DOC, NAMESPACE, NODE, SAMPLE_POLICIES, WAIT, creates_until, dropped_capabilities,
    gatehouse_pods, get_json, is_ready, pod, stderr,
};

const RELEASE: &str = "gatehouse";
/// The Helm install as docs/operations/install.md and the README show it.
const DOCUMENTED_INSTALL: &str = "helm install gatehouse charts/gatehouse -n gatehouse-system --create-namespace --set image.repository=registry.example/gatehouse --set image.tag=0.1.0 --wait";
/// Policies of the user's, applied with kubectl beside the release.
const OWN_POLICY: &str = "helm-e2e-labelled";
const OWN_MUTATING_POLICY: &str = "helm-e2e-annotate";
const OWN_ANNOTATION: &str = "helm-e2e/annotated";
/// Labels of what Gatehouse generates (admission policies and their bindings).
const GENERATED: &str = "app.kubernetes.io/managed-by=gatehouse";

/// The user's own Policies, for Pods in namespaces labelled `helm-e2e=strict`: one requires an
/// `app` label (in-process), one annotates Pods (on the webhook).
fn own_policies() -> String {
    let rules = serde_json::json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]);
    let selector = serde_json::json!({"matchLabels": {"helm-e2e": "strict"}});
    serde_json::json!({
        "apiVersion": "v1", "kind": "List",
        "items": [
            {
                "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
                "metadata": {"name": OWN_POLICY},
                "spec": {
                    "match": {"rules": rules, "namespaceSelector": selector},
                    "validate": [{"expression": "has(object.metadata.labels) && 'app' in object.metadata.labels", "message": "Pods need an app label"}],
                },
            },
            {
                "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
                "metadata": {"name": OWN_MUTATING_POLICY},
                "spec": {
                    "enforcement": "Webhook",
                    "match": {"rules": rules, "namespaceSelector": selector},
                    "mutate": [{"merge": {"metadata": {"annotations": {OWN_ANNOTATION: "yes"}}}}],
                },
            },
        ],
    })
    .to_string()
}

/// A server dry-run create of a Pod in `namespace`, labelled `app: <app>` if given: the Pod as it
/// would be stored, or the refusal.
async fn dry_run_pod(
    cluster: &Cluster,
    namespace: &str,
    app: Option<&str>,
) -> anyhow::Result<Result<Value, String>> {
    let mut p: Value = serde_json::from_str(&pod("probe", namespace, true))?;
    if let Some(app) = app {
        p["metadata"]["labels"] = serde_json::json!({"app": app});
    }
    let out = cluster
        .kubectl_output(
            ["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&p.to_string()),
        )
        .await?;
    if out.status.success() {
        Ok(Ok(serde_json::from_slice(&out.stdout)?))
    } else {
        Ok(Err(stderr(&out)))
    }
}

/// Uninstalls the release if the test ends before it does (so the kustomize test after it finds
/// the node clean).
struct ReleaseGuard {
    helm: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    armed: bool,
}

impl ReleaseGuard {
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = std::process::Command::new(&self.helm)
                .args([
                    "uninstall",
                    RELEASE,
                    "-n",
                    NAMESPACE,
                    "--wait",
                    "--timeout",
                    "120s",
                    "--kubeconfig",
                ])
                .arg(&self.kubeconfig)
                .status();
        }
    }
}

/// Runs helm against the node cluster, failing with its stderr.
async fn helm(cluster: &Cluster, args: &[&str]) -> anyhow::Result<String> {
    let bin = cluster.bin_dir().join("helm");
    ensure!(
        bin.exists(),
        "{} missing: tests/cluster/up --node links it",
        bin.display()
    );
    let out = tokio::process::Command::new(&bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .current_dir(cluster.repo_root())
        .output()
        .await
        .with_context(|| format!("running helm {}", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        stderr(&out)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `helm upgrade` of the release with its values and `set`, waiting for the rollout.
async fn upgrade(cluster: &Cluster, chart: &str, set: &str) -> anyhow::Result<String> {
    helm(
        cluster,
        &[
            "upgrade",
            RELEASE,
            chart,
            "-n",
            NAMESPACE,
            "--reuse-values",
            "--set",
            set,
            "--wait",
            "--timeout",
            "180s",
        ],
    )
    .await
}

/// Ready Gatehouse replicas, each with the container args it runs.
async fn ready_replicas(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    Ok(gatehouse_pods(cluster)
        .await?
        .into_iter()
        .filter(is_ready)
        .collect())
}

fn args_of(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"][0]["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Names of what Gatehouse generated cluster-wide: webhook configurations, admission policies
/// and their bindings.
async fn generated_objects(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        if get_json(cluster, &[kind, "gatehouse"]).await?.is_some() {
            names.push(format!("{kind}/gatehouse"));
        }
    }
    for kind in [
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
        "mutatingadmissionpolicies",
        "mutatingadmissionpolicybindings",
    ] {
        let list = get_json(cluster, &[kind, "-l", GENERATED])
            .await?
            .with_context(|| format!("listing {kind}"))?;
        for item in list["items"].as_array().into_iter().flatten() {
            names.push(format!(
                "{kind}/{}",
                item["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    Ok(names)
}

#[tokio::test]
async fn helm_installs_upgrades_and_uninstalls_on_the_node() {
    run_test(|cluster| async move {
        // A namespace left terminating by an earlier installation must be gone first.
        await_condition("no gatehouse-system namespace", WAIT, || async {
            Ok(get_json(cluster, &["namespace", NAMESPACE])
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        let chart = cluster
            .repo_root()
            .join("charts/gatehouse")
            .to_string_lossy()
            .into_owned();
        let bin_dir = format!(
            "cni.binDir={}",
            cluster.state_dir().join("node/cni-bin").display()
        );
        let release = ReleaseGuard {
            helm: cluster.bin_dir().join("helm"),
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            armed: true,
        };

        // As documented, with this node's image (a later --set wins), the CNI plugin in this
        // node's directory and the samples.
        let mut install = documented(INSTALL_DOC, DOCUMENTED_INSTALL)?;
        install.remove(0);
        for set in ["image.repository=gatehouse", "image.tag=dev", "cni.enabled=true", &bin_dir, "samples.enabled=true"] {
            install.extend(["--set".to_string(), set.to_string()]);
        }
        install.extend(["--timeout".to_string(), "180s".to_string()]);
        helm(cluster, &install.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        let label = documented(INSTALL_DOC, "kubectl label namespace gatehouse-system pod-security.kubernetes.io/enforce=restricted")?;
        cluster.kubectl_ok(&label[1..], None).await?;

        // Two Ready replicas on the node, the CNI DaemonSet's Pod Ready there.
        let replicas = await_condition("two Ready Gatehouse replicas", WAIT, || async {
            let ready = ready_replicas(cluster).await?;
            Ok((ready.len() == 2).then_some(ready))
        })
        .await?;
        for p in &replicas {
            ensure!(p["spec"]["nodeName"] == NODE, "a replica is not on {NODE}");
            ensure!(
                p["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm",
                "a replica not of the release: {}",
                p["metadata"]["labels"]
            );
        }
        await_condition("gatehouse-cni Ready on the node", WAIT, || async {
            let ds = get_json(
                cluster,
                &["daemonset", "gatehouse-cni", "-n", "kube-system"],
            )
            .await?;
            Ok(ds.filter(|d| d["status"]["numberReady"] == 1))
        })
        .await?;

        // The samples, installed by the chart, behave as with kustomize.
        let mut wait = vec!["wait", "--for=condition=Ready", "--timeout=120s"];
        let names: Vec<String> = SAMPLE_POLICIES
            .iter()
            .map(|p| format!("policy/{p}"))
            .collect();
        wait.extend(names.iter().map(String::as_str));
        cluster.kubectl_ok(&wait, None).await?;
        let plain = TestNamespace::new(cluster, "helm-plain").await?;
        let injected = TestNamespace::new(cluster, "helm-injected").await?;
        cluster
            .kubectl_ok(
                ["label", "namespace", injected.name(), "inject=enabled"],
                None,
            )
            .await?;
        let created = cluster
            .kubectl_ok(
                ["create", "-o", "json", "-f", "-"],
                Some(&pod("web", plain.name(), false)),
            )
            .await?;
        let created: Value = serde_json::from_str(&created)?;
        ensure!(
            dropped_capabilities(&created) == ["BPF"],
            "drop-bpf did not mutate the Pod: {}",
            created["spec"]["containers"][0]
        );
        // The namespace label reaches the replicas' caches a moment after it is set.
        let refused = await_condition("the injected Pod without limits refused", WAIT, || async {
            let out = cluster
                .kubectl_output(
                    ["create", "-f", "-"],
                    Some(&pod("web", injected.name(), false)),
                )
                .await?;
            if out.status.success() {
                cluster
                    .kubectl_ok(
                        ["delete", "pod", "web", "-n", injected.name(), "--wait=true"],
                        None,
                    )
                    .await?;
                return Ok(None);
            }
            Ok(Some(stderr(&out)))
        })
        .await?;
        ensure!(
            refused.contains("every container must declare resource limits"),
            "refused for another reason: {refused}"
        );
        let generated = await_condition(
            "Gatehouse's configurations and an in-process policy",
            WAIT,
            || async {
                let generated = generated_objects(cluster).await?;
                Ok(generated
                    .iter()
                    .any(|n| n.starts_with("validatingadmissionpolicies/"))
                    .then_some(generated))
            },
        )
        .await?;
        eprintln!("generated by Gatehouse under the release: {generated:?}");

        // An upgrade with a changed value rolls both replicas while Pods are created at 5/s:
        // none is refused and every one is mutated.
        let load = TestNamespace::new(cluster, "helm-load").await?;
        let failures = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let creating = tokio::spawn(creates_until(
            cluster,
            load.name().to_owned(),
            5,
            stop.clone(),
            failures.clone(),
        ));
        tokio::time::sleep(Duration::from_secs(3)).await;
        // The documented upgrade; its new replicas are admitted under the restricted profile.
        let mut documented_upgrade = documented(INSTALL_DOC, "helm upgrade gatehouse charts/gatehouse -n gatehouse-system --reuse-values --set logFormat=json")?;
        documented_upgrade.remove(0);
        documented_upgrade.extend(["--wait", "--timeout", "180s"].map(String::from));
        helm(cluster, &documented_upgrade.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        // --wait returns once the new replicas are Ready; the old ones still drain. The load
        // goes on until they are gone, and a moment more.
        let old: Vec<Value> = replicas
            .iter()
            .map(|p| p["metadata"]["name"].clone())
            .collect();
        await_condition("the old replicas gone", WAIT, || async {
            let pods = gatehouse_pods(cluster).await?;
            Ok((!pods.iter().any(|p| old.contains(&p["metadata"]["name"]))).then_some(()))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        stop.store(true, Ordering::SeqCst);
        let names = creating.await??;
        ensure!(
            failures.load(Ordering::SeqCst) == 0,
            "{} of {} Pod creates failed during helm upgrade",
            failures.load(Ordering::SeqCst),
            names.len()
        );
        let stored = get_json(cluster, &["pods", "-n", load.name()])
            .await?
            .context("listing load Pods")?;
        let items = stored["items"].as_array().cloned().unwrap_or_default();
        ensure!(
            items.len() == names.len(),
            "{} Pods stored of {} created",
            items.len(),
            names.len()
        );
        for p in &items {
            ensure!(
                dropped_capabilities(p) == ["BPF"],
                "a Pod created during the upgrade was not mutated: {}",
                p["metadata"]["name"]
            );
        }
        cluster
            .kubectl_ok(
                [
                    "rollout",
                    "status",
                    "deployment/gatehouse",
                    "-n",
                    NAMESPACE,
                    "--timeout=180s",
                ],
                None,
            )
            .await?;
        let rolled = await_condition("two Ready replicas logging JSON", WAIT, || async {
            let ready = ready_replicas(cluster).await?;
            let json = ready
                .iter()
                .filter(|p| args_of(p).windows(2).any(|w| w == ["--log-format", "json"]))
                .count();
            Ok((ready.len() == 2 && json == 2).then_some(ready))
        })
        .await?;
        for p in &rolled {
            ensure!(
                replicas
                    .iter()
                    .all(|old| old["metadata"]["name"] != p["metadata"]["name"]),
                "replica {} was not replaced by the upgrade",
                p["metadata"]["name"]
            );
        }
        eprintln!(
            "{} Pods created at 5/s during helm upgrade: none refused, all mutated",
            names.len()
        );

        // Uninstall as docs/operations/install.md says: users' Pods and the samples first, while Gatehouse still
        // runs (an IPPool is held by a finalizer the leader removes; `helm uninstall` deletes the
        // RBAC before custom resources). Two Policies of the user's own stay through the
        // uninstall, one on the webhook and one in-process: what Gatehouse wrote for them must go
        // with the release, and a Pod they would change or refuse is then created as it is.
        for ns in [plain, injected, load] {
            ns.cleanup().await?;
        }
        let _own = cluster.delete_on_drop("policy", OWN_POLICY, None);
        let _own_mutating = cluster.delete_on_drop("policy", OWN_MUTATING_POLICY, None);
        cluster
            .kubectl_ok(["apply", "-f", "-"], Some(&own_policies()))
            .await?;
        let strict = TestNamespace::new(cluster, "helm-strict").await?;
        cluster
            .kubectl_ok(
                ["label", "namespace", strict.name(), "helm-e2e=strict"],
                None,
            )
            .await?;
        await_condition("the user's Policies enforced", WAIT, || async {
            let in_process = get_json(cluster, &["policy", OWN_POLICY]).await?;
            if !in_process.is_some_and(|p| p["status"]["enforcement"] == "InProcess") {
                return Ok(None);
            }
            let refused = dry_run_pod(cluster, strict.name(), None).await?.is_err();
            let annotated = dry_run_pod(cluster, strict.name(), Some("web"))
                .await?
                .is_ok_and(|p| p["metadata"]["annotations"][OWN_ANNOTATION] == "yes");
            Ok((refused && annotated).then_some(()))
        })
        .await?;
        upgrade(cluster, &chart, "samples.enabled=false").await?;
        for (kind, name) in [
            ("ippool", "pods-v4"),
            ("policy", "drop-bpf"),
            ("policy", "require-limits"),
        ] {
            await_condition(&format!("sample {kind} {name} deleted"), WAIT, || async {
                Ok(get_json(cluster, &[kind, name])
                    .await?
                    .is_none()
                    .then_some(()))
            })
            .await?;
        }
        let generated = generated_objects(cluster).await?;
        ensure!(
            generated
                .iter()
                .any(|n| n.ends_with(&format!("/gatehouse-{OWN_POLICY}"))),
            "no admission policy generated for {OWN_POLICY}: {generated:?}"
        );
        let delete_pools = documented(INSTALL_DOC, "kubectl delete ippools --all")?;
        cluster.kubectl_ok(&delete_pools[1..], None).await?;
        let mut uninstall = documented(INSTALL_DOC, "helm uninstall gatehouse -n gatehouse-system")?;
        uninstall.remove(0);
        uninstall.extend(["--wait", "--timeout", "180s"].map(String::from));
        helm(cluster, &uninstall.iter().map(String::as_str).collect::<Vec<_>>()).await?;
        release.disarm();
        await_condition("nothing Gatehouse wrote left", WAIT, || async {
            let left = generated_objects(cluster).await?;
            Ok(left.is_empty().then_some(()))
        })
        .await?;
        for (kind, name, namespace) in [
            ("deployment", "gatehouse", NAMESPACE),
            ("daemonset", "gatehouse-cni", "kube-system"),
            ("clusterrole", "gatehouse", ""),
        ] {
            let mut args = vec![kind, name];
            if !namespace.is_empty() {
                args.extend(["-n", namespace]);
            }
            await_condition(&format!("{kind} {name} deleted"), WAIT, || async {
                Ok(get_json(cluster, &args).await?.is_none().then_some(()))
            })
            .await?;
        }
        // The API server drops a deleted admission policy a moment after the garbage collector.
        let created = await_condition(
            "a Pod without an app label admitted after helm uninstall",
            WAIT,
            || async { Ok(dry_run_pod(cluster, strict.name(), None).await?.ok()) },
        )
        .await?;
        ensure!(
            created["metadata"]["annotations"][OWN_ANNOTATION].is_null(),
            "mutated after helm uninstall: {}",
            created["metadata"]
        );
        let plain_after = cluster
            .kubectl_output(
                ["create", "-o", "json", "-f", "-"],
                Some(&pod("after", strict.name(), false)),
            )
            .await?;
        ensure!(
            plain_after.status.success(),
            "a Pod after helm uninstall: {}",
            stderr(&plain_after)
        );
        let plain_after: Value = serde_json::from_slice(&plain_after.stdout)?;
        ensure!(
            dropped_capabilities(&plain_after).is_empty(),
            "mutated after helm uninstall: {}",
            plain_after["spec"]
        );
        strict.cleanup().await?;

        // The namespace --create-namespace made is the user's to delete (Helm leaves it, and the
        // CRDs, in place); deleting it leaves the node as the kustomize test expects it.
        cluster
            .kubectl_ok(["delete", "namespace", NAMESPACE, "--timeout=180s"], None)
            .await?;
        Ok(())
    })
    .await;
}
