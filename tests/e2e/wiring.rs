//! The webhook configurations follow the Policies: a deleted Policy is unwired, a hand edit
//! is repaired, and a burst of Policies is written in few configuration writes.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_e2e::await_condition;
use gatehouse_e2e::instance::Options;
use gatehouse_engine::Phase;
use serde_json::Value;

use crate::fixtures::*;
use crate::scene::scenario;

#[tokio::test]
async fn deleting_a_policy_unwires_it() {
    scenario("gh-delete", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        ensure!(entry_of(cluster, &inject, Phase::Mutating).await?.is_some());
        create_pod_until(cluster, scene.ns(), "before", &[], |o| o.status.success()).await?;
        cluster
            .kubectl_ok(["delete", "policy", &inject], None)
            .await?;
        await_condition("unwired", WAIT, || async {
            Ok(entry_of(cluster, &inject, Phase::Mutating)
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        // Later Pods are untouched (allowing the API server a moment to see the change).
        create_pod_until(cluster, scene.ns(), "after", &["-o", "json"], |o| {
            o.status.success()
                && serde_json::from_slice::<Value>(&o.stdout)
                    .is_ok_and(|p| container_names(&p) == ["app"])
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn drift_is_repaired() {
    scenario("gh-drift", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        let entry = entry_of(cluster, &inject, Phase::Mutating)
            .await?
            .context("the Policy's entry")?;
        let timeout_of = |cfg: &Value| {
            cfg["webhooks"].as_array().and_then(|ws| {
                ws.iter()
                    .find(|w| w["name"] == entry.as_str())
                    .map(|w| w["timeoutSeconds"].clone())
            })
        };
        // Deleted: restored.
        cluster
            .kubectl_ok(
                ["delete", "mutatingwebhookconfiguration", "gatehouse"],
                None,
            )
            .await?;
        let started = Instant::now();
        await_condition(
            "configuration restored",
            Duration::from_secs(20),
            || async {
                Ok(entries(cluster, "mutatingwebhookconfiguration")
                    .await?
                    .contains(&entry)
                    .then_some(()))
            },
        )
        .await?;
        eprintln!("restored after delete in {:?}", started.elapsed());
        // Edited: repaired.
        let idx = entries(cluster, "mutatingwebhookconfiguration")
            .await?
            .iter()
            .position(|e| e == &entry)
            .context("entry")?;
        let patch =
            format!(r#"[{{"op":"replace","path":"/webhooks/{idx}/timeoutSeconds","value":29}}]"#);
        cluster
            .kubectl_ok(
                [
                    "patch",
                    "mutatingwebhookconfiguration",
                    "gatehouse",
                    "--type=json",
                    "-p",
                    &patch,
                ],
                None,
            )
            .await?;
        let started = Instant::now();
        await_condition("edit repaired", Duration::from_secs(20), || async {
            let cfg = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
                .await?
                .context("cfg")?;
            Ok((timeout_of(&cfg) == Some(Value::from(10))).then_some(()))
        })
        .await?;
        eprintln!("repaired after edit in {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn two_hundred_policies_coalesce_into_few_writes() {
    scenario("gh-many", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let names: Vec<String> = (0..200)
            .map(|i| scene.track(format!("many-{id}-{i:03}")))
            .collect();
        let all = list(
            names
                .iter()
                .map(|n| policy(n, scene.ns(), label(100, "many", "yes"))),
        );
        // The first pass after start-up writes both configurations once; count from here.
        let writes = "gatehouse_reconcile_webhook_configuration_writes_total";
        await_condition("initial configurations", WAIT, || async {
            Ok((scene.gh.metric_sum(writes, "").await? >= 2.0).then_some(()))
        })
        .await?;
        let before = scene.gh.metric_sum(writes, "").await?;
        let started = Instant::now();
        apply(cluster, &all).await?;
        let applied = started.elapsed();
        await_condition("200 Policies Ready", Duration::from_secs(120), || async {
            let out = cluster
                .kubectl_ok(["get", "policies", "-o", "json"], None)
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            let ready = v["items"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter(|p| {
                            p["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(&format!("many-{id}-")))
                                && p["status"]["conditions"][0]["status"] == "True"
                        })
                        .count()
                })
                .unwrap_or(0);
            Ok((ready == 200).then_some(()))
        })
        .await?;
        let all_ready = started.elapsed();
        // Shared: the 200 alike Policies are one entry, and every one of them is a member.
        let count = entries(cluster, "mutatingwebhookconfiguration").await?.len();
        ensure!(count == 1, "{count} mutating entries for 200 alike Policies");
        let members: usize = wired_groups(cluster)
            .await?
            .iter()
            .filter(|g| g.phase == Phase::Mutating)
            .map(|g| g.members.iter().filter(|m| names.contains(m)).count())
            .sum();
        ensure!(members == 200, "{members} of 200 Policies wired");
        let writes = scene.gh.metric_sum(writes, "").await? - before;
        eprintln!(
            "200 Policies: kubectl apply took {applied:?}, all Ready after {all_ready:?}, {writes} configuration writes"
        );
        // Coalesced: a handful of writes of the growing configuration, not one per Policy.
        ensure!(writes <= 20.0, "{writes} configuration writes for 200 Policies");
        Ok(())
    })
    .await;
}
