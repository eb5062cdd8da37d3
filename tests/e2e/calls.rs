//! Calls to external systems (issue 42): Apply once per object after it is stored, retried,
//! released when it goes; records visible with kubectl; gates; bad input.
use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, ensure};
use gatehouse_e2e::documented::documented;
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
        await_condition("status.calls 200/200 and CallsApplied", WAIT, || async {
            let p = get_json(cluster, &["policy", &name])
                .await?
                .context("policy")?;
            let applied = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "CallsApplied" && c["status"] == "True");
            let counts = json!({"wanted": 200, "applied": 200, "failed": 0});
            Ok((applied && p["status"]["calls"] == counts).then_some(()))
        })
        .await?;
        // As the docs show them: the state of each call.
        let shown = documented("docs/concepts/calls.md", "kubectl get externalcalls")?;
        let listed = cluster.kubectl_ok(&shown[1..], None).await?;
        ensure!(
            listed.contains("STATE") && listed.contains("Applied"),
            "{listed}"
        );
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
        retire(cluster, &name).await?;
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
        await_condition("CallsApplied=False naming the refusal", WAIT, || async {
            let p = get_json(cluster, &["policy", &name])
                .await?
                .context("policy")?;
            let refused = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "CallsApplied" && c["reason"] == "Refused")
                .cloned();
            Ok(refused.filter(|c| {
                c["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no-000") && m.contains("403"))
            }))
        })
        .await?;
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
        // The Policy deleted: the Pod it left at the gate is let go, and its records go.
        cluster
            .kubectl_ok(["delete", "policy", &name, "--wait=false"], None)
            .await?;
        await_condition("the refused Pod let go", WAIT, || async {
            let pod = get_json(cluster, &["pod", "no-000", "-n", &ns]).await?;
            Ok(pod.filter(|p| !gates(p).contains(&"gatehouse.dev/calls".to_string())))
        })
        .await?;
        await_condition("the Policy gone with its records", WAIT, || async {
            let gone = get_json(cluster, &["policy", &name]).await?.is_none();
            Ok((gone && records(cluster, &policy_uid).await?.is_empty()).then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}

/// Deletes Policy `name` and waits until it is gone: its calls released while the test's
/// receiver still answers (a Policy whose receiver went for good keeps its finalizer).
async fn retire(cluster: &Cluster, name: &str) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(["delete", "policy", name, "--wait=false"], None)
        .await?;
    await_condition(&format!("Policy {name} gone"), WAIT * 2, || async {
        Ok(get_json(cluster, &["policy", name])
            .await?
            .is_none()
            .then_some(()))
    })
    .await
}

/// What `kubectl apply` of Policy `name` (`object`) says when it is refused.
async fn refusal(cluster: &Cluster, object: &Value, name: &str) -> anyhow::Result<String> {
    await_condition(&format!("Policy {name} refused"), WAIT, || async {
        let out = try_apply(cluster, object).await?;
        if out.status.success() {
            cluster.kubectl_ok(["delete", "policy", name], None).await?;
            return Ok(None);
        }
        Ok(Some(stderr(&out)))
    })
    .await
}

#[tokio::test]
async fn bad_receivers_are_refused_or_named_and_bad_answers_recorded() {
    scenario("gh-calls-bad", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let receiver = Receiver::start().await?;
        // Refused when written, with the field (once Gatehouse's webhook for Policies is
        // registered: until then one slips in, and is deleted to try again).
        let plain = scene.policy("plain");
        let http = policy(
            &plain,
            &ns,
            json!({"effects": [{"call": {"url": "http://cmdb.example/hook"}}]}),
        );
        let refused = refusal(cluster, &http, &plain).await?;
        ensure!(refused.contains("spec.effects[0].call.url"), "{refused}");
        let bundle = scene.policy("bundle");
        let garbage = calling(
            &bundle,
            &ns,
            &receiver,
            json!({"caBundle": "bm90IGEgY2VydA=="}),
        );
        let refused = refusal(cluster, &garbage, &bundle).await?;
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
        // Garbage with 200 is done; the record says Applied and that the answer was unreadable.
        receiver.behave(Behaviour::Garbage);
        let applied = await_condition("the call applied after garbage", WAIT * 2, || async {
            let found = records(cluster, &policy_uid).await?;
            Ok(found
                .get(&uid)
                .filter(|r| r["status"]["state"] == "Applied")
                .cloned())
        })
        .await?;
        let noted = applied["status"]["lastError"].as_str().unwrap_or_default();
        ensure!(noted.contains("not JSON"), "{applied:#}");
        // A Secret's snapshot carries no data.
        receiver.behave(Behaviour::Accept);
        let secrets = scene.policy("secrets");
        let mut on_secrets = calling(&secrets, &ns, &receiver, json!({}));
        on_secrets["spec"]["match"]["rules"][0]["resources"] = json!(["secrets"]);
        apply(cluster, &on_secrets).await?;
        await_ready(cluster, &secrets, "True").await?;
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "kept-here", "namespace": &ns},
            "stringData": {"password": "never-sent"}});
        apply(cluster, &secret).await?;
        let secret_uid = uid_of(cluster, &["secret", "kept-here", "-n", &ns]).await?;
        let call = await_condition("the Secret's call", WAIT, || async {
            Ok(receiver
                .calls()
                .into_iter()
                .find(|c| c.key.starts_with(&secret_uid) && c.accepted))
        })
        .await?;
        ensure!(
            call.body["snapshot"]["metadata"]["name"] == "kept-here",
            "{:#}",
            call.body
        );
        let text = call.body.to_string();
        ensure!(
            call.body["snapshot"].get("data").is_none() && !text.contains("bmV2ZXItc2VudA"),
            "{text}"
        );
        // A receiver that never answers: the call times out, is recorded and retried.
        receiver.behave(Behaviour::Stall);
        let stalled = scene.policy("stall");
        apply(
            cluster,
            &calling(&stalled, &ns, &receiver, json!({"timeoutSeconds": 1})),
        )
        .await?;
        await_ready(cluster, &stalled, "True").await?;
        let stalled_uid = uid_of(cluster, &["policy", &stalled]).await?;
        let record = await_condition("the stalled call recorded", WAIT, || async {
            let found = records(cluster, &stalled_uid).await?;
            Ok(found
                .get(&uid)
                .filter(|r| r["status"]["lastError"].is_string())
                .cloned())
        })
        .await?;
        let error = record["status"]["lastError"].as_str().unwrap_or_default();
        ensure!(error.contains("no answer in 1s"), "{record:#}");
        scene
            .gh
            .metrics()
            .await
            .context("Gatehouse alive after bad answers")?;
        receiver.behave(Behaviour::Accept);
        for policy in [&token, &secrets, &stalled] {
            retire(cluster, policy).await?;
        }
        Ok(())
    })
    .await;
}

/// Calls made for Policy `uid` so far, as its records count them.
async fn attempts(cluster: &Cluster, uid: &str) -> anyhow::Result<i64> {
    let found = records(cluster, uid).await?;
    Ok(found
        .values()
        .filter_map(|r| r["status"]["attempts"].as_i64())
        .sum())
}

#[tokio::test]
async fn a_receiver_down_during_a_burst_costs_a_few_calls_then_everything_converges() {
    scenario("gh-calls-down", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let mut receiver = Receiver::start().await?;
        let name = scene.policy("down");
        apply(cluster, &calling(&name, &ns, &receiver, json!({}))).await?;
        await_ready(cluster, &name, "True").await?;
        let policy_uid = uid_of(cluster, &["policy", &name]).await?;
        receiver.go_away();
        create_pods(cluster, &ns, "d", 50).await?;
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let midway = attempts(cluster, &policy_uid).await?;
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        let after = attempts(cluster, &policy_uid).await?;
        // 50 calls due at once: the first few fail, then the receiver rests and only one call
        // now and then finds out whether it is back.
        let (first, second) = (midway, after - midway);
        eprintln!("calls while the receiver was down: {first} in 0-10 s, {second} in 10-20 s");
        ensure!(
            first <= 30 && second <= 5,
            "calls while the receiver was down: {first} in the first 10 s, {second} in the next 10 s"
        );
        receiver.come_back().await?;
        let live = pod_uids(cluster, &ns).await?;
        await_condition("every call applied after the receiver came back", WAIT * 2, || async {
            Ok(live
                .is_subset(&accepted(&receiver.calls(), "Apply"))
                .then_some(()))
        })
        .await?;
        retire(cluster, &name).await?;
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn gatehouse_killed_mid_burst_releases_what_was_deleted_while_it_was_down() {
    scenario("gh-calls-kill", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let receiver = Receiver::start().await?;
        let name = scene.policy("kill");
        apply(cluster, &calling(&name, &ns, &receiver, json!({}))).await?;
        await_ready(cluster, &name, "True").await?;
        let policy_uid = uid_of(cluster, &["policy", &name]).await?;
        create_pods(cluster, &ns, "k", 80).await?;
        await_condition("some calls applied", WAIT, || async {
            Ok((accepted(&receiver.calls(), "Apply").len() >= 10).then_some(()))
        })
        .await?;
        scene.gh.kill().await?;
        // Half the Pods deleted while Gatehouse is down.
        let deleted: Vec<String> = (0..40).map(|i| format!("k-{i:03}")).collect();
        let mut gone = BTreeSet::new();
        for pod in &deleted {
            gone.insert(uid_of(cluster, &["pod", pod, "-n", &ns]).await?);
        }
        let mut args = vec!["delete", "pod", "-n", ns.as_str(), "--wait=false"];
        args.extend(deleted.iter().map(String::as_str));
        cluster.kubectl_ok(args, None).await?;
        scene.gh.restart().await?;
        let live = pod_uids(cluster, &ns).await?;
        await_condition(
            "the live Pods applied, the deleted released",
            WAIT * 2,
            || async {
                let calls = receiver.calls();
                let applied = accepted(&calls, "Apply");
                let released = accepted(&calls, "Release");
                let open: BTreeSet<String> = applied.difference(&released).cloned().collect();
                let left = records(cluster, &policy_uid).await?;
                let settled = open == live && left.keys().cloned().collect::<BTreeSet<_>>() == live;
                Ok(settled.then_some(()))
            },
        )
        .await?;
        let calls = receiver.calls();
        let released = accepted(&calls, "Release");
        ensure!(released.is_subset(&gone), "released a live Pod's key");
        // One key per object: a repeat is the same key, never a second registration.
        let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for call in &calls {
            let uid = call.key.split('/').next().unwrap_or_default().to_string();
            keys.entry(uid).or_default().insert(call.key.clone());
        }
        ensure!(keys.values().all(|k| k.len() == 1), "{keys:?}");
        retire(cluster, &name).await?;
        Ok(())
    })
    .await;
}
