//! Replicas share one CA and one leader; a restart or a leader's death loses no Policy and
//! fails no request, nor does a CA rotation under load.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition, run_test, tls_client};
use gatehouse_engine::Phase;
use serde_json::Value;

use crate::fixtures::*;
use crate::scene::{Stage, scenario};

/// Creates Pod `name` (retrying until it is admitted) and checks that the sidecar was injected
/// into it; `when` says when, for the error.
async fn create_mutated_pod(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    when: &str,
) -> anyhow::Result<()> {
    let out = create_pod_until(cluster, ns, name, &["-o", "json"], |o| o.status.success()).await?;
    let p: Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        container_names(&p) == ["app", "proxy"],
        "not mutated {when}"
    );
    Ok(())
}

#[tokio::test]
async fn restart_loses_nothing() {
    scenario("gh-restart", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        let secret = |c: &'static Cluster, home: String| async move {
            get_json(c, &["secret", "gatehouse-tls", "-n", &home])
                .await?
                .context("secret")
        };
        let before = secret(cluster, scene.home().to_string()).await?;
        let mwc_before = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("mwc")?;
        scene.gh.kill().await?;
        scene.gh.restart().await?;
        let after = secret(cluster, scene.home().to_string()).await?;
        ensure!(
            before["data"]["ca.crt"] == after["data"]["ca.crt"],
            "CA changed across a restart"
        );
        let mwc_after = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("mwc")?;
        ensure!(
            mwc_before["webhooks"] == mwc_after["webhooks"],
            "configuration changed across a restart"
        );
        create_mutated_pod(cluster, scene.ns(), "after", "after restart").await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn replicas_share_one_ca_and_one_leader_fails_over() {
    run_test(|cluster| async move {
        let options = || Options::url().arg("--lease-duration", "4s");
        let stage = Stage::open(cluster, "gh-replicas").await?;
        let scene = stage.start_together(options(), options()).await?;
        scene
            .run(async |scene| {
                let (home, ns) = (scene.home().to_string(), scene.ns().to_string());
                let inject = scene.policy("inject");
                let (a, b) = (&mut scene.gh, &mut scene.replicas[0]);
                // One CA, created race-free; both replicas serve certificates it signed.
                let secret = get_json(cluster, &["secret", "gatehouse-tls", "-n", &home])
                    .await?
                    .context("TLS secret")?;
                let ca = decode_secret_key(&secret, "ca.crt")?;
                tls_client(&ca)?.connect(a.port).await?;
                tls_client(&ca)?.connect(b.port).await?;

                // One leader writes the configurations, pointing at itself.
                apply_sidecar(cluster, &inject, &ns).await?;
                let entry = entry_of(cluster, &inject, Phase::Mutating).await?;
                let url_of_entry = || async {
                    let cfg =
                        get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"]).await?;
                    Ok::<_, anyhow::Error>(cfg.and_then(|c| {
                        c["webhooks"].as_array().and_then(|ws| {
                            ws.iter()
                                .find(|w| {
                                    Some(w["name"].as_str().unwrap_or_default()) == entry.as_deref()
                                })
                                .and_then(|w| w["clientConfig"]["url"].as_str().map(str::to_string))
                        })
                    }))
                };
                let url = url_of_entry().await?.context("entry url")?;
                let lease = get_json(cluster, &["lease", "gatehouse-controller", "-n", &home])
                    .await?
                    .context("lease")?;
                let holder = lease["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                ensure!(!holder.is_empty(), "nobody holds the lease: {lease}");
                let leader_is_a = url.contains(&format!(":{}/", a.port));
                ensure!(
                    leader_is_a || url.contains(&format!(":{}/", b.port)),
                    "entry url {url} is neither replica"
                );
                let (leader, follower) = if leader_is_a { (a, b) } else { (b, a) };
                ensure!(
                    holder.ends_with(&format!("-{}", leader.pid().context("pid")?)),
                    "lease holder {holder} is not the replica the configuration points at"
                );

                // The leader dies without releasing the Lease; the follower takes over when it
                // expires and rewires the configuration to itself.
                leader.kill().await?;
                let follower_port = follower.port;
                await_condition("follower rewires the configuration", WAIT, || async {
                    Ok(url_of_entry()
                        .await?
                        .filter(|u| u.contains(&format!(":{follower_port}/")))
                        .map(|_| ()))
                })
                .await?;
                create_mutated_pod(cluster, &ns, "after-failover", "after failover").await?;
                Ok(())
            })
            .await
    })
    .await;
}

#[tokio::test]
async fn rotation_under_load_fails_no_request() {
    scenario(
        "gh-rotate",
        rotating(Options::service(), "24s", "9s"),
        async |scene| {
            let cluster = scene.cluster;
            let inject = scene.policy("inject");
            apply_sidecar(cluster, &inject, scene.ns()).await?;
            create_pod_until(
                cluster,
                scene.ns(),
                "warmup",
                &["--dry-run=server", "-o", "json"],
                |o| {
                    serde_json::from_slice::<Value>(&o.stdout)
                        .is_ok_and(|p| container_names(&p).len() == 2)
                },
            )
            .await?;
            let (mut cas, mut certs) = (BTreeSet::new(), BTreeSet::new());
            let (mut created, mut i) = (0, 0);
            let deadline = Instant::now() + Duration::from_secs(150);
            while (cas.len() < 3 || certs.len() < 4) && Instant::now() < deadline {
                if let Some(secret) =
                    get_json(cluster, &["secret", "gatehouse-tls", "-n", scene.home()]).await?
                {
                    cas.insert(
                        secret["data"]["ca.crt"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    );
                    certs.insert(
                        secret["data"]["tls.crt"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    );
                }
                i += 1;
                let name = format!("load-{i}");
                let out = cluster
                    .kubectl_output(
                        ["create", "-o", "json", "-f", "-"],
                        Some(&pod(&name, scene.ns())),
                    )
                    .await?;
                ensure!(
                    out.status.success(),
                    "create #{i} failed during rotation: {}\n{}",
                    stderr(&out),
                    scene.gh.log()
                );
                let p: Value = serde_json::from_slice(&out.stdout)?;
                ensure!(
                    container_names(&p) == ["app", "proxy"],
                    "create #{i} was not mutated"
                );
                created += 1;
                cluster
                    .kubectl_ok(
                        [
                            "delete",
                            "pod",
                            &name,
                            "-n",
                            scene.ns(),
                            "--wait=false",
                            "--grace-period=0",
                        ],
                        None,
                    )
                    .await?;
            }
            eprintln!(
                "{created} pods created across {} CAs and {} serving certificates",
                cas.len(),
                certs.len()
            );
            // Two rotations of each: three CAs seen, and more serving certificates than that.
            ensure!(
                cas.len() >= 3,
                "CA rotated {} times",
                cas.len().saturating_sub(1)
            );
            ensure!(
                certs.len() >= 3,
                "serving certificate rotated {} times",
                certs.len().saturating_sub(1)
            );
            Ok(())
        },
    )
    .await;
}
