//! An outage's blast radius on the real API server: with Gatehouse down, `Fail` entries refuse
//! exactly the requests their Policies' selectors cover, because each shared entry carries the
//! union of its members' namespaceSelectors and objectSelectors, and the API server evaluates
//! them itself.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::{
    apply, await_ready, create_pod_until, get_json, merge, policy_object, stderr,
};
use crate::scene::scenario;
use crate::shared::create_labelled;

/// What the API server says when it cannot reach a webhook.
const UNREACHABLE: &str = "failed calling webhook";

/// A `Fail` Policy for Pod creates, with `spec` merged over that.
fn pod_create_policy(name: &str, spec: Value) -> Value {
    let mut full = json!({
        "failurePolicy": "Fail",
        "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]},
    });
    merge(&mut full, spec);
    policy_object(name, full)
}

/// Refuses only Pods named `probe-denied…`: proof that the entry is live, while it answers.
fn refuses_probe() -> Value {
    json!({"validate": [{"expression": "!object.metadata.name.startsWith('probe-denied')", "message": "probe refused"}]})
}

/// The resourceVersions of both configurations.
async fn configuration_versions(cluster: &Cluster) -> anyhow::Result<Vec<Value>> {
    let mut versions = Vec::new();
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        let cfg = get_json(cluster, &[kind, "gatehouse"])
            .await?
            .with_context(|| format!("no {kind}"))?;
        versions.push(cfg["metadata"]["resourceVersion"].clone());
    }
    Ok(versions)
}

/// Waits until creating `name` in `ns` is refused with a message containing `reason`; returns
/// how long that took.
async fn refused_within(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    reason: &str,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut attempt = 0;
    await_condition(
        &format!("a Pod in {ns} refused with {reason:?}"),
        Duration::from_secs(30),
        || {
            attempt += 1;
            let name = format!("{name}-{attempt}");
            async move {
                let out = create_labelled(cluster, ns, &name, labels).await?;
                Ok((!out.status.success() && stderr(&out).contains(reason))
                    .then(|| started.elapsed()))
            }
        },
    )
    .await
}

#[tokio::test]
async fn with_gatehouse_down_only_the_policies_scopes_fail_closed() {
    scenario("gh-outage", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (key_a, key_b, key_tier) = ("outage-team-a", "outage-team-b", "outage-tier");
        let in_a = scene.namespace("gh-out-a").await?;
        let in_b = scene.namespace("gh-out-b").await?;
        let unrelated = scene.namespace("gh-out-u").await?;
        let later = scene.namespace("gh-out-l").await?;
        let flipped = scene.namespace("gh-out-m").await?;
        cluster
            .kubectl_ok(
                ["label", "namespace", &in_a, &format!("{key_a}={id}")],
                None,
            )
            .await?;
        cluster
            .kubectl_ok(
                ["label", "namespace", &in_b, &format!("{key_b}={id}")],
                None,
            )
            .await?;

        let by_ns_a = scene.policy("out-ns-a");
        let by_ns_b = scene.policy("out-ns-b");
        let by_object = scene.policy("out-obj");
        let mut ns_a = refuses_probe();
        merge(
            &mut ns_a,
            json!({"match": {"namespaceSelector": {"matchLabels": {key_a: id}}}}),
        );
        let ns_b = json!({
            "match": {"namespaceSelector": {"matchLabels": {key_b: id}}},
            "mutate": [{"merge": {"metadata": {"labels": {"outage-mutated": "yes"}}}}],
        });
        let mut object = refuses_probe();
        merge(
            &mut object,
            json!({"match": {"objectSelector": {"matchLabels": {key_tier: id}}}}),
        );
        for (name, spec) in [(&by_ns_a, ns_a), (&by_ns_b, ns_b), (&by_object, object)] {
            apply(cluster, &pod_create_policy(name, spec)).await?;
        }
        for name in [&by_ns_a, &by_ns_b, &by_object] {
            await_ready(cluster, name, "True").await?;
        }

        // Each entry selects its members' scope: two validating entries besides the self
        // entry (a namespace scope and an object scope have no exact union), one mutating.
        let validating = get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("validating configuration")?;
        let shared: Vec<&Value> = validating["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| {
                w["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with(".validate.gatehouse.dev"))
            })
            .collect();
        ensure!(shared.len() == 2, "validating entries {shared:?}");
        ensure!(
            // The API server stores an absent selector as `{}`.
            shared.iter().any(
                |w| w["namespaceSelector"]["matchLabels"][key_a] == id.as_str()
                    && w["objectSelector"].as_object().is_none_or(|o| o.is_empty())
            ),
            "no entry selecting namespace scope A alone: {shared:?}"
        );
        ensure!(
            shared
                .iter()
                .any(|w| w["objectSelector"]["matchLabels"][key_tier] == id.as_str()),
            "no entry selecting the object scope: {shared:?}"
        );
        let mutating = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("mutating configuration")?;
        ensure!(
            mutating["webhooks"][0]["namespaceSelector"]["matchLabels"][key_b] == id.as_str(),
            "the mutating entry does not select scope B: {mutating}"
        );

        // While Gatehouse answers, each entry is live and judges exactly.
        refused_within(cluster, &in_a, "probe-denied", &[], "probe refused").await?;
        refused_within(
            cluster,
            &unrelated,
            "probe-denied",
            &[(key_tier, &id)],
            "probe refused",
        )
        .await?;
        create_pod_until(cluster, &in_b, "mutated", &["-o", "json"], |o| {
            serde_json::from_slice::<Value>(&o.stdout)
                .is_ok_and(|p| p["metadata"]["labels"]["outage-mutated"] == "yes")
        })
        .await?;

        // A Namespace labelled into scope after Gatehouse started: the entries do not depend on
        // Namespaces, so nothing is rewritten (the API server evaluates the selector itself).
        let before = configuration_versions(cluster).await?;
        cluster
            .kubectl_ok(
                ["label", "namespace", &later, &format!("{key_a}={id}")],
                None,
            )
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            configuration_versions(cluster).await? == before,
            "a Namespace label rewrote the configurations"
        );
        refused_within(cluster, &later, "probe-denied", &[], "probe refused").await?;

        // The outage: Gatehouse killed, as in a crash; its configurations stay.
        scene.gh.kill().await?;
        for (ns, labels, what) in [
            (&in_a, vec![], "namespace scope A (validating)"),
            (&in_b, vec![], "namespace scope B (mutating)"),
            (
                &later,
                vec![],
                "a Namespace labelled into scope A after start",
            ),
            (
                &unrelated,
                vec![(key_tier, id.as_str())],
                "an object in the object scope",
            ),
        ] {
            let out = create_labelled(cluster, ns, "during-outage", &labels).await?;
            ensure!(
                !out.status.success() && stderr(&out).contains(UNREACHABLE),
                "{what} did not fail closed: {}",
                stderr(&out)
            );
        }
        for (labels, what) in [
            (vec![], "an unlabelled Pod"),
            (vec![("tier", "web")], "a Pod of another label"),
        ] {
            let out = create_labelled(
                cluster,
                &unrelated,
                &format!("outside-{}", labels.len()),
                &labels,
            )
            .await?;
            ensure!(
                out.status.success(),
                "{what} in an unrelated namespace was refused: {}",
                stderr(&out)
            );
        }

        // A Namespace's labels changing while Gatehouse is down: in scope at once, as far as the
        // API server's own view of the Namespace goes.
        let out = create_labelled(cluster, &flipped, "before-label", &[]).await?;
        ensure!(
            out.status.success(),
            "out of scope, yet refused: {}",
            stderr(&out)
        );
        cluster
            .kubectl_ok(
                ["label", "namespace", &flipped, &format!("{key_b}={id}")],
                None,
            )
            .await?;
        let took = refused_within(cluster, &flipped, "after-label", &[], UNREACHABLE).await?;
        eprintln!("outage: a Namespace labelled into scope failed closed after {took:?}");

        // Back up: every scope answers again.
        scene.gh.restart().await?;
        create_pod_until(cluster, &flipped, "recovered", &["-o", "json"], |o| {
            serde_json::from_slice::<Value>(&o.stdout)
                .is_ok_and(|p| p["metadata"]["labels"]["outage-mutated"] == "yes")
        })
        .await?;
        Ok(())
    })
    .await;
}
