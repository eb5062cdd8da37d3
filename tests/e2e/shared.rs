//! Shared webhook entries on the real API server: many Policies in few entries, each still
//! matched, ordered and failing on its own.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, TestWebhook, await_condition};
use gatehouse_engine::Phase;
use gatehouse_engine::group;
use serde_json::{Value, json};

use crate::fixtures::{
    WAIT, apply, await_ready, container_names, create_pod_until, entries, entry_of, get_json,
    merge, pod, pod_policy, stderr,
};
use crate::scene::scenario;

/// A Policy for Pods in `ns` (CREATE, UPDATE and DELETE), with `spec` merged over that.
fn policy(name: &str, ns: &str, spec: Value) -> Value {
    pod_policy(name, ns, &["CREATE", "UPDATE", "DELETE"], spec)
}

/// Adds a container named `name`: the order of containers shows the order Policies ran in.
fn adds_container(name: &str) -> Value {
    json!({"mutate": [{"merge": {"spec": {"containers": [{"name": name, "image": "example.com/c:1"}]}}}]})
}

/// Applies all `policies` and waits until each is Ready.
async fn apply_all_ready(cluster: &Cluster, policies: &[Value]) -> anyhow::Result<()> {
    for p in policies {
        apply(cluster, p).await?;
    }
    for p in policies {
        let name = p["metadata"]["name"]
            .as_str()
            .context("a Policy without a name")?;
        await_ready(cluster, name, "True").await?;
    }
    Ok(())
}

#[tokio::test]
async fn sixteen_policies_share_one_entry_and_keep_their_order() {
    scenario("gh-shared", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let (id, ns) = (scene.id(), scene.ns().to_string());
        // Priorities against name order, so that priority, not name, must decide.
        let sixteen: Vec<Value> = (0..16)
            .map(|i| {
                let name = scene.track(format!("p{i:02}-{id}"));
                let mut spec = adds_container(&format!("c{i:02}"));
                merge(&mut spec, json!({"priority": 100 - i, "validate": [{"expression": "true", "message": "never"}]}));
                policy(&name, &ns, spec)
            })
            .collect();
            apply_all_ready(cluster, &sixteen).await?;
            let mutating = entries(cluster, "mutatingwebhookconfiguration").await?;
            let validating = entries(cluster, "validatingwebhookconfiguration").await?;
            ensure!(mutating.len() == 1, "mutating entries {mutating:?}");
            ensure!(validating.len() <= 3, "validating entries (self included) {validating:?}");
            let expected: Vec<String> = std::iter::once("app".to_string())
                .chain((0..16).rev().map(|i| format!("c{i:02}")))
                .collect();
            let out = create_pod_until(cluster, &ns, "sixteen", &["-o", "json"], |o| {
                serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|p| container_names(&p).len() == 17)
            })
            .await?;
            let stored: Value = serde_json::from_slice(&out.stdout)?;
            ensure!(container_names(&stored) == expected, "containers {:?}", container_names(&stored));

            // Mixed failure policies at interleaved priorities: the runs are exact.
            let flipped: Vec<Value> = [(2, "Ignore"), (3, "Ignore"), (9, "Ignore")]
                .into_iter()
                .map(|(i, fp)| {
                    let mut spec = adds_container(&format!("c{i:02}"));
                    merge(&mut spec, json!({"priority": 100 - i, "failurePolicy": fp, "validate": [{"expression": "true", "message": "never"}]}));
                    policy(&format!("p{i:02}-{id}"), &ns, spec)
                })
                .collect();
            apply_all_ready(cluster, &flipped).await?;
            // In run order (priority descending index): 15..10 Fail, 9 Ignore, 8..4 Fail,
            // 3..2 Ignore, 1..0 Fail.
            let runs: Vec<Vec<usize>> = vec![
                (10..16).rev().collect(),
                vec![9],
                (4..9).rev().collect(),
                vec![3, 2],
                vec![1, 0],
            ];
            let order = entries(cluster, "mutatingwebhookconfiguration").await?;
            ensure!(order.len() == runs.len(), "entries {order:?}");
            for (k, run) in runs.iter().enumerate() {
                for i in run {
                    let entry = entry_of(cluster, &format!("p{i:02}-{id}"), Phase::Mutating)
                        .await?
                        .context("unwired")?;
                    ensure!(entry == order[k], "p{i:02} in {entry}, want run {k} ({})", order[k]);
                }
            }
            let out = create_pod_until(cluster, &ns, "mixed", &["-o", "json"], |o| {
                o.status.success()
            })
            .await?;
            let stored: Value = serde_json::from_slice(&out.stdout)?;
            ensure!(container_names(&stored) == expected, "containers {:?}", container_names(&stored));
            Ok(())
    })
    .await;
}

/// Creates a Pod named `name` with `labels` in `ns`; returns kubectl's output.
pub(crate) async fn create_labelled(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<std::process::Output> {
    let mut pod: Value = serde_saphyr::from_str(&pod(name, ns))?;
    for (k, v) in labels {
        pod["metadata"]["labels"][*k] = json!(v);
    }
    cluster
        .kubectl_output(["create", "-f", "-", "-o", "json"], Some(&pod.to_string()))
        .await
}

#[tokio::test]
async fn selectors_and_conditions_choose_policies_inside_a_shared_entry() {
    scenario("gh-select", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let deny = |message: &str| json!({"validate": [{"expression": "false", "message": message}]});
        let by_ns = scene.policy("by-ns");
        let by_object = scene.policy("by-object");
        let by_condition = scene.policy("by-condition");
        let broken = scene.policy("broken");
        let works = scene.policy("works");
        let mut ns_spec = deny("team a is closed");
        merge(&mut ns_spec, json!({"match": {"namespaceSelector": {"matchLabels": {"team": "a"}}}}));
        let mut object_spec = deny("db pods are frozen");
        merge(&mut object_spec, json!({"match": {
            "rules": [{"operations": ["UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "objectSelector": {"matchLabels": {"tier": "db"}},
        }}));
        let mut condition_spec = deny("x- pods are refused");
        merge(&mut condition_spec, json!({"match": {"conditions": [{"name": "x-prefix", "expression": "object.metadata.name.startsWith('x-')"}]}}));
        // An Ignore run of two: the first throws at run time, the second must still apply.
        let broken_spec = json!({
            "priority": 10, "failurePolicy": "Ignore",
            "match": {"conditions": [{"name": "throws", "expression": "object.metadata.labels.missing == 'x'"}]},
            "mutate": [{"merge": {"metadata": {"labels": {"broken": "ran"}}}}],
        });
        let works_spec = json!({
            "priority": 20, "failurePolicy": "Ignore",
            "mutate": [{"merge": {"metadata": {"labels": {"works": "ran"}}}}],
        });
        let all = vec![
            policy(&by_ns, &ns, ns_spec),
            policy(&by_object, &ns, object_spec),
            policy(&by_condition, &ns, condition_spec),
            policy(&broken, &ns, broken_spec),
            policy(&works, &ns, works_spec),
        ];
        apply_all_ready(cluster, &all).await?;
        let validating = entries(cluster, "validatingwebhookconfiguration").await?;
        ensure!(validating.len() == 2, "one shared validating entry plus self: {validating:?}");
        let mutating = entries(cluster, "mutatingwebhookconfiguration").await?;
        ensure!(mutating.len() == 1, "one shared mutating entry: {mutating:?}");

        // The Ignore run: broken is skipped with a warning, works applies.
        let out = create_pod_until(cluster, &ns, "web", &["-o", "json"], |o| {
            serde_json::from_slice::<Value>(&o.stdout)
                .is_ok_and(|p| p["metadata"]["labels"]["works"] == "ran")
        })
        .await?;
        let web: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(web["metadata"]["labels"].get("broken").is_none(), "{web}");
        ensure!(
            stderr(&out).contains(&format!("policy \"{broken}\"")) && stderr(&out).contains("failurePolicy is Ignore"),
            "no warning for the skipped Policy: {}",
            stderr(&out)
        );

        // conditions
        let out = create_labelled(cluster, &ns, "x-web", &[]).await?;
        ensure!(!out.status.success() && stderr(&out).contains("x- pods are refused"), "{}", stderr(&out));
        // objectSelector on UPDATE (object and oldObject) and DELETE (oldObject only).
        let out = create_labelled(cluster, &ns, "db", &[("tier", "db")]).await?;
        ensure!(out.status.success(), "CREATE is not selected: {}", stderr(&out));
        let out = cluster.kubectl_output(["label", "pod", "db", "-n", &ns, "touched=yes"], None).await?;
        ensure!(!out.status.success() && stderr(&out).contains("db pods are frozen"), "UPDATE: {}", stderr(&out));
        let out = cluster.kubectl_output(["delete", "pod", "db", "-n", &ns, "--wait=false"], None).await?;
        ensure!(!out.status.success() && stderr(&out).contains("db pods are frozen"), "DELETE: {}", stderr(&out));
        let out = cluster.kubectl_output(["label", "pod", "web", "-n", &ns, "touched=yes"], None).await?;
        ensure!(out.status.success(), "a web Pod is not selected: {}", stderr(&out));

        // namespaceSelector: the Namespace is labelled now, after Gatehouse started.
        let out = create_labelled(cluster, &ns, "before-label", &[]).await?;
        ensure!(out.status.success(), "{}", stderr(&out));
        cluster.kubectl_ok(["label", "namespace", &ns, "team=a"], None).await?;
        let labelled = Instant::now();
        let mut attempt = 0;
        let took = await_condition("the label to select the namespace", WAIT, || {
            attempt += 1;
            let name = format!("after-label-{attempt}");
            let ns = ns.clone();
            async move {
                let out = create_labelled(cluster, &ns, &name, &[]).await?;
                Ok((!out.status.success() && stderr(&out).contains("team a is closed"))
                    .then(|| labelled.elapsed()))
            }
        })
        .await?;
        eprintln!("a Namespace label took effect after {took:?}");
        ensure!(took <= Duration::from_secs(1), "the label took {took:?} to take effect");
        // Policies are deleted first; the namespace's Pods go with it.
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_authorizer_condition_gets_its_own_entry() {
    scenario("gh-authz", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let admins = scene.policy("admins");
        let shared = scene.policy("shared");
        let admins_spec = json!({
            "priority": 10,
            "match": {"conditions": [{"name": "may-create", "expression": format!("authorizer.group('').resource('pods').namespace('{ns}').check('create').allowed()")}]},
            "mutate": [{"merge": {"metadata": {"labels": {"authorized": "yes"}}}}],
        });
        let shared_spec = json!({"priority": 20, "mutate": [{"merge": {"metadata": {"labels": {"shared": "yes"}}}}]});
        let all = vec![
            policy(&admins, &ns, admins_spec),
            policy(&shared, &ns, shared_spec),
        ];
        apply_all_ready(cluster, &all).await?;
        let cond = await_ready(cluster, &admins, "True").await?;
        ensure!(
            cond["message"].as_str().unwrap_or_default().contains("own webhook entry"),
            "the status does not say so: {cond}"
        );
        let cfg = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("mutating configuration")?;
        let admins_group = group::own(&serde_json::from_value::<Policy>(all[0].clone())?, Phase::Mutating);
        let own = admins_group.entry_name();
        let entry = cfg["webhooks"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["name"] == own.as_str()))
            .with_context(|| format!("no entry {own}: {cfg}"))?;
        ensure!(entry["matchConditions"][0]["name"] == "may-create", "{entry}");
        ensure!(
            entry["clientConfig"]["service"]["path"] == admins_group.path().as_str(),
            "{entry}"
        );
        ensure!(entry_of(cluster, &shared, Phase::Mutating).await? != Some(own.clone()));
        // The API server evaluates authorizer (the test user may create Pods): both apply.
        create_pod_until(cluster, &ns, "authorized", &["-o", "json"], |o| {
            serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|p| {
                p["metadata"]["labels"]["authorized"] == "yes" && p["metadata"]["labels"]["shared"] == "yes"
            })
        })
        .await?;
        Ok(())
    })
    .await;
}

/// Answers every request with a JSONPatch that adds the label `external: touched` when absent.
fn touch_label(request: &Value) -> Value {
    use base64::Engine as _;
    let labels = &request["object"]["metadata"]["labels"];
    if labels["external"] == "touched" {
        return json!({"allowed": true});
    }
    let has_labels = labels.is_object();
    let patch = if has_labels {
        json!([{"op": "add", "path": "/metadata/labels/external", "value": "touched"}])
    } else {
        json!([{"op": "add", "path": "/metadata/labels", "value": {"external": "touched"}}])
    };
    json!({
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string()),
    })
}

#[tokio::test]
async fn a_later_foreign_webhook_reinvokes_the_group_without_duplicates() {
    scenario("gh-foreign", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let (id, ns) = (scene.id(), scene.ns().to_string());
        let sidecar = scene.policy("sidecar");
        let label = scene.policy("label");
        let mut sidecar_spec = adds_container("proxy");
        merge(&mut sidecar_spec, json!({"priority": 10, "reinvocationPolicy": "IfNeeded"}));
        let label_spec = json!({
            "priority": 20, "reinvocationPolicy": "IfNeeded",
            "mutate": [{"merge": {"metadata": {"labels": {"team": "platform"}}}}],
        });
        let all = vec![
            policy(&sidecar, &ns, sidecar_spec),
            policy(&label, &ns, label_spec),
        ];
        // A foreign mutating webhook in a configuration that sorts after "gatehouse", so the
        // API server calls it after Gatehouse's entry and then reinvokes that entry.
        let hook = TestWebhook::start(&["127.0.0.1"], touch_label)?;
        let foreign = format!("zz-foreign-{id}");
        let config = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": foreign, "labels": {"gatehouse.dev/e2e": "true"}},
            "webhooks": [{
                "name": "foreign.e2e.gatehouse.dev",
                "clientConfig": {"url": hook.url("/touch"), "caBundle": hook.ca_bundle()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "sideEffects": "None", "failurePolicy": "Fail", "admissionReviewVersions": ["v1"],
                "reinvocationPolicy": "Never", "timeoutSeconds": 5,
            }],
        });
        apply(cluster, &config).await?;
        let _guard = cluster.delete_on_drop("mutatingwebhookconfiguration", &foreign, None);
        apply_all_ready(cluster, &all).await?;
        let evaluations = "gatehouse_policy_decisions_total";
        let of_sidecar = format!("policy=\"{sidecar}\"");
        let out = create_pod_until(cluster, &ns, "probe", &["--dry-run=server", "-o", "json"], |o| {
            serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|p| {
                p["metadata"]["labels"]["external"] == "touched" && container_names(&p).len() == 2
            })
        })
        .await?;
        drop(out);
        let before = scene.gh.metric_sum(evaluations, &of_sidecar).await?;
        let out = create_labelled(cluster, &ns, "app", &[]).await?;
        ensure!(out.status.success(), "{}", stderr(&out));
        let after = scene.gh.metric_sum(evaluations, &of_sidecar).await?;
        let stored = get_json(cluster, &["pod", "app", "-n", &ns]).await?.context("pod")?;
        ensure!(container_names(&stored) == ["app", "proxy"], "containers {:?}", container_names(&stored));
        let labels = &stored["metadata"]["labels"];
        ensure!(labels["team"] == "platform" && labels["external"] == "touched", "labels {labels}");
        // The first call runs the sidecar, then the label, then the sidecar once more (it
        // ran before the label changed the object); the API server's reinvocation after
        // the foreign webhook's change runs it once more, changing nothing.
        ensure!(after - before == 3.0, "the sidecar Policy ran {} times, want 3", after - before);
        Ok(())
    })
    .await;
}
