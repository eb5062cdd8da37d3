//! Never lock the cluster out, never two leaders: the defects a review reproduced on the real
//! API server, each driven the way it happened.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::instance::{Gatehouse, Options};
use gatehouse_e2e::lease::{Impostor, leader_gauge};
use gatehouse_e2e::proxy::FreezableProxy;
use gatehouse_e2e::{Cluster, await_condition, run_test, tls_client};
use serde_json::{Value, json};

use crate::fixtures::{
    WAIT, apply, apply_ready, apply_sidecar, await_ready, container_names, decode_secret_key,
    delete_policies, get_json, merge, pod, policy, require_limits, rotating, sidecar, stderr,
    try_apply, wired_groups,
};
use crate::scene::{Scene, scenario};

/// Creates Pods one after another in `ns`, each of which must be admitted and mutated by the
/// sidecar Policy: a TLS failure of the Fail-policy webhook would refuse one.
struct PodLoad<'a> {
    cluster: &'a Cluster,
    ns: String,
    created: usize,
}

impl<'a> PodLoad<'a> {
    fn new(cluster: &'a Cluster, ns: &str) -> Self {
        Self {
            cluster,
            ns: ns.to_string(),
            created: 0,
        }
    }

    async fn one(&mut self, gh: &Gatehouse) -> anyhow::Result<()> {
        let name = format!("load-{}", self.created);
        let out = self
            .cluster
            .kubectl_output(
                ["create", "-o", "json", "-f", "-"],
                Some(&pod(&name, &self.ns)),
            )
            .await?;
        ensure!(
            out.status.success(),
            "create #{} was refused: {}\n--- gatehouse log tail ---\n{}",
            self.created,
            stderr(&out),
            tail(&gh.log(), 40)
        );
        let p: Value = serde_json::from_slice(&out.stdout)?;
        ensure!(
            container_names(&p) == ["app", "proxy"],
            "create #{} was not mutated",
            self.created
        );
        self.created += 1;
        self.cluster
            .kubectl_ok(
                [
                    "delete",
                    "pod",
                    &name,
                    "-n",
                    &self.ns,
                    "--wait=false",
                    "--grace-period=0",
                ],
                None,
            )
            .await?;
        Ok(())
    }

    /// Creates Pods until `done` says so (checked between Pods), or fails after `timeout`.
    async fn until<F, Fut>(
        &mut self,
        gh: &Gatehouse,
        what: &str,
        timeout: Duration,
        mut done: F,
    ) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.one(gh).await?;
            if done().await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {timeout:?} waiting for {what}\n--- gatehouse log tail ---\n{}",
                    tail(&gh.log(), 60)
                );
            }
        }
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The CAs (PEM, one string each) in every entry's caBundle of both configurations.
async fn bundles(cluster: &Cluster) -> anyhow::Result<Vec<String>> {
    use base64::Engine as _;
    let mut out = Vec::new();
    for kind in [
        "mutatingwebhookconfiguration",
        "validatingwebhookconfiguration",
    ] {
        let Some(cfg) = get_json(cluster, &[kind, "gatehouse"]).await? else {
            continue;
        };
        for w in cfg["webhooks"].as_array().into_iter().flatten() {
            let b64 = w["clientConfig"]["caBundle"].as_str().unwrap_or_default();
            out.push(String::from_utf8(
                base64::engine::general_purpose::STANDARD.decode(b64)?,
            )?);
        }
    }
    Ok(out)
}

/// The resourceVersions of the named Policies (null for a missing one).
async fn resource_versions(cluster: &Cluster, names: &[&str]) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for name in names {
        let p = get_json(cluster, &["policy", name]).await?;
        out.push(
            p.map(|p| p["metadata"]["resourceVersion"].clone())
                .unwrap_or_default(),
        );
    }
    Ok(out)
}

fn pem_body(pem: &str) -> String {
    pem.lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<String>()
}

/// Defect 1: with nobody able to write the configurations (an impostor holds the Lease), a CA
/// rotation comes due. The serving certificate must not switch to a CA the API server does not
/// trust yet: the old certificate keeps being served and no request fails. Once Gatehouse
/// leads again, the rotation completes with the overlap, and a deleted Secret comes back with
/// the CA the cluster trusts.
#[tokio::test]
async fn ca_rotation_waits_while_the_bundle_cannot_be_written() {
    scenario(
        "gh-stuck-rotation",
        rotating(Options::url(), "80s", "20s").arg("--lease-duration", "4s"),
        async |scene| {
            let cluster = scene.cluster;
            let inject = scene.policy("inject");
            let gh = &scene.gh;
            apply_sidecar(cluster, &inject, scene.ns()).await?;
            let secret = |c: &'static Cluster, home: String| async move {
                get_json(c, &["secret", "gatehouse-tls", "-n", &home])
                    .await?
                    .context("TLS secret")
            };
            let ca1 = decode_secret_key(&secret(cluster, scene.home().into()).await?, "ca.crt")?;
            let mut load = PodLoad::new(cluster, scene.ns());
            load.one(gh).await?;

            let impostor = Impostor::start(cluster, scene.home()).await?;
            await_condition("gatehouse follows the impostor", WAIT, || async {
                Ok((leader_gauge(gh).await? == 0.0).then_some(()))
            })
            .await?;

            // The rotation comes due at about 2/3 of the CA's lifetime.
            load.until(
                gh,
                "a CA rotation to start",
                Duration::from_secs(90),
                || async {
                    Ok(
                        secret(cluster, scene.home().into()).await?["data"]["ca-next.crt"]
                            .is_string(),
                    )
                },
            )
            .await?;
            // Five times the grace: long enough for yesterday's timers to switch and drop.
            let hold_until = Instant::now() + Duration::from_secs(10);
            load.until(gh, "the hold", Duration::from_secs(20), || async {
                Ok(Instant::now() > hold_until)
            })
            .await?;
            let s = secret(cluster, scene.home().into()).await?;
            ensure!(
                decode_secret_key(&s, "ca.crt")? == ca1,
                "the serving CA switched although no configuration trusts the new one"
            );
            tls_client(&ca1)?
                .connect(gh.port)
                .await
                .context("the certificate served is not the one the API server trusts")?;
            let waiting = gh
                .metric_sum("gatehouse_tls_rotation_waiting", "step=\"switch\"")
                .await?;
            ensure!(
                waiting == 1.0,
                "gatehouse_tls_rotation_waiting{{step=switch}} is {waiting}"
            );
            let events = cluster
                .kubectl_ok(
                    [
                        "get",
                        "events.events.k8s.io",
                        "-n",
                        scene.home(),
                        "-o",
                        "json",
                    ],
                    None,
                )
                .await?;
            ensure!(
                events.contains("RotationWaiting"),
                "no RotationWaiting event in {}",
                scene.home()
            );

            // Leading again, Gatehouse publishes the new CA, then switches, then drops the old.
            drop(impostor);
            cluster
                .kubectl_ok(
                    [
                        "delete",
                        "lease",
                        "gatehouse-controller",
                        "-n",
                        scene.home(),
                        "--ignore-not-found",
                    ],
                    None,
                )
                .await?;
            load.until(
                gh,
                "the rotation to complete",
                Duration::from_secs(60),
                || async {
                    let s = secret(cluster, scene.home().into()).await?;
                    Ok(decode_secret_key(&s, "ca.crt")? != ca1
                        && !s["data"]["ca-previous.crt"].is_string())
                },
            )
            .await?;
            let ca2 = decode_secret_key(&secret(cluster, scene.home().into()).await?, "ca.crt")?;
            tls_client(&ca2)?.connect(gh.port).await?;
            load.until(
                gh,
                "the configurations to trust only the new CA",
                WAIT,
                || async {
                    let all = bundles(cluster).await?;
                    let (old, new) = (pem_body(&ca1), pem_body(&ca2));
                    // Compared without line breaks: a bundle's PEM wraps its lines.
                    Ok(!all.is_empty()
                        && all
                            .iter()
                            .map(|b| pem_body(b))
                            .all(|b| b.contains(&new) && !b.contains(&old)))
                },
            )
            .await?;

            // A Secret deleted by hand is recreated from memory, not with a CA nobody trusts.
            cluster
                .kubectl_ok(
                    ["delete", "secret", "gatehouse-tls", "-n", scene.home()],
                    None,
                )
                .await?;
            let back = await_condition("the TLS Secret to be recreated", WAIT, || async {
                get_json(cluster, &["secret", "gatehouse-tls", "-n", scene.home()]).await
            })
            .await?;
            ensure!(
                decode_secret_key(&back, "ca.crt")? == ca2,
                "the recreated Secret holds a new CA"
            );
            load.one(gh).await?;
            eprintln!(
                "{} pods admitted across the stalled and the completed rotation",
                load.created
            );
            Ok(())
        },
    )
    .await;
}

/// Defect 2: a Policy the API server would refuse can never block the configuration writes
/// everything else depends on. What our validation can know is refused at apply with the
/// reason; what only the API server knows is found, marked Ready=False with its message and
/// left out, while other Policies keep being wired and unwired.
#[tokio::test]
async fn a_policy_the_api_server_refuses_blocks_nothing() {
    scenario("gh-refused", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let (spaced, typed, deny, later) = (
            scene.policy("spaced"),
            scene.policy("typed"),
            scene.policy("deny"),
            scene.policy("later"),
        );
        // A sidecar Policy with one match condition.
        let conditional = |name: &str, condition: &str, expression: &str| {
            let mut spec = sidecar(100, true, false);
            merge(
                &mut spec,
                json!({"match": {"conditions": [{"name": condition, "expression": expression}]}}),
            );
            policy(name, scene.ns(), spec)
        };
        // A condition name the API server would refuse: refused at apply, with the reason.
        let spaced_policy = conditional(&spaced, "has space", "true");
        let out = await_condition("the spaced condition name refused", WAIT, || async {
            let out = try_apply(cluster, &spaced_policy).await?;
            if out.status.success() {
                // Our validation entry was not yet registered; try again.
                cluster
                    .kubectl_ok(["delete", "policy", &spaced], None)
                    .await?;
                return Ok(None);
            }
            Ok(Some(out))
        })
        .await?;
        let err = stderr(&out);
        ensure!(
            err.contains("spec.match.conditions[0].name") && err.contains("has space"),
            "kubectl said: {err}"
        );

        // A Deny Policy wired first.
        apply_ready(cluster, &policy(&deny, scene.ns(), require_limits())).await?;
        // What only the API server knows: a ValidatingAdmissionPolicy of the cluster's own
        // refuses (as Invalid, 422) webhook configurations with a match condition that names
        // `typed`. Gatehouse's checks accept the Policy; the API server's judgement of its
        // conditions (the dry-run condition check) refuses it.
        let message = format!("matchConditions: an expression naming {typed} is refused here");
        let _guard = (
            cluster.delete_on_drop("validatingadmissionpolicy", &typed, None),
            cluster.delete_on_drop("validatingadmissionpolicybinding", &typed, None),
        );
        apply(cluster, &refuse_conditions_naming(&typed, &message)).await?;
        await_condition(
            "the cluster's policy on webhook configurations in effect",
            WAIT,
            || async {
                let out = cluster
                    .kubectl_output(
                        ["create", "--dry-run=server", "-f", "-"],
                        Some(&configuration_with_condition(&typed).to_string()),
                    )
                    .await?;
                Ok((!out.status.success()).then_some(()))
            },
        )
        .await?;
        apply(
            cluster,
            &conditional(&typed, "typed", &format!("request.operation != '{typed}'")),
        )
        .await?;
        let cond = await_ready(cluster, &typed, "False").await?;
        ensure!(cond["reason"] == "RejectedByAPIServer", "condition {cond}");
        ensure!(
            cond["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&message),
            "the API server's message is missing: {cond}"
        );

        // Others are still wired...
        apply_sidecar(cluster, &later, scene.ns()).await?;
        let wired = wired_groups(cluster).await?;
        let is_wired = |p: &str| wired.iter().any(|g| g.members.iter().any(|m| m == p));
        ensure!(is_wired(&later), "{wired:?}");
        ensure!(!is_wired(&typed), "{wired:?}");
        // ...and unwired: with the Deny Policy deleted, a Pod without limits is admitted.
        delete_policies(cluster, &[&deny]).await?;
        let no_limits = pod("unlimited", scene.ns())
            .replace("    resources: {limits: {cpu: 100m, memory: 64Mi}}\n", "");
        await_condition("the Deny Policy to be unwired", WAIT, || async {
            let out = cluster
                .kubectl_output(["create", "--dry-run=server", "-f", "-"], Some(&no_limits))
                .await?;
            Ok(out.status.success().then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

/// A ValidatingAdmissionPolicy and its binding, named `marker`, that refuse (as Invalid) every
/// ValidatingWebhookConfiguration with a match condition whose expression names `marker`.
fn refuse_conditions_naming(marker: &str, message: &str) -> Value {
    let expression = format!(
        "!has(object.webhooks) || !object.webhooks.exists(w, has(w.matchConditions) && w.matchConditions.exists(c, c.expression.contains('{marker}')))"
    );
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": marker, "labels": {"gatehouse.dev/e2e": "true"}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["admissionregistration.k8s.io"], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["validatingwebhookconfigurations"],
                }]},
                "validations": [{"expression": expression, "message": message, "reason": "Invalid"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": marker, "labels": {"gatehouse.dev/e2e": "true"}},
            "spec": {"policyName": marker, "validationActions": ["Deny"]},
        },
    ]})
}

/// A configuration (only ever dry-run) with one entry whose match condition names `marker`.
fn configuration_with_condition(marker: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("{marker}-probe")},
        "webhooks": [{
            "name": "probe.gatehouse.dev",
            "clientConfig": {"url": "https://127.0.0.1:1/probe"},
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "matchConditions": [{"name": "probe", "expression": format!("request.operation != '{marker}'")}],
        }],
    })
}

/// Defect 3: the leader loses the API server behind a frozen proxy (its requests hang, none
/// fail). It must stop leading within its renew deadline, before the other replica may take
/// over, and nothing it queued may land after the other's first write.
#[tokio::test]
async fn a_partitioned_leader_stops_writing_before_another_takes_over() {
    run_test(|cluster| async move {
        let kubeconfig_text = std::fs::read_to_string(cluster.kubeconfig())?;
        let proxy =
            FreezableProxy::start(gatehouse_e2e::proxy::api_server(&kubeconfig_text)?).await?;
        let proxied = proxy.kubeconfig(cluster.kubeconfig(), cluster.state_dir())?;
        // Lease 6s: renew deadline 4s, a round every second.
        let options = || Options::url().arg("--lease-duration", "6s");
        // A (Scene::gh) reaches the API server through the proxy.
        let scene = Scene::start(cluster, "gh-partition", options().kubeconfig(proxied)).await?;
        scene.run(async |scene| {
        await_condition("A leads", WAIT, || async {
            Ok((leader_gauge(&scene.gh).await? == 1.0).then_some(()))
        })
        .await?;
        scene.replica(options()).await?;
        let ns = scene.ns().to_string();
        let (first, second) = (scene.policy("first"), scene.policy("second"));
        let (a, b) = (&scene.gh, &scene.replicas[0]);
            apply_sidecar(cluster, &first, &ns).await?;
            let urls = || async {
                let cfg = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
                    .await?
                    .context("mutating configuration")?;
                Ok::<Vec<String>, anyhow::Error>(
                    cfg["webhooks"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|w| w["clientConfig"]["url"].as_str().map(str::to_string))
                        .collect(),
                )
            };
            let points_at = |urls: &[String], port: u16| {
                !urls.is_empty() && urls.iter().all(|u| u.contains(&format!(":{port}/")))
            };
            ensure!(points_at(&urls().await?, a.port), "A should have wired: {:?}", urls().await?);

            // A sees a change and is about to write when its network freezes.
            apply(cluster, &policy(&second, &ns, sidecar(100, true, false))).await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let frozen_at = Instant::now();
            proxy.freeze();
            // A write in flight now can only complete through the proxy, which holds it.
            let a_writes_before = a
                .metric_sum("gatehouse_reconcile_webhook_configuration_writes_total", "")
                .await?;

            let (mut a_stopped, mut b_started) = (None, None);
            while a_stopped.is_none() || b_started.is_none() {
                ensure!(
                    frozen_at.elapsed() < Duration::from_secs(40),
                    "no handover within 40s (A stopped {a_stopped:?}, B started {b_started:?})"
                );
                if a_stopped.is_none() && leader_gauge(a).await? == 0.0 {
                    a_stopped = Some(frozen_at.elapsed());
                }
                if b_started.is_none() && leader_gauge(b).await? == 1.0 {
                    b_started = Some(frozen_at.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (a_stopped, b_started) = (a_stopped.unwrap_or_default(), b_started.unwrap_or_default());
            eprintln!("partition: A stopped leading after {a_stopped:?}, B led after {b_started:?}");
            ensure!(
                a_stopped < b_started,
                "two leaders: A stopped at {a_stopped:?}, B started at {b_started:?}"
            );
            ensure!(
                a_stopped <= Duration::from_secs(6),
                "A kept leading {a_stopped:?} into the partition (renew deadline 4s)"
            );
            // B rewires everything to itself, the second Policy included.
            await_condition("B rewires the configuration", WAIT, || async {
                Ok(points_at(&urls().await?, b.port).then_some(()))
            })
            .await?;
            await_ready(cluster, &second, "True").await?;
            let config_before = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
                .await?
                .context("mutating configuration")?;
            let status_before = resource_versions(cluster, &[&first, &second]).await?;

            // The partition heals: whatever A had queued is delivered now, and must not land.
            proxy.thaw();
            tokio::time::sleep(Duration::from_secs(8)).await;
            let config_after = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
                .await?
                .context("mutating configuration")?;
            ensure!(
                config_after["metadata"]["resourceVersion"] == config_before["metadata"]["resourceVersion"],
                "the configuration was written after B took over: {:?}",
                urls().await?
            );
            ensure!(points_at(&urls().await?, b.port), "entries moved away from B");
            let status_after = resource_versions(cluster, &[&first, &second]).await?;
            ensure!(status_before == status_after, "a Policy was written after B took over");
            ensure!(leader_gauge(a).await? == 0.0, "A leads again after the partition healed");
            let a_writes_after = a
                .metric_sum("gatehouse_reconcile_webhook_configuration_writes_total", "")
                .await?;
            ensure!(
                a_writes_after == a_writes_before,
                "A counted configuration writes during or after the partition ({a_writes_before} → {a_writes_after})"
            );
            Ok(())
        })
        .await
    })
    .await;
}
