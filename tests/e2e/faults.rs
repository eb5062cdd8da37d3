//! Faults on the real control plane while Gatehouse runs: the API server restarted, etcd stopped
//! for 20 s (with Policies and during an IPAM burst), Gatehouse killed with SIGKILL in the
//! middle of a Policy burst. Each test runs alone
//! on the cluster ([`disruptive_scenario`]). (The TLS Secret deleted by hand under load is in
//! `lockout.rs`, the leader killed in `operator.rs`, SIGKILL during an IPAM burst in `ipam.rs`.)

use std::time::Duration;

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::Value;

use crate::fixtures::{
    apply, apply_ready, await_ready, create_pod_until, get_json, label, list, policy, wired_groups,
};
use crate::ipam::{
    allocations, assert_consistent, await_marking, await_placed, create_pods, names as pod_names,
    pool_and_policy,
};
use crate::scene::disruptive_scenario;

/// A Policy that labels Pods `<label>: "yes"`.
fn labeller(name: &str, ns: &str, key: &str) -> Value {
    policy(name, ns, label(10, key, "yes"))
}

/// Creates Pod `name` until the API server has picked up the configuration, and returns its
/// labels once every one of `labels` is there.
async fn pod_labelled(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    labels: &[&str],
) -> anyhow::Result<()> {
    let mut last = Value::Null;
    create_pod_until(cluster, ns, name, &["-o", "json"], |out| {
        let Ok(pod) = serde_json::from_slice::<Value>(&out.stdout) else {
            return false;
        };
        last = pod["metadata"]["labels"].clone();
        labels.iter().all(|l| last[*l] == "yes")
    })
    .await
    .with_context(|| format!("Pod {name} was never labelled {labels:?} (last: {last})"))?;
    Ok(())
}

#[tokio::test]
async fn an_api_server_restart_and_a_20s_etcd_outage_heal_without_restarting_gatehouse() {
    disruptive_scenario("gh-faults", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_owned();
        let names = [
            scene.policy("before"),
            scene.policy("after-api"),
            scene.policy("after-etcd"),
        ];
        let pid = scene.gh.pid().context("gatehouse is not running")?;
        apply_ready(cluster, &labeller(&names[0], &ns, "before")).await?;

        cluster.restart("kube-apiserver", Duration::ZERO).await?;
        // The Policy controller sees a Policy written after the restart: its watches resumed.
        apply_ready(cluster, &labeller(&names[1], &ns, "after-api")).await?;
        pod_labelled(cluster, &ns, "web-1", &["before", "after-api"]).await?;

        cluster.restart("etcd", Duration::from_secs(20)).await?;
        apply_ready(cluster, &labeller(&names[2], &ns, "after-etcd")).await?;
        pod_labelled(
            cluster,
            &ns,
            "web-2",
            &["before", "after-api", "after-etcd"],
        )
        .await?;

        let state = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        ensure!(
            scene.gh.pid() == Some(pid)
                && state
                    .lines()
                    .any(|l| l.starts_with("State:") && !l.contains("zombie")),
            "gatehouse (pid {pid}) did not survive: {}",
            state
                .lines()
                .find(|l| l.starts_with("State:"))
                .unwrap_or("gone")
        );
        let log = scene.gh.log();
        ensure!(!log.contains("panicked"), "gatehouse panicked: {log}");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_policy_burst_cut_by_sigkill_is_all_ready_and_wired_after_the_restart() {
    disruptive_scenario("gh-burst", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let (ns, id) = (scene.ns().to_owned(), scene.id());
        let names: Vec<String> = (0..40)
            .map(|i| scene.track(format!("burst-{id}-{i:02}")))
            .collect();
        let burst = list(names.iter().map(|n| labeller(n, &ns, n)));
        let applying = async { apply(cluster, &burst).await };
        let killing = async {
            // Once the controller has seen part of the burst.
            await_condition(
                "a Policy of the burst Ready",
                Duration::from_secs(60),
                || async {
                    let p = get_json(cluster, &["policy", &names[0]]).await?;
                    Ok(p.filter(|p| p["status"]["conditions"].is_array())
                        .map(|_| ()))
                },
            )
            .await?;
            scene.gh.kill().await
        };
        let (applied, killed) = tokio::join!(applying, killing);
        applied?;
        killed?;
        scene.gh.restart().await?;
        for name in &names {
            await_ready(cluster, name, "True").await?;
        }
        await_condition("all 40 Policies wired", Duration::from_secs(60), || async {
            let groups = wired_groups(cluster).await?;
            let wired = names
                .iter()
                .all(|n| groups.iter().any(|g| g.members.iter().any(|m| m == n)));
            Ok(wired.then_some(()))
        })
        .await?;
        let last = &names[names.len() - 1];
        pod_labelled(cluster, &ns, "web", &[&names[0], last]).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn an_ipam_burst_through_an_api_server_restart_and_an_etcd_outage_leaks_nothing() {
    let options = Options::url()
        .arg("--gc-interval", "5s")
        .arg("--gc-grace", "5s");
    disruptive_scenario("gh-ipam-faults", options, async |scene| {
        let cluster = scene.cluster;
        let (ns, id) = (scene.ns().to_owned(), scene.id());
        let (pool, _) = pool_and_policy(scene, &id, &ns, "10.79.0.0/24", &[], "Fail").await?;
        await_marking(cluster, &ns).await?;
        let pods = pod_names("web", 60);
        // The API server goes away while the Pods are created (creates are retried) and the
        // effects loop allocates; then etcd goes for 20 s while allocations are under way.
        let restart = async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            cluster.restart("kube-apiserver", Duration::ZERO).await
        };
        let (created, restarted) = tokio::join!(create_pods(cluster, &ns, &pods), restart);
        created?;
        restarted?;
        cluster.restart("etcd", Duration::from_secs(20)).await?;
        await_placed(cluster, &ns, pods.len(), Duration::from_secs(120)).await?;
        let placed = assert_consistent(cluster, &ns, &pool).await?;
        ensure!(
            placed == pods.len(),
            "{placed} of {} Pods placed",
            pods.len()
        );
        let held = allocations(cluster, &pool).await?.len();
        ensure!(
            held == pods.len(),
            "{held} allocations for {} Pods",
            pods.len()
        );

        // Nothing leaks: with the Pods gone, every address comes back.
        cluster
            .kubectl_ok(["delete", "pods", "--all", "-n", &ns, "--wait=true"], None)
            .await?;
        await_condition(
            "every address released",
            Duration::from_secs(90),
            || async { Ok(allocations(cluster, &pool).await?.is_empty().then_some(())) },
        )
        .await?;
        Ok(())
    })
    .await;
}
