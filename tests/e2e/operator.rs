//! `gatehouse run` against the real API server: the API server, not the test, calls the webhooks.
//! Each scenario runs its own Gatehouse (service mode unless said otherwise) in its own
//! namespace, and its Policies select only the scenario's namespace.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition, run_test, tls_client};
use gatehouse_engine::Phase;
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::{Scene, Stage, scenario};

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

/// Whether Pod `name` exists in `ns`.
async fn pod_stored(cluster: &Cluster, ns: &str, name: &str) -> anyhow::Result<bool> {
    Ok(get_json(cluster, &["pod", name, "-n", ns]).await?.is_some())
}

/// Scenario 1, in the given mode.
async fn order_matters(scene: &mut Scene) -> anyhow::Result<()> {
    let cluster = scene.cluster;
    let (inject, limits) = (scene.policy("inject"), scene.policy("require-limits"));
    let no_limits = policy(&inject, scene.ns(), sidecar(100, false, false));
    apply_ready(cluster, &no_limits).await?;
    apply_ready(cluster, &policy(&limits, scene.ns(), require_limits())).await?;

    // The sidecar injected by the mutating Policy has no limits, and the validating Policy
    // judges the final object: the Pod is rejected, naming the validating Policy.
    let out = create_pod_until(cluster, scene.ns(), "app", &[], |o| !o.status.success()).await?;
    let err = stderr(&out);
    ensure!(
        err.contains(&limits) && err.contains("every container must declare resource limits"),
        "rejection should name {limits} and its message: {err}"
    );

    // Give the sidecar limits: admitted, with the sidecar exactly once.
    apply_sidecar(cluster, &inject, scene.ns()).await?;
    create_pod_until(cluster, scene.ns(), "app", &[], |o| o.status.success()).await?;
    let stored = get_json(cluster, &["pod", "app", "-n", scene.ns()])
        .await?
        .context("pod not stored")?;
    let names = container_names(&stored);
    ensure!(names == ["app", "proxy"], "containers: {names:?}");
    Ok(())
}

#[tokio::test]
async fn order_matters_service_mode() {
    scenario("gh-order", Options::service(), order_matters).await;
}

#[tokio::test]
async fn order_matters_url_mode() {
    scenario("gh-order", Options::url(), order_matters).await;
}

#[tokio::test]
async fn reinvocation_keeps_one_sidecar() {
    scenario("gh-reinvoke", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let (a, b) = (scene.policy("a-sidecar"), scene.policy("b-label"));
        apply_ready(cluster, &policy(&a, scene.ns(), sidecar(10, true, true))).await?;
        apply_ready(
            cluster,
            &policy(&b, scene.ns(), label(20, "team", "platform")),
        )
        .await?;
        // A reinvokes and B does not: two runs, two entries, A's first.
        let order = entries(cluster, "mutatingwebhookconfiguration").await?;
        let (entry_a, entry_b) = (
            entry_of(cluster, &a, Phase::Mutating)
                .await?
                .context("A unwired")?,
            entry_of(cluster, &b, Phase::Mutating)
                .await?
                .context("B unwired")?,
        );
        let pos = |e: &str| order.iter().position(|x| x == e);
        ensure!(
            entry_a != entry_b && pos(&entry_a) < pos(&entry_b),
            "entry order {order:?}"
        );

        // Wait until both are in effect (a dry run shows label and sidecar), then create
        // one Pod and count how often A was asked.
        create_pod_until(
            cluster,
            scene.ns(),
            "probe",
            &["--dry-run=server", "-o", "json"],
            |o| {
                serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|p| {
                    p["metadata"]["labels"]["team"] == "platform" && container_names(&p).len() == 2
                })
            },
        )
        .await?;
        let evaluations = "gatehouse_policy_decisions_total";
        let of_a = format!("policy=\"{a}\"");
        let before = scene.gh.metric_sum(evaluations, &of_a).await?;
        cluster
            .kubectl_ok(["create", "-f", "-"], Some(&pod("app", scene.ns())))
            .await?;
        let after = scene.gh.metric_sum(evaluations, &of_a).await?;
        let stored = get_json(cluster, &["pod", "app", "-n", scene.ns()])
            .await?
            .context("pod")?;
        ensure!(
            container_names(&stored) == ["app", "proxy"],
            "containers {:?}",
            container_names(&stored)
        );
        ensure!(
            stored["metadata"]["labels"]["team"] == "platform",
            "label missing: {stored}"
        );
        // B changed the object after A, so the API server invoked A a second time, and A's
        // second run added nothing.
        ensure!(
            after - before == 2.0,
            "policy A was called {} times, want 2",
            after - before
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn server_dry_run_previews_and_stores_nothing() {
    scenario("gh-dryrun", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        let preview = pod("preview", scene.ns());
        await_condition("the dry run to show the mutation", WAIT, || async {
            let out = cluster
                .kubectl_ok(
                    ["apply", "--dry-run=server", "-o", "json", "-f", "-"],
                    Some(&preview),
                )
                .await?;
            let p: Value = serde_json::from_str(&out)?;
            if container_names(&p) != ["app", "proxy"] {
                bail!("dry run did not show the mutation: {p}");
            }
            Ok(Some(()))
        })
        .await?;
        ensure!(
            !pod_stored(cluster, scene.ns(), "preview").await?,
            "server dry-run stored the Pod"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn warn_admits_and_warns() {
    scenario("gh-warn", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let warn = scene.policy("warn-team");
        let spec = json!({"priority": 100, "validate": [{
            "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
            "message": "pods should carry a team label",
            "action": "Warn",
        }]});
        apply_ready(cluster, &policy(&warn, scene.ns(), spec)).await?;
        let out = create_pod_until(cluster, scene.ns(), "app", &[], |o| {
            o.status.success() && stderr(o).contains("pods should carry a team label")
        })
        .await?;
        let err = stderr(&out);
        ensure!(
            err.contains("Warning:") && err.contains(&warn),
            "kubectl printed: {err}"
        );
        ensure!(
            pod_stored(cluster, scene.ns(), "app").await?,
            "pod not stored"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn deleting_a_policy_unwires_it() {
    scenario("gh-delete", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        ensure!(entry_of(cluster, &inject, Phase::Mutating).await?.is_some());
        create_pod_until(cluster, scene.ns(), "before", &[], |o| o.status.success()).await?;
        cluster
            .kubectl_ok(["delete", "policy", &inject], None)
            .await?;
        await_condition("unwired", WAIT, || async {
            Ok(entry_of(cluster, &inject, Phase::Mutating)
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
        // Later Pods are untouched (allowing the API server a moment to see the change).
        create_pod_until(cluster, scene.ns(), "after", &["-o", "json"], |o| {
            o.status.success()
                && serde_json::from_slice::<Value>(&o.stdout)
                    .is_ok_and(|p| container_names(&p) == ["app"])
        })
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn drift_is_repaired() {
    scenario("gh-drift", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let inject = scene.policy("inject");
        apply_sidecar(cluster, &inject, scene.ns()).await?;
        let entry = entry_of(cluster, &inject, Phase::Mutating)
            .await?
            .context("the Policy's entry")?;
        let timeout_of = |cfg: &Value| {
            cfg["webhooks"].as_array().and_then(|ws| {
                ws.iter()
                    .find(|w| w["name"] == entry.as_str())
                    .map(|w| w["timeoutSeconds"].clone())
            })
        };
        // Deleted: restored.
        cluster
            .kubectl_ok(
                ["delete", "mutatingwebhookconfiguration", "gatehouse"],
                None,
            )
            .await?;
        let started = Instant::now();
        await_condition(
            "configuration restored",
            Duration::from_secs(20),
            || async {
                Ok(entries(cluster, "mutatingwebhookconfiguration")
                    .await?
                    .contains(&entry)
                    .then_some(()))
            },
        )
        .await?;
        eprintln!("restored after delete in {:?}", started.elapsed());
        // Edited: repaired.
        let idx = entries(cluster, "mutatingwebhookconfiguration")
            .await?
            .iter()
            .position(|e| e == &entry)
            .context("entry")?;
        let patch =
            format!(r#"[{{"op":"replace","path":"/webhooks/{idx}/timeoutSeconds","value":29}}]"#);
        cluster
            .kubectl_ok(
                [
                    "patch",
                    "mutatingwebhookconfiguration",
                    "gatehouse",
                    "--type=json",
                    "-p",
                    &patch,
                ],
                None,
            )
            .await?;
        let started = Instant::now();
        await_condition("edit repaired", Duration::from_secs(20), || async {
            let cfg = get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
                .await?
                .context("cfg")?;
            Ok((timeout_of(&cfg) == Some(Value::from(10))).then_some(()))
        })
        .await?;
        eprintln!("repaired after edit in {:?}", started.elapsed());
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn match_everything_spares_system_namespaces() {
    scenario("gh-everything", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let name = scene.policy("everything");
        let label = format!("deny-{id}");
        // Matches every resource in every namespace; denies only objects carrying the label, so
        // that the rest of the (shared) test cluster keeps working.
        let everything = policy_object(&name, json!({
            "match": {"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "*"}]},
            "failurePolicy": "Ignore",
            "validate": [{
                "expression": format!("!has(object.metadata) || !has(object.metadata.labels) || !('{label}' in object.metadata.labels)"),
                "message": format!("labelled {label}"),
            }],
        }));
        let cm = |namespace: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: probe-{id}\n  namespace: {namespace}\n  labels: {{{label}: \"x\"}}\n")
        };
        apply(cluster, &everything).await?;
        await_ready(cluster, &name, "True").await?;
        await_condition("match-everything policy in effect", WAIT, || async {
            let out = cluster.kubectl_output(["create", "--dry-run=server", "-f", "-"], Some(&cm(scene.ns()))).await?;
            Ok((!out.status.success() && stderr(&out).contains(&format!("labelled {label}"))).then_some(()))
        })
        .await?;
        for protected in ["kube-system", scene.home()] {
            let out = cluster.kubectl_output(["create", "-f", "-"], Some(&cm(protected))).await?;
            ensure!(out.status.success(), "create in {protected} was refused: {}", stderr(&out));
            cluster.kubectl_ok(["delete", "configmap", &format!("probe-{id}"), "-n", protected], None).await?;
        }
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn invalid_policies_are_refused_or_marked_not_ready() {
    scenario("gh-invalid", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let (bad, slipped) = (scene.policy("bad-cel"), scene.policy("slipped"));
        let broken = json!({"priority": 100, "validate": [{"expression": "object.spec.containers.all(c, ", "message": "broken"}]});
        // With Gatehouse up, kubectl apply fails with the exact reason.
        let out = await_condition("invalid policy refused", WAIT, || async {
            let out = try_apply(cluster, &policy(&bad, scene.ns(), broken.clone())).await?;
            if out.status.success() {
                // Our validation webhook was not yet registered; try again.
                cluster.kubectl_ok(["delete", "policy", &bad], None).await?;
                return Ok(None);
            }
            Ok(Some(out))
        })
        .await?;
        let err = stderr(&out);
        ensure!(err.contains("spec.validate[0].expression"), "kubectl said: {err}");
        ensure!(get_json(cluster, &["policy", &bad]).await?.is_none(), "refused policy was stored");
        // An expression over the cost budget is refused with its estimate.
        let costly = format!("costly-{id}");
        let three = "object.spec.containers.all(a, object.spec.containers.all(b, object.spec.containers.all(c, a.name != b.name || b.name != c.name)))";
        let costly_spec = json!({"priority": 100, "validate": [{"expression": three, "message": "too costly"}]});
        let out = try_apply(cluster, &policy(&costly, scene.ns(), costly_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success()
                && err.contains("spec.validate[0].expression: estimated cost")
                && err.contains("exceeds the budget of 1000000"),
            "an over-budget Policy was not refused with its estimate: {err}"
        );
        ensure!(get_json(cluster, &["policy", &costly]).await?.is_none(), "refused policy was stored");
        // A function the environment does not declare is refused by name, not failed at run time.
        let unknown = format!("unknown-fn-{id}");
        let unknown_spec = json!({"priority": 100, "validate": [{"expression": "foo(object)", "message": "never runs"}]});
        let out = try_apply(cluster, &policy(&unknown, scene.ns(), unknown_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success() && err.contains("spec.validate[0].expression: unknown function \"foo\""),
            "a Policy calling an unknown function was not refused with its name: {err}"
        );
        ensure!(get_json(cluster, &["policy", &unknown]).await?.is_none(), "refused policy was stored");
        // So is a library call no overload takes, as the API server's checker reports it.
        let overload = format!("no-overload-{id}");
        let overload_spec = json!({"priority": 100, "validate": [{
            "expression": "object.spec.containers.all(c, quantity(c.resources.limits.cpu).isLessThan(2))",
            "message": "never runs",
        }]});
        let out = try_apply(cluster, &policy(&overload, scene.ns(), overload_spec)).await?;
        let err = stderr(&out);
        ensure!(
            !out.status.success()
                && err.contains("spec.validate[0].expression: found no matching overload for 'isLessThan' applied to 'kubernetes.Quantity.(int)'"),
            "a Policy calling a library function with the wrong types was not refused with the reason: {err}"
        );
        ensure!(get_json(cluster, &["policy", &overload]).await?.is_none(), "refused policy was stored");

        // With Gatehouse away, an invalid Policy slips in; once back, it is Ready=False with
        // reason InvalidSpec and is not wired.
        scene.gh.stop().await?;
        // What the schema can say, the API server enforces even with Gatehouse away.
        let empty = policy_object(&format!("empty-{id}"), json!({
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
        }));
        let out = try_apply(cluster, &empty).await?;
        ensure!(
            !out.status.success() && stderr(&out).contains("a Policy needs at least one of mutate, validate or effects"),
            "a Policy with neither mutate nor validate was not refused: {}",
            stderr(&out)
        );
        apply(cluster, &policy(&slipped, scene.ns(), broken)).await?;
        scene.gh.restart().await?;
        let cond = await_ready(cluster, &slipped, "False").await?;
        ensure!(cond["reason"] == "InvalidSpec", "condition {cond}");
        ensure!(
            cond["message"].as_str().unwrap_or_default().contains("spec.validate[0].expression"),
            "condition {cond}"
        );
        let wired = wired_groups(cluster).await?;
        ensure!(
            !wired.iter().any(|g| g.members.contains(&slipped)),
            "the invalid Policy is wired: {wired:?}"
        );
        let events = await_condition("InvalidSpec event", WAIT, || async {
            let out = cluster
                .kubectl_ok(["get", "events.events.k8s.io", "-A", "-o", "json"], None)
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            Ok(v["items"].as_array().and_then(|items| {
                items.iter().find(|e| e["regarding"]["name"] == slipped.as_str() && e["reason"] == "InvalidSpec").cloned()
            }))
        })
        .await?;
        ensure!(events["type"] == "Warning");
        Ok(())
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
async fn two_hundred_policies_coalesce_into_few_writes() {
    scenario("gh-many", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let id = scene.id();
        let names: Vec<String> = (0..200)
            .map(|i| scene.track(format!("many-{id}-{i:03}")))
            .collect();
        let all = list(
            names
                .iter()
                .map(|n| policy(n, scene.ns(), label(100, "many", "yes"))),
        );
        // The first pass after start-up writes both configurations once; count from here.
        let writes = "gatehouse_reconcile_webhook_configuration_writes_total";
        await_condition("initial configurations", WAIT, || async {
            Ok((scene.gh.metric_sum(writes, "").await? >= 2.0).then_some(()))
        })
        .await?;
        let before = scene.gh.metric_sum(writes, "").await?;
        let started = Instant::now();
        apply(cluster, &all).await?;
        let applied = started.elapsed();
        await_condition("200 Policies Ready", Duration::from_secs(120), || async {
            let out = cluster
                .kubectl_ok(["get", "policies", "-o", "json"], None)
                .await?;
            let v: Value = serde_json::from_str(&out)?;
            let ready = v["items"]
                .as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter(|p| {
                            p["metadata"]["name"].as_str().is_some_and(|n| n.starts_with(&format!("many-{id}-")))
                                && p["status"]["conditions"][0]["status"] == "True"
                        })
                        .count()
                })
                .unwrap_or(0);
            Ok((ready == 200).then_some(()))
        })
        .await?;
        let all_ready = started.elapsed();
        // Shared: the 200 alike Policies are one entry, and every one of them is a member.
        let count = entries(cluster, "mutatingwebhookconfiguration").await?.len();
        ensure!(count == 1, "{count} mutating entries for 200 alike Policies");
        let members: usize = wired_groups(cluster)
            .await?
            .iter()
            .filter(|g| g.phase == Phase::Mutating)
            .map(|g| g.members.iter().filter(|m| names.contains(m)).count())
            .sum();
        ensure!(members == 200, "{members} of 200 Policies wired");
        let writes = scene.gh.metric_sum(writes, "").await? - before;
        eprintln!(
            "200 Policies: kubectl apply took {applied:?}, all Ready after {all_ready:?}, {writes} configuration writes"
        );
        // Coalesced: a handful of writes of the growing configuration, not one per Policy.
        ensure!(writes <= 20.0, "{writes} configuration writes for 200 Policies");
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
