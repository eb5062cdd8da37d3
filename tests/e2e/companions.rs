//! Companion objects (issue 41): reconciled from what is stored, kept in sync, collected.
use std::collections::BTreeMap;

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::scenario;

/// The namespace-provisioning sample's effects, for Namespaces labelled `team-<id>`.
fn provisioning(team_label: &str) -> Value {
    json!({
        "match": {
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
            "objectSelector": {"matchExpressions": [{"key": team_label, "operator": "Exists"}]},
        },
        "effects": [
            {"object": {
                "template": {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                             "metadata": {"name": "default-deny"},
                             "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
                "fields": [{"path": "metadata.labels.team", "expression": format!("object.metadata.labels['{team_label}']")}],
            }},
            {"object": {"template": {"apiVersion": "v1", "kind": "ResourceQuota",
                                     "metadata": {"name": "team-quota"},
                                     "spec": {"hard": {"pods": "10"}}}}},
            {"object": {"template": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                                     "metadata": {"name": "team-view"},
                                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
                                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "team"}]}}},
        ],
    })
}

const KINDS: [&str; 3] = [
    "networkpolicy/default-deny",
    "resourcequota/team-quota",
    "rolebinding/team-view",
];

/// `kubectl get <kind/name> -n ns` as JSON, if it exists.
async fn companion(cluster: &Cluster, ns: &str, which: &str) -> anyhow::Result<Option<Value>> {
    get_json(cluster, &[which, "-n", ns]).await
}

async fn await_companions(
    cluster: &Cluster,
    namespaces: &[String],
    present: bool,
) -> anyhow::Result<()> {
    let what = format!(
        "{} namespaces' companions {}",
        namespaces.len(),
        if present { "in place" } else { "gone" }
    );
    await_condition(&what, WAIT, || async {
        for ns in namespaces {
            for which in KINDS {
                if companion(cluster, ns, which).await?.is_some() != present {
                    return Ok(None);
                }
            }
        }
        Ok(Some(()))
    })
    .await
}

fn uid(object: &Value) -> String {
    object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

#[tokio::test]
async fn namespaces_get_their_companions_kept_in_sync_and_collected() {
    scenario("gh-companions", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let label = format!("team-{id}");
        // 20 Namespaces stored before the Policy.
        let mut names = Vec::new();
        for i in 0..20 {
            let name = scene.track_object("namespace", format!("co-{id}-{i:02}"));
            apply(cluster, &namespace(&name, json!({&label: format!("t{i}")}))).await?;
            names.push(name);
        }
        let policy = scene.policy("provision");
        apply(cluster, &policy_object(&policy, provisioning(&label))).await?;
        await_companions(cluster, &names, true).await?;
        let first = &names[0];
        let netpol = companion(cluster, first, KINDS[0])
            .await?
            .context("netpol")?;
        ensure!(netpol["metadata"]["labels"]["team"] == "t0", "{netpol:#}");
        ensure!(
            netpol["metadata"]["ownerReferences"][0]["kind"] == "Namespace",
            "{netpol:#}"
        );
        let status = await_condition("status.companions 60/60", WAIT, || async {
            let p = get_json(cluster, &["policy", &policy])
                .await?
                .context("policy")?;
            let kinds = json!([
                "networking.k8s.io/v1/NetworkPolicy",
                "rbac.authorization.k8s.io/v1/RoleBinding",
                "v1/ResourceQuota"
            ]);
            let counts = json!({"wanted": 60, "inPlace": 60, "kinds": kinds});
            Ok((p["status"]["companions"] == counts).then_some(p))
        })
        .await?;
        ensure!(
            status["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready"
                    && c["status"] == "True"
                    && c["reason"] == "EffectsOnly"),
            "{status:#}"
        );
        // A new Namespace gets them within seconds.
        let fresh = scene.track_object("namespace", format!("co-{id}-new"));
        apply(cluster, &namespace(&fresh, json!({&label: "new"}))).await?;
        await_companions(cluster, std::slice::from_ref(&fresh), true).await?;
        // A companion deleted by hand comes back, as a new object.
        let quota = companion(cluster, first, KINDS[1])
            .await?
            .context("quota")?;
        cluster
            .kubectl_ok(["delete", KINDS[1], "-n", first], None)
            .await?;
        let back = await_condition("the deleted quota back", WAIT, || async {
            Ok(companion(cluster, first, KINDS[1])
                .await?
                .filter(|q| uid(q) != uid(&quota)))
        })
        .await?;
        // A managed field edited by hand is reverted; a foreign label stays.
        cluster
            .kubectl_ok(
                [
                    "patch",
                    KINDS[1],
                    "-n",
                    first,
                    "--type=merge",
                    "-p",
                    r#"{"spec":{"hard":{"pods":"99"}},"metadata":{"labels":{"foreign":"kept"}}}"#,
                ],
                None,
            )
            .await?;
        let reverted = await_condition("the edited quota reverted", WAIT, || async {
            Ok(companion(cluster, first, KINDS[1])
                .await?
                .filter(|q| q["spec"]["hard"]["pods"] == "10"))
        })
        .await?;
        ensure!(
            reverted["metadata"]["labels"]["foreign"] == "kept",
            "{reverted:#}"
        );
        ensure!(
            uid(&reverted) == uid(&back),
            "the quota was re-created, not updated"
        );
        // A trigger update that changes nothing the companions say writes nothing.
        let versions = |q: &Value| {
            q["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        let before = versions(
            &companion(cluster, first, KINDS[0])
                .await?
                .context("netpol")?,
        );
        cluster
            .kubectl_ok(["annotate", "namespace", first, "touched=yes"], None)
            .await?;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let after = companion(cluster, first, KINDS[0])
            .await?
            .context("the netpol went on a no-op update")?;
        ensure!(
            versions(&after) == before,
            "a no-op trigger update rewrote the companion"
        );
        // The template edited: companions updated in place.
        let uids: BTreeMap<String, String> = {
            let mut uids = BTreeMap::new();
            for ns in &names {
                uids.insert(
                    ns.clone(),
                    uid(&companion(cluster, ns, KINDS[1]).await?.context("quota")?),
                );
            }
            uids
        };
        let mut edited = provisioning(&label);
        edited["effects"][1]["object"]["template"]["spec"]["hard"]["pods"] = json!("20");
        apply(cluster, &policy_object(&policy, edited.clone())).await?;
        await_condition("every quota at 20 Pods, same objects", WAIT, || async {
            for ns in &names {
                let q = companion(cluster, ns, KINDS[1]).await?.context("quota")?;
                if q["spec"]["hard"]["pods"] != "20" {
                    return Ok(None);
                }
                ensure!(uid(&q) == uids[ns], "the quota of {ns} was re-created");
            }
            Ok(Some(()))
        })
        .await?;
        // An effect dropped: its kind's companions are swept, and the kind leaves the status.
        let mut dropped = edited;
        dropped["effects"].as_array_mut().context("effects")?.pop();
        apply(cluster, &policy_object(&policy, dropped)).await?;
        await_condition("every RoleBinding swept", WAIT, || async {
            for ns in &names {
                if companion(cluster, ns, KINDS[2]).await?.is_some() {
                    return Ok(None);
                }
            }
            let p = get_json(cluster, &["policy", &policy])
                .await?
                .context("policy")?;
            let kinds = json!(["networking.k8s.io/v1/NetworkPolicy", "v1/ResourceQuota"]);
            Ok((p["status"]["companions"]["kinds"] == kinds).then_some(()))
        })
        .await?;
        // The trigger's label removed: its companions go.
        cluster
            .kubectl_ok(
                ["label", "namespace", &names[1], &format!("{label}-")],
                None,
            )
            .await?;
        await_companions(cluster, &names[1..2], false).await?;
        // The Namespace deleted: its companions go with it.
        cluster
            .kubectl_ok(["delete", "namespace", &names[2], "--wait=false"], None)
            .await?;
        await_companions(cluster, &names[2..3], false).await?;
        // A server dry run creates nothing.
        let dry = format!("co-{id}-dry");
        cluster
            .kubectl_ok(
                ["apply", "--dry-run=server", "-f", "-"],
                Some(&namespace(&dry, json!({&label: "dry"})).to_string()),
            )
            .await?;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        ensure!(
            get_json(cluster, &["namespace", &dry]).await?.is_none(),
            "the dry run stored a Namespace"
        );
        // The Policy deleted: its companions are collected (the finalizer held it till then).
        delete_policies(cluster, &[&policy]).await?;
        await_companions(cluster, &names[3..], false).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_cloned_secret_follows_its_source_and_goes_with_the_policy_unless_kept() {
    scenario("gh-clone", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let label = format!("clone-{id}");
        let source_ns = scene.ns().to_string();
        apply(cluster, &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pull", "namespace": source_ns},
                               "type": "Opaque", "data": {"token": "b25l"}})).await?;
        let mut names = Vec::new();
        for i in 0..5 {
            let name = scene.track_object("namespace", format!("cl-{id}-{i}"));
            apply(cluster, &namespace(&name, json!({&label: "yes"}))).await?;
            names.push(name);
        }
        let spec = |keep: bool, secret: &str| json!({
            "match": {
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
                "objectSelector": {"matchLabels": {&label: "yes"}},
            },
            "effects": [{"object": {
                "template": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}},
                "cloneFrom": {"namespace": source_ns, "name": "pull"},
                "keepOnPolicyDelete": keep,
            }}],
        });
        let copies = |secret: &'static str, token: &'static str| {
            let names = names.clone();
            async move {
                await_condition(&format!("{} copies of {secret} with {token}", names.len()), WAIT, || async {
                    for ns in &names {
                        let copy = get_json(cluster, &["secret", secret, "-n", ns]).await?;
                        if copy.is_none_or(|c| c["data"]["token"] != token) {
                            return Ok(None);
                        }
                    }
                    Ok(Some(()))
                })
                .await
            }
        };
        let dropped = scene.policy("clone");
        let kept = scene.policy("clone-kept");
        apply(cluster, &policy_object(&dropped, spec(false, "pull"))).await?;
        apply(cluster, &policy_object(&kept, spec(true, "pull-kept"))).await?;
        copies("pull", "b25l").await?;
        copies("pull-kept", "b25l").await?;
        // The source changes: every copy follows.
        cluster
            .kubectl_ok(["patch", "secret", "pull", "-n", &source_ns, "--type=merge", "-p", r#"{"data":{"token":"dHdv"}}"#], None)
            .await?;
        copies("pull", "dHdv").await?;
        copies("pull-kept", "dHdv").await?;
        // Deleted: one Policy's copies go, the other's stay, no longer labelled.
        delete_policies(cluster, &[&dropped, &kept]).await?;
        await_condition("the copies of the deleted Policy gone", WAIT, || async {
            for ns in &names {
                if get_json(cluster, &["secret", "pull", "-n", ns]).await?.is_some() {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        })
        .await?;
        for ns in &names {
            let copy = get_json(cluster, &["secret", "pull-kept", "-n", ns]).await?.context("kept copy gone")?;
            ensure!(copy["metadata"]["labels"].get("gatehouse.dev/companion-of-policy").is_none(), "{copy:#}");
        }
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn bad_object_effects_are_refused_or_named_in_a_condition() {
    scenario("gh-companion-bad", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let rules = json!([{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}]);
        let selector = json!({"matchLabels": {format!("bad-{id}"): "yes"}});
        let with = |effect: Value| json!({"match": {"rules": rules, "objectSelector": selector}, "effects": [{"object": effect}]});
        let refused = [
            (with(json!({"template": {"apiVersion": "v1", "metadata": {"name": "x"}}})), "spec.effects[0].object.template.kind"),
            (with(json!({"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}})), "spec.effects[0].object.template.metadata.name"),
            (with(json!({"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
                         "fields": [{"path": "data.x", "expression": "'a'"}]})), "spec.effects[0].object.fields[0].path: names a path outside the template"),
            (with(json!({"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}},
                         "fields": [{"path": "data.x", "expression": "object.metadata.name.size() + 'a'"}]})), "spec.effects[0].object.fields[0].expression"),
        ];
        let name = scene.policy("bad");
        for (spec, field) in refused {
            let out = await_condition("the bad Policy refused", WAIT, || async {
                let out = try_apply(cluster, &policy_object(&name, spec.clone())).await?;
                if out.status.success() {
                    // Our validation webhook was not registered yet.
                    cluster.kubectl_ok(["delete", "policy", &name, "--wait=false"], None).await?;
                    return Ok(None);
                }
                Ok(Some(out))
            })
            .await?;
            ensure!(stderr(&out).contains(field), "expected {field}: {}", stderr(&out));
        }
        // What only the API server's discovery and the stored objects tell: a condition with the
        // field path, nothing written.
        let cases = [
            (with(json!({"template": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": format!("x-{id}"), "namespace": "default"}}})),
             "spec.effects[0].object.template.metadata.namespace: ClusterRole is cluster-scoped"),
            (with(json!({"template": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "copy"}},
                         "cloneFrom": {"namespace": scene.ns(), "name": "missing"}})),
             "spec.effects[0].object.cloneFrom: the source Secret"),
        ];
        let trigger = scene.track_object("namespace", format!("bad-{id}"));
        apply(cluster, &namespace(&trigger, json!({format!("bad-{id}"): "yes"}))).await?;
        for (i, (spec, message)) in cases.into_iter().enumerate() {
            let policy = scene.policy(&format!("bad-run-{i}"));
            apply(cluster, &policy_object(&policy, spec)).await?;
            let condition = await_condition("CompanionsInPlace=False", WAIT, || async {
                let p = get_json(cluster, &["policy", &policy]).await?.context("policy")?;
                Ok(p["status"]["conditions"].as_array().into_iter().flatten()
                    .find(|c| c["type"] == "CompanionsInPlace" && c["status"] == "False").cloned())
            })
            .await?;
            ensure!(condition["message"].as_str().is_some_and(|m| m.contains(message)), "{condition:#}");
            // And an Event on the Policy (a cluster-scoped object's Events are in default).
            await_condition("a CompanionsNotInPlace Event", WAIT, || async {
                let out = cluster.kubectl_ok(["get", "events.events.k8s.io", "-n", "default", "-o", "json"], None).await?;
                let events: Value = serde_json::from_str(&out)?;
                Ok(events["items"].as_array().into_iter().flatten()
                    .find(|e| e["reason"] == "CompanionsNotInPlace" && e["regarding"]["name"] == policy.as_str() && e["note"].as_str().is_some_and(|n| n.contains(message)))
                    .map(|_| ()))
            })
            .await?;
        }
        ensure!(get_json(cluster, &["clusterrole", &format!("x-{id}")]).await?.is_none(), "half-written");
        ensure!(get_json(cluster, &["secret", "copy", "-n", &trigger]).await?.is_none(), "half-written");
        Ok(())
    })
    .await;
}

/// Under the installed least-privilege RBAC (run by the install test, which installs it): a
/// companion kind not granted is `Ready=False` naming the verb and resource, nothing written;
/// granted through the aggregated role `gatehouse-effects`, it heals.
pub(crate) async fn a_kind_not_granted_is_ready_false_until_granted(
    scene: &crate::scene::Scene,
) -> anyhow::Result<()> {
    let cluster = scene.cluster;
    let id = scene.id();
    let grant = format!("grant-configmaps-{id}");
    let _grant = cluster.delete_on_drop("clusterrole", &grant, None);
    let label = format!("rbac-{id}");
    let trigger = scene.track_object("namespace", format!("co-rbac-{id}"));
    apply(cluster, &namespace(&trigger, json!({&label: "yes"}))).await?;
    let policy = scene.policy("configmaps");
    apply(cluster, &policy_object(&policy, json!({
        "match": {
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
            "objectSelector": {"matchLabels": {&label: "yes"}},
        },
        "effects": [{"object": {"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}, "data": {"a": "b"}}}}],
    }))).await?;
    let ready = |status: &'static str| {
        let policy = policy.clone();
        async move {
            await_condition(&format!("Policy Ready={status}"), WAIT, || async {
                let p = get_json(cluster, &["policy", &policy])
                    .await?
                    .context("policy")?;
                Ok(p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|c| c["type"] == "Ready" && c["status"] == status)
                    .cloned())
            })
            .await
        }
    };
    let refused = ready("False").await?;
    ensure!(
        refused["message"].as_str().is_some_and(
            |m| m.contains("may not list configmaps") && m.contains("gatehouse-effects")
        ),
        "{refused:#}"
    );
    ensure!(
        get_json(cluster, &["configmap", "team", "-n", &trigger])
            .await?
            .is_none(),
        "written without the grant"
    );
    apply(cluster, &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": grant, "labels": {"gatehouse.dev/aggregate-to-effects": "true"}},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch", "create", "patch", "delete"]}]})).await?;
    ready("True").await?;
    await_condition("the ConfigMap written", WAIT, || async {
        get_json(cluster, &["configmap", "team", "-n", &trigger]).await
    })
    .await?;
    delete_policies(cluster, &[&policy]).await?;
    Ok(())
}

/// Companions of `policy_uid` across the cluster, as `namespace/kind/name`.
async fn companions_of(cluster: &Cluster, policy_uid: &str) -> anyhow::Result<Vec<String>> {
    let selector = format!("gatehouse.dev/companion-of-policy={policy_uid}");
    let out = cluster
        .kubectl_ok(
            [
                "get",
                "configmaps,resourcequotas",
                "-A",
                "-l",
                &selector,
                "-o",
                "json",
            ],
            None,
        )
        .await?;
    let list: Value = serde_json::from_str(&out)?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            format!(
                "{}/{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or_default(),
                o["kind"].as_str().unwrap_or_default(),
                o["metadata"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

#[tokio::test]
async fn kills_and_leader_changes_in_a_burst_leave_each_companion_once_and_no_orphan() {
    let options = || Options::url().arg("--lease-duration", "4s");
    scenario("gh-co-faults", options(), async |scene| {
        let cluster = scene.cluster;
        scene.replica(options()).await?;
        let id = scene.id();
        let label = format!("burst-{id}");
        let policy = scene.policy("burst");
        apply(cluster, &policy_object(&policy, json!({
            "match": {
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "*"}],
                "objectSelector": {"matchLabels": {&label: "yes"}},
            },
            "effects": [
                {"object": {"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "team"}, "data": {"a": "b"}},
                            "fields": [{"path": "data.namespace", "expression": "object.metadata.name"}]}},
                {"object": {"template": {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "team"}, "spec": {"hard": {"pods": "5"}}}}},
            ],
        }))).await?;
        let uid = await_condition("the Policy's finalizer", WAIT, || async {
            let p = get_json(cluster, &["policy", &policy]).await?.context("policy")?;
            let held = p["metadata"]["finalizers"].as_array().is_some_and(|f| f.iter().any(|f| f == "gatehouse.dev/companions"));
            Ok(held.then(|| p["metadata"]["uid"].as_str().unwrap_or_default().to_string()))
        })
        .await?;
        // 200 Namespaces created at once while the leader is killed (SIGKILL) again and again.
        let names: Vec<String> = (0..200).map(|i| scene.track_object("namespace", format!("bu-{id}-{i:03}"))).collect();
        let items: Vec<Value> = names.iter().map(|n| namespace(n, json!({&label: "yes"}))).collect();
        let list = json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
        let burst = cluster.kubectl_ok(["apply", "-f", "-"], Some(&list));
        let a = &mut scene.gh;
        let crashes = async {
            for i in 0..4u64 {
                tokio::time::sleep(std::time::Duration::from_millis(500 + 400 * i)).await;
                a.kill().await?;
                a.restart().await?;
            }
            Ok::<(), anyhow::Error>(())
        };
        let (created, crashed) = tokio::join!(burst, crashes);
        created?;
        crashed?;
        let expected: std::collections::BTreeSet<String> = names
            .iter()
            .flat_map(|n| [format!("{n}/ConfigMap/team"), format!("{n}/ResourceQuota/team")])
            .collect();
        let found = await_condition("400 companions", std::time::Duration::from_secs(120), || async {
            let found = companions_of(cluster, &uid).await?;
            Ok((found.len() >= expected.len()).then_some(found))
        })
        .await?;
        let unique: std::collections::BTreeSet<String> = found.iter().cloned().collect();
        ensure!(found.len() == unique.len() && unique == expected, "{} companions, {} distinct, expected {}", found.len(), unique.len(), expected.len());
        // Every Gatehouse down, the Policy deleted: held by its finalizer until one starts.
        scene.gh.kill().await?;
        for replica in &mut scene.replicas {
            replica.kill().await?;
        }
        cluster.kubectl_ok(["delete", "policy", &policy, "--wait=false"], None).await?;
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        ensure!(get_json(cluster, &["policy", &policy]).await?.is_some(), "the Policy went without its companions collected");
        ensure!(companions_of(cluster, &uid).await?.len() == expected.len(), "collected while Gatehouse was down");
        scene.gh.restart().await?;
        await_condition("companions collected and the Policy gone", std::time::Duration::from_secs(120), || async {
            let left = companions_of(cluster, &uid).await?.len();
            Ok((left == 0 && get_json(cluster, &["policy", &policy]).await?.is_none()).then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_gated_pod_leaves_the_gate_once_its_companion_exists() {
    scenario("gh-co-gate", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let policy = scene.policy("gate");
        apply(cluster, &policy_object(&policy, json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
            },
            "effects": [{"object": {
                "gate": true,
                "template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}, "data": {}},
                "fields": [
                    {"path": "metadata.name", "expression": "object.metadata.name + '-config'"},
                    {"path": "data.greeting", "expression": "'hello ' + object.metadata.name"},
                ],
            }}],
        }))).await?;
        await_ready(cluster, &policy, "True").await?;
        // A dry run is gated in its answer, and creates nothing.
        let dry = cluster.kubectl_ok(["create", "--dry-run=server", "-o", "json", "-f", "-"], Some(&pod("dry", &ns))).await?;
        let dry: Value = serde_json::from_str(&dry)?;
        ensure!(dry["spec"]["schedulingGates"] == json!([{"name": "gatehouse.dev/companions"}]), "{:#}", dry["spec"]);
        let web = await_condition("a gated Pod", WAIT, || async {
            let created = cluster.kubectl_ok(["create", "-o", "json", "-f", "-"], Some(&pod("web", &ns))).await?;
            let created: Value = serde_json::from_str(&created)?;
            if created["spec"]["schedulingGates"].is_array() {
                return Ok(Some(created));
            }
            // Created before the entry reached the API server: not gated; again.
            cluster.kubectl_ok(["delete", "pod", "web", "-n", &ns, "--wait=true"], None).await?;
            Ok(None)
        })
        .await?;
        let opened = await_condition("the gate opened", WAIT, || async {
            let p = get_json(cluster, &["pod", "web", "-n", &ns]).await?.context("pod")?;
            Ok(p["spec"]["schedulingGates"].as_array().is_none_or(|g| g.is_empty()).then_some(p))
        })
        .await?;
        ensure!(opened["metadata"]["uid"] == web["metadata"]["uid"], "another Pod");
        let config = get_json(cluster, &["configmap", "web-config", "-n", &ns]).await?.context("the ConfigMap is missing")?;
        ensure!(config["data"]["greeting"] == "hello web", "{config:#}");
        ensure!(config["metadata"]["ownerReferences"][0]["uid"] == web["metadata"]["uid"], "{config:#}");
        ensure!(get_json(cluster, &["configmap", "dry-config", "-n", &ns]).await?.is_none(), "the dry run made a companion");
        // A companion that cannot be (its name would be 257 characters, the Pod's is 250)
        // keeps its Pod at the gate; the Policy deleted, the Pod is let go: a gone Policy
        // holds no Pod.
        let long = format!("held-{}", "x".repeat(245));
        let held: Value = serde_json::from_str(&cluster.kubectl_ok(["create", "-o", "json", "-f", "-"], Some(&pod(&long, &ns))).await?)?;
        ensure!(held["spec"]["schedulingGates"].is_array(), "{:#}", held["spec"]);
        await_condition("the companion that cannot be named", WAIT, || async {
            let p = get_json(cluster, &["policy", &policy]).await?.context("policy")?;
            let named = p["status"]["conditions"].as_array().into_iter().flatten().any(|c| {
                c["type"] == "CompanionsInPlace" && c["status"] == "False"
                    && c["message"].as_str().is_some_and(|m| m.contains("held-xxx"))
            });
            Ok(named.then_some(()))
        })
        .await?;
        let gates = |p: &Value| p["spec"]["schedulingGates"].as_array().map_or(0, Vec::len);
        let still = get_json(cluster, &["pod", &long, "-n", &ns]).await?.context("pod")?;
        ensure!(gates(&still) == 1, "the Pod left the gate without its companion");
        delete_policies(cluster, &[&policy]).await?;
        await_condition("the held Pod let go", WAIT, || async {
            let p = get_json(cluster, &["pod", &long, "-n", &ns]).await?.context("pod")?;
            Ok((gates(&p) == 0).then_some(()))
        })
        .await?;
        await_condition("the Policy gone", WAIT, || async {
            Ok(get_json(cluster, &["policy", &policy]).await?.is_none().then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}
