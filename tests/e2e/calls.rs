//! Calls to external systems (issue 42): Apply once per object after it is stored, retried,
//! released when it goes; records visible with kubectl; gates; bad input.
use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::receiver::{Behaviour, Call, Receiver};
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::scenario;

/// A Policy calling `receiver` for every Pod in `ns`.
fn calling(name: &str, ns: &str, receiver: &Receiver, extra: Value) -> Value {
    let mut call = json!({"url": receiver.url(), "caBundle": receiver.ca_bundle});
    merge(&mut call, extra);
    policy(name, ns, json!({"effects": [{"call": call}]}))
}

/// `count` Pods named `<prefix>-<i>` in `ns`, in one apply.
async fn create_pods(
    cluster: &Cluster,
    ns: &str,
    prefix: &str,
    count: usize,
) -> anyhow::Result<()> {
    let docs: Vec<String> = (0..count)
        .map(|i| pod(&format!("{prefix}-{i:03}"), ns))
        .collect();
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs.join("---\n")))
        .await?;
    Ok(())
}

/// The UIDs of the Pods in `ns`.
async fn pod_uids(cluster: &Cluster, ns: &str) -> anyhow::Result<BTreeSet<String>> {
    let pods = get_json(cluster, &["pods", "-n", ns])
        .await?
        .context("pods")?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        .collect())
}

/// The object UIDs whose calls `action` the receiver accepted.
fn accepted(calls: &[Call], action: &str) -> BTreeSet<String> {
    calls
        .iter()
        .filter(|c| c.accepted && c.action == action)
        .filter_map(|c| c.key.split('/').next().map(str::to_string))
        .collect()
}

/// The ExternalCalls of Policy `uid`, by object UID.
async fn records(cluster: &Cluster, policy_uid: &str) -> anyhow::Result<BTreeMap<String, Value>> {
    let selector = format!("gatehouse.dev/call-of-policy={policy_uid}");
    // None: no ExternalCall at all.
    let list = get_json(cluster, &["externalcalls", "-l", &selector])
        .await?
        .unwrap_or_default();
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let uid = r["spec"]["object"]["uid"].as_str().unwrap_or_default();
            (uid.to_string(), r.clone())
        })
        .collect())
}

async fn uid_of(cluster: &Cluster, what: &[&str]) -> anyhow::Result<String> {
    let object = get_json(cluster, what).await?.context("object")?;
    Ok(object["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

#[tokio::test]
async fn calls_apply_once_retry_and_release_every_key_of_gone_pods() {
    scenario("gh-calls", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let receiver = Receiver::start().await?;
        receiver.behave(Behaviour::FailShare(0.3));
        let name = scene.policy("register");
        let extra = json!({"resultAnnotation": "example.com/ticket"});
        apply(cluster, &calling(&name, &ns, &receiver, extra)).await?;
        await_ready(cluster, &name, "True").await?;
        let policy_uid = uid_of(cluster, &["policy", &name]).await?;
        create_pods(cluster, &ns, "p", 200).await?;
        let live = pod_uids(cluster, &ns).await?;
        ensure!(live.len() == 200, "{} Pods", live.len());
        await_condition("every Pod's call applied", WAIT * 2, || async {
            let applied = accepted(&receiver.calls(), "Apply");
            Ok(live.is_subset(&applied).then_some(()))
        })
        .await?;
        // Each record says Applied with the receiver's result, which is on the Pod too.
        let done = await_condition("200 records Applied", WAIT, || async {
            let found = records(cluster, &policy_uid).await?;
            let all =
                found.len() == 200 && found.values().all(|r| r["status"]["state"] == "Applied");
            Ok(all.then_some(found))
        })
        .await?;
        let (uid, record) = done.iter().next().context("a record")?;
        let key = format!("{uid}/{policy_uid}/0");
        ensure!(record["spec"]["key"] == key.as_str(), "{record:#}");
        ensure!(
            record["status"]["result"] == format!("r-{key}").as_str(),
            "{record:#}"
        );
        let pod_name = record["spec"]["object"]["name"]
            .as_str()
            .unwrap_or_default();
        let pod = await_condition("the result on the Pod", WAIT, || async {
            let pod = get_json(cluster, &["pod", pod_name, "-n", &ns]).await?;
            Ok(pod.filter(|p| {
                p["metadata"]["annotations"]["example.com/ticket"] == format!("r-{key}").as_str()
            }))
        })
        .await?;
        ensure!(pod["metadata"]["uid"] == uid.as_str());
        let sent = receiver.calls();
        let first = sent.iter().find(|c| c.key == key).context("the call")?;
        ensure!(first.body["object"]["kind"] == "Pod", "{:#}", first.body);
        ensure!(first.body["snapshot"]["metadata"]["uid"] == uid.as_str());
        // Everything deleted: every key released, each after its Apply, and no record left.
        cluster
            .kubectl_ok(["delete", "pods", "--all", "-n", &ns, "--wait=false"], None)
            .await?;
        await_condition(
            "every call released and its record gone",
            WAIT * 2,
            || async {
                let calls = receiver.calls();
                let released = accepted(&calls, "Release");
                let left = records(cluster, &policy_uid).await?;
                Ok((live.is_subset(&released) && left.is_empty()).then_some(()))
            },
        )
        .await?;
        let calls = receiver.calls();
        for key_uid in &live {
            let key = format!("{key_uid}/{policy_uid}/0");
            let applied = calls
                .iter()
                .position(|c| c.key == key && c.action == "Apply" && c.accepted);
            let released = calls
                .iter()
                .position(|c| c.key == key && c.action == "Release");
            ensure!(
                matches!((applied, released), (Some(a), Some(r)) if a < r),
                "{key}: apply at {applied:?}, first release at {released:?}"
            );
        }
        let open: BTreeSet<String> = accepted(&calls, "Apply")
            .difference(&accepted(&calls, "Release"))
            .cloned()
            .collect();
        ensure!(open.is_empty(), "applied and never released: {open:?}");
        let applies = calls.iter().filter(|c| c.action == "Apply").count();
        ensure!(applies >= 200, "{applies} Apply calls");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_gated_pod_waits_for_its_call_and_a_refusal_keeps_it_gated() {
    scenario("gh-calls-gate", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let receiver = Receiver::start().await?;
        let name = scene.policy("gate");
        apply(
            cluster,
            &calling(&name, &ns, &receiver, json!({"gate": true})),
        )
        .await?;
        await_ready(cluster, &name, "True").await?;
        let gates = |pod: &Value| -> Vec<String> {
            pod["spec"]["schedulingGates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|g| g["name"].as_str().map(str::to_string))
                .collect()
        };
        create_pods(cluster, &ns, "ok", 1).await?;
        let created = get_json(cluster, &["pod", "ok-000", "-n", &ns])
            .await?
            .context("pod")?;
        ensure!(
            gates(&created).contains(&"gatehouse.dev/calls".to_string())
                || accepted(&receiver.calls(), "Apply")
                    .contains(created["metadata"]["uid"].as_str().unwrap_or_default()),
            "admission did not gate the Pod: {created:#}"
        );
        await_condition("the accepted Pod's gate gone", WAIT, || async {
            let pod = get_json(cluster, &["pod", "ok-000", "-n", &ns]).await?;
            Ok(pod.filter(|p| !gates(p).contains(&"gatehouse.dev/calls".to_string())))
        })
        .await?;
        ensure!(
            accepted(&receiver.calls(), "Apply")
                .contains(created["metadata"]["uid"].as_str().unwrap_or_default())
        );
        // A permanent refusal: the Pod stays gated, the record says Failed and why, an Event too.
        receiver.behave(Behaviour::Status(403));
        create_pods(cluster, &ns, "no", 1).await?;
        let uid = uid_of(cluster, &["pod", "no-000", "-n", &ns]).await?;
        let policy_uid = uid_of(cluster, &["policy", &name]).await?;
        let failed = await_condition("the refused call Failed", WAIT, || async {
            let found = records(cluster, &policy_uid).await?;
            Ok(found
                .get(&uid)
                .filter(|r| r["status"]["state"] == "Failed")
                .cloned())
        })
        .await?;
        let error = failed["status"]["lastError"].as_str().unwrap_or_default();
        ensure!(error.contains("403"), "{failed:#}");
        await_condition("an Event on the Pod", WAIT, || async {
            let events = get_json(
                cluster,
                &[
                    "events",
                    "-n",
                    &ns,
                    "--field-selector",
                    "reason=CallRefused",
                ],
            )
            .await?;
            Ok(events.filter(|e| e["items"].as_array().is_some_and(|i| !i.is_empty())))
        })
        .await?;
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let pod = get_json(cluster, &["pod", "no-000", "-n", &ns])
            .await?
            .context("pod")?;
        ensure!(
            gates(&pod).contains(&"gatehouse.dev/calls".to_string()),
            "{pod:#}"
        );
        let tries = receiver
            .calls()
            .iter()
            .filter(|c| c.key.starts_with(&uid))
            .count();
        ensure!(tries == 1, "a refusal was tried {tries} times");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn bad_receivers_are_refused_or_named_and_bad_answers_recorded() {
    scenario("gh-calls-bad", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let receiver = Receiver::start().await?;
        // Refused when written, with the field.
        let plain = scene.policy("plain");
        let http = policy(
            &plain,
            &ns,
            json!({"effects": [{"call": {"url": "http://cmdb.example/hook"}}]}),
        );
        let refused = stderr(&try_apply(cluster, &http).await?);
        ensure!(refused.contains("spec.effects[0].call.url"), "{refused}");
        let bundle = scene.policy("bundle");
        let garbage = calling(
            &bundle,
            &ns,
            &receiver,
            json!({"caBundle": "bm90IGEgY2VydA=="}),
        );
        let refused = stderr(&try_apply(cluster, &garbage).await?);
        ensure!(
            refused.contains("spec.effects[0].call.caBundle"),
            "{refused}"
        );
        // A token Secret that does not exist: Ready=False naming the field.
        let token = scene.policy("token");
        apply(
            cluster,
            &calling(&token, &ns, &receiver, json!({"tokenSecret": "missing"})),
        )
        .await?;
        let condition = await_ready(cluster, &token, "False").await?;
        let message = condition["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("spec.effects[0].call.tokenSecret"),
            "{condition:#}"
        );
        // The Secret made: Ready, and the token is sent.
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "missing", "namespace": scene.home()},
            "stringData": {"token": "s3cret"}});
        apply(cluster, &secret).await?;
        await_ready(cluster, &token, "True").await?;
        // A receiver answering 10 MB: an error on the record, no result, the process alive.
        receiver.behave(Behaviour::Huge(10 * 1024 * 1024));
        create_pods(cluster, &ns, "huge", 1).await?;
        let uid = uid_of(cluster, &["pod", "huge-000", "-n", &ns]).await?;
        let policy_uid = uid_of(cluster, &["policy", &token]).await?;
        let record = await_condition("the oversized answer recorded", WAIT, || async {
            let found = records(cluster, &policy_uid).await?;
            Ok(found
                .get(&uid)
                .filter(|r| r["status"]["lastError"].is_string())
                .cloned())
        })
        .await?;
        ensure!(record["status"]["state"] == "Pending", "{record:#}");
        let call = receiver
            .calls()
            .into_iter()
            .find(|c| c.key.starts_with(&uid))
            .context("a call")?;
        ensure!(
            call.authorization.as_deref() == Some("Bearer s3cret"),
            "{:?}",
            call.authorization
        );
        // Garbage with 200 is done (no result to read); the record says Applied.
        receiver.behave(Behaviour::Garbage);
        await_condition("the call applied after garbage", WAIT * 2, || async {
            let found = records(cluster, &policy_uid).await?;
            Ok(found
                .get(&uid)
                .filter(|r| r["status"]["state"] == "Applied")
                .cloned())
        })
        .await?;
        scene
            .gh
            .metrics()
            .await
            .context("Gatehouse alive after bad answers")?;
        Ok(())
    })
    .await;
}
