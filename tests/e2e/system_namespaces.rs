//! System namespaces are always excluded: a Policy matching everything spares them.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use anyhow::ensure;
use gatehouse_e2e::await_condition;
use gatehouse_e2e::instance::Options;
use serde_json::json;

use crate::fixtures::*;
use crate::scene::scenario;

#[tokio::test]
async fn match_everything_spares_system_namespaces() {
    scenario("gh-everything", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let name = scene.policy("everything");
        let label = format!("deny-{id}");
        // Matches every resource in every namespace; denies only objects carrying the label, so
        // that the rest of the (shared) test cluster keeps working.
        let everything = policy_object(&name, json!({
            "match": {"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "*"}]},
            "failurePolicy": "Ignore",
            "validate": [{
                "expression": format!("!has(object.metadata) || !has(object.metadata.labels) || !('{label}' in object.metadata.labels)"),
                "message": format!("labelled {label}"),
            }],
        }));
        let cm = |namespace: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe-{id}\n  namespace: {namespace}\n  labels: {{{label}: \"x\"}}\n")
        };
        apply(cluster, &everything).await?;
        await_ready(cluster, &name, "True").await?;
        await_condition("match-everything policy in effect", WAIT, || async {
            let out = cluster.kubectl_output(["create", "--dry-run=server", "-f", "-"], Some(&cm(scene.ns()))).await?;
            Ok((!out.status.success() && stderr(&out).contains(&format!("labelled {label}"))).then_some(()))
        })
        .await?;
        for protected in ["kube-system", scene.home()] {
            let out = cluster.kubectl_output(["create", "-f", "-"], Some(&cm(protected))).await?;
            ensure!(out.status.success(), "create in {protected} was refused: {}", stderr(&out));
            cluster.kubectl_ok(["delete", "configmap", &format!("probe-{id}"), "-n", protected], None).await?;
        }
        Ok(())
    })
    .await;
}
