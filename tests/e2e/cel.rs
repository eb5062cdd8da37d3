//! Policies in Kubernetes' CEL dialect on the real API server.

use anyhow::ensure;
use gatehouse_e2e::await_condition;
use gatehouse_e2e::instance::Options;
use serde_json::{Value, json};

use gatehouse_e2e::Cluster;

use crate::fixtures::{WAIT, apply, apply_ready, pod, policy, stderr};
use crate::scene::scenario;

/// A Pod `name` in `ns` whose container declares `memory` as its memory limit.
fn pod_with_memory(name: &str, ns: &str, memory: &str) -> anyhow::Result<String> {
    let mut pod: Value = serde_saphyr::from_str(&pod(name, ns))?;
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!(memory);
    Ok(pod.to_string())
}

#[tokio::test]
async fn a_quantity_limit_admits_pods_within_it_and_denies_the_rest() {
    scenario("gh-cel", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns().to_string();
        let name = scene.policy("memory-cap");
        let spec = json!({"failurePolicy": "Fail", "validate": [{
            "expression": "object.spec.containers.all(c, has(c.resources.limits.memory) && quantity(c.resources.limits.memory).compareTo(quantity('128Mi')) <= 0)",
            "message": "every container's memory limit must be at most 128Mi",
        }]});
        apply_ready(cluster, &policy(&name, &ns, spec)).await?;
        // Denied once the entry is in effect (the API server picks configurations up with a
        // lag); a Pod created before that is deleted and the create tried again.
        let big = pod_with_memory("big", &ns, "1Gi")?;
        let out = await_condition("the memory cap in effect", WAIT, || async {
            let out = cluster.kubectl_output(["create", "-f", "-"], Some(&big)).await?;
            if out.status.success() {
                cluster
                    .kubectl_ok(["delete", "pod", "big", "-n", &ns, "--grace-period=0"], None)
                    .await?;
                return Ok(None);
            }
            Ok(Some(out))
        })
        .await?;
        ensure!(
            stderr(&out).contains("every container's memory limit must be at most 128Mi"),
            "a Pod over the limit was not denied with the Policy's message: {}",
            stderr(&out)
        );
        for (pod_name, memory) in [("small", "64Mi"), ("exact", "0.125Gi"), ("milli", "100M")] {
            let out = cluster
                .kubectl_output(["create", "-f", "-"], Some(&pod_with_memory(pod_name, &ns, memory)?))
                .await?;
            ensure!(out.status.success(), "a Pod with {memory} was refused: {}", stderr(&out));
        }
        Ok(())
    })
    .await;
}

/// Error cases judged by one ValidatingAdmissionPolicy: their warnings (each cut at 256
/// characters) stay well inside what the API server keeps of a response's warnings.
const ERRORS_PER_POLICY: usize = 6;

/// The parity corpus, which the unit test `engine::cel::parity` runs through Gatehouse.
const CORPUS: &str = include_str!("../../cel/testdata/parity.txt");

/// The corpus's cases with outcome `outcome`.
fn cases(outcome: &str) -> Vec<&'static str> {
    CORPUS
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(o, _)| *o == outcome)
        .map(|(_, source)| source)
        .collect()
}

/// A ValidatingAdmissionPolicy named `name` for ConfigMap creates, one validation per expression
/// (message `false:<index>`), and its binding: warnings only, in namespace `ns`.
fn policy_and_binding(name: &str, ns: &str, expressions: &[&str]) -> Value {
    let validations: Vec<Value> = expressions
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"expression": e, "message": format!("false:{i}")}))
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"gatehouse.dev/e2e": "true"}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"]}]},
                "validations": validations,
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"gatehouse.dev/e2e": "true"}},
            "spec": {
                "policyName": name,
                "validationActions": ["Warn"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
            },
        },
    ]})
}

/// The warnings the ValidatingAdmissionPolicy `name` gave a server-dry-run ConfigMap create in
/// `ns`, once it is in effect: its validation `false` (the last) reports itself first.
async fn warnings_of(cluster: &Cluster, name: &str, ns: &str) -> anyhow::Result<Vec<String>> {
    let prefix = format!("ValidatingAdmissionPolicy '{name}'");
    await_condition(&format!("{name} in effect"), WAIT, || async {
        let out = cluster
            .kubectl_output(
                ["create", "configmap", "probe", "-n", ns, "--dry-run=server"],
                None,
            )
            .await?;
        let warnings: Vec<String> = stderr(&out)
            .lines()
            .filter(|l| l.contains(&prefix))
            .map(str::to_string)
            .collect();
        Ok((!warnings.is_empty()).then_some(warnings))
    })
    .await
}

/// Every case of the corpus means on kube-apiserver what it means in Gatehouse: the `true` cases
/// are true there, the `error` cases fail at run time there, and the `refused` cases are refused
/// when the policy is written.
#[tokio::test]
async fn parity_with_the_api_server() {
    gatehouse_e2e::run_test(|cluster| async move {
        let ns = gatehouse_e2e::TestNamespace::new(cluster, "gh-parity").await?;
        let id = ns.name().rsplit('-').next().unwrap_or("x").to_string();
        let sentinel = "false";

        let name = format!("gh-parity-true-{id}");
        let mut expressions = cases("true");
        let trues = expressions.len();
        expressions.push(sentinel);
        let _guard = (
            cluster.delete_on_drop("validatingadmissionpolicy", &name, None),
            cluster.delete_on_drop("validatingadmissionpolicybinding", &name, None),
        );
        apply(cluster, &policy_and_binding(&name, ns.name(), &expressions)).await?;
        let warnings = warnings_of(cluster, &name, ns.name()).await?;
        let sentinel_message = format!("false:{trues}");
        let not_true: Vec<&str> = warnings
            .iter()
            .filter(|w| !w.ends_with(&sentinel_message))
            .map(|w| {
                w.rsplit_once("false:")
                    .and_then(|(_, i)| i.parse::<usize>().ok())
                    .and_then(|i| expressions.get(i).copied())
                    .unwrap_or(w)
            })
            .collect();
        ensure!(
            not_true.is_empty(),
            "cases true in Gatehouse are not true on the API server: {not_true:#?}"
        );

        // The API server keeps only the first few kilobytes of a response's warnings, so the
        // error cases go a few at a time, each group bound in a namespace of its own.
        for (group, chunk) in cases("error").chunks(ERRORS_PER_POLICY).enumerate() {
            let group_ns = gatehouse_e2e::TestNamespace::new(cluster, "gh-parity-e").await?;
            let name = format!("gh-parity-error-{group}-{id}");
            let mut expressions = chunk.to_vec();
            let errors = expressions.len();
            expressions.push(sentinel);
            let _guard = (
                cluster.delete_on_drop("validatingadmissionpolicy", &name, None),
                cluster.delete_on_drop("validatingadmissionpolicybinding", &name, None),
            );
            apply(
                cluster,
                &policy_and_binding(&name, group_ns.name(), &expressions),
            )
            .await?;
            let warnings = warnings_of(cluster, &name, group_ns.name()).await?;
            let evaluated: Vec<&String> = warnings
                .iter()
                .filter(|w| w.contains("false:") && !w.ends_with(&format!("false:{errors}")))
                .collect();
            ensure!(
                evaluated.is_empty() && warnings.len() == errors + 1,
                "cases that fail in Gatehouse did not all fail on the API server ({} warnings for {errors} cases {chunk:#?}): {warnings:#?}",
                warnings.len()
            );
            group_ns.cleanup().await?;
        }

        for (i, expression) in cases("refused").into_iter().enumerate() {
            let name = format!("gh-parity-refused-{i}-{id}");
            let policy = policy_and_binding(&name, ns.name(), &[expression]);
            let out = cluster
                .kubectl_output(
                    ["create", "--dry-run=server", "-f", "-"],
                    Some(&policy["items"][0].to_string()),
                )
                .await?;
            ensure!(
                !out.status.success(),
                "the API server accepted {expression:?} (refused in the corpus)"
            );
        }
        ns.cleanup().await
    })
    .await;
}
