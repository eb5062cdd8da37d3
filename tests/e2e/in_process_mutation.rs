//! In-process mutation: mutating Policies the API server runs itself, as generated
//! MutatingAdmissionPolicies `gatehouse-mutating-<first member>` (one per group of Policies that
//! can match the same requests), in (priority, name) order, storing what the webhook path
//! stores.

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, TestWebhook, await_condition};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, container_names, get_json, pod_policy, wired_groups};
use crate::scene::scenario;

/// The generated MutatingAdmissionPolicy (and binding) whose first member is `first`.
pub(crate) fn generated(first: &str) -> String {
    format!("gatehouse-mutating-{first}")
}

/// A generated MutatingAdmissionPolicy as stored: its name, its members in order, and whether
/// its binding is there.
#[derive(Debug)]
pub(crate) struct GeneratedGroup {
    pub name: String,
    pub members: Vec<String>,
    pub bound: bool,
}

/// The generated MutatingAdmissionPolicies.
pub(crate) async fn generated_groups(cluster: &Cluster) -> anyhow::Result<Vec<GeneratedGroup>> {
    let selector = "gatehouse.dev/generated=mutating";
    let list = |kind: &'static str| async move {
        // Nothing listed prints nothing (`--ignore-not-found`).
        let listed = get_json(cluster, &[kind, "-l", selector]).await?;
        anyhow::Ok(
            listed
                .and_then(|l| l["items"].as_array().cloned())
                .unwrap_or_default(),
        )
    };
    let bindings: Vec<String> = list("mutatingadmissionpolicybindings")
        .await?
        .iter()
        .filter_map(|b| b["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    Ok(list("mutatingadmissionpolicies")
        .await?
        .iter()
        .map(|p| {
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            GeneratedGroup {
                bound: bindings.contains(&name),
                members: p["metadata"]["annotations"]["gatehouse.dev/policies"]
                    .as_str()
                    .unwrap_or_default()
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
                name,
            }
        })
        .collect())
}

/// The drop-BPF sample: every container not from the internal registry drops BPF.
fn drop_bpf(name: &str, ns: &str, enforcement: &str) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({
            "priority": 50, "enforcement": enforcement,
            "mutate": [{
                "forEach": "spec.containers",
                "when": "!element.image.startsWith('registry.internal/')",
                "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}},
            }],
        }),
    )
}

/// A label Policy at `priority`.
fn labels(name: &str, ns: &str, priority: i32, enforcement: &str) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({
            "priority": priority, "enforcement": enforcement,
            "mutate": [{"merge": {"metadata": {"labels": {"team": "platform"}}}}],
        }),
    )
}

/// The inject-proxy sample: a sidecar, reinvoked when needed.
fn inject_proxy(name: &str, ns: &str, enforcement: &str) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({
            "priority": 100, "reinvocationPolicy": "IfNeeded", "enforcement": enforcement,
            "mutate": [{"merge": {"spec": {"containers": [{"name": "proxy", "image": "example.com/proxy:1.0"}]}}}],
        }),
    )
}

/// A Pod with a container from the internal registry and one from elsewhere.
fn two_containers(name: &str, ns: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [
                {"name": "app", "image": "example.com/app:1.0"},
                {"name": "internal", "image": "registry.internal/tool:2"},
            ],
        },
    })
}

/// The object a server-dry-run create of `object` stores, without what differs between
/// creates.
pub(crate) async fn dry_run_stored(cluster: &Cluster, object: &Value) -> anyhow::Result<Value> {
    let out = cluster
        .kubectl_output(
            ["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&object.to_string()),
        )
        .await?;
    if !out.status.success() {
        bail!(
            "the create was refused: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut stored: Value = serde_json::from_slice(&out.stdout)?;
    if let Some(meta) = stored["metadata"].as_object_mut() {
        meta.retain(|k, _| matches!(k.as_str(), "name" | "namespace" | "labels" | "annotations"));
    }
    Ok(stored)
}

/// Applies every Policy (one `kubectl apply`) and waits until each reports `enforcement` at its
/// generation.
pub(crate) async fn apply_enforced(
    cluster: &Cluster,
    policies: &[Value],
    enforcement: &str,
) -> anyhow::Result<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": policies});
    apply(cluster, &list).await?;
    let mut names = Vec::new();
    for p in policies {
        names.push(
            p["metadata"]["name"]
                .as_str()
                .context("a Policy without a name")?
                .to_string(),
        );
    }
    await_condition(
        &format!("{} Policies enforced {enforcement}", names.len()),
        WAIT,
        || async {
            let listed = cluster
                .kubectl_ok(["get", "policies", "-o", "json"], None)
                .await?;
            let listed: Value = serde_json::from_str(&listed)?;
            let enforced = listed["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| {
                    names.iter().any(|n| p["metadata"]["name"] == n.as_str())
                        && p["status"]["observedGeneration"] == p["metadata"]["generation"]
                        && p["status"]["enforcement"] == enforcement
                })
                .count();
            Ok((enforced == names.len()).then_some(()))
        },
    )
    .await
}

/// The Ready condition of Policy `name` once it is at its generation.
pub(crate) async fn await_ready_condition(
    cluster: &Cluster,
    name: &str,
    status: &str,
) -> anyhow::Result<Value> {
    await_condition(&format!("Policy {name} Ready={status}"), WAIT, || async {
        let Some(p) = get_json(cluster, &["policy", name]).await? else {
            return Ok(None);
        };
        let ready = p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .cloned();
        Ok(ready.filter(|c| {
            c["status"] == status && c["observedGeneration"] == p["metadata"]["generation"]
        }))
    })
    .await
}

/// Once the generated MutatingAdmissionPolicies hold `want` in-process and nothing else of
/// theirs: each of `want` in exactly one bound generated policy, every generated policy holding
/// one of them holding only Policies of `want`, in `want`'s order.
pub(crate) async fn await_members(cluster: &Cluster, want: &[&str]) -> anyhow::Result<()> {
    await_condition(
        &format!("generated policies holding {}", want.join(",")),
        WAIT,
        || async {
            let groups = generated_groups(cluster).await?;
            let holding: Vec<&GeneratedGroup> = groups
                .iter()
                .filter(|g| g.members.iter().any(|m| want.contains(&m.as_str())))
                .collect();
            let each_once = want.iter().all(|w| {
                holding
                    .iter()
                    .flat_map(|g| &g.members)
                    .filter(|m| m == w)
                    .count()
                    == 1
            });
            let only_these_in_order = holding.iter().all(|g| {
                g.bound
                    && g.members.iter().all(|m| want.contains(&m.as_str()))
                    && g.members
                        .is_sorted_by_key(|m| want.iter().position(|w| w == m))
            });
            Ok((each_once && only_these_in_order).then_some(()))
        },
    )
    .await
}

/// Once no generated MutatingAdmissionPolicy holds one of `names`.
pub(crate) async fn await_out_of_process(cluster: &Cluster, names: &[&str]) -> anyhow::Result<()> {
    await_condition(
        &format!("{} out of the generated policies", names.join(",")),
        WAIT,
        || async {
            let groups = generated_groups(cluster).await?;
            let held = groups
                .iter()
                .any(|g| g.members.iter().any(|m| names.contains(&m.as_str())));
            Ok((!held).then_some(()))
        },
    )
    .await
}

/// Test 1: the samples' drop-BPF defaulting, a label and the sidecar, compiled in-process,
/// store what the webhook path stores, with Gatehouse running and stopped; the generated
/// objects go when the Policies do.
#[tokio::test]
async fn mutating_policies_run_in_the_api_server_with_gatehouse_stopped() {
    scenario("gh-inmut", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let (drop, label, proxy) = (
            scene.policy("inmut-drop-bpf"),
            scene.policy("inmut-label"),
            scene.policy("inmut-proxy"),
        );
        let policies = |enforcement: &str| {
            vec![
                drop_bpf(&drop, &ns, enforcement),
                labels(&label, &ns, 60, enforcement),
                inject_proxy(&proxy, &ns, enforcement),
            ]
        };
        let pod = two_containers("p", &ns);
        apply_enforced(cluster, &policies("Webhook"), "Webhook").await?;
        let through_webhook = dry_run_stored(cluster, &pod).await?;
        ensure!(
            container_names(&through_webhook) == ["app", "internal", "proxy"]
                && through_webhook["metadata"]["labels"]["team"] == "platform"
                && through_webhook["spec"]["containers"][0]["securityContext"]["capabilities"]["drop"] == json!(["BPF"])
                && through_webhook["spec"]["containers"][1]["securityContext"].is_null()
                && through_webhook["spec"]["containers"][2]["securityContext"].is_null(),
            "the webhook path: {through_webhook:#}"
        );

        apply_enforced(cluster, &policies("InProcess"), "InProcess").await?;
        await_members(cluster, &[&drop, &label, &proxy]).await?;
        let wired = wired_groups(cluster).await?;
        ensure!(
            !wired.iter().any(|g| g
                .members
                .iter()
                .any(|m| [&drop, &label, &proxy].contains(&m))),
            "an in-process Policy is still in a webhook entry: {wired:?}"
        );
        let in_process = dry_run_stored(cluster, &pod).await?;
        ensure!(
            in_process == through_webhook,
            "in-process stores\n{in_process:#}\nthe webhook path\n{through_webhook:#}"
        );

        scene.gh.kill().await?;
        let stopped = dry_run_stored(cluster, &pod).await?;
        ensure!(
            stopped == through_webhook,
            "with Gatehouse stopped the API server stores\n{stopped:#}\nthe webhook path\n{through_webhook:#}"
        );
        scene.gh.restart().await?;

        cluster
            .kubectl_ok(["delete", "policy", &drop, &label, &proxy], None)
            .await?;
        let removed = generated(&drop);
        await_condition("the generated MutatingAdmissionPolicy removed", WAIT, || async {
            let policy = get_json(cluster, &["mutatingadmissionpolicy", &removed]).await?;
            let binding = get_json(cluster, &["mutatingadmissionpolicybinding", &removed]).await?;
            Ok((policy.is_none() && binding.is_none()).then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

/// An overwrite of the label `tier` at `priority`.
fn tier(name: &str, ns: &str, priority: i32, enforcement: &str) -> Value {
    pod_policy(
        name,
        ns,
        &["CREATE"],
        json!({
            "priority": priority, "enforcement": enforcement,
            "mutate": [{"merge": {"metadata": {"labels": {"tier": name}}}, "overwrite": true}],
        }),
    )
}

/// Test 3: Policies writing the same label at different priorities: the last in (priority,
/// name) order wins in-process and mixed with webhook-only Policies; a Policy after one on the
/// webhook cannot move in and says so.
#[tokio::test]
async fn the_last_policy_in_priority_then_name_order_wins_in_process_too() {
    scenario("gh-inmut-order", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        // a < b < c by (priority, name): c is named last but b and c share a priority.
        let (a, b, c) = (
            scene.policy("order-a"),
            scene.policy("order-b"),
            scene.policy("order-c"),
        );
        let pod = two_containers("p", &ns);
        let tier_of = async || -> anyhow::Result<String> {
            let stored = dry_run_stored(cluster, &pod).await?;
            Ok(stored["metadata"]["labels"]["tier"]
                .as_str()
                .unwrap_or_default()
                .to_string())
        };
        let settled = async |want: &str| {
            await_condition(&format!("tier {want}"), WAIT, || async {
                Ok((tier_of().await? == want).then_some(()))
            })
            .await
        };

        apply_enforced(
            cluster,
            &[
                tier(&c, &ns, 20, "Webhook"),
                tier(&b, &ns, 20, "Webhook"),
                tier(&a, &ns, 10, "Webhook"),
            ],
            "Webhook",
        )
        .await?;
        ensure!(
            tier_of().await? == c,
            "on the webhook the last in order wins"
        );

        apply_enforced(
            cluster,
            &[
                tier(&a, &ns, 10, "InProcess"),
                tier(&b, &ns, 20, "InProcess"),
                tier(&c, &ns, 20, "InProcess"),
            ],
            "InProcess",
        )
        .await?;
        await_members(cluster, &[&a, &b, &c]).await?;
        ensure!(tier_of().await? == c, "in-process the last in order wins");

        // Mixed: the last one on the webhook.
        apply_enforced(cluster, &[tier(&c, &ns, 20, "Webhook")], "Webhook").await?;
        await_members(cluster, &[&a, &b]).await?;
        settled(&c).await?;

        // The middle one on the webhook: the last cannot run in-process after it.
        apply_enforced(cluster, &[tier(&b, &ns, 20, "Webhook")], "Webhook").await?;
        apply(cluster, &tier(&c, &ns, 20, "InProcess")).await?;
        let refused = await_ready_condition(cluster, &c, "False").await?;
        ensure!(
            refused["reason"] == "CannotRunInProcess"
                && refused["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&format!("Policy {b} comes before it"))),
            "{refused}"
        );
        await_members(cluster, &[&a]).await?;
        settled(&b).await?;
        // Under Auto it stays on the webhook, after the middle one: it wins again.
        apply_enforced(cluster, &[tier(&c, &ns, 20, "Auto")], "Webhook").await?;
        settled(&c).await?;
        Ok(())
    })
    .await;
}

/// Adds the label `external: touched` and a container `foreign` when absent.
fn touch(request: &Value) -> Value {
    use base64::Engine as _;
    let object = &request["object"];
    let mut patch = Vec::new();
    if object["metadata"]["labels"]["external"] != "touched" {
        patch.push(if object["metadata"]["labels"].is_object() {
            json!({"op": "add", "path": "/metadata/labels/external", "value": "touched"})
        } else {
            json!({"op": "add", "path": "/metadata/labels", "value": {"external": "touched"}})
        });
    }
    if !container_names(object).iter().any(|n| n == "foreign") {
        patch.push(json!({"op": "add", "path": "/spec/containers/-", "value": {"name": "foreign", "image": "example.com/foreign:1"}}));
    }
    if patch.is_empty() {
        return json!({"allowed": true});
    }
    json!({
        "allowed": true,
        "patchType": "JSONPatch",
        "patch": base64::engine::general_purpose::STANDARD.encode(Value::Array(patch).to_string()),
    })
}

/// Test 4: a foreign mutating webhook that changes the object after the in-process mutations
/// (and is reinvoked) leaves no duplicated element, and the object stored is the webhook path's.
#[tokio::test]
async fn a_foreign_webhook_after_in_process_mutations_changes_nothing_twice() {
    scenario("gh-inmut-foreign", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let (id, ns) = (scene.id(), scene.ns().to_string());
        let (drop, label, proxy) = (
            scene.policy("foreign-drop-bpf"),
            scene.policy("foreign-label"),
            scene.policy("foreign-proxy"),
        );
        let policies = |enforcement: &str| {
            let mut label = labels(&label, &ns, 60, enforcement);
            label["spec"]["reinvocationPolicy"] = json!("IfNeeded");
            vec![
                drop_bpf(&drop, &ns, enforcement),
                label,
                inject_proxy(&proxy, &ns, enforcement),
            ]
        };
        let hook = TestWebhook::start(&["127.0.0.1"], touch)?;
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
                "reinvocationPolicy": "IfNeeded", "timeoutSeconds": 5,
            }],
        });
        apply(cluster, &config).await?;
        let _guard = cluster.delete_on_drop("mutatingwebhookconfiguration", &foreign, None);
        let pod = two_containers("p", &ns);
        let foreign_seen = |stored: &Value| {
            stored["metadata"]["labels"]["external"] == "touched"
                && container_names(stored).iter().any(|n| n == "foreign")
        };

        apply_enforced(cluster, &policies("Webhook"), "Webhook").await?;
        let through_webhook = await_condition("the foreign webhook called", WAIT, || async {
            let stored = dry_run_stored(cluster, &pod).await?;
            Ok(foreign_seen(&stored).then_some(stored))
        })
        .await?;
        ensure!(
            container_names(&through_webhook) == ["app", "internal", "proxy", "foreign"],
            "the webhook path: {through_webhook:#}"
        );

        apply_enforced(cluster, &policies("InProcess"), "InProcess").await?;
        await_members(cluster, &[&drop, &label, &proxy]).await?;
        let in_process = dry_run_stored(cluster, &pod).await?;
        ensure!(
            in_process == through_webhook,
            "in-process with a foreign webhook stores\n{in_process:#}\nthe webhook path\n{through_webhook:#}"
        );
        Ok(())
    })
    .await;
}

/// Test 5: moving a mutating Policy between the webhook and the API server during a loop of
/// creates: every Pod is mutated, exactly once (one sidecar, never two). Before that, the
/// generated policy deleted or edited by hand is restored.
#[tokio::test]
async fn moving_a_mutating_policy_leaves_no_gap_and_mutates_once() {
    scenario("gh-inmut-flip", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let name = scene.policy("inmut-flip");
        let policy = |enforcement: &str| {
            pod_policy(
                &name,
                &ns,
                &["CREATE"],
                json!({
                    "enforcement": enforcement,
                    "mutate": [{"merge": {
                        "metadata": {"labels": {"mutated": "yes"}},
                        "spec": {"containers": [{"name": "proxy", "image": "example.com/proxy:1.0"}]},
                    }}],
                }),
            )
        };
        // Drift: the generated policy deleted by hand, or its mutations edited, is restored.
        apply_enforced(cluster, &[policy("InProcess")], "InProcess").await?;
        await_members(cluster, &[&name]).await?;
        cluster
            .kubectl_ok(["delete", "mutatingadmissionpolicy", &generated(&name)], None)
            .await?;
        await_members(cluster, &[&name]).await?;
        cluster
            .kubectl_ok(
                [
                    "patch",
                    "mutatingadmissionpolicy",
                    &generated(&name),
                    "--type=json",
                    "-p",
                    r#"[{"op": "replace", "path": "/spec/mutations", "value": [{"patchType": "JSONPatch", "jsonPatch": {"expression": "[JSONPatch{op: \"test\", path: \"/kind\", value: \"Pod\"}].filter(p, false)"}}]}]"#,
                ],
                None,
            )
            .await?;
        await_condition("the edited mutations restored", WAIT, || async {
            let stored = dry_run_stored(cluster, &two_containers("drift", &ns)).await?;
            Ok((stored["metadata"]["labels"]["mutated"] == "yes").then_some(()))
        })
        .await?;
        apply_enforced(cluster, &[policy("Webhook")], "Webhook").await?;

        let stop = std::sync::atomic::AtomicBool::new(false);
        let creates = async {
            let mut tried = 0usize;
            let mut wrong = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) || tried < 100 {
                let stored = dry_run_stored(cluster, &two_containers(&format!("f{tried}"), &ns)).await?;
                let proxies = container_names(&stored)
                    .iter()
                    .filter(|n| *n == "proxy")
                    .count();
                if proxies != 1 || stored["metadata"]["labels"]["mutated"] != "yes" {
                    wrong.push(format!("#{tried}: {proxies} sidecars, labels {}", stored["metadata"]["labels"]));
                }
                tried += 1;
            }
            anyhow::Ok((tried, wrong))
        };
        let flips = async {
            let result = async {
                for round in 0..6 {
                    let enforcement = if round % 2 == 0 { "InProcess" } else { "Webhook" };
                    apply_enforced(cluster, &[policy(enforcement)], enforcement).await?;
                    if enforcement == "InProcess" {
                        await_members(cluster, &[&name]).await?;
                    } else {
                        await_out_of_process(cluster, &[&name]).await?;
                    }
                }
                anyhow::Ok(())
            }
            .await;
            stop.store(true, std::sync::atomic::Ordering::Release);
            result
        };
        let (created, flipped) = tokio::join!(creates, flips);
        flipped?;
        let (tried, wrong) = created?;
        ensure!(
            wrong.is_empty(),
            "{} of {tried} Pods were not mutated exactly once while the Policy moved: {wrong:#?}",
            wrong.len()
        );
        eprintln!("{tried} Pods across 6 moves: each mutated once");
        Ok(())
    })
    .await;
}

/// Under `Auto` a mutating Policy runs in-process when its merges fit the schema the API server
/// publishes; one naming a field Pods lack stays on the webhook (where the field is dropped)
/// and, under `InProcess`, is `Ready=False`: a patch naming it would fail every create
/// in-process. Pods are created either way.
#[tokio::test]
async fn merges_the_pod_schema_lacks_stay_on_the_webhook() {
    scenario("gh-inmut-schema", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let (fit, typo, wrong_type) = (
            scene.policy("schema-fit"),
            scene.policy("schema-typo"),
            scene.policy("schema-type"),
        );
        let fitting = labels(&fit, &ns, 10, "Auto");
        let typo_policy = pod_policy(
            &typo,
            &ns,
            &["CREATE"],
            json!({"priority": 20, "enforcement": "Auto", "mutate": [{"merge": {"spec": {"hostNetwrok": true}}}]}),
        );
        let wrong_type_policy = pod_policy(
            &wrong_type,
            &ns,
            &["CREATE"],
            json!({"priority": 5, "enforcement": "InProcess", "mutate": [{"forEach": "spec.containers", "merge": {"securityContext": {"runAsUser": "1000"}}}]}),
        );
        apply_enforced(cluster, &[fitting], "InProcess").await?;
        apply_enforced(cluster, &[typo_policy], "Webhook").await?;
        await_members(cluster, &[&fit]).await?;
        let on_webhook = await_ready_condition(cluster, &typo, "True").await?;
        ensure!(
            on_webhook["message"].as_str().is_some_and(|m| m.contains(
                "spec.mutate[0]: spec.hostNetwrok: the Pod schema has no such field"
            )),
            "{on_webhook}"
        );
        apply(cluster, &wrong_type_policy).await?;
        let refused = await_ready_condition(cluster, &wrong_type, "False").await?;
        ensure!(
            refused["reason"] == "CannotRunInProcess"
                && refused["message"].as_str().is_some_and(|m| m.contains(
                    "spec.containers[].securityContext.runAsUser: a string where the Pod schema wants integer"
                )),
            "{refused}"
        );
        // The refused Policy runs nowhere and blocks nothing: the fitting one stays in.
        await_members(cluster, &[&fit]).await?;
        let stored = dry_run_stored(cluster, &two_containers("p", &ns)).await?;
        ensure!(
            stored["metadata"]["labels"]["team"] == "platform"
                && stored["spec"]["hostNetwork"].is_null(),
            "{stored:#}"
        );
        Ok(())
    })
    .await;
}
