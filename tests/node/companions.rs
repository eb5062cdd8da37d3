//! Companion objects on the node: the provisioning sample fills a team Namespace, and Pods held
//! at the companions gate start only once the ConfigMap they mount exists.
use anyhow::{Context, ensure};
use gatehouse_e2e::{Cluster, TestNamespace, await_condition};
use serde_json::{Value, json};

use super::{BUSYBOX, WAIT, await_running, get_json};

/// The sample `namespace-provisioning` (applied with config/samples) gives a Namespace labelled
/// `team` its three companions, under the installed RBAC and the sample's grant.
pub async fn the_provisioning_sample_fills_a_team_namespace(
    cluster: &Cluster,
    ns: &TestNamespace,
) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(["label", "namespace", ns.name(), "team=node"], None)
        .await?;
    await_condition("the team Namespace's companions", WAIT, || async {
        for which in [
            "networkpolicy/default-deny",
            "resourcequota/team-quota",
            "rolebinding/team-view",
        ] {
            if get_json(cluster, &[which, "-n", ns.name()])
                .await?
                .is_none()
            {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    let binding = get_json(cluster, &["rolebinding/team-view", "-n", ns.name()])
        .await?
        .context("rolebinding")?;
    ensure!(binding["subjects"][0]["name"] == "node", "{binding:#}");
    Ok(())
}

/// `count` Pods mounting a per-Pod ConfigMap companion, with `gate: true`: each starts Running
/// and reads its own ConfigMap's content; none ever fails to mount.
pub async fn gated_pods_start_with_their_config(
    cluster: &Cluster,
    count: usize,
) -> anyhow::Result<()> {
    let ns = TestNamespace::new(cluster, "node-gate").await?;
    let grant = "node-e2e-effects-configmaps";
    let _grant = cluster.delete_on_drop("clusterrole", grant, None);
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": grant, "labels": {"gatehouse.dev/aggregate-to-effects": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "create", "patch", "delete"]}]});
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&role.to_string()))
        .await?;
    let policy = "node-e2e-pod-config";
    let _policy = cluster.delete_on_drop("policy", policy, None);
    let spec = json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": policy}, "spec": {
        "match": {
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name()}},
        },
        "effects": [{"object": {
            "gate": true,
            "template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}, "data": {}},
            "fields": [
                {"path": "metadata.name", "expression": "object.metadata.name + '-config'"},
                {"path": "data.greeting", "expression": "'hello ' + object.metadata.name"},
            ],
        }}],
    }});
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&spec.to_string()))
        .await?;
    cluster
        .kubectl_ok(
            [
                "wait",
                "--for=condition=Ready",
                "--timeout=120s",
                &format!("policy/{policy}"),
            ],
            None,
        )
        .await?;
    // The replicas see the new entry a moment after Ready: a Pod created before is not gated,
    // so it is removed and the burst waits for one that is.
    await_condition("a Pod held at the companions gate", WAIT, || async {
        let out = cluster
            .kubectl_output(
                ["create", "-o", "json", "-f", "-"],
                Some(&gated_pod("probe", ns.name())),
            )
            .await?;
        let created: Value =
            serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap_or_default();
        let gated = created["spec"]["schedulingGates"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["name"] == "gatehouse.dev/companions"));
        cluster
            .kubectl_ok(
                [
                    "delete",
                    "pod",
                    "probe",
                    "-n",
                    ns.name(),
                    "--wait=true",
                    "--ignore-not-found",
                ],
                None,
            )
            .await?;
        Ok(gated.then_some(()))
    })
    .await?;
    let names: Vec<String> = (0..count).map(|i| format!("gated-{i}")).collect();
    let items: Vec<Value> = names
        .iter()
        .map(|n| serde_json::from_str(&gated_pod(n, ns.name())).unwrap_or_default())
        .collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    cluster
        .kubectl_ok(["create", "-f", "-"], Some(&list))
        .await?;
    for name in &names {
        let running = await_running(cluster, ns.name(), name).await?;
        ensure!(
            running["spec"]["schedulingGates"]
                .as_array()
                .is_none_or(|g| g.is_empty()),
            "{name} still gated"
        );
        let said = cluster
            .kubectl_ok(["logs", name, "-n", ns.name()], None)
            .await?;
        ensure!(
            said.trim() == format!("hello {name}"),
            "{name} read {said:?}"
        );
    }
    let events = get_json(
        cluster,
        &[
            "events",
            "-n",
            ns.name(),
            "--field-selector",
            "reason=FailedMount",
        ],
    )
    .await?
    .context("events")?;
    ensure!(
        events["items"].as_array().is_none_or(|e| e.is_empty()),
        "a Pod failed to mount: {events:#}"
    );
    cluster
        .kubectl_ok(["delete", "policy", policy, "--timeout=60s"], None)
        .await?;
    ns.cleanup().await?;
    Ok(())
}

/// A Pod that prints its ConfigMap's greeting, then sleeps.
fn gated_pod(name: &str, namespace: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            // The config volume is the only one, so that any FailedMount is about the
            // companion: the service-account volume's own ConfigMap (kube-root-ca.crt) can
            // fail to sync once on a loaded kubelet, which says nothing of the gate.
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "app", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "cat /config/greeting; echo; sleep 3600"],
                "resources": {"limits": {"cpu": "50m", "memory": "16Mi"}},
                "volumeMounts": [{"name": "config", "mountPath": "/config"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}],
        },
    })
    .to_string()
}
