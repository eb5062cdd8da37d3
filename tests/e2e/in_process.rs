//! In-process enforcement: validating Policies the API server runs itself as
//! ValidatingAdmissionPolicies, with no gap when a Policy moves between there and the webhook.

use anyhow::{Context, ensure};
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, await_ready, get_json, pod, policy, stderr, wired_groups};
use crate::scene::scenario;
use gatehouse_e2e::instance::Options;

/// A Pod without resource limits, which `require_limits` refuses.
fn unlimited(name: &str, ns: &str) -> String {
    pod(name, ns).replace("    resources: {limits: {cpu: 100m, memory: 64Mi}}\n", "")
}

/// The Deny Policy every container must declare limits, for Pods in `ns`, enforced as
/// `enforcement` says.
fn limits_policy(name: &str, ns: &str, enforcement: &str) -> Value {
    policy(
        name,
        ns,
        json!({
            "enforcement": enforcement,
            "validate": [{
                "expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
                "message": "every container must declare resource limits",
            }],
        }),
    )
}

/// Waits until the Policy `name` reports `enforcement` at its current generation (Ready=True).
async fn await_enforcement(
    cluster: &Cluster,
    name: &str,
    enforcement: &str,
) -> anyhow::Result<Value> {
    await_condition(
        &format!("Policy {name} enforced {enforcement}"),
        WAIT,
        || async {
            let Some(p) = get_json(cluster, &["policy", name]).await? else {
                return Ok(None);
            };
            let current = p["status"]["observedGeneration"] == p["metadata"]["generation"];
            Ok((current && p["status"]["enforcement"] == enforcement).then_some(p))
        },
    )
    .await
}

/// Waits until the generated policy and binding `generated` are gone.
async fn await_generated_gone(cluster: &Cluster, generated: &str) -> anyhow::Result<()> {
    await_condition(&format!("{generated} removed"), WAIT, || async {
        let policy = get_json(cluster, &["validatingadmissionpolicy", generated]).await?;
        let binding = get_json(cluster, &["validatingadmissionpolicybinding", generated]).await?;
        Ok((policy.is_none() && binding.is_none()).then_some(()))
    })
    .await
}

/// A server-dry-run create of `manifest`: whether it was admitted, and what kubectl said.
async fn dry_run_create(cluster: &Cluster, manifest: &str) -> anyhow::Result<(bool, String)> {
    let out = cluster
        .kubectl_output(["create", "--dry-run=server", "-f", "-"], Some(manifest))
        .await?;
    Ok((out.status.success(), stderr(&out)))
}

/// Test 1: a validate-only Policy under `Auto` becomes a ValidatingAdmissionPolicy and binding,
/// left out of the webhook configuration, and the API server enforces it with Gatehouse stopped:
/// violating Pods denied naming the Policy, compliant ones admitted, a Warn rule warns, a
/// namespace outside the selector and kube-system are never touched.
#[tokio::test]
async fn a_validating_policy_runs_in_the_api_server_with_gatehouse_stopped() {
    scenario("gh-inproc", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let outside = scene.namespace("gh-inproc-out").await?;
        let (deny, warn) = (scene.policy("inproc-deny"), scene.policy("inproc-warn"));
        // Selects the scene's namespace and kube-system: the system exclusion must win.
        let mut deny_policy = limits_policy(&deny, &ns, "Auto");
        deny_policy["spec"]["match"]["namespaceSelector"] = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns, "kube-system"],
        }]});
        apply(cluster, &deny_policy).await?;
        let warn_policy = policy(
            &warn,
            &ns,
            json!({
                "enforcement": "Auto",
                "validate": [{"expression": "!has(object.metadata.labels) || !('legacy' in object.metadata.labels)", "message": "the legacy label is going away", "action": "Warn"}],
            }),
        );
        apply(cluster, &warn_policy).await?;
        for name in [&deny, &warn] {
            let p = await_enforcement(cluster, name, "InProcess").await?;
            let ready = p["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .cloned()
                .context("no Ready condition")?;
            ensure!(
                ready["status"] == "True" && ready["reason"] == "InProcess",
                "{ready}"
            );
            let generated = format!("gatehouse-{name}");
            for kind in ["validatingadmissionpolicy", "validatingadmissionpolicybinding"] {
                let object = get_json(cluster, &[kind, &generated])
                    .await?
                    .with_context(|| format!("{kind} {generated} missing"))?;
                ensure!(
                    object["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gatehouse"
                        && object["metadata"]["annotations"]["gatehouse.dev/policy"] == name.as_str(),
                    "{object}"
                );
            }
        }
        let wired = wired_groups(cluster).await?;
        ensure!(
            !wired
                .iter()
                .any(|g| g.members.iter().any(|m| *m == deny || *m == warn)),
            "an in-process Policy is still in a webhook entry: {wired:?}"
        );

        scene.gh.kill().await?;
        let (admitted, said) = dry_run_create(cluster, &unlimited("bare", &ns)).await?;
        ensure!(
            !admitted
                && said.contains(&format!("gatehouse-{deny}"))
                && said.contains("every container must declare resource limits"),
            "a violating Pod with Gatehouse stopped: {said}"
        );
        let (admitted, said) = dry_run_create(cluster, &pod("limited", &ns)).await?;
        ensure!(admitted && !said.contains("legacy"), "a compliant Pod: {said}");
        let legacy = pod("legacy", &ns).replace(
            "  name: legacy\n",
            "  name: legacy\n  labels: {legacy: \"true\"}\n",
        );
        let (admitted, said) = dry_run_create(cluster, &legacy).await?;
        ensure!(
            admitted && said.contains("the legacy label is going away"),
            "the Warn rule: {said}"
        );
        let (admitted, said) = dry_run_create(cluster, &unlimited("bare", &outside)).await?;
        ensure!(admitted, "a namespace outside the selector: {said}");
        let (admitted, said) = dry_run_create(cluster, &unlimited("bare", "kube-system")).await?;
        ensure!(admitted, "kube-system: {said}");
        scene.gh.restart().await?;
        Ok(())
    })
    .await;
}

/// Test 4: under `Auto` a Policy the API server would answer differently stays on the webhook
/// with the reason in its status; under `InProcess` it is `Ready=False` with the reason and
/// enforced nowhere.
#[tokio::test]
async fn what_cannot_run_in_process_stays_on_the_webhook_or_is_not_ready() {
    scenario("gh-inproc-no", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let (auto, required) = (scene.policy("inproc-auto"), scene.policy("inproc-req"));
        // Deny and Warn rules in one Policy: the API server binds a policy's validations to one
        // action.
        let mixed = |name: &str, enforcement: &str| {
            policy(
                name,
                &ns,
                json!({
                    "enforcement": enforcement,
                    "validate": [
                        {"expression": "object.metadata.name != 'y'", "message": "m"},
                        {"expression": "object.metadata.name != 'x'", "message": "w", "action": "Warn"},
                    ],
                }),
            )
        };
        apply(cluster, &mixed(&auto, "Auto")).await?;
        apply(cluster, &mixed(&required, "InProcess")).await?;
        let p = await_enforcement(cluster, &auto, "Webhook").await?;
        let ready = await_ready(cluster, &auto, "True").await?;
        ensure!(
            ready["message"]
                .as_str()
                .is_some_and(|m| m.contains("not in-process: spec.validate[1].action")),
            "{p}"
        );
        let wired = wired_groups(cluster).await?;
        ensure!(
            wired.iter().any(|g| g.members.contains(&auto)),
            "{wired:?}"
        );
        let cond = await_ready(cluster, &required, "False").await?;
        ensure!(
            cond["reason"] == "CannotRunInProcess"
                && cond["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("spec.validate[1].action")),
            "{cond}"
        );
        ensure!(
            !wired.iter().any(|g| g.members.contains(&required)),
            "{wired:?}"
        );
        for name in [&auto, &required] {
            let generated = format!("gatehouse-{name}");
            ensure!(
                get_json(cluster, &["validatingadmissionpolicy", &generated])
                    .await?
                    .is_none(),
                "{generated} exists"
            );
        }
        Ok(())
    })
    .await;
}

/// A Warn rule never denies (issue 39): a Warn-only Policy with `failurePolicy: Fail` whose rule
/// fails at run time warns, on the webhook and in-process alike; on the webhook its entry is
/// `Ignore`, so Gatehouse unreachable refuses nothing; under `Auto` it runs in-process.
#[tokio::test]
async fn a_warn_rule_never_denies_on_either_path() {
    scenario("gh-warn", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let name = scene.policy("warn-only");
        let advisory = |enforcement: &str| {
            policy(
                &name,
                &ns,
                json!({
                    "enforcement": enforcement,
                    "failurePolicy": "Fail",
                    // No Pod here has a nodeName: the expression fails at run time.
                    "validate": [{"expression": "object.spec.nodeName == 'n'", "message": "pin Pods to n", "action": "Warn"}],
                }),
            )
        };
        let warned = |said: &str| said.contains("nodeName") && !said.contains("denied");
        apply(cluster, &advisory("Webhook")).await?;
        await_enforcement(cluster, &name, "Webhook").await?;
        let entry = crate::fixtures::entry_of(cluster, &name, gatehouse_engine::Phase::Validating)
            .await?
            .context("the Warn Policy has no entry")?;
        let configuration = get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"])
            .await?
            .context("no validating configuration")?;
        let failure_policy = configuration["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|w| w["name"] == entry.as_str())
            .map(|w| w["failurePolicy"].clone());
        ensure!(failure_policy == Some(json!("Ignore")), "{entry}: {failure_policy:?}");
        let (admitted, said) = dry_run_create(cluster, &pod("w1", &ns)).await?;
        ensure!(admitted && warned(&said), "through the webhook: {said}");
        scene.gh.kill().await?;
        let (admitted, said) = dry_run_create(cluster, &pod("w2", &ns)).await?;
        ensure!(admitted, "Gatehouse unreachable: {said}");
        scene.gh.restart().await?;

        apply(cluster, &advisory("Auto")).await?;
        await_enforcement(cluster, &name, "InProcess").await?;
        let (admitted, said) = dry_run_create(cluster, &pod("w3", &ns)).await?;
        ensure!(admitted && warned(&said), "in-process: {said}");
        Ok(())
    })
    .await;
}

/// Tests 3 and 5: a hand-deleted generated object is restored; flipping `enforcement` between
/// `Webhook` and `InProcess` ten times while violating Pods are created denies every one (no
/// gap), the webhook reviews none of them while the Policy is in-process, and a Policy moved
/// back, or deleted, leaves no generated object behind.
#[tokio::test]
async fn moving_between_the_webhook_and_the_api_server_leaves_no_gap() {
    scenario("gh-inproc-flip", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let name = scene.policy("inproc-flip");
        let generated = format!("gatehouse-{name}");
        apply(cluster, &limits_policy(&name, &ns, "InProcess")).await?;
        await_enforcement(cluster, &name, "InProcess").await?;

        // Drift: deleted by hand, restored.
        cluster
            .kubectl_ok(["delete", "validatingadmissionpolicy", &generated], None)
            .await?;
        await_condition("the generated policy restored", WAIT, || async {
            Ok(
                get_json(cluster, &["validatingadmissionpolicy", &generated])
                    .await?
                    .map(|_| ()),
            )
        })
        .await?;
        // A policy deleted by hand enforces nothing until it is restored and loaded again, which
        // no controller can prevent; the moves below start from a Policy enforced again.
        await_condition("the restored policy enforced", WAIT, || async {
            let (admitted, _) = dry_run_create(cluster, &unlimited("restored", &ns)).await?;
            Ok((!admitted).then_some(()))
        })
        .await?;

        // Flips under a loop of violating creates.
        let stop = std::sync::atomic::AtomicBool::new(false);
        let creates = async {
            let mut tried = 0usize;
            let mut admitted = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Acquire) || tried < 200 {
                let (ok, said) =
                    dry_run_create(cluster, &unlimited(&format!("v{tried}"), &ns)).await?;
                if ok {
                    admitted.push(format!("#{tried}: {said}"));
                }
                tried += 1;
            }
            anyhow::Ok((tried, admitted))
        };
        let flips = async {
            let result = async {
                for round in 0..10 {
                    let enforcement = if round % 2 == 0 {
                        "Webhook"
                    } else {
                        "InProcess"
                    };
                    apply(cluster, &limits_policy(&name, &ns, enforcement)).await?;
                    await_enforcement(cluster, &name, enforcement).await?;
                    if enforcement == "Webhook" {
                        // The webhook alone for a while: the generated objects go first.
                        await_generated_gone(cluster, &generated).await?;
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
        let (tried, admitted) = created?;
        ensure!(
            admitted.is_empty(),
            "{} of {tried} violating Pods were admitted while the Policy moved: {admitted:#?}",
            admitted.len()
        );
        eprintln!("{tried} violating Pods across 10 moves: all denied");

        // In-process now (the last flip): the webhook reviews none of its requests.
        let reviews = || {
            scene
                .gh
                .metric_sum("gatehouse_policy_decisions_total", &name)
        };
        let before = reviews().await?;
        for i in 0..20 {
            let (ok, _) = dry_run_create(cluster, &unlimited(&format!("w{i}"), &ns)).await?;
            ensure!(!ok, "a violating Pod was admitted in-process");
        }
        let after = reviews().await?;
        ensure!(
            after == before,
            "the webhook reviewed the in-process Policy: {before} -> {after}"
        );

        // Back to the webhook: the generated objects go; deleted: nothing left.
        apply(cluster, &limits_policy(&name, &ns, "Webhook")).await?;
        await_enforcement(cluster, &name, "Webhook").await?;
        await_generated_gone(cluster, &generated).await?;
        let (ok, said) = dry_run_create(cluster, &unlimited("back", &ns)).await?;
        ensure!(
            !ok && said.contains("every container must declare resource limits"),
            "on the webhook again: {said}"
        );

        // In-process once more, then deleted: its generated objects go with it.
        apply(cluster, &limits_policy(&name, &ns, "InProcess")).await?;
        await_enforcement(cluster, &name, "InProcess").await?;
        cluster
            .kubectl_ok(["delete", "policy", &name], None)
            .await?;
        await_generated_gone(cluster, &generated).await?;
        // The API server drops a deleted policy from its cache a moment later.
        await_condition("the deleted Policy no longer enforced", WAIT, || async {
            let (ok, _) = dry_run_create(cluster, &unlimited("gone", &ns)).await?;
            Ok(ok.then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

/// What the API server's type checking warns of a generated policy (a field Pods do not have,
/// read under a guard) is reported in the Policy's status; the Policy stays in-process and is
/// enforced, since the API server enforces it whatever its type checking says.
#[tokio::test]
async fn type_checking_warnings_are_reported_and_the_policy_enforced() {
    scenario("gh-inproc-typed", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let typed = scene.policy("inproc-typed");
        let rule = json!([{"expression": "!has(object.spec.nope) || object.spec.nope == 'x'", "message": "nope must be x"}]);
        apply(cluster, &policy(&typed, &ns, json!({"enforcement": "Auto", "validate": rule}))).await?;
        let ready = await_condition("the type checking's warning reported", WAIT, || async {
            let ready = await_ready(cluster, &typed, "True").await?;
            let warned = ready["message"]
                .as_str()
                .is_some_and(|m| m.contains("spec.validations[0].expression") && m.contains("undefined field 'nope'"));
            Ok(warned.then_some(ready))
        })
        .await?;
        ensure!(ready["reason"] == "InProcess", "{ready}");
        await_enforcement(cluster, &typed, "InProcess").await?;
        let (admitted, said) = dry_run_create(cluster, &pod("plain", &ns)).await?;
        ensure!(admitted, "{said}");
        Ok(())
    })
    .await;
}
