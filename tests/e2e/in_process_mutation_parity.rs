//! Test 2 of in-process mutation: a corpus of mutating Policies (the samples, merges of maps,
//! lists of named objects and scalars, overwrite, forEach with and without `when`, chains of 2–8
//! Policies with interleaved priorities) and objects with and without the fields, each created
//! by server dry run with the Policies on the webhook and then in-process: the stored objects
//! are identical.

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use serde_json::{Value, json};

use ::gatehouse::controller::wiring::mutating_policy;
use ::gatehouse::controller::wiring::schema_fit::{SchemaFit, fits, kind_schema};
use ::gatehouse::controller::wiring::{Endpoint, Wiring};
use gatehouse_api::v1alpha1::Policy;

use crate::fixtures::{pod_policy, policy_object};
use crate::in_process_mutation::{
    apply_enforced, await_members, await_out_of_process, await_ready_condition, dry_run_stored,
};
use crate::mutation_translation::{config_map_mutations, config_maps, pod_mutations, pods};
use crate::scene::scenario;

/// One case: Policies (priority, `mutate`) in the order they are listed, and the object.
struct Case {
    policies: Vec<(i32, Value)>,
    object: Value,
}

/// Priorities of a chain's Policies by position: listing order is not (priority, name) order.
const INTERLEAVED: [i32; 8] = [30, 10, 20, 10, 30, 20, 10, 20];

/// The cases, keeping those Gatehouse runs in-process. `core`: the API server's OpenAPI v3
/// document of the core group (`/openapi/v3/api/v1`).
fn corpus(core: &Value) -> Vec<Case> {
    // Under Ignore a guard may fail: such a Policy stays on the webhook by design.
    let merges: Vec<Value> = pod_mutations()
        .into_iter()
        .filter(|(_, ignore)| !ignore)
        .map(|(m, _)| m)
        .collect();
    let objects = pods();
    let mut cases = Vec::new();
    for (i, mutate) in merges.iter().enumerate() {
        for object in [
            &objects[i % objects.len()],
            &objects[(i + 1) % objects.len()],
        ] {
            cases.push(Case {
                policies: vec![(100, mutate.clone())],
                object: object.clone(),
            });
        }
    }
    for j in 0..20 {
        let length = 2 + j % 7;
        let mut picked: Vec<usize> = Vec::new();
        for k in 0..length {
            let mut index = (j * 5 + k * 3) % merges.len();
            while picked.contains(&index) {
                index = (index + 1) % merges.len();
            }
            picked.push(index);
        }
        let policies: Vec<(i32, Value)> = picked
            .iter()
            .enumerate()
            .map(|(k, &index)| (INTERLEAVED[k], merges[index].clone()))
            .collect();
        for object in [
            &objects[j % objects.len()],
            &objects[(j + 2) % objects.len()],
        ] {
            cases.push(Case {
                policies: policies.clone(),
                object: object.clone(),
            });
        }
    }
    // Eight Policies, the samples first and last, interleaved by priority.
    let eight: Vec<(i32, Value)> = [
        (0, 10),
        (2, 30),
        (3, 20),
        (4, 10),
        (10, 30),
        (11, 20),
        (8, 10),
        (1, 40),
    ]
    .iter()
    .map(|&(index, priority)| (priority, merges[index].clone()))
    .collect();
    for object in [&objects[0], &objects[1], &objects[2]] {
        cases.push(Case {
            policies: eight.clone(),
            object: object.clone(),
        });
    }
    for (mutate, _) in config_map_mutations() {
        for object in config_maps() {
            cases.push(Case {
                policies: vec![(100, mutate.clone())],
                object,
            });
        }
    }
    // Only what Gatehouse runs in-process is compared: a chain where a Policy depends on what an
    // earlier one may append or create stays on the webhook (the API server defaults between
    // them). The same placement decides, with the structs the real schema says may be absent.
    cases.retain(|case| {
        let kind = if resource_of(&case.object) == "pods" {
            "Pod"
        } else {
            "ConfigMap"
        };
        let Some(schema) = kind_schema(core, "", "v1", kind) else {
            return false;
        };
        let policies: Vec<Policy> = case
            .policies
            .iter()
            .enumerate()
            .filter_map(|(k, (priority, mutate))| {
                serde_json::from_value(json!({
                    "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
                    "metadata": {"name": format!("p{k}")},
                    "spec": {
                        "priority": priority, "enforcement": "InProcess",
                        "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [resource_of(&case.object)]}]},
                        "mutate": mutate,
                    },
                }))
                .ok()
            })
            .collect();
        let refs: Vec<&Policy> = policies.iter().collect();
        let wiring = Wiring {
            endpoint: Endpoint::Url { base: String::new() },
            excluded_namespaces: Vec::new(),
            home_namespace: String::new(),
            owner_cluster_role: None,
            owner: None,
            max_admission_policies: usize::MAX,
        };
        let fit = refs
            .iter()
            .map(|p| {
                let verdict = match fits(&p.spec.mutate, &schema) {
                    Ok(optional) => SchemaFit::Fits(optional),
                    Err(reason) => SchemaFit::Unfit(reason),
                };
                (p.metadata.name.clone().unwrap_or_default(), verdict)
            })
            .collect();
        let (placements, _) = mutating_policy::place_mutating(&refs, &wiring, true, &fit);
        policies.len() == case.policies.len()
            && placements
                .iter()
                .all(|(_, p)| matches!(p, mutating_policy::MutatingPlacement::InProcess(_)))
    });
    cases
}

/// The resource of the case's object: a Policy matches only that kind, whose schema its merges
/// fit (Pod merges would fail ConfigMap creates in-process).
fn resource_of(object: &Value) -> &'static str {
    if object["kind"] == "ConfigMap" {
        "configmaps"
    } else {
        "pods"
    }
}

/// Cases whose Policies are in the cluster together, each case in a namespace of its own.
const BATCH: usize = 16;

#[tokio::test]
async fn webhook_and_in_process_mutations_store_the_same_objects() {
    scenario("gh-inmut-parity", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let core: Value = serde_json::from_str(
            &cluster
                .kubectl_ok(["get", "--raw", "/openapi/v3/api/v1"], None)
                .await?,
        )?;
        let cases = corpus(&core);
        ensure!(cases.len() >= 60, "{} cases", cases.len());
        let mut compared = 0;
        let mut changed = 0;
        for (b, batch) in cases.chunks(BATCH).enumerate() {
            // Namespaces of the batch's own: the API server drops a deleted policy from its
            // cache a moment after the object is gone, so a namespace is never reused.
            let namespaces: Vec<String> = futures::future::try_join_all(
                batch.iter().map(|_| scene.namespace("gh-inmut-case")),
            )
            .await?;
            let mut policies = Vec::new();
            let mut objects = Vec::new();
            for (slot, case) in batch.iter().enumerate() {
                let ns = &namespaces[slot];
                let n = b * BATCH + slot;
                for (k, (priority, mutate)) in case.policies.iter().enumerate() {
                    let name = scene.policy(&format!("mp{n}-{k}"));
                    let mut p = policy_object(
                        &name,
                        json!({
                            "priority": priority,
                            "match": {
                                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": [resource_of(&case.object)], "scope": "Namespaced"}],
                                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                            },
                            "mutate": mutate,
                        }),
                    );
                    p["spec"]["enforcement"] = json!("Webhook");
                    policies.push(p);
                }
                let mut object = case.object.clone();
                object["metadata"]["namespace"] = json!(ns);
                objects.push((n, object));
            }
            let names: Vec<String> = policies
                .iter()
                .map(|p| p["metadata"]["name"].as_str().unwrap_or_default().to_string())
                .collect();
            apply_enforced(cluster, &policies, "Webhook").await?;
            let stored_all = async || {
                futures::future::join_all(objects.iter().map(|(_, object)| async {
                    dry_run_stored(cluster, object).await.map_err(|e| e.to_string())
                }))
                .await
            };
            let through_webhook = stored_all().await;
            for p in &mut policies {
                p["spec"]["enforcement"] = json!("InProcess");
            }
            apply_enforced(cluster, &policies, "InProcess").await?;
            let mut ordered: Vec<(i64, &str)> = policies
                .iter()
                .map(|p| (p["spec"]["priority"].as_i64().unwrap_or_default(), p["metadata"]["name"].as_str().unwrap_or_default()))
                .collect();
            ordered.sort();
            let members: Vec<&str> = ordered.iter().map(|(_, n)| *n).collect();
            await_members(cluster, &members).await?;
            let in_process = stored_all().await;
            for (((n, object), expected), actual) in
                objects.iter().zip(&through_webhook).zip(in_process)
            {
                let agree = match (&actual, expected) {
                    (Ok(a), Ok(e)) => a == e,
                    (Err(_), Err(_)) => true,
                    _ => false,
                };
                let case = &cases[*n];
                ensure!(
                    agree,
                    "case {n} ({:?} on {}): in-process stores\n{actual:#?}\nthe webhook path\n{expected:#?}",
                    case.policies,
                    case.object
                );
                compared += 1;
                // Against the same object created where no Policy applies.
                let mut plain = object.clone();
                plain["metadata"]["namespace"] = json!(scene.ns());
                let mut plain = dry_run_stored(cluster, &plain).await?;
                plain["metadata"]["namespace"] = object["metadata"]["namespace"].clone();
                if expected.as_ref().ok() != Some(&plain) {
                    changed += 1;
                }
            }
            cluster
                .kubectl_ok(
                    ["delete", "policy"].into_iter().chain(names.iter().map(String::as_str)),
                    None,
                )
                .await
                .context("deleting the batch's Policies")?;
            await_out_of_process(cluster, &members).await?;
        }
        let chains: Vec<usize> = cases
            .iter()
            .map(|c| c.policies.len())
            .filter(|n| *n > 1)
            .collect();
        ensure!(
            chains.len() >= 8 && chains.iter().any(|n| *n >= 8),
            "too few chains survive: {chains:?}"
        );
        eprintln!(
            "{compared} cases agree ({changed} change their object; {} chains of {}-{} Policies)",
            chains.len(),
            chains.iter().min().unwrap_or(&0),
            chains.iter().max().unwrap_or(&0)
        );
        Ok(())
    })
    .await;
}

/// Chains where the API server would default between two Policies what the first one made
/// defaultable: a struct it creates (a container's `livenessProbe`, whose `periodSeconds` the
/// second sets when absent) and a field a default copies (`resources.limits`, copied into
/// `requests` when absent, which the second sets). Under Auto both stay on the webhook, and the
/// stored Pod is the webhook path's: in-process it would hold the defaults instead.
#[tokio::test]
async fn chains_the_api_server_would_default_in_between_stay_on_the_webhook() {
    scenario("gh-inmut-defaults", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let for_each = |name: &str, priority: i32, merge: Value| {
            pod_policy(
                name,
                &ns,
                &["CREATE"],
                json!({"priority": priority, "enforcement": "Auto", "mutate": [{"forEach": "spec.containers", "merge": merge}]}),
            )
        };
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "defaults", "namespace": ns},
            "spec": {"containers": [
                {"name": "app", "image": "example.com/app:1.0"},
                {"name": "tool", "image": "example.com/tool:2"},
            ]},
        });
        // (what the first Policy merges, what the second merges, where the stored Pod shows
        // which ran last)
        let chains = [
            (
                json!({"livenessProbe": {"httpGet": {"port": 8080}}}),
                json!({"livenessProbe": {"periodSeconds": 30}}),
                ("/livenessProbe/periodSeconds", json!(30)),
            ),
            (
                json!({"resources": {"limits": {"cpu": "1"}}}),
                json!({"resources": {"requests": {"cpu": "250m"}}}),
                ("/resources/requests/cpu", json!("250m")),
            ),
        ];
        for (k, (first_merge, second_merge, (pointer, expected))) in chains.into_iter().enumerate()
        {
            let (first, second) = (
                scene.policy(&format!("defaults-{k}-a")),
                scene.policy(&format!("defaults-{k}-b")),
            );
            let policies = [
                for_each(&first, 10, first_merge),
                for_each(&second, 20, second_merge),
            ];
            apply_enforced(cluster, &policies, "Webhook").await?;
            let ready = await_ready_condition(cluster, &first, "True").await?;
            ensure!(
                ready["message"].as_str().is_some_and(|m| m.contains(&format!(
                    "Policy {second}'s mutate[0], later in the order, reads or writes what it \
                     may append or create"
                ))),
                "{ready}"
            );
            await_out_of_process(cluster, &[&first, &second]).await?;
            let stored = dry_run_stored(cluster, &pod).await?;
            for container in stored["spec"]["containers"].as_array().into_iter().flatten() {
                ensure!(
                    container.pointer(pointer) == Some(&expected),
                    "{pointer} should be {expected}: {stored:#}"
                );
            }
            cluster
                .kubectl_ok(["delete", "policy", &first, &second], None)
                .await?;
        }
        Ok(())
    })
    .await;
}
