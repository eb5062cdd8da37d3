//! Admission is pure: a server dry run previews and stores nothing, and a Warn rule admits
//! with its warning.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use anyhow::{bail, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::scenario;

/// Whether Pod `name` exists in `ns`.
async fn pod_stored(cluster: &Cluster, ns: &str, name: &str) -> anyhow::Result<bool> {
    Ok(get_json(cluster, &["pod", name, "-n", ns]).await?.is_some())
}

#[tokio::test]
async fn server_dry_run_previews_and_stores_nothing() {
    scenario("gh-dryrun", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        let preview = pod("preview", scene.ns());
        await_condition("the dry run to show the mutation", WAIT, || async {
            let out = cluster
                .kubectl_ok(
                    ["apply", "--dry-run=server", "-o", "json", "-f", "-"],
                    Some(&preview),
                )
                .await?;
            let p: Value = serde_json::from_str(&out)?;
            if container_names(&p) != ["app", "proxy"] {
                bail!("dry run did not show the mutation: {p}");
            }
            Ok(Some(()))
        })
        .await?;
        ensure!(
            !pod_stored(cluster, scene.ns(), "preview").await?,
            "server dry-run stored the Pod"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn warn_admits_and_warns() {
    scenario("gh-warn", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let warn = scene.policy("warn-team");
        let spec = json!({"priority": 100, "validate": [{
            "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
            "message": "pods should carry a team label",
            "action": "Warn",
        }]});
        apply_ready(cluster, &policy(&warn, scene.ns(), spec)).await?;
        let out = create_pod_until(cluster, scene.ns(), "app", &[], |o| {
            o.status.success() && stderr(o).contains("pods should carry a team label")
        })
        .await?;
        let err = stderr(&out);
        ensure!(
            err.contains("Warning:") && err.contains(&warn),
            "kubectl printed: {err}"
        );
        ensure!(
            pod_stored(cluster, scene.ns(), "app").await?,
            "pod not stored"
        );
        Ok(())
    })
    .await;
}
