//! The installation's RBAC and uninstall, on the plain control plane: Gatehouse runs under the
//! ServiceAccount of `config/rbac` (a TokenRequest token, so the API server enforces exactly the
//! manifests' rules), does everything it does, is refused what it should not do, and deleting
//! the installation's ClusterRole removes its webhook configurations and generated admission
//! policies.

use std::time::Duration;

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::{Options, remove_pool};
use gatehouse_e2e::{Cluster, await_condition, run_test};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, await_ready, container_names, get_json, pod, stderr};
use crate::scene::Stage;

/// `config/rbac` rendered by kustomize, bound in `namespace` instead of gatehouse-system.
pub(crate) async fn install_rbac(cluster: &Cluster, namespace: &str) -> anyhow::Result<()> {
    let dir = cluster.repo_root().join("config/rbac");
    let rendered = cluster
        .kubectl_ok(["kustomize", &dir.to_string_lossy()], None)
        .await?;
    let rendered = rendered.replace(
        "namespace: gatehouse-system",
        &format!("namespace: {namespace}"),
    );
    cluster
        .kubectl_ok(["apply", "-n", namespace, "-f", "-"], Some(&rendered))
        .await?;
    Ok(())
}

#[tokio::test]
async fn least_privilege_rbac_is_enough_and_uninstalling_leaves_no_webhook() {
    run_test(|cluster| async move {
        let stage = Stage::open(cluster, "gh-rbac").await?;
        let id = stage.id();
        let _role = cluster.delete_on_drop("clusterrole", "gatehouse", None);
        let _binding = cluster.delete_on_drop("clusterrolebinding", "gatehouse", None);
        let _audit = [
            cluster.delete_on_drop("clusterrole", "gatehouse-audit", None),
            cluster.delete_on_drop("clusterrole", "gatehouse-audit-default", None),
            cluster.delete_on_drop("clusterrolebinding", "gatehouse-audit", None),
            cluster.delete_on_drop("clusterrole", "gatehouse-effects", None),
            cluster.delete_on_drop("clusterrolebinding", "gatehouse-effects", None),
        ];
        install_rbac(cluster, stage.home()).await?;
        let kubeconfig = cluster
            .service_account_kubeconfig(stage.home(), "gatehouse", &format!("kubeconfig-sa-{id}"))
            .await?;
        let options = Options::url().kubeconfig(kubeconfig.clone());
        stage.start(options).await?.run(async |scene| {
            let (inject, ipam, pool) = (scene.policy("inject"), scene.policy("ipam"), format!("pool-{id}"));
            let limits = scene.policy("limits");
            scene.track_pool(&pool, &ipam);
            let (home, ns) = (scene.home().to_string(), scene.ns().to_string());
            // Companion objects: only what the aggregated gatehouse-effects grants.
            crate::companions::a_kind_not_granted_is_ready_false_until_granted(scene).await?;
            let gh = &mut scene.gh;
            // Everything Gatehouse does, under the ServiceAccount: TLS Secret and Leases in its
            // namespace, configurations, Policy status, the Namespace watch, Pods and IPAM.
            let rules = json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]);
            let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": &ns}});
            for doc in [
                json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPPool", "metadata": {"name": pool}, "spec": {"cidr": "10.77.0.0/24"}}),
                json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": inject}, "spec": {
                    "match": {"rules": rules, "namespaceSelector": selector},
                    "mutate": [{"merge": {"spec": {"containers": [{"name": "proxy", "image": "example.com/proxy:1", "resources": {"limits": {"cpu": "10m", "memory": "16Mi"}}}]}}}],
                }}),
                json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": ipam}, "spec": {
                    "match": {"rules": rules, "namespaceSelector": selector},
                    "effects": [{"ipam": {"pool": pool}}],
                }}),
                // Validation only, enforcement Auto: in-process.
                json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": limits}, "spec": {
                    "match": {"rules": rules, "namespaceSelector": selector},
                    "validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "every container must declare resource limits"}],
                }}),
            ] {
                apply(cluster, &doc).await?;
            }
            let injected = await_ready(cluster, &inject, "True").await?;
            ensure!(injected["reason"] == "InProcess", "{injected}");
            await_ready(cluster, &ipam, "True").await?;
            let in_process = await_ready(cluster, &limits, "True").await?;
            ensure!(in_process["reason"] == "InProcess", "{in_process}");
            let placed = await_condition("a mutated Pod with an address", WAIT, || async {
                let _ = cluster.kubectl_output(["create", "-f", "-"], Some(&pod("web", &ns))).await?;
                let p = get_json(cluster, &["pod", "web", "-n", &ns]).await?;
                Ok(p.filter(|p| {
                    container_names(p) == ["app", "proxy"]
                        && p["metadata"]["annotations"]["gatehouse.dev/ip"].is_string()
                }))
            })
            .await?;
            eprintln!("placed at {}", placed["metadata"]["annotations"]["gatehouse.dev/ip"]);
            let secret = get_json(cluster, &["secret", "gatehouse-tls", "-n", &home]).await?;
            ensure!(secret.is_some(), "no TLS Secret");

            // Owned by the installation's ClusterRole.
            let role = get_json(cluster, &["clusterrole", "gatehouse"]).await?.context("role")?;
            let generated = format!("gatehouse-{limits}");
            let generated_mutating = format!("gatehouse-mutating-{inject}");
            for (kind, name) in [
                ("mutatingwebhookconfiguration", "gatehouse"),
                ("validatingwebhookconfiguration", "gatehouse"),
                ("validatingadmissionpolicy", generated.as_str()),
                ("validatingadmissionpolicybinding", generated.as_str()),
                ("mutatingadmissionpolicy", generated_mutating.as_str()),
                ("mutatingadmissionpolicybinding", generated_mutating.as_str()),
            ] {
                let cfg = get_json(cluster, &[kind, name]).await?.context("configuration")?;
                let owner = &cfg["metadata"]["ownerReferences"][0];
                ensure!(
                    owner["kind"] == "ClusterRole" && owner["uid"] == role["metadata"]["uid"],
                    "{kind} is not owned by the ClusterRole: {}",
                    cfg["metadata"]
                );
            }

            // Nothing more: what it must not do is forbidden for its identity.
            let foreign = format!("e2e-foreign-{id}");
            let _foreign = cluster.delete_on_drop("validatingwebhookconfiguration", &foreign, None);
            apply(cluster, &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": foreign}, "webhooks": []})).await?;
            for (what, args) in [
                ("reading Secrets of another namespace", vec!["get", "secrets", "-n", "kube-system"]),
                ("reading a Secret of its own namespace but not its own", vec!["get", "secret", "other", "-n", &home]),
                ("patching a webhook configuration it does not own", vec!["patch", "validatingwebhookconfiguration", &foreign, "--type=merge", "-p", r#"{"metadata":{"labels":{"taken":"yes"}}}"#]),
                ("deleting a Pod", vec!["delete", "pod", "web", "-n", &ns]),
                // Patching a Policy it may (the companions finalizer), deleting one never.
                ("deleting a Policy", vec!["delete", "policy", &inject, "--wait=false"]),
            ] {
                let out = cluster.kubectl_as(&kubeconfig, &args).await?;
                ensure!(
                    !out.status.success() && stderr(&out).contains("Forbidden"),
                    "{what} was not forbidden: {}",
                    stderr(&out)
                );
            }

            // The IPAM pool goes while Gatehouse can still release it.
            cluster.kubectl_ok(["delete", "pod", "web", "-n", &ns, "--wait=true"], None).await?;
            remove_pool(cluster, &pool, &ipam).await?;

            // Uninstall without Gatehouse's help: it dies (a Fail entry stays behind), then the
            // installation's ClusterRole goes, as `kubectl delete -k config/default` does.
            gh.kill().await?;
            cluster.kubectl_ok(["delete", "clusterrole", "gatehouse"], None).await?;
            await_condition("configurations collected", Duration::from_secs(60), || async {
                let m = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"]).await?;
                let v = get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"]).await?;
                let generated = cluster
                    .kubectl_ok(
                        ["get", "validatingadmissionpolicy,validatingadmissionpolicybinding,mutatingadmissionpolicy,mutatingadmissionpolicybinding", "-l", "app.kubernetes.io/managed-by=gatehouse", "-o", "name"],
                        None,
                    )
                    .await?;
                Ok((m.is_none() && v.is_none() && generated.trim().is_empty()).then_some(()))
            })
            .await?;
            // The API server drops a deleted admission policy from its cache a moment later: wait
            // until neither the validating nor the mutating one acts on a dry run.
            let unlimited = pod("bare", &ns).replace("    resources: {limits: {cpu: 100m, memory: 64Mi}}\n", "");
            await_condition("a Pod without limits admitted unmutated after uninstalling", WAIT, || async {
                let out = cluster.kubectl_output(["create", "--dry-run=server", "-f", "-", "-o", "json"], Some(&unlimited)).await?;
                if !out.status.success() {
                    return Ok(None);
                }
                let previewed: Value = serde_json::from_slice(&out.stdout)?;
                Ok((container_names(&previewed) == ["app"]).then_some(()))
            })
            .await?;
            let out = cluster.kubectl_output(["create", "-f", "-", "-o", "json"], Some(&pod("after", &ns))).await?;
            ensure!(out.status.success(), "a Pod after uninstalling: {}", stderr(&out));
            let after: Value = serde_json::from_slice(&out.stdout)?;
            ensure!(container_names(&after) == ["app"], "mutated after uninstalling: {after}");
            Ok(())
        })
        .await
    })
    .await;
}
