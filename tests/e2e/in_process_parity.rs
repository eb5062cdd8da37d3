//! Test 2 of in-process enforcement: the same validating Policies, once `enforcement: Webhook`
//! and once `enforcement: InProcess`, give the same answers on the real API server.
//!
//! Every case is a Policy over ConfigMaps (rules, selectors, conditions with `authorizer`,
//! Deny/Warn, failurePolicy, oldObject on UPDATE and DELETE), written twice: bound to namespace
//! `w` on the webhook and to namespace `p` in-process, each narrowed to the objects labelled with
//! the case's number (an extra requirement of the objectSelector, which ANDs). The same requests
//! go to both namespaces by server dry run; the answers must agree: admitted or not, the same
//! warnings' messages, the same denial message after the documented prefixes (the API server
//! names the first failing rule, the webhook lists every one: the first must match).

use anyhow::ensure;
use gatehouse_e2e::Cluster;
use gatehouse_e2e::instance::Options;
use serde_json::{Value, json};

use crate::fixtures::{apply, await_ready, policy_object, stderr};
use crate::scene::scenario;

const CASE_LABEL: &str = "gh-case";

/// What a case's Policy says besides the scoping this test adds.
struct Case {
    operations: Vec<&'static str>,
    validate: Value,
    failure_policy: &'static str,
    object_selector: Option<Value>,
    namespace_selector: Option<Value>,
    conditions: Option<Value>,
}

/// The validation rules the corpus combines.
fn rules() -> Vec<Value> {
    vec![
        json!([{"expression": "has(object.data) && 'owner' in object.data", "message": "needs an owner"}]),
        json!([{"expression": "object.metadata.name.size() <= 12", "message": "name too long"}]),
        json!([
            {"expression": "has(object.data) && 'owner' in object.data", "message": "needs an owner"},
            {"expression": "object.metadata.name.size() <= 12", "message": "name too long"},
        ]),
        json!([{"expression": "oldObject == null || !has(oldObject.data) || !('frozen' in oldObject.data) || (has(object.data) && 'frozen' in object.data && object.data.frozen == oldObject.data.frozen)", "message": "frozen is immutable"}]),
        json!([{"expression": "!has(oldObject.metadata.labels) || !('protected' in oldObject.metadata.labels)", "message": "protected"}]),
        // Fails at run time where data has no `size` key.
        json!([{"expression": "int(object.data.size) < 10", "message": "too big"}]),
        json!([{"expression": "has(object.data) && 'owner' in object.data", "message": "owner missing (advice)", "action": "Warn"}]),
        json!([{"expression": "object.metadata.name.startsWith('ok')", "message": "names start with ok (advice)", "action": "Warn"}]),
    ]
}

/// The corpus: each rule set under several matches.
fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    for validate in rules() {
        let warn = validate[0]["action"] == "Warn";
        let delete_rule = validate[0]["message"] == "protected";
        let operations: Vec<&'static str> = if delete_rule {
            vec!["DELETE"]
        } else {
            vec!["CREATE", "UPDATE"]
        };
        for failure_policy in ["Fail", "Ignore"] {
            cases.push(Case {
                operations: operations.clone(),
                validate: validate.clone(),
                failure_policy,
                object_selector: None,
                namespace_selector: None,
                conditions: None,
            });
        }
        cases.push(Case {
            operations: if delete_rule {
                vec!["DELETE"]
            } else {
                vec!["CREATE"]
            },
            validate: validate.clone(),
            failure_policy: if warn { "Ignore" } else { "Fail" },
            object_selector: Some(json!({"key": "tier", "operator": "DoesNotExist"})),
            namespace_selector: None,
            conditions: None,
        });
        cases.push(Case {
            operations: vec!["*"],
            validate: validate.clone(),
            failure_policy: "Ignore",
            object_selector: Some(json!({"key": "tier", "operator": "In", "values": ["web"]})),
            namespace_selector: None,
            conditions: None,
        });
        cases.push(Case {
            operations: operations.clone(),
            validate: validate.clone(),
            failure_policy: if warn { "Ignore" } else { "Fail" },
            object_selector: None,
            namespace_selector: Some(json!({"key": "env", "operator": "In", "values": ["prod"]})),
            conditions: Some(json!([
                {"name": "not-skipped", "expression": "(object == null ? oldObject : object).metadata.name != 'skipme'"},
            ])),
        });
        cases.push(Case {
            operations: operations.clone(),
            validate: validate.clone(),
            failure_policy: if warn { "Ignore" } else { "Fail" },
            object_selector: None,
            namespace_selector: Some(json!({"key": "env", "operator": "In", "values": ["staging"]})),
            conditions: Some(json!([
                {"name": "may-get", "expression": "authorizer.group('').resource('configmaps').namespace(request.namespace).check('get').allowed()"},
            ])),
        });
    }
    cases
}

/// The Policy of case `i`, in namespace `ns`, enforced as `enforcement`.
fn case_policy(case: &Case, i: usize, name: &str, ns: &str, enforcement: &str) -> Value {
    let mut namespace_exprs =
        vec![json!({"key": "kubernetes.io/metadata.name", "operator": "In", "values": [ns]})];
    namespace_exprs.extend(case.namespace_selector.clone());
    let mut object_exprs =
        vec![json!({"key": CASE_LABEL, "operator": "In", "values": [i.to_string()]})];
    object_exprs.extend(case.object_selector.clone());
    let mut spec = json!({
        "enforcement": enforcement,
        "failurePolicy": case.failure_policy,
        "match": {
            "rules": [{"operations": case.operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": namespace_exprs},
            "objectSelector": {"matchExpressions": object_exprs},
        },
        "validate": case.validate,
    });
    if let Some(conditions) = &case.conditions {
        spec["match"]["conditions"] = conditions.clone();
    }
    policy_object(name, spec)
}

/// A ConfigMap of case `i`.
fn config_map(name: &str, ns: &str, i: usize, labels: Value, data: Value) -> Value {
    let mut labels = labels;
    labels[CASE_LABEL] = json!(i.to_string());
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, "labels": labels}, "data": data})
}

/// The requests every case gets: (description, kubectl arguments, stdin) for namespace `ns`.
fn requests(i: usize, ns: &str) -> Vec<(String, Vec<String>, Option<String>)> {
    let create = |name: &str, labels: Value, data: Value| {
        (
            format!("create {name} {labels} {data}"),
            vec![
                "create".into(),
                "--dry-run=server".into(),
                "-f".into(),
                "-".into(),
            ],
            Some(config_map(name, ns, i, labels, data).to_string()),
        )
    };
    let stored = stored_name(i);
    let update = |data: Value| {
        (
            format!("update {stored} {data}"),
            vec![
                "replace".into(),
                "--dry-run=server".into(),
                "-f".into(),
                "-".into(),
            ],
            Some(config_map(&stored, ns, i, json!({"protected": "yes"}), data).to_string()),
        )
    };
    vec![
        create("ok-good", json!({}), json!({"owner": "me", "size": "3"})),
        create("ok-no-owner", json!({}), json!({"size": "3"})),
        create("a-very-long-name-indeed", json!({}), json!({"size": "3"})),
        create("ok-web-bad", json!({"tier": "web"}), json!({})),
        create("skipme", json!({}), json!({})),
        create("ok-big", json!({}), json!({"owner": "me", "size": "30"})),
        update(json!({"frozen": "1", "owner": "me", "size": "1"})),
        update(json!({"frozen": "2", "owner": "me", "size": "1"})),
        (
            format!("delete {stored}"),
            vec![
                "delete".into(),
                "configmap".into(),
                stored.clone(),
                "-n".into(),
                ns.into(),
                "--dry-run=server".into(),
            ],
            None,
        ),
    ]
}

/// The stored ConfigMap of case `i`, which its UPDATE and DELETE requests address.
fn stored_name(i: usize) -> String {
    format!("stored-{i}")
}

/// What one request's answer means, with the documented prefixes taken off.
#[derive(Debug, PartialEq)]
struct Answer {
    admitted: bool,
    /// The first denial message, after the prefix.
    denial: Option<String>,
    /// Every warning's message, after the prefix, sorted.
    warnings: Vec<String>,
    /// The denial came from an expression failing at run time.
    failed: bool,
}

fn answer(admitted: bool, said: &str) -> Answer {
    let mut warnings: Vec<String> = said
        .lines()
        .filter_map(|l| l.strip_prefix("Warning: "))
        .filter_map(|w| {
            // The webhook's: `policy "<name>": <message>`; the API server's: `Validation failed
            // for ValidatingAdmissionPolicy '<name>' with binding '<name>': <message>`.
            w.split_once("\": ")
                .or_else(|| w.split_once("': "))
                .map(|(_, m)| m.to_string())
        })
        .filter(|m| !m.contains("(ignored: failurePolicy is Ignore)"))
        .collect();
    warnings.sort();
    let error = said
        .lines()
        .find(|l| l.starts_with("Error from server") || l.contains("denied"))
        .unwrap_or_default();
    let failed = error.contains("resulted in error") || error.contains(".expression: ");
    let denial = (!admitted && !failed).then(|| {
        let message = error
            .split_once("denied the request: policy \"")
            .and_then(|(_, rest)| rest.split_once("\": "))
            .map(|(_, m)| m.split("; ").next().unwrap_or(m))
            .or_else(|| error.split_once("denied request: ").map(|(_, m)| m))
            .unwrap_or(error);
        message.trim().to_string()
    });
    Answer {
        admitted,
        denial,
        warnings,
        failed,
    }
}

async fn ask(cluster: &Cluster, args: &[String], stdin: Option<&str>) -> anyhow::Result<Answer> {
    let out = cluster.kubectl_output(args, stdin).await?;
    Ok(answer(out.status.success(), &stderr(&out)))
}

#[tokio::test]
async fn webhook_and_in_process_answer_alike() {
    scenario("gh-parity-w", Options::url(), async |scene| {
        let cluster = scene.cluster;
        let w = scene.ns().to_string();
        let p = scene.namespace("gh-parity-p").await?;
        let staging = scene.namespace("gh-parity-s").await?;
        let staging_p = scene.namespace("gh-parity-sp").await?;
        for ns in [&w, &p] {
            cluster.kubectl_ok(["label", "namespace", ns, "env=prod"], None).await?;
        }
        for ns in [&staging, &staging_p] {
            cluster.kubectl_ok(["label", "namespace", ns, "env=staging"], None).await?;
        }
        let cases = corpus();
        ensure!(cases.len() >= 40, "only {} cases", cases.len());
        // Each case's namespaces: the authorizer cases select staging ones.
        let pair = |case: &Case| {
            if case.namespace_selector.as_ref().is_some_and(|s| s["values"][0] == "staging") {
                (staging.clone(), staging_p.clone())
            } else {
                (w.clone(), p.clone())
            }
        };
        // The objects UPDATE and DELETE find, before any Policy judges writes.
        for (i, case) in cases.iter().enumerate() {
            let (on_webhook, in_process) = pair(case);
            for ns in [&on_webhook, &in_process] {
                let stored = config_map(&stored_name(i), ns, i, json!({"protected": "yes"}), json!({"frozen": "1", "owner": "me", "size": "1"}));
                apply(cluster, &stored).await?;
            }
        }
        let mut names = Vec::new();
        for (i, case) in cases.iter().enumerate() {
            let (on_webhook, in_process) = pair(case);
            let (a, b) = (scene.policy(&format!("pw{i}")), scene.policy(&format!("pp{i}")));
            apply(cluster, &case_policy(case, i, &a, &on_webhook, "Webhook")).await?;
            apply(cluster, &case_policy(case, i, &b, &in_process, "InProcess")).await?;
            names.push((a, b));
        }
        for (a, b) in &names {
            await_ready(cluster, a, "True").await?;
            let ready = await_ready(cluster, b, "True").await?;
            ensure!(ready["reason"] == "InProcess", "{b}: {ready}");
        }
        let (mut compared, mut denied, mut warned, mut failed) = (0, 0, 0, 0);
        for (i, case) in cases.iter().enumerate() {
            let (on_webhook, in_process) = pair(case);
            let asked_w = requests(i, &on_webhook);
            let asked_p = requests(i, &in_process);
            for ((what, args_w, stdin_w), (_, args_p, stdin_p)) in asked_w.into_iter().zip(asked_p) {
                let mut by_webhook = ask(cluster, &args_w, stdin_w.as_deref()).await?;
                let mut in_api_server = ask(cluster, &args_p, stdin_p.as_deref()).await?;
                // The API server's caches of webhook configurations and of admission policies
                // follow a write by a moment: a difference that goes away within seconds is that
                // moment, one that stays is a difference.
                for _ in 0..10 {
                    if by_webhook == in_api_server {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    by_webhook = ask(cluster, &args_w, stdin_w.as_deref()).await?;
                    in_api_server = ask(cluster, &args_p, stdin_p.as_deref()).await?;
                }
                ensure!(
                    by_webhook == in_api_server,
                    "case {i} ({}; {}), {what}: the webhook answered {by_webhook:?}, the API server {in_api_server:?}",
                    case.validate, case.failure_policy
                );
                // The prefixes came off: what is compared is a rule's own message.
                let messages = ["needs an owner", "name too long", "frozen is immutable", "protected", "too big"];
                ensure!(
                    by_webhook.denial.as_deref().is_none_or(|d| messages.contains(&d)),
                    "case {i}, {what}: a denial not read as a rule's message: {by_webhook:?}"
                );
                ensure!(
                    by_webhook.warnings.iter().all(|w| w.ends_with("(advice)")),
                    "case {i}, {what}: a warning not read as a rule's message: {by_webhook:?}"
                );
                compared += 1;
                denied += usize::from(!by_webhook.admitted && !by_webhook.failed);
                failed += usize::from(by_webhook.failed);
                warned += usize::from(!by_webhook.warnings.is_empty());
            }
        }
        eprintln!("{} cases, {compared} requests: {denied} denied, {failed} failed at run time, {warned} with warnings; all alike", cases.len());
        ensure!(denied > 20 && warned > 10 && failed > 0, "the corpus does not exercise both outcomes");
        Ok(())
    })
    .await;
}
