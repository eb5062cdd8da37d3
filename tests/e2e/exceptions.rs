//! PolicyExceptions: the platform exempts exactly the workloads it names, on both paths and in
//! the audit; an exception written anywhere else, under any served version, changes nothing
//! and says why; a restart loses none.

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::{Options, ensure_report_crds};
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::{Scene, scenario};

const TEAM: &str = "every Pod carries the label team";

/// A Pod `name` in `ns` without the label team.
fn bare_pod(name: &str, ns: &str) -> String {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0"}]}})
    .to_string()
}

/// The PolicyException `name` in `ns` (sent as `version`) exempting the Pods `names` of the
/// scene's namespace from `policies`.
fn exception(
    version: &str,
    name: &str,
    ns: &str,
    policies: &[&str],
    target: &str,
    names: &[&str],
) -> Value {
    json!({"apiVersion": format!("gatehouse.dev/{version}"), "kind": "PolicyException",
           "metadata": {"name": name, "namespace": ns},
           "spec": {"policies": policies, "match": {"namespaces": [target], "names": names}}})
}

/// The exception's `Honoured` condition once its status is `status`.
async fn await_honoured(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    status: &str,
) -> anyhow::Result<Value> {
    let what = format!("PolicyException {ns}/{name} Honoured={status}");
    await_condition(&what, WAIT, || async {
        let Some(e) = get_json(cluster, &["policyexception", name, "-n", ns]).await? else {
            return Ok(None);
        };
        Ok(e["status"]["conditions"]
            .as_array()
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c["type"] == "Honoured" && c["status"] == status)
            })
            .cloned())
    })
    .await
}

/// The result the Policy's report gives the Pod `pod` as stored now (by its UID), once it gives
/// one.
async fn audit_result(
    cluster: &Cluster,
    ns: &str,
    policy: &str,
    pod: &str,
) -> anyhow::Result<String> {
    let stored = get_json(cluster, &["pod", pod, "-n", ns])
        .await?
        .context("the Pod")?;
    let uid = &stored["metadata"]["uid"];
    let report = format!("gatehouse-{policy}");
    await_condition(&format!("{report} judges {pod}"), WAIT, || async {
        let Some(r) = get_json(cluster, &["policyreport", &report, "-n", ns]).await? else {
            return Ok(None);
        };
        Ok(r["results"].as_array().into_iter().flatten().find_map(|r| {
            (&r["resources"][0]["uid"] == uid)
                .then(|| r["result"].as_str().unwrap_or_default().to_string())
        }))
    })
    .await
}

/// The two Policies requiring the label team of every Pod in the scene's namespace: one on the
/// webhook, one in-process; both Ready and placed so.
async fn team_policies(scene: &Scene) -> anyhow::Result<(String, String)> {
    let cluster = scene.cluster;
    let rule = json!({"validate": [{"expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                                     "message": TEAM}]});
    let (webhook, in_process) = (
        scene.policy("team-webhook"),
        scene.policy("team-in-process"),
    );
    for (name, enforcement) in [(&webhook, "Webhook"), (&in_process, "InProcess")] {
        let mut spec = rule.clone();
        spec["enforcement"] = json!(enforcement);
        apply_ready(cluster, &policy(name, scene.ns(), spec)).await?;
        let placed = get_json(cluster, &["policy", name])
            .await?
            .context("the Policy")?;
        ensure!(
            placed["status"]["enforcement"] == enforcement,
            "{name}: {}",
            placed["status"]
        );
    }
    Ok((webhook, in_process))
}

/// Test 3.
#[tokio::test]
async fn exceptions_exempt_exactly_what_the_platform_names() {
    let options = Options::url().arg("--audit-interval", "4s");
    scenario("gh-except", options, async |scene| {
        let cluster = scene.cluster;
        ensure_report_crds(cluster).await?;
        let ns = scene.ns().to_string();
        // Stored before any Policy: the audit's to judge.
        apply(
            cluster,
            &serde_json::from_str(&bare_pod("stored-bare", &ns))?,
        )
        .await?;
        let (webhook, in_process) = team_policies(scene).await?;
        let both = [webhook.as_str(), in_process.as_str()];

        // The platform's exception, in Gatehouse's namespace: exactly the Pod legacy, on both
        // paths (either one not honouring it would refuse the Pod).
        apply(
            cluster,
            &exception("v1alpha1", "legacy", scene.home(), &both, &ns, &["legacy"]),
        )
        .await?;
        await_honoured(cluster, scene.home(), "legacy", "True").await?;
        create_expecting(cluster, &bare_pod("legacy", &ns), Ok(())).await?;
        create_expecting(cluster, &bare_pod("other", &ns), Err(TEAM)).await?;

        // The same exception in the tenant's namespace, or sent under the other served version:
        // ignored, and it says why.
        for (version, name) in [("v1alpha1", "tenant-legacy"), ("v1beta1", "beta-legacy")] {
            apply(cluster, &exception(version, name, &ns, &both, &ns, &[name])).await?;
            let condition = await_honoured(cluster, &ns, name, "False").await?;
            ensure!(condition["reason"] == "NamespaceNotAllowed", "{condition}");
            ensure!(
                condition["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(scene.home())),
                "{condition}"
            );
            create_expecting(cluster, &bare_pod(name, &ns), Err(TEAM)).await?;
        }

        // The audit: the exempted Pod is a skip, the other stored one a fail.
        for policy in both {
            ensure!(
                audit_result(cluster, &ns, policy, "legacy").await? == "skip",
                "{policy}: legacy"
            );
            ensure!(
                audit_result(cluster, &ns, policy, "stored-bare").await? == "fail",
                "{policy}: stored-bare"
            );
        }

        // Restarted, Gatehouse still honours it: the Pod is admitted again, still a skip.
        scene.gh.restart().await?;
        cluster
            .kubectl_ok(["delete", "pod", "legacy", "-n", &ns, "--wait=true"], None)
            .await?;
        create_expecting(cluster, &bare_pod("legacy", &ns), Ok(())).await?;
        create_expecting(cluster, &bare_pod("other", &ns), Err(TEAM)).await?;
        ensure!(
            audit_result(cluster, &ns, &webhook, "legacy").await? == "skip",
            "after the restart"
        );
        Ok(())
    })
    .await;
}
