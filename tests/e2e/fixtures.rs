//! What the scenarios are built from: Policies and Pods as JSON or YAML, and kubectl-like
//! helpers that apply them and read back what the cluster made of them.
use std::cell::RefCell;
use std::time::Duration;

use ::gatehouse::controller::wiring;
use anyhow::{Context, bail};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use gatehouse_engine::Phase;
use gatehouse_engine::group::Group;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use serde_json::{Value, json};

pub(crate) use gatehouse_e2e::kubectl::{apply, get_json, list, stderr, try_apply};

pub(crate) const WAIT: Duration = Duration::from_secs(60);

/// `options` with a CA and a serving certificate valid for `ca` and `cert` (each rotated at
/// about two thirds of that), and 2 s allowed for a new CA bundle to reach the API server.
pub(crate) fn rotating(options: Options, ca: &str, cert: &str) -> Options {
    options
        .arg("--ca-validity", ca)
        .arg("--cert-validity", cert)
        .arg("--bundle-propagation", "2s")
}

/// A Policy for Pods (CREATE and UPDATE) in namespace `ns` only, with `spec` merged over that
/// (objects field by field, anything else replaced).
pub(crate) fn policy(name: &str, ns: &str, spec: Value) -> Value {
    pod_policy(name, ns, &["CREATE", "UPDATE"], spec)
}

/// A Policy for `operations` on Pods in namespace `ns` only, with `spec` merged over that.
pub(crate) fn pod_policy(name: &str, ns: &str, operations: &[&str], spec: Value) -> Value {
    let mut full = json!({
        "match": {
            "rules": [{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        },
    });
    merge(&mut full, spec);
    policy_object(name, full)
}

/// The Policy `name` with `spec`: on the webhook unless `spec` says otherwise (the scenarios
/// written for the webhook path test it; `in_process` tests the default, `Auto`).
pub(crate) fn policy_object(name: &str, mut spec: Value) -> Value {
    if let Some(fields) = spec.as_object_mut() {
        fields
            .entry("enforcement")
            .or_insert_with(|| json!("Webhook"));
    }
    json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec})
}

/// Merges `from` into `into`: objects field by field, anything else replaced.
pub(crate) fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

/// A mutation adding the sidecar `proxy` (with resource limits if `limits`), reinvoked if
/// `reinvoke`, at `priority`.
pub(crate) fn sidecar(priority: i32, limits: bool, reinvoke: bool) -> Value {
    let mut proxy = json!({"name": "proxy", "image": "example.com/proxy:1.0"});
    if limits {
        proxy["resources"] = json!({"limits": {"cpu": "100m", "memory": "64Mi"}});
    }
    let mut spec =
        json!({"priority": priority, "mutate": [{"merge": {"spec": {"containers": [proxy]}}}]});
    if reinvoke {
        spec["reinvocationPolicy"] = json!("IfNeeded");
    }
    spec
}

/// A mutation setting the label `key: value`, at `priority`.
pub(crate) fn label(priority: i32, key: &str, value: &str) -> Value {
    json!({"priority": priority, "mutate": [{"merge": {"metadata": {"labels": {key: value}}}}]})
}

/// A validation refusing Pods with a container without resource limits.
pub(crate) fn require_limits() -> Value {
    json!({"priority": 100, "validate": [{
        "expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
        "message": "every container must declare resource limits",
    }]})
}

pub(crate) fn pod(name: &str, ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  containers:
  - name: app
    image: example.com/app:1.0
    resources: {{limits: {{cpu: 100m, memory: 64Mi}}}}
"#
    )
}

/// Waits until the Policy reports `Ready=<status>` for its current generation; returns the
/// condition.
pub(crate) async fn await_ready(
    cluster: &Cluster,
    name: &str,
    status: &str,
) -> anyhow::Result<Value> {
    await_condition(&format!("Policy {name} Ready={status}"), WAIT, || async {
        let Some(p) = get_json(cluster, &["policy", name]).await? else {
            return Ok(None);
        };
        let generation = p["metadata"]["generation"].clone();
        let ready = p["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .cloned();
        Ok(ready.filter(|c| {
            c["status"] == status
                && c["observedGeneration"] == generation
                && p["status"]["observedGeneration"] == generation
        }))
    })
    .await
}

/// Applies a Policy and waits until it is Ready for its current generation.
pub(crate) async fn apply_ready(cluster: &Cluster, policy: &Value) -> anyhow::Result<()> {
    apply(cluster, policy).await?;
    let name = policy["metadata"]["name"]
        .as_str()
        .context("a Policy without a name")?;
    await_ready(cluster, name, "True").await?;
    Ok(())
}

/// The sidecar injector (with limits) most scenarios use, applied and Ready.
pub(crate) async fn apply_sidecar(cluster: &Cluster, name: &str, ns: &str) -> anyhow::Result<()> {
    apply_ready(cluster, &policy(name, ns, sidecar(100, true, false))).await
}

/// The groups both live configurations hold, read from their membership annotation by the
/// product's own function.
pub(crate) async fn wired_groups(cluster: &Cluster) -> anyhow::Result<Vec<Group>> {
    let mutating: Option<MutatingWebhookConfiguration> =
        get_json(cluster, &["mutatingwebhookconfiguration", "gatehouse"])
            .await?
            .map(serde_json::from_value)
            .transpose()?;
    let validating: Option<ValidatingWebhookConfiguration> =
        get_json(cluster, &["validatingwebhookconfiguration", "gatehouse"])
            .await?
            .map(serde_json::from_value)
            .transpose()?;
    Ok(wiring::wired_groups(mutating.iter(), validating.iter()))
}

/// The name of the entry that holds `policy` in `phase`, if it is wired there.
pub(crate) async fn entry_of(
    cluster: &Cluster,
    policy: &str,
    phase: Phase,
) -> anyhow::Result<Option<String>> {
    Ok(wired_groups(cluster)
        .await?
        .iter()
        .find(|g| g.phase == phase && g.members.iter().any(|m| m == policy))
        .map(|g| g.entry_name()))
}

/// Entry names of `kind`/gatehouse (empty when absent).
pub(crate) async fn entries(cluster: &Cluster, kind: &str) -> anyhow::Result<Vec<String>> {
    let Some(cfg) = get_json(cluster, &[kind, "gatehouse"]).await? else {
        return Ok(vec![]);
    };
    Ok(cfg["webhooks"]
        .as_array()
        .map(|ws| {
            ws.iter()
                .filter_map(|w| w["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// Creates a Pod, retrying while the API server has not yet picked up a configuration change
/// (its webhook informer lags the write by a moment). `done` decides from the outcome whether
/// the change is in effect; a Pod created before that is deleted and the create retried.
pub(crate) async fn create_pod_until<F>(
    cluster: &Cluster,
    ns: &str,
    name: &str,
    extra_args: &[&str],
    done: F,
) -> anyhow::Result<std::process::Output>
where
    F: FnMut(&std::process::Output) -> bool,
{
    create_until(cluster, &pod(name, ns), extra_args, done).await
}

/// Creates `object` until it is admitted (`Ok`) or refused with the text of `wanted`'s `Err`.
pub(crate) async fn create_expecting(
    cluster: &Cluster,
    object: &str,
    wanted: Result<(), &str>,
) -> anyhow::Result<std::process::Output> {
    create_until(cluster, object, &[], |out| match wanted {
        Ok(()) => out.status.success(),
        Err(text) => !out.status.success() && stderr(out).contains(text),
    })
    .await
}

/// [`create_pod_until`] of any namespaced `object` (YAML or JSON text).
pub(crate) async fn create_until<F>(
    cluster: &Cluster,
    object: &str,
    extra_args: &[&str],
    done: F,
) -> anyhow::Result<std::process::Output>
where
    F: FnMut(&std::process::Output) -> bool,
{
    let mut args = vec!["create", "-f", "-"];
    args.extend_from_slice(extra_args);
    let dry_run = extra_args.contains(&"--dry-run=server");
    let done = RefCell::new(done);
    let (args, done) = (&args, &done);
    let what = "the outcome wanted of a create";
    await_condition(what, WAIT, move || async move {
        let out = cluster.kubectl_output(args, Some(object)).await?;
        if (done.borrow_mut())(&out) {
            return Ok(Some(out));
        }
        if out.status.success() && !dry_run {
            cluster
                .kubectl_ok(
                    ["delete", "-f", "-", "--wait=true", "--grace-period=0"],
                    Some(object),
                )
                .await?;
        }
        bail!(
            "status {} stdout {} stderr {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
    .await
}

pub(crate) fn container_names(pod: &Value) -> Vec<String> {
    pod["spec"]["containers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) async fn delete_policies(cluster: &Cluster, names: &[&str]) -> anyhow::Result<()> {
    if names.is_empty() {
        return Ok(());
    }
    let mut args = vec!["delete", "policies", "--ignore-not-found", "--wait=false"];
    args.extend_from_slice(names);
    cluster.kubectl_ok(args, None).await?;
    Ok(())
}

pub(crate) fn decode_secret_key(secret: &Value, key: &str) -> anyhow::Result<String> {
    use base64::Engine as _;
    let b64 = secret["data"][key].as_str().context("key missing")?;
    Ok(String::from_utf8(
        base64::engine::general_purpose::STANDARD.decode(b64)?,
    )?)
}
