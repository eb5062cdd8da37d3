//! The audit's reports in the API the cluster serves (issue 44): `openreports.io` alone → its
//! Reports; both served → `auto` takes openreports.io and a named API is obeyed; a switch
//! leaves no Gatehouse report behind in the other API.
//!
//! The report CRDs are the cluster's, so the whole test runs inside one scenario (scenarios
//! take turns): no other Gatehouse sees them change, and the wgpolicyk8s.io CRDs the audit
//! tests read are back, and openreports.io gone, before the turn ends.

use anyhow::{Context, ensure};
use gatehouse_api::reports::ReportApi;
use gatehouse_e2e::instance::{Options, install_report_crds, remove_report_crds};
use gatehouse_e2e::{Cluster, await_condition, run_test};
use serde_json::{Value, json};

use crate::fixtures::{WAIT, apply, get_json, policy_object};
use crate::scene::{Scene, Stage};

/// Passes close together.
const INTERVAL: &str = "2s";

/// The Gatehouse report of `policy` in namespace `ns`, in `api`, if there is one.
async fn report_in(
    cluster: &Cluster,
    api: ReportApi,
    policy: &str,
    ns: &str,
) -> anyhow::Result<Option<Value>> {
    let resource = format!(
        "{}.{}",
        api.plural(gatehouse_api::reports::ReportKind::Namespaced),
        api.group()
    );
    get_json(
        cluster,
        &[&resource, &format!("gatehouse-{policy}"), "-n", ns],
    )
    .await
}

/// Waits until `policy`'s report listing `pod` is in `api` and none is in the other API (when
/// `other_served`).
async fn await_only_in(
    cluster: &Cluster,
    api: ReportApi,
    other_served: bool,
    policy: &str,
    ns: &str,
    pod: &str,
) -> anyhow::Result<Value> {
    let other = ReportApi::ALL
        .into_iter()
        .find(|a| *a != api)
        .context("no other API")?;
    let what = format!("the report of {policy} in {} only", api.group());
    await_condition(&what, WAIT, || async {
        let Some(report) = report_in(cluster, api, policy, ns).await? else {
            return Ok(None);
        };
        let lists_pod = report["results"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["resources"][0]["name"] == pod);
        let stale = other_served && report_in(cluster, other, policy, ns).await?.is_some();
        Ok((lists_pod && !stale).then_some(report))
    })
    .await
}

fn options(report_api: Option<&str>) -> Options {
    let options = Options::url().arg("--audit-interval", INTERVAL);
    match report_api {
        Some(api) => options.arg("--report-api", api),
        None => options,
    }
}

/// A Pod stored without a team label, then a Warn Policy asking for one.
async fn violation(scene: &Scene) -> anyhow::Result<(String, String)> {
    let (cluster, ns) = (scene.cluster, scene.ns().to_string());
    let pod = "unlabelled".to_string();
    apply(
        cluster,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": ns},
            "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}]},
        }),
    )
    .await?;
    let policy = scene.policy("team-label");
    let rule = json!({
        "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
        "message": "a Pod names its team",
        "action": "Warn",
    });
    apply(
        cluster,
        &policy_object(
            &policy,
            json!({
                "match": {
                    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                },
                "validate": [rule],
            }),
        ),
    )
    .await?;
    Ok((policy, pod))
}

/// The phases, in the scenario; the CRDs are put back by the caller whatever happens here.
async fn phases(scene: &mut Scene) -> anyhow::Result<()> {
    let cluster = scene.cluster;
    let ns = scene.ns().to_string();
    let (policy, pod) = violation(scene).await?;

    // Only openreports.io is served (set before Gatehouse started): `auto` writes there.
    let report = await_only_in(cluster, ReportApi::Openreports, false, &policy, &ns, &pod).await?;
    ensure!(report["kind"] == "Report", "{report:#}");
    ensure!(report["summary"]["warn"] == 1, "{report:#}");

    // Both served: `auto` keeps to the newer, writing nothing in wgpolicyk8s.io.
    install_report_crds(cluster, ReportApi::Wgpolicyk8s).await?;
    let passes = scene
        .gh
        .metric_sum("gatehouse_audit_duration_seconds_count", "")
        .await?;
    await_condition("two more audit passes", WAIT, || async {
        let now = scene
            .gh
            .metric_sum("gatehouse_audit_duration_seconds_count", "")
            .await?;
        Ok((now >= passes + 2.0).then_some(()))
    })
    .await?;
    ensure!(
        report_in(cluster, ReportApi::Wgpolicyk8s, &policy, &ns)
            .await?
            .is_none(),
        "auto wrote a PolicyReport while openreports.io is served"
    );
    await_only_in(cluster, ReportApi::Openreports, true, &policy, &ns, &pod).await?;

    // Told to write PolicyReports: they come, and the Report goes.
    scene.gh.stop().await?;
    scene.replica(options(Some("wgpolicyk8s"))).await?;
    let report = await_only_in(cluster, ReportApi::Wgpolicyk8s, true, &policy, &ns, &pod).await?;
    ensure!(report["kind"] == "PolicyReport", "{report:#}");

    // And back: the PolicyReport goes.
    scene.replicas[0].stop().await?;
    scene.replica(options(Some("openreports"))).await?;
    await_only_in(cluster, ReportApi::Openreports, true, &policy, &ns, &pod).await?;
    Ok(())
}

#[tokio::test]
async fn reports_follow_the_served_api_and_a_switch_leaves_none_behind() {
    run_test(async |cluster| {
        let stage = Stage::open(cluster, "gh-report-api").await?;
        // Only openreports.io served, before Gatehouse starts; the CRDs are put back on every
        // way out.
        let only_openreports = async {
            remove_report_crds(cluster, ReportApi::Wgpolicyk8s).await?;
            install_report_crds(cluster, ReportApi::Openreports).await
        };
        let started = match only_openreports.await {
            Ok(()) => stage.start(options(None)).await,
            Err(e) => Err(e),
        };
        let scene = match started {
            Ok(scene) => scene,
            Err(e) => {
                restore(cluster).await?;
                return Err(e);
            }
        };
        scene
            .run(async |scene| {
                let outcome = phases(scene).await;
                let restored = restore(cluster).await;
                outcome.and(restored)
            })
            .await
    })
    .await;
}

/// The CRDs as the other tests expect them: wgpolicyk8s.io served, openreports.io not.
async fn restore(cluster: &Cluster) -> anyhow::Result<()> {
    remove_report_crds(cluster, ReportApi::Openreports).await?;
    install_report_crds(cluster, ReportApi::Wgpolicyk8s).await
}
