//! The effects loop on the real API server: addresses are allocated after the Pod is stored,
//! keyed by its UID, never twice, and collected when their owner is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, apply_ready, await_ready, get_json, pod_policy, stderr};
use crate::scene::{Scene, scenario};

use gatehouse_api::v1alpha1::IPAM_GATE as GATE;
use gatehouse_e2e::pods::ipam_gated;
const ANNOTATION: &str = "gatehouse.dev/ip";

/// An IPPool and a Policy giving every Pod created in `ns` an address from it.
/// Both are removed at the end of the scene.
pub(crate) async fn pool_and_policy(
    scene: &Scene,
    id: &str,
    ns: &str,
    cidr: &str,
    exclude: &[&str],
    failure_policy: &str,
) -> anyhow::Result<(String, String)> {
    let cluster = scene.cluster;
    let (pool, policy) = (format!("pool-{id}"), scene.track(format!("ipam-{id}")));
    scene.track_pool(&pool, &policy);
    let pool_object = json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPPool",
        "metadata": {"name": pool},
        "spec": {"cidr": cidr, "exclude": exclude},
    });
    apply(cluster, &pool_object).await?;
    let spec = json!({"effects": [{"ipam": {"pool": pool}}], "failurePolicy": failure_policy});
    let policy_object = pod_policy(&policy, ns, &["CREATE"], spec);
    apply_ready(cluster, &policy_object).await?;
    Ok((pool, policy))
}

fn pod_json(name: &str, labels: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0"}]},
    }))
    .expect("test Pod decodes")
}

/// Creates the Pods concurrently (ten at a time). A create the webhook could not answer (a
/// Gatehouse being restarted; the Policy is `Fail`) is retried: the Pod was not stored.
pub(crate) async fn create_pods(
    cluster: &Cluster,
    ns: &str,
    names: &[String],
) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(cluster.client().await?, ns);
    for chunk in names.chunks(10) {
        let creates = chunk.iter().map(|n| create_pod(&api, n));
        for (name, created) in chunk.iter().zip(futures::future::join_all(creates).await) {
            let pod = created.with_context(|| format!("creating Pod {name}"))?;
            ensure!(
                ipam_gated(&pod),
                "Pod {name} was stored without the IPAM gate (is the Policy wired?)"
            );
        }
    }
    Ok(())
}

async fn create_pod(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    let mut last = None;
    for _ in 0..50 {
        match api
            .create(
                &PostParams::default(),
                &pod_json(name, json!({"app": "web"})),
            )
            .await
        {
            Ok(pod) => return Ok(pod),
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(api.get(name).await?),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(last
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow::anyhow!("no attempt")))
}

/// Waits until the API server marks new Pods (the Policy's entry is live).
pub(crate) async fn await_marking(cluster: &Cluster, ns: &str) -> anyhow::Result<()> {
    let probe = serde_json::to_string(&pod_json("probe", json!({})))?;
    await_condition("Pods to be marked at admission", WAIT, || async {
        let out = cluster
            .kubectl_output(
                [
                    "create",
                    "-n",
                    ns,
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    "-",
                ],
                Some(&probe),
            )
            .await?;
        let pod: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        Ok(pod["spec"]["schedulingGates"]
            .to_string()
            .contains(GATE)
            .then_some(()))
    })
    .await
}

/// Pod name → (uid, address) for every Pod of `ns` whose gate is gone.
async fn placed(cluster: &Cluster, ns: &str) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let api: Api<Pod> = Api::namespaced(cluster.client().await?, ns);
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| !ipam_gated(p))
        .filter_map(|p| {
            let address = p.metadata.annotations.as_ref()?.get(ANNOTATION)?.clone();
            Some((p.metadata.name?, (p.metadata.uid?, address)))
        })
        .collect())
}

/// IPAllocations of `pool`: (address, owner name, owner uid).
pub(crate) async fn allocations(
    cluster: &Cluster,
    pool: &str,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let out = cluster
        .kubectl_ok(
            [
                "get",
                "ipallocations",
                "-l",
                &format!("gatehouse.dev/pool={pool}"),
                "-o",
                "json",
            ],
            None,
        )
        .await?;
    let v: Value = serde_json::from_str(&out)?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            let s = |p: &str| {
                a.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            (
                s("/spec/address"),
                s("/spec/owner/name"),
                s("/spec/owner/uid"),
            )
        })
        .collect())
}

/// Every placed Pod's annotation is its own allocation, and no address is held twice.
pub(crate) async fn assert_consistent(
    cluster: &Cluster,
    ns: &str,
    pool: &str,
) -> anyhow::Result<usize> {
    let pods = placed(cluster, ns).await?;
    let allocs = allocations(cluster, pool).await?;
    let addresses: BTreeSet<&String> = allocs.iter().map(|a| &a.0).collect();
    ensure!(
        addresses.len() == allocs.len(),
        "an address is allocated twice: {allocs:?}"
    );
    let owners: BTreeSet<&String> = allocs.iter().map(|a| &a.2).collect();
    ensure!(
        owners.len() == allocs.len(),
        "a Pod holds two addresses: {allocs:?}"
    );
    for (name, (uid, address)) in &pods {
        ensure!(
            allocs.iter().any(|(a, _, u)| a == address && u == uid),
            "Pod {name} says {address}, which no allocation of its UID holds"
        );
    }
    Ok(pods.len())
}

pub(crate) fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

pub(crate) async fn await_placed(
    cluster: &Cluster,
    ns: &str,
    n: usize,
    within: Duration,
) -> anyhow::Result<()> {
    await_condition(&format!("{n} Pods placed"), within, || async {
        Ok((placed(cluster, ns).await?.len() >= n).then_some(()))
    })
    .await
}

/// Scenarios 1 and 2: fifty Pods created at once get fifty distinct addresses; a Pod denied by a
/// validating Policy after the mutating one marked it, and a server dry run, allocate nothing.
#[tokio::test]
async fn pods_get_distinct_addresses_and_denied_or_dry_run_pods_none() {
    scenario("gh-ipam", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let deny = scene.policy("deny");
        let (pool, _) = pool_and_policy(scene, &id, scene.ns(), "10.30.0.0/24", &["10.30.0.0/30"], "Fail").await?;
        await_marking(cluster, scene.ns()).await?;
        create_pods(cluster, scene.ns(), &names("web", 50)).await?;
        await_placed(cluster, scene.ns(), 50, WAIT).await?;
        ensure!(assert_consistent(cluster, scene.ns(), &pool).await? == 50);
        let pool_obj = get_json(cluster, &["ippool", &pool]).await?.context("pool")?;
        ensure!(pool_obj["status"]["allocated"] == 50, "{}", pool_obj["status"]);
        ensure!(pool_obj["status"]["capacity"] == 251, "{}", pool_obj["status"]);

        // Marked by the mutating entry, then denied by a validating one: never allocated.
        let spec = json!({"validate": [{"expression": "!has(object.metadata.labels.forbidden)", "message": "forbidden Pods are refused"}]});
        let deny_policy = pod_policy(&deny, scene.ns(), &["CREATE"], spec);
        apply_ready(cluster, &deny_policy).await?;
        let forbidden = serde_json::to_string(&pod_json("forbidden", json!({"forbidden": "yes"})))?;
        await_condition("the forbidden Pod refused", WAIT, || async {
            let out = cluster.kubectl_output(["create", "-n", scene.ns(), "-f", "-"], Some(&forbidden)).await?;
            if out.status.success() {
                cluster.kubectl_ok(["delete", "pod", "forbidden", "-n", scene.ns()], None).await?;
                return Ok(None);
            }
            Ok(stderr(&out).contains("forbidden Pods are refused").then_some(()))
        })
        .await?;
        let dry = serde_json::to_string(&pod_json("dry", json!({})))?;
        let out = cluster
            .kubectl_ok(["create", "-n", scene.ns(), "--dry-run=server", "-o", "json", "-f", "-"], Some(&dry))
            .await?;
        ensure!(out.contains(GATE), "the dry run was not marked: {out}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let allocs = allocations(cluster, &pool).await?;
        ensure!(
            !allocs.iter().any(|(_, owner, _)| owner == "forbidden" || owner == "dry"),
            "an allocation exists for a Pod that was never stored: {allocs:?}"
        );
        ensure!(allocs.len() == 50, "{} allocations for 50 Pods", allocs.len());
        Ok(())
    })
    .await;
}

/// Scenarios 3 and 4: Pods deleted while Gatehouse is stopped are collected after the grace,
/// the others are kept; a Pod re-created under the same name is another owner.
#[tokio::test]
async fn orphans_of_a_stopped_gatehouse_are_collected_by_uid() {
    let options = Options::service()
        .arg("--gc-interval", "2s")
        .arg("--gc-grace", "3s");
    scenario("gh-ipam-gc", options, async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (pool, _) =
            pool_and_policy(scene, &id, scene.ns(), "10.21.0.0/24", &[], "Ignore").await?;
        await_marking(cluster, scene.ns()).await?;
        create_pods(cluster, scene.ns(), &names("web", 50)).await?;
        await_placed(cluster, scene.ns(), 50, WAIT).await?;
        let before = placed(cluster, scene.ns()).await?;

        scene.gh.stop().await?;
        let api: Api<Pod> = Api::namespaced(cluster.client().await?, scene.ns());
        for name in names("web", 20) {
            api.delete(&name, &DeleteParams::default()).await?;
        }
        // The StatefulSet case: same name, new UID, while nobody watches. With the webhook
        // down too (the Policy is Ignore here), the Pod carries the mark admission would
        // have added: the loop serves any marked Pod.
        api.delete("web-49", &DeleteParams::default()).await?;
        await_condition("web-49 gone", WAIT, || async {
            Ok(api.get_opt("web-49").await?.is_none().then_some(()))
        })
        .await?;
        let mut marked = pod_json(
            "web-49",
            json!({"app": "web", "gatehouse.dev/ipam-pool": pool}),
        );
        if let Some(spec) = marked.spec.as_mut() {
            spec.scheduling_gates = Some(vec![k8s_openapi::api::core::v1::PodSchedulingGate {
                name: GATE.to_string(),
            }]);
        }
        let recreated = api.create(&PostParams::default(), &marked).await?;
        ensure!(ipam_gated(&recreated), "the re-created Pod was not marked");
        scene.gh.restart().await?;

        await_condition("orphans collected", WAIT, || async {
            let allocs = allocations(cluster, &pool).await?;
            Ok((allocs.len() == 30).then_some(()))
        })
        .await?;
        await_placed(cluster, scene.ns(), 30, WAIT).await?;
        ensure!(assert_consistent(cluster, scene.ns(), &pool).await? == 30);
        let after = placed(cluster, scene.ns()).await?;
        for (name, (uid, address)) in &after {
            if name == "web-49" {
                ensure!(*uid != before[name].0, "web-49 kept its old UID");
            } else {
                ensure!(
                    before[name] == (uid.clone(), address.clone()),
                    "{name} changed address"
                );
            }
        }
        let collected = scene
            .gh
            .metric_sum("gatehouse_ipam_orphans_collected_total", "")
            .await?;
        ensure!(collected == 21.0, "{collected} orphans collected, want 21");
        Ok(())
    })
    .await;
}

/// Scenario 7: a /29 has six addresses; the seventh and eighth Pods wait gated, with an Event
/// and the pool Exhausted, until two Pods are deleted. An IPv6 pool works the same way.
#[tokio::test]
async fn an_exhausted_pool_makes_pods_wait_for_a_freed_address() {
    scenario("gh-ipam-full", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (pool, _) =
            pool_and_policy(scene, &id, scene.ns(), "10.22.0.0/29", &[], "Fail").await?;
        let v6 = scene.namespace("gh-ipam-v6").await?;
        let (pool6, _) = pool_and_policy(
            scene,
            &format!("{id}-6"),
            &v6,
            "fd00:22::/125",
            &[],
            "Fail",
        )
        .await?;
        let nowhere = scene.policy("nowhere");
        // A Policy naming a pool that does not exist is not wired.
        let nowhere_policy = json!({
            "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
            "metadata": {"name": nowhere},
            "spec": {
                "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]},
                "effects": [{"ipam": {"pool": format!("missing-{id}")}}],
            },
        });
        apply(cluster, &nowhere_policy).await?;
        let cond = await_ready(cluster, &nowhere, "False").await?;
        ensure!(
            cond["message"].as_str().unwrap_or_default().contains("does not exist"),
            "{cond}"
        );
        await_marking(cluster, scene.ns()).await?;
        create_pods(cluster, scene.ns(), &names("web", 8)).await?;
        await_placed(cluster, scene.ns(), 6, WAIT).await?;
        await_condition("the pool Exhausted", WAIT, || async {
            let p = get_json(cluster, &["ippool", &pool])
                .await?
                .context("pool")?;
            let exhausted = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Exhausted" && c["status"] == "True");
            Ok(exhausted.then_some(()))
        })
        .await?;
        let events = await_condition("a PoolExhausted Event", WAIT, || async {
            let out = cluster
                .kubectl_ok(
                    [
                        "get",
                        "events.events.k8s.io",
                        "-n",
                        scene.ns(),
                        "-o",
                        "json",
                    ],
                    None,
                )
                .await?;
            Ok(out.contains("PoolExhausted").then_some(out))
        })
        .await?;
        ensure!(events.contains("has no free address"));
        let waiting = placed(cluster, scene.ns()).await?;
        ensure!(
            waiting.len() == 6,
            "{} placed from a pool of 6",
            waiting.len()
        );
        let api: Api<Pod> = Api::namespaced(cluster.client().await?, scene.ns());
        let mut freed = Vec::new();
        for name in waiting.keys().take(2) {
            api.delete(name, &DeleteParams::default()).await?;
            freed.push(waiting[name].1.clone());
        }
        let deleted: Vec<String> = waiting.keys().take(2).cloned().collect();
        await_condition(
            "the freed addresses handed to the waiting Pods",
            WAIT,
            || async {
                let now = placed(cluster, scene.ns()).await?;
                let got: BTreeSet<String> = now.values().map(|v| v.1.clone()).collect();
                Ok((now.len() == 6
                    && deleted.iter().all(|d| !now.contains_key(d))
                    && freed.iter().all(|a| got.contains(a)))
                .then_some(()))
            },
        )
        .await?;
        ensure!(assert_consistent(cluster, scene.ns(), &pool).await? == 6);

        // IPv6: /125 minus the subnet-router anycast address.
        await_marking(cluster, &v6).await?;
        create_pods(cluster, &v6, &names("v6", 7)).await?;
        await_placed(cluster, &v6, 7, WAIT).await?;
        ensure!(assert_consistent(cluster, &v6, &pool6).await? == 7);
        let addresses: BTreeSet<String> = placed(cluster, &v6)
            .await?
            .into_values()
            .map(|v| v.1)
            .collect();
        ensure!(
            addresses
                .iter()
                .all(|a| a.starts_with("fd00:22::") && a != "fd00:22::"),
            "{addresses:?}"
        );
        Ok(())
    })
    .await;
}

/// Scenarios 5 and 6: two Gatehouse processes at once, one of them killed with SIGKILL again
/// and again during a 200-Pod burst: every Pod ends with exactly one address, none held twice,
/// allocations == Pods.
#[tokio::test]
async fn crashes_and_two_replicas_never_hand_out_an_address_twice() {
    let options = || {
        Options::url()
            .arg("--lease-duration", "4s")
            .arg("--gc-interval", "5s")
            .arg("--gc-grace", "10s")
    };
    scenario("gh-ipam-crash", options(), async |scene| {
        let cluster = scene.cluster;
        scene.replica(options()).await?;
        let (ns, id) = (scene.ns().to_string(), scene.id());
        let (pool, _) = pool_and_policy(scene, &id, &ns, "10.23.0.0/22", &[], "Fail").await?;
        let a = &mut scene.gh;
        await_marking(cluster, &ns).await?;
        let all = names("burst", 200);
        let burst = create_pods(cluster, &ns, &all);
        let crashes = async {
            for i in 0..5u64 {
                tokio::time::sleep(Duration::from_millis(700 + 300 * i)).await;
                a.kill().await?;
                a.restart().await?;
            }
            Ok::<(), anyhow::Error>(())
        };
        let (created, crashed) = tokio::join!(burst, crashes);
        created?;
        crashed?;
        await_placed(cluster, &ns, 200, Duration::from_secs(120)).await?;
        ensure!(assert_consistent(cluster, &ns, &pool).await? == 200);
        // Allocations of a crash between the two writes are reused, never duplicated.
        let allocs = allocations(cluster, &pool).await?;
        ensure!(
            allocs.len() == 200,
            "{} allocations for 200 Pods",
            allocs.len()
        );
        Ok(())
    })
    .await;
}

/// The IPPool's conditions and finalizer, and release by a finished Pod: an overlapping or
/// malformed pool is Ready=False with the reason; a Pod that Succeeded gives its address back;
/// a deleted pool stays until its last allocation is gone.
#[tokio::test]
async fn pools_report_problems_and_are_held_until_their_addresses_are_free() {
    scenario("gh-ipam-pool", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (pool, _) =
            pool_and_policy(scene, &id, scene.ns(), "10.24.0.0/28", &[], "Fail").await?;
        let (overlapping, malformed) = (
            scene.track_object("ippool", format!("overlap-{id}")),
            scene.track_object("ippool", format!("malformed-{id}")),
        );
        // Creation times have a resolution of one second, and "younger" must be true: two
        // pools created within the same second tie (broken by name, which would make this
        // overlapping pool the older one). CI hit that tie.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        for (name, cidr) in [(&overlapping, "10.24.0.0/29"), (&malformed, "10.24.1.5/24")] {
            let object = json!({
                "apiVersion": "gatehouse.dev/v1alpha1", "kind": "IPPool",
                "metadata": {"name": name}, "spec": {"cidr": cidr},
            });
            apply(cluster, &object).await?;
        }
        let ready = |name: String| async move {
            await_condition(&format!("IPPool {name} Ready=False"), WAIT, || async {
                let p = get_json(cluster, &["ippool", &name])
                    .await?
                    .context("pool")?;
                Ok(p["status"]["conditions"].as_array().and_then(|cs| {
                    cs.iter()
                        .find(|c| c["type"] == "Ready" && c["status"] == "False")
                        .cloned()
                }))
            })
            .await
        };
        let c = ready(overlapping.clone()).await?;
        ensure!(
            c["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("overlaps IPPool {pool}")),
            "{c}"
        );
        let c = ready(malformed.clone()).await?;
        ensure!(
            c["message"]
                .as_str()
                .unwrap_or_default()
                .contains("10.24.1.0/24"),
            "{c}"
        );

        await_marking(cluster, scene.ns()).await?;
        create_pods(cluster, scene.ns(), &names("web", 3)).await?;
        await_placed(cluster, scene.ns(), 3, WAIT).await?;
        // A finished Pod (the kubelet would set this) releases its address at once.
        cluster
            .kubectl_ok(
                [
                    "patch",
                    "pod",
                    "web-0",
                    "-n",
                    scene.ns(),
                    "--subresource=status",
                    "--type=merge",
                    "-p",
                    r#"{"status":{"phase":"Succeeded"}}"#,
                ],
                None,
            )
            .await?;
        await_condition("the finished Pod's address released", WAIT, || async {
            let owners: Vec<String> = allocations(cluster, &pool)
                .await?
                .into_iter()
                .map(|a| a.1)
                .collect();
            Ok((owners.len() == 2 && !owners.contains(&"web-0".to_string())).then_some(()))
        })
        .await?;

        // Deleted while addresses are held: the finalizer keeps the pool until they are free.
        cluster
            .kubectl_ok(["delete", "ippool", &pool, "--wait=false"], None)
            .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let held = get_json(cluster, &["ippool", &pool])
            .await?
            .context("the pool went while addresses were held")?;
        ensure!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
        let api: Api<Pod> = Api::namespaced(cluster.client().await?, scene.ns());
        api.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await?;
        await_condition("the pool gone with its last address", WAIT, || async {
            Ok(get_json(cluster, &["ippool", &pool])
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        ensure!(allocations(cluster, &pool).await?.is_empty());
        Ok(())
    })
    .await;
}
