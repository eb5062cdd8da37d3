//! Mutating Policies run in (priority, name) order on one copy of the object, validating ones
//! judge the final object, and a reinvocation changes nothing Gatehouse already did.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_engine::Phase;
use serde_json::Value;

use crate::fixtures::*;
use crate::scene::{Scene, scenario};

/// Scenario 1, in the given mode.
async fn order_matters(scene: &mut Scene) -> anyhow::Result<()> {
    let cluster = scene.cluster;
    let (inject, limits) = (scene.policy("inject"), scene.policy("require-limits"));
    let no_limits = policy(&inject, scene.ns(), sidecar(100, false, false));
    apply_ready(cluster, &no_limits).await?;
    apply_ready(cluster, &policy(&limits, scene.ns(), require_limits())).await?;

    // The sidecar injected by the mutating Policy has no limits, and the validating Policy
    // judges the final object: the Pod is rejected, naming the validating Policy.
    // Wait for that denial, not any failure: on a loaded machine a create can also fail while
    // the API server's informers catch up (a webhook call timing out), which says nothing
    // about the order.
    let denial = "every container must declare resource limits";
    let out = create_pod_until(cluster, scene.ns(), "app", &[], |o| {
        !o.status.success() && stderr(o).contains(denial)
    })
    .await?;
    let err = stderr(&out);
    ensure!(
        err.contains(&limits),
        "rejection should name {limits} and its message: {err}"
    );

    // Give the sidecar limits: admitted, with the sidecar exactly once.
    apply_sidecar(cluster, &inject, scene.ns()).await?;
    create_pod_until(cluster, scene.ns(), "app", &[], |o| o.status.success()).await?;
    let stored = get_json(cluster, &["pod", "app", "-n", scene.ns()])
        .await?
        .context("pod not stored")?;
    let names = container_names(&stored);
    ensure!(names == ["app", "proxy"], "containers: {names:?}");
    Ok(())
}

#[tokio::test]
async fn order_matters_service_mode() {
    scenario("gh-order", Options::service(), order_matters).await;
}

#[tokio::test]
async fn order_matters_url_mode() {
    scenario("gh-order", Options::url(), order_matters).await;
}

#[tokio::test]
async fn reinvocation_keeps_one_sidecar() {
    scenario("gh-reinvoke", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let (a, b) = (scene.policy("a-sidecar"), scene.policy("b-label"));
        apply_ready(cluster, &policy(&a, scene.ns(), sidecar(10, true, true))).await?;
        apply_ready(
            cluster,
            &policy(&b, scene.ns(), label(20, "team", "platform")),
        )
        .await?;
        // A reinvokes and B does not: two runs, two entries, A's first.
        let order = entries(cluster, "mutatingwebhookconfiguration").await?;
        let (entry_a, entry_b) = (
            entry_of(cluster, &a, Phase::Mutating)
                .await?
                .context("A unwired")?,
            entry_of(cluster, &b, Phase::Mutating)
                .await?
                .context("B unwired")?,
        );
        let pos = |e: &str| order.iter().position(|x| x == e);
        ensure!(
            entry_a != entry_b && pos(&entry_a) < pos(&entry_b),
            "entry order {order:?}"
        );

        // Wait until both are in effect (a dry run shows label and sidecar), then create
        // one Pod and count how often A was asked.
        create_pod_until(
            cluster,
            scene.ns(),
            "probe",
            &["--dry-run=server", "-o", "json"],
            |o| {
                serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|p| {
                    p["metadata"]["labels"]["team"] == "platform" && container_names(&p).len() == 2
                })
            },
        )
        .await?;
        let evaluations = "gatehouse_policy_decisions_total";
        let of_a = format!("policy=\"{a}\"");
        let before = scene.gh.metric_sum(evaluations, &of_a).await?;
        cluster
            .kubectl_ok(["create", "-f", "-"], Some(&pod("app", scene.ns())))
            .await?;
        let after = scene.gh.metric_sum(evaluations, &of_a).await?;
        let stored = get_json(cluster, &["pod", "app", "-n", scene.ns()])
            .await?
            .context("pod")?;
        ensure!(
            container_names(&stored) == ["app", "proxy"],
            "containers {:?}",
            container_names(&stored)
        );
        ensure!(
            stored["metadata"]["labels"]["team"] == "platform",
            "label missing: {stored}"
        );
        // B changed the object after A, so the API server invoked A a second time, and A's
        // second run added nothing.
        ensure!(
            after - before == 2.0,
            "policy A was called {} times, want 2",
            after - before
        );
        Ok(())
    })
    .await;
}
