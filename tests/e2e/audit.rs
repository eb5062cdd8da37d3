//! The audit of stored objects (issue 29): validating Policies judged against what is already
//! in the cluster, results in `wgpolicyk8s.io` PolicyReports and ClusterPolicyReports.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::{Options, ensure_report_crds};
use gatehouse_e2e::latency::p99;
use gatehouse_e2e::{Cluster, TestNamespace, await_condition};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, get_json, policy_object};
use crate::install::install_rbac;
use crate::scene::{Stage, scenario};

/// Passes close together: every test sees a few.
const INTERVAL: &str = "4s";

/// The Gatehouse report of Policy `policy` (`-n namespace`, or the cluster's), once `ready`
/// holds for it.
async fn await_report(
    cluster: &Cluster,
    policy: &str,
    namespace: Option<&str>,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let name = format!("gatehouse-{policy}");
    await_condition(what, WAIT, || async {
        let report = match namespace {
            Some(ns) => get_json(cluster, &["policyreport", &name, "-n", ns]).await?,
            None => get_json(cluster, &["clusterpolicyreport", &name]).await?,
        };
        Ok(report.filter(|r| ready(r)))
    })
    .await
}

/// The names of the objects a report lists.
fn listed(report: &Value) -> BTreeSet<String> {
    report["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["resources"][0]["name"].as_str().map(str::to_string))
        .collect()
}

/// The Policy's `Audited` condition, once its status is `status`.
async fn await_audited(cluster: &Cluster, policy: &str, status: &str) -> anyhow::Result<Value> {
    await_condition(
        &format!("Policy {policy} Audited={status}"),
        WAIT,
        || async {
            let Some(p) = get_json(cluster, &["policy", policy]).await? else {
                return Ok(None);
            };
            let audited = p["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Audited"))
                .cloned();
            Ok(audited
                .filter(|c| c["status"] == status && p["status"]["lastAuditTime"].is_string()))
        },
    )
    .await
}

fn pod(name: &str, ns: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]},
    })
}

#[tokio::test]
async fn a_warn_policy_applied_afterwards_reports_exactly_the_stored_pods_violating_it() {
    let options = Options::url().arg("--audit-interval", INTERVAL);
    scenario("gh-audit", options, async |scene| {
        let cluster = scene.cluster;
        ensure_report_crds(cluster).await?;
        let ns = scene.ns().to_string();
        // 30 Pods stored before the Policy exists; 10 lack the label.
        let mut items = Vec::new();
        for i in 0..30 {
            let labels = if i % 3 == 0 {
                json!({"app": "web"})
            } else {
                json!({"app": "web", "team": "a"})
            };
            items.push(pod(&format!("p{i:02}"), &ns, labels));
        }
        apply(cluster, &json!({"apiVersion": "v1", "kind": "List", "items": items})).await?;
        let violating: BTreeSet<String> = (0..30)
            .filter(|i| i % 3 == 0)
            .map(|i| format!("p{i:02}"))
            .collect();
        let policy = scene.policy("team");
        apply(
            cluster,
            &policy_object(
                &policy,
                json!({
                    "enforcement": "Auto",
                    "match": {
                        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    },
                    "validate": [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels", "message": "every Pod needs a team label", "action": "Warn"}],
                }),
            ),
        )
        .await?;
        let report = await_report(cluster, &policy, Some(&ns), "a report of 30 Pods", |r| {
            r["summary"]["pass"].as_u64().unwrap_or(0) + r["summary"]["warn"].as_u64().unwrap_or(0) == 30
        })
        .await?;
        ensure!(listed(&report) == violating, "listed {:?}, expected {violating:?}", listed(&report));
        ensure!(
            report["summary"] == json!({"pass": 20, "fail": 0, "warn": 10, "error": 0, "skip": 0}),
            "{:#}",
            report["summary"]
        );
        for result in report["results"].as_array().into_iter().flatten() {
            ensure!(
                result["result"] == "warn"
                    && result["message"] == "every Pod needs a team label"
                    && result["policy"] == policy.as_str()
                    && result["source"] == "gatehouse"
                    && result["resources"][0]["kind"] == "Pod"
                    && result["resources"][0]["namespace"] == ns.as_str()
                    && result["timestamp"]["seconds"].as_i64().is_some_and(|s| s > 0),
                "{result:#}"
            );
        }
        await_audited(cluster, &policy, "True").await?;
        // So is the condition, on the Policy.
        let table = cluster.kubectl_ok(["get", "policy", &policy], None).await?;
        let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        let column = rows.first().and_then(|h| h.iter().position(|c| *c == "AUDITED"));
        ensure!(
            column.is_some_and(|i| rows.get(1).and_then(|r| r.get(i)) == Some(&"True")),
            "{table}"
        );
        // The counts are printer columns.
        let table = cluster
            .kubectl_ok(["get", "policyreports", "-n", &ns], None)
            .await?;
        ensure!(
            table.contains("PASS") && table.contains("WARN") && table.lines().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.len() >= 6 && cells[1] == "20" && cells[3] == "10"
            }),
            "{table}"
        );
        let judged = scene
            .gh
            .metric_sum("gatehouse_audit_objects_total", "result=\"warn\"")
            .await?;
        ensure!(judged >= 10.0, "gatehouse_audit_objects_total warn = {judged}");
        // Fixed: it leaves the report at the next pass.
        cluster
            .kubectl_ok(["label", "pod", "p00", "team=a", "-n", &ns], None)
            .await?;
        let report = await_report(cluster, &policy, Some(&ns), "p00 out of the report", |r| {
            r["summary"]["warn"] == 9
        })
        .await?;
        ensure!(!listed(&report).contains("p00") && listed(&report).len() == 9, "{report:#}");
        // Deleting the Policy deletes its reports.
        cluster.kubectl_ok(["delete", "policy", &policy], None).await?;
        await_condition("the report gone with its Policy", WAIT, || async {
            let report = get_json(cluster, &["policyreport", &format!("gatehouse-{policy}"), "-n", &ns]).await?;
            Ok(report.is_none().then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn cluster_scoped_objects_land_in_a_cluster_policy_report() {
    let options = Options::url().arg("--audit-interval", INTERVAL);
    scenario("gh-audit-cluster", options, async |scene| {
        let cluster = scene.cluster;
        ensure_report_crds(cluster).await?;
        let mark = scene.policy("mark");
        let (owned, unowned) = (
            TestNamespace::new(cluster, "gh-audit-owned").await?,
            TestNamespace::new(cluster, "gh-audit-unowned").await?,
        );
        cluster
            .kubectl_ok(["label", "namespace", owned.name(), &format!("audit-mark={mark}"), "owner=platform"], None)
            .await?;
        cluster
            .kubectl_ok(["label", "namespace", unowned.name(), &format!("audit-mark={mark}")], None)
            .await?;
        let policy = scene.policy("owner");
        apply(
            cluster,
            &policy_object(
                &policy,
                json!({
                    "enforcement": "Auto",
                    "match": {
                        "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "Cluster"}],
                        "objectSelector": {"matchLabels": {"audit-mark": mark}},
                    },
                    "validate": [{"expression": "'owner' in object.metadata.labels", "message": "a Namespace needs an owner"}],
                }),
            ),
        )
        .await?;
        let report = await_report(cluster, &policy, None, "a cluster report of 2 Namespaces", |r| {
            r["summary"]["pass"] == 1 && r["summary"]["fail"] == 1
        })
        .await?;
        ensure!(report["kind"] == "ClusterPolicyReport", "{report:#}");
        let result = &report["results"][0];
        ensure!(
            result["result"] == "fail"
                && result["severity"] == "high"
                && result["resources"][0]["kind"] == "Namespace"
                && result["resources"][0]["name"] == unowned.name()
                && result["message"] == "a Namespace needs an owner",
            "{report:#}"
        );
        cluster.kubectl_ok(["delete", "policy", &policy], None).await?;
        owned.cleanup().await?;
        unowned.cleanup().await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn what_the_audit_cannot_judge_is_said_and_policies_that_stop_validating_drop_their_audit() {
    let options = Options::url()
        .arg("--audit-interval", INTERVAL)
        .arg("--audit-max-results", "1000");
    scenario("gh-audit-edges", options, async |scene| {
        let cluster = scene.cluster;
        ensure_report_crds(cluster).await?;
        let ns = scene.ns().to_string();
        apply(cluster, &pod("unlabelled", &ns, json!({"app": "web"}))).await?;
        let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        let team = json!([{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels", "message": "needs a team", "action": "Warn"}]);
        // Groups and resources multiply as in the API server: apps/pods and core/deployments
        // exist nowhere, and are no gap; a subresource beside them is no stored object.
        let crossed = scene.policy("crossed");
        // Only the API server can say what the requesting user may do; an audit has no user.
        let by_user = scene.policy("by-user");
        // Every Namespace, but never the ones admission leaves alone.
        let namespaces = scene.policy("namespaces");
        for (name, spec) in [
            (&crossed, json!({
                "match": {
                    "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": ["", "apps"], "apiVersions": ["v1"], "resources": ["pods", "deployments", "pods/status"], "scope": "Namespaced"}],
                    "namespaceSelector": selector,
                },
                "validate": team,
            })),
            (&by_user, json!({
                "match": {
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                    "namespaceSelector": selector,
                    "conditions": [{"name": "not-admin", "expression": "!authorizer.requestResource.check('delete').allowed()"}],
                },
                "validate": team,
            })),
            (&namespaces, json!({
                "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["namespaces"], "scope": "Cluster"}]},
                "validate": [
                    {"expression": "request.namespace == object.metadata.name", "message": "request.namespace is not the Namespace's name"},
                    {"expression": "false", "message": "listed", "action": "Warn"},
                ],
            })),
        ] {
            apply(cluster, &policy_object(name, spec)).await?;
        }
        let audited = await_audited(cluster, &crossed, "True").await?;
        ensure!(audited["message"].as_str().unwrap_or_default().contains("judged 1 "), "{audited:#}");
        let report = await_report(cluster, &crossed, Some(&ns), "the crossed Policy's report", |r| r["summary"]["warn"] == 1).await?;
        ensure!(listed(&report) == BTreeSet::from(["unlabelled".to_string()]), "{report:#}");
        let refused = await_audited(cluster, &by_user, "False").await?;
        ensure!(refused["message"].as_str().unwrap_or_default().contains("authorizer"), "{refused:#}");
        // A Namespace's request names the Namespace itself, as the API server's does.
        let report = await_report(cluster, &namespaces, None, "the Namespaces' report", |r| listed(r).contains(&ns)).await?;
        let names = listed(&report);
        for system in ["kube-system", "kube-node-lease", scene.home()] {
            ensure!(!names.contains(system), "{system} audited: {names:?}");
        }
        ensure!(report["summary"]["error"] == 0 && report["summary"]["fail"] == 0, "{report:#}");
        // The reference is the object's: a Namespace is in none.
        ensure!(
            report["results"].as_array().into_iter().flatten().all(|r| r["resources"][0].get("namespace").is_none()),
            "{report:#}"
        );

        // No validate rules any more: the audit's condition, time and report go.
        apply(
            cluster,
            &policy_object(
                &crossed,
                json!({
                    "match": {
                        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                        "namespaceSelector": selector,
                    },
                    "mutate": [{"merge": {"metadata": {"labels": {"audited": "no"}}}}],
                }),
            ),
        )
        .await?;
        await_condition("the audit's status gone from a Policy that no longer validates", WAIT, || async {
            let Some(p) = get_json(cluster, &["policy", &crossed]).await? else {
                return Ok(None);
            };
            let audited = p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Audited");
            let report = get_json(cluster, &["policyreport", &format!("gatehouse-{crossed}"), "-n", &ns]).await?;
            Ok((!audited && p["status"]["lastAuditTime"].is_null() && report.is_none()).then_some(()))
        })
        .await?;
        for p in [&crossed, &by_user, &namespaces] {
            cluster.kubectl_ok(["delete", "policy", p], None).await?;
        }
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_kind_gatehouse_may_not_list_is_not_audited_until_the_aggregated_role_grants_it() {
    gatehouse_e2e::run_test(|cluster| async move {
        let stage = Stage::open(cluster, "gh-audit-rbac").await?;
        let id = stage.id();
        let _guards = [
            cluster.delete_on_drop("clusterrole", "gatehouse", None),
            cluster.delete_on_drop("clusterrolebinding", "gatehouse", None),
            cluster.delete_on_drop("clusterrole", "gatehouse-audit", None),
            cluster.delete_on_drop("clusterrole", "gatehouse-audit-default", None),
            cluster.delete_on_drop("clusterrolebinding", "gatehouse-audit", None),
        ];
        install_rbac(cluster, stage.home()).await?;
        ensure_report_crds(cluster).await?;
        let kubeconfig = cluster
            .service_account_kubeconfig(stage.home(), "gatehouse", &format!("kubeconfig-audit-{id}"))
            .await?;
        let options = Options::url()
            .kubeconfig(kubeconfig)
            .arg("--audit-interval", INTERVAL);
        stage.start(options).await?.run(async |scene| {
            let ns = scene.ns().to_string();
            apply(
                cluster,
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unowned", "namespace": ns}, "data": {"a": "b"}}),
            )
            .await?;
            let policy = scene.policy("cm-owner");
            apply(
                cluster,
                &policy_object(
                    &policy,
                    json!({
                        "match": {
                            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}],
                            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                        },
                        "validate": [{"expression": "has(object.data) && 'owner' in object.data", "message": "a ConfigMap names its owner", "action": "Warn"}],
                    }),
                ),
            )
            .await?;
            let refused = await_audited(cluster, &policy, "False").await?;
            let message = refused["message"].as_str().unwrap_or_default();
            ensure!(
                message.contains("Gatehouse may not list configmaps")
                    && message.contains("gatehouse.dev/aggregate-to-audit"),
                "{refused:#}"
            );
            ensure!(
                get_json(cluster, &["policyreport", &format!("gatehouse-{policy}"), "-n", &ns]).await?.is_none(),
                "a report of a kind that was not listed"
            );
            // Granted through the aggregated role: audited.
            let grant = format!("gh-audit-configmaps-{id}");
            let _grant = cluster.delete_on_drop("clusterrole", &grant, None);
            apply(
                cluster,
                &json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                    "metadata": {"name": grant, "labels": {"gatehouse.dev/aggregate-to-audit": "true"}},
                    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}],
                }),
            )
            .await?;
            await_audited(cluster, &policy, "True").await?;
            let report = await_report(cluster, &policy, Some(&ns), "the ConfigMaps' report", |r| {
                listed(r).contains("unowned")
            })
            .await?;
            ensure!(report["summary"]["warn"].as_u64().unwrap_or(0) >= 1, "{report:#}");
            cluster.kubectl_ok(["delete", "policy", &policy], None).await.context("deleting the Policy")?;
            Ok(())
        })
        .await
    })
    .await;
}

/// Creates Pods named `<prefix>-<worker>-<i>` in `ns` (server dry run) for `length`, `WORKERS`
/// at a time, through Gatehouse's mutating webhook: each create's latency, or the first failure.
async fn create_for(
    client: &kube::Client,
    ns: &str,
    prefix: &str,
    length: Duration,
) -> anyhow::Result<Vec<Duration>> {
    const WORKERS: usize = 8;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + length;
    let workers = (0..WORKERS).map(|w| {
        let api = api.clone();
        async move {
            let mut latencies = Vec::new();
            let mut i = 0;
            while Instant::now() < deadline {
                let name = format!("{prefix}-{w}-{i}");
                let pod: Pod = serde_json::from_value(pod(&name, ns, json!({})))?;
                let started = Instant::now();
                let params = PostParams {
                    dry_run: true,
                    ..PostParams::default()
                };
                let created = api
                    .create(&params, &pod)
                    .await
                    .with_context(|| format!("creating {name}"))?;
                ensure!(
                    created
                        .metadata
                        .labels
                        .unwrap_or_default()
                        .get("team")
                        .map(String::as_str)
                        == Some("platform"),
                    "{name} was not mutated"
                );
                latencies.push(started.elapsed());
                i += 1;
            }
            anyhow::Ok(latencies)
        }
    });
    let per_worker = futures::future::try_join_all(workers).await?;
    Ok(per_worker.into_iter().flatten().collect())
}

#[tokio::test]
async fn admission_keeps_its_pace_while_the_audit_lists_and_judges() {
    let options = Options::url().arg("--audit-interval", "2s");
    scenario("gh-audit-load", options, async |scene| {
        let cluster = scene.cluster;
        ensure_report_crds(cluster).await?;
        let ns = scene.ns().to_string();
        let client = cluster.client().await?;
        // What admission runs: a mutating Policy on Pods, on the webhook (mutating Policies are
        // not audited: the audit's work is only the ConfigMaps below).
        let images = scene.policy("label");
        apply(
            cluster,
            &policy_object(
                &images,
                json!({
                    "enforcement": "Webhook",
                    "match": {
                        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    },
                    "mutate": [{"merge": {"metadata": {"labels": {"team": "platform"}}}}],
                }),
            ),
        )
        .await?;
        crate::fixtures::await_ready(cluster, &images, "True").await?;
        // What the audit reads: 1000 stored ConfigMaps (two pages).
        let items: Vec<Value> = (0..1000)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}"), "namespace": ns}, "data": {"i": i.to_string()}}))
            .collect();
        apply(cluster, &json!({"apiVersion": "v1", "kind": "List", "items": items})).await?;
        const LENGTH: Duration = Duration::from_secs(15);
        let mut without = create_for(&client, &ns, "before", LENGTH).await?;
        // Now every pass (one every 2 s) lists and judges the 1000 ConfigMaps.
        let owners = scene.policy("owners");
        apply(
            cluster,
            &policy_object(
                &owners,
                json!({
                    "enforcement": "Webhook",
                    "match": {
                        "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}],
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    },
                    "validate": [{"expression": "'owner' in object.data", "message": "a ConfigMap names its owner", "action": "Warn"}],
                }),
            ),
        )
        .await?;
        await_report(cluster, &owners, Some(&ns), "the first pass over 1000 ConfigMaps", |r| {
            r["summary"]["warn"].as_u64().unwrap_or(0) >= 1000
        })
        .await?;
        let passes = || async {
            scene.gh.metric_sum("gatehouse_audit_duration_seconds_count", "").await
        };
        let passes_before = passes().await?;
        let mut during = create_for(&client, &ns, "during", LENGTH).await?;
        let passes_during = passes().await? - passes_before;
        ensure!(passes_during >= 2.0, "{passes_during} audit passes ran during the creates");
        let (quiet, busy) = (p99(&mut without), p99(&mut during));
        eprintln!(
            "audit load: {} creates without a pass (p99 {quiet:?}), {} during {passes_during} \
             passes (p99 {busy:?}), every one admitted: {:.2}x",
            without.len(),
            during.len(),
            busy.as_secs_f64() / quiet.as_secs_f64().max(1e-9)
        );
        Ok(())
    })
    .await;
}
