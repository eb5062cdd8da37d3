//! Scope before order: many tenants' namespace-scoped Policies under `Auto` run in-process, and
//! a request in one tenant's namespace reaches only that tenant's generated objects.

use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{Value, json};

use gatehouse_engine::matcher::selector_matches;

use crate::fixtures::{WAIT, get_json, pod_policy};
use crate::in_process_mutation::{
    apply_enforced, await_members, await_ready_condition, dry_run_stored, generated,
    generated_groups,
};
use crate::scene::scenario;

const TENANTS: usize = 32;
/// The tenant whose requests the test makes.
const SEVENTH: usize = 7;

/// Tenant `i`'s mutating Policy: its own label on every Pod of its namespace.
fn labelling(name: &str, ns: &str, i: usize) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({"enforcement": "Auto", "mutate": [{"merge": {"metadata": {"labels": {format!("tenant-{i}"): "yes"}}}}]}),
    )
}

/// Tenant `i`'s validating Policy: no Pod of its namespace carries `forbidden-<i>`.
fn forbidding(name: &str, ns: &str, i: usize) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({"enforcement": "Auto", "validate": [{
            "expression": format!("!has(object.metadata.labels) || !('forbidden-{i}' in object.metadata.labels)"),
            "message": format!("tenant {i} forbids the label forbidden-{i}"),
        }]}),
    )
}

fn pod(ns: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]}})
}

/// The labels of the namespace `ns`.
async fn namespace_labels(cluster: &Cluster, ns: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let namespace = get_json(cluster, &["namespace", ns])
        .await?
        .context("the namespace")?;
    Ok(serde_json::from_value(
        namespace["metadata"]["labels"].clone(),
    )?)
}

/// The generated admission policies of `kind` whose match constraints select the namespace
/// labelled `labels`, with what they stand for (`annotation`).
async fn selecting(
    cluster: &Cluster,
    kind: &str,
    annotation: &str,
    labels: &BTreeMap<String, String>,
) -> anyhow::Result<Vec<String>> {
    // Nothing listed prints nothing (`--ignore-not-found`).
    let listed = get_json(
        cluster,
        &[kind, "-l", "app.kubernetes.io/managed-by=gatehouse"],
    )
    .await?
    .unwrap_or_default();
    let mut found = Vec::new();
    for item in listed["items"].as_array().into_iter().flatten() {
        let selector = &item["spec"]["matchConstraints"]["namespaceSelector"];
        let selector: LabelSelector = serde_json::from_value(selector.clone()).unwrap_or_default();
        if selector_matches(&selector, |k| labels.get(k).map(String::as_str)) {
            let stands_for = item["metadata"]["annotations"][annotation]
                .as_str()
                .unwrap_or_default();
            found.push(format!(
                "{}: {stands_for}",
                item["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    Ok(found)
}

/// A create in tenant 7's namespace: labelled by tenant 7 alone, refused by tenant 7's rule
/// alone.
async fn only_the_seventh_applies(cluster: &Cluster, namespaces: &[String]) -> anyhow::Result<()> {
    let ns = &namespaces[SEVENTH];
    let stored = dry_run_stored(cluster, &pod(ns, json!({"app": "web"}))).await?;
    let tenant_labels: Vec<&String> = stored["metadata"]["labels"]
        .as_object()
        .map(|l| l.keys().filter(|k| k.starts_with("tenant-")).collect())
        .unwrap_or_default();
    ensure!(
        tenant_labels == ["tenant-7"],
        "stored in tenant 7's namespace: {stored:#}"
    );
    let refused = dry_run_stored(cluster, &pod(ns, json!({"forbidden-7": "x"}))).await;
    ensure!(
        refused.as_ref().is_err_and(|e| e
            .to_string()
            .contains("tenant 7 forbids the label forbidden-7")),
        "tenant 7's rule did not refuse: {refused:?}"
    );
    dry_run_stored(cluster, &pod(ns, json!({"forbidden-8": "x"})))
        .await
        .context("tenant 8's rule refused a Pod of tenant 7's namespace")?;
    Ok(())
}

/// Issue 39, test 1: 32 tenants, each with a namespace-scoped mutating and validating Policy
/// under `Auto`, all in-process: a Pod in tenant 7's namespace gets tenant 7's mutation only,
/// the generated objects that select its namespace hold tenant 7's Policies only, with
/// Gatehouse running and stopped. (All 64 Policies' generated objects in-process: the cap of
/// `--max-admission-policies` is raised to them; it has a test of its own below.)
#[tokio::test]
async fn a_tenants_requests_reach_only_its_own_generated_policies() {
    let all = (2 * TENANTS).to_string();
    let options = Options::url().arg("--max-admission-policies", &all);
    scenario("gh-tenants", options, async |scene| {
        let cluster = scene.cluster;
        let namespaces: Vec<String> =
            futures::future::try_join_all((0..TENANTS).map(|_| scene.namespace("gh-tenant")))
                .await?;
        let mutating: Vec<String> = (0..TENANTS)
            .map(|i| scene.policy(&format!("t{i}-label")))
            .collect();
        let validating: Vec<String> = (0..TENANTS)
            .map(|i| scene.policy(&format!("t{i}-forbid")))
            .collect();
        let policies: Vec<Value> = namespaces
            .iter()
            .enumerate()
            .flat_map(|(i, ns)| {
                [
                    labelling(&mutating[i], ns, i),
                    forbidding(&validating[i], ns, i),
                ]
            })
            .collect();
        apply_enforced(cluster, &policies, "InProcess").await?;
        // One generated mutating policy per tenant, each holding that tenant's Policy alone.
        for name in &mutating {
            await_members(cluster, &[name]).await?;
        }
        let groups = generated_groups(cluster).await?;
        let ours: Vec<_> = groups
            .iter()
            .filter(|g| g.members.iter().any(|m| mutating.contains(m)))
            .collect();
        ensure!(
            ours.len() == TENANTS
                && ours
                    .iter()
                    .all(|g| g.members.len() == 1 && g.name == generated(&g.members[0])),
            "{ours:#?}"
        );

        let labels = namespace_labels(cluster, &namespaces[SEVENTH]).await?;
        let mutations = selecting(
            cluster,
            "mutatingadmissionpolicies",
            "gatehouse.dev/policies",
            &labels,
        )
        .await?;
        ensure!(
            mutations == [format!("gatehouse-mutating-{0}: {0}", mutating[SEVENTH])],
            "mutating policies selecting tenant 7's namespace: {mutations:?}"
        );
        let validations = selecting(
            cluster,
            "validatingadmissionpolicies",
            "gatehouse.dev/policy",
            &labels,
        )
        .await?;
        ensure!(
            validations == [format!("gatehouse-{0}: {0}", validating[SEVENTH])],
            "validating policies selecting tenant 7's namespace: {validations:?}"
        );
        only_the_seventh_applies(cluster, &namespaces).await?;

        scene.gh.kill().await?;
        only_the_seventh_applies(cluster, &namespaces)
            .await
            .context("with Gatehouse stopped")?;
        scene.gh.restart().await?;
        Ok(())
    })
    .await;
}

/// Auto weighs the cluster: past `--max-admission-policies` generated admission policies, the
/// later Policies in (priority, name) order run on the webhook with the reason, and still
/// mutate and refuse there; when earlier ones go, they move in-process.
#[tokio::test]
async fn past_the_cap_auto_runs_later_tenants_on_the_webhook() {
    let options = Options::url().arg("--max-admission-policies", "2");
    scenario("gh-tenant-cap", options, async |scene| {
        let cluster = scene.cluster;
        let mut namespaces = Vec::new();
        let mut policies: Vec<Vec<Value>> = Vec::new();
        for i in 0..2 {
            let ns = scene.namespace("gh-tenant").await?;
            let (label, forbid) = (
                scene.policy(&format!("t{i}-label")),
                scene.policy(&format!("t{i}-forbid")),
            );
            policies.push(vec![labelling(&label, &ns, i), forbidding(&forbid, &ns, i)]);
            namespaces.push(ns);
        }
        // Tenant 0's two Policies come first by name: a generated policy each, the cap.
        apply_enforced(cluster, &policies[0], "InProcess").await?;
        apply_enforced(cluster, &policies[1], "Webhook").await?;
        for p in &policies[1] {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let ready = await_ready_condition(cluster, name, "True").await?;
            ensure!(
                ready["message"].as_str().is_some_and(|m| {
                    m.contains("past the 2 generated admission policies")
                        && m.contains("--max-admission-policies")
                }),
                "{name}: {ready:#}"
            );
        }
        let ns = &namespaces[1];
        let stored = dry_run_stored(cluster, &pod(ns, json!({"app": "web"}))).await?;
        ensure!(
            stored["metadata"]["labels"]["tenant-1"] == "yes",
            "through the webhook: {stored:#}"
        );
        let refused = dry_run_stored(cluster, &pod(ns, json!({"forbidden-1": "x"}))).await;
        ensure!(
            refused.is_err_and(|e| e.to_string().contains("tenant 1 forbids")),
            "tenant 1's rule on the webhook did not refuse"
        );
        let mut delete = vec!["delete", "policy"];
        delete.extend(
            policies[0]
                .iter()
                .filter_map(|p| p["metadata"]["name"].as_str()),
        );
        cluster.kubectl_ok(delete, None).await?;
        apply_enforced(cluster, &policies[1], "InProcess").await?;
        Ok(())
    })
    .await;
}

/// Issue 39, tests 3 and 4: joined mutations and Auto weighing the cost. Three Policies of one
/// match are joined into one mutation and run in-process. Three Policies of one scope matched
/// apart (a condition each), one mutation each, are past the crossover (a request would pay three
/// mutations in-process, where one webhook call costs less): all stay on the webhook with the
/// reason; with two deleted, the one left is within it and moves in-process.
#[tokio::test]
async fn joined_policies_run_in_process_and_auto_keeps_the_costly_on_the_webhook() {
    scenario("gh-crossover", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        // One match: joined, one mutation, in-process under Auto.
        let alike: Vec<String> = (0..3).map(|i| scene.policy(&format!("alike{i}"))).collect();
        let joined: Vec<Value> = alike
            .iter()
            .enumerate()
            .map(|(i, name)| labelling(name, &ns, i))
            .collect();
        apply_enforced(cluster, &joined, "InProcess").await?;
        await_members(
            cluster,
            &alike.iter().map(String::as_str).collect::<Vec<_>>(),
        )
        .await?;
        let generated_policy =
            get_json(cluster, &["mutatingadmissionpolicy", &generated(&alike[0])])
                .await?
                .context("the generated policy")?;
        let mutations = generated_policy["spec"]["mutations"]
            .as_array()
            .map_or(0, Vec::len);
        ensure!(
            mutations == 1,
            "{} mutations: {generated_policy:#}",
            mutations
        );
        let stored = dry_run_stored(cluster, &pod(&ns, json!({"app": "web"}))).await?;
        for i in 0..3 {
            ensure!(
                stored["metadata"]["labels"][format!("tenant-{i}")] == "yes",
                "joined in-process: {stored:#}"
            );
        }
        let mut delete = vec!["delete", "policy"];
        delete.extend(alike.iter().map(String::as_str));
        cluster.kubectl_ok(delete, None).await?;

        // Matched apart: three mutations, past the crossover.
        let names: Vec<String> = (0..3).map(|i| scene.policy(&format!("cost{i}"))).collect();
        let policies: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut p = labelling(name, &ns, i);
                p["spec"]["match"]["conditions"] =
                    json!([{"name": format!("own-{i}"), "expression": "true"}]);
                p
            })
            .collect();
        apply_enforced(cluster, &policies, "Webhook").await?;
        let past = "a request would pay the 3 mutations of the generated MutatingAdmissionPolicy";
        for name in &names {
            // Placed on the webhook for this reason once the schemas are read and weighed.
            await_condition(
                &format!("{name} on the webhook past the crossover"),
                WAIT,
                || async {
                    let ready = await_ready_condition(cluster, name, "True").await?;
                    let said = ready["message"].as_str().is_some_and(|m| m.contains(past));
                    Ok(said.then_some(()))
                },
            )
            .await?;
        }
        let stored = dry_run_stored(cluster, &pod(&ns, json!({"app": "web"}))).await?;
        for i in 0..3 {
            ensure!(
                stored["metadata"]["labels"][format!("tenant-{i}")] == "yes",
                "through the webhook: {stored:#}"
            );
        }
        cluster
            .kubectl_ok(["delete", "policy", &names[1], &names[2]], None)
            .await?;
        await_members(cluster, &[&names[0]]).await?;
        apply_enforced(cluster, &policies[..1], "InProcess").await?;
        Ok(())
    })
    .await;
}

/// An overwrite of the label `tier` with the Policy's own name, at `priority`, in-process.
fn tier(name: &str, ns: &str, priority: i32) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({
            "priority": priority, "enforcement": "InProcess",
            "mutate": [{"merge": {"metadata": {"labels": {"tier": name}}}, "overwrite": true}],
        }),
    )
}

/// Issue 39, test 2: order stays exact where scopes overlap. Two Policies of one namespace sit
/// between Policies of two others in (priority, name) order: three generated policies, the
/// overlapping pair in one, in order; the last of the pair wins in its namespace, and again
/// when their priorities swap.
#[tokio::test]
async fn overlapping_policies_between_disjoint_ones_keep_their_order() {
    scenario("gh-overlap", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let namespaces: Vec<String> =
            futures::future::try_join_all((0..3).map(|_| scene.namespace("gh-overlap"))).await?;
        let (a, x, y, z) = (
            scene.policy("a-first"),
            scene.policy("x-middle"),
            scene.policy("y-middle"),
            scene.policy("z-last"),
        );
        let policies = |x_priority: i32, y_priority: i32| {
            vec![
                tier(&a, &namespaces[0], 10),
                tier(&x, &namespaces[1], x_priority),
                tier(&y, &namespaces[1], y_priority),
                tier(&z, &namespaces[2], 40),
            ]
        };
        let tier_in = |ns: String| async move {
            let stored = dry_run_stored(cluster, &pod(&ns, json!({"app": "web"}))).await?;
            anyhow::Ok(
                stored["metadata"]["labels"]["tier"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        };
        apply_enforced(cluster, &policies(20, 30), "InProcess").await?;
        for members in [
            vec![a.as_str()],
            vec![x.as_str(), y.as_str()],
            vec![z.as_str()],
        ] {
            await_members(cluster, &members).await?;
        }
        let groups = generated_groups(cluster).await?;
        ensure!(
            groups
                .iter()
                .any(|g| g.members == [x.clone(), y.clone()] && g.name == generated(&x)),
            "{groups:#?}"
        );
        ensure!(tier_in(namespaces[0].clone()).await? == a, "namespace one");
        ensure!(
            tier_in(namespaces[1].clone()).await? == y,
            "the last of the pair wins"
        );
        ensure!(
            tier_in(namespaces[2].clone()).await? == z,
            "namespace three"
        );

        // The pair's order swapped: one policy, now led by y, and x wins.
        apply_enforced(cluster, &policies(30, 20), "InProcess").await?;
        await_members(cluster, &[&y, &x]).await?;
        await_condition("x wins once reordered", WAIT, || async {
            Ok((tier_in(namespaces[1].clone()).await? == x).then_some(()))
        })
        .await?;
        ensure!(
            tier_in(namespaces[0].clone()).await? == a,
            "namespace one after the swap"
        );
        Ok(())
    })
    .await;
}
