//! The translation of merges into the API server's JSONPatch mutations
//! (`engine::jsonpatch_cel`), against the engine, on the real API server: for every case (a
//! Policy's `mutate` list and an object), the object the API server stores when the translated
//! mutations run in a MutatingAdmissionPolicy equals the one it stores when the engine's result
//! comes back as a webhook's patch would (the engine applied to the defaulted object, the API
//! server defaulting again). Both by server dry run; nothing is stored.
//!
//! This proves the translation only; which Policies Gatehouse compiles in-process, and the
//! ordering across Policies, are the controller's, which does not compile mutating Policies
//! in-process yet.

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::{StreamExt, TryStreamExt};
use gatehouse::controller::wiring::jsonpatch_cel;
use gatehouse::controller::wiring::mutating_policy;
use gatehouse::controller::wiring::schema_fit::{SchemaFit, fits, kind_schema};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_e2e::{TestNamespace, run_test};
use gatehouse_engine::{mutate, policy};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};

const CASE_LABEL: &str = "gatehouse-e2e/case";
const ADMISSION: &str = "admissionregistration.k8s.io";
/// The API server loads policies about a second after they are written; a difference must
/// persist this long to count.
const SETTLE: Duration = Duration::from_secs(8);

struct Case {
    mutate: Value,
    ignore: bool,
    object: Value,
    /// Run as Gatehouse generates it (`mutating_policy::policy_mutations`: the Policy's match as
    /// a guard, its own number of passes), not as the bare translation repeated.
    gatehouse: bool,
}

/// Pods whose dry-run creates are deterministic (no ServiceAccount token volume).
fn pod(containers: Value, extra: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"automountServiceAccountToken": false, "containers": containers},
    });
    if let (Some(p), Some(e)) = (pod.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            match (p.get_mut(k), v) {
                (Some(Value::Object(existing)), Value::Object(add)) => {
                    existing.extend(add.clone());
                }
                _ => {
                    p.insert(k.clone(), v.clone());
                }
            }
        }
    }
    pod
}

pub(crate) fn pods() -> Vec<Value> {
    vec![
        pod(json!([{"name": "app", "image": "nginx"}]), json!({})),
        pod(
            json!([
                {"name": "app", "image": "registry.internal/app", "env": [{"name": "A", "value": "orig"}],
                 "securityContext": {"capabilities": {"drop": ["NET_RAW"]}}},
                {"name": "side", "image": "busybox", "args": ["--y"]},
            ]),
            json!({"metadata": {"labels": {"tier": "web"}, "annotations": {"old": "1"}}}),
        ),
        pod(
            json!([{"name": "proxy", "image": "envoy", "resources": {"limits": {"memory": "64Mi"}}},
                   {"name": "app", "image": "nginx", "env": [{"name": "B", "value": "b"}, {"name": "A", "value": "x"}]}]),
            json!({"spec": {"volumes": [{"name": "cache", "emptyDir": {"medium": "Memory"}}],
                            "securityContext": {"runAsUser": 1000}}}),
        ),
        pod(
            json!([{"name": "app", "image": "nginx", "imagePullPolicy": "Always", "args": ["--x", "--y"],
                    "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["BPF"]}}}]),
            json!({"metadata": {"labels": {"tier": "db", "team": "t"}}}),
        ),
    ]
}

/// Mutate lists over Pods: the samples, merges of maps, named lists and scalars, overwrite,
/// removal, forEach with and without `when`, chains that take more than one pass.
pub(crate) fn pod_mutations() -> Vec<(Value, bool)> {
    vec![
        // drop-bpf (the sample).
        (
            json!([{"forEach": "spec.containers", "when": "!element.image.startsWith('registry.internal/')",
                 "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}]),
            false,
        ),
        // inject-proxy (the sample).
        (
            json!([{"merge": {"spec": {"containers": [{"name": "proxy", "image": "example.com/proxy:1.0"}]}}}]),
            false,
        ),
        (
            json!([{"merge": {"metadata": {"labels": {"team": "platform", "app.kubernetes.io/managed-by": "gatehouse"}}}}]),
            false,
        ),
        (
            json!([{"merge": {"metadata": {"labels": {"team": "platform"}}}, "overwrite": true}]),
            false,
        ),
        (
            json!([{"merge": {"metadata": {"annotations": {"old": null, "new": "2"}}}, "overwrite": true}]),
            false,
        ),
        (
            json!([{"forEach": "spec.containers", "merge": {"env": [{"name": "A", "value": "set"}, {"name": "C", "value": "c"}]}}]),
            false,
        ),
        (
            json!([{"forEach": "spec.containers", "merge": {"env": [{"name": "A", "value": "set"}]}, "overwrite": true}]),
            false,
        ),
        (
            json!([{"forEach": "spec.containers", "merge": {"args": ["--x", "--z", "--x"]}}]),
            false,
        ),
        (
            json!([{"merge": {"spec": {"volumes": [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]}}}]),
            false,
        ),
        (
            json!([{"forEach": "spec.containers", "merge": {"resources": {"limits": {"memory": "128Mi", "cpu": "1"}}}}]),
            false,
        ),
        (
            json!([{"merge": {"spec": {"securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}}}}}]),
            false,
        ),
        (
            json!([{"merge": {"spec": {"securityContext": {"runAsUser": 65532}}}, "overwrite": true}]),
            false,
        ),
        // A chain: the forEach runs before the sidecar exists; the second pass reaches it.
        (
            json!([
                {"forEach": "spec.containers", "merge": {"securityContext": {"allowPrivilegeEscalation": false}}},
                {"merge": {"spec": {"containers": [{"name": "sidecar", "image": "busybox"}]}}},
            ]),
            false,
        ),
        (
            json!([{"when": "has(object.metadata.labels) && 'tier' in object.metadata.labels && object.metadata.labels.tier == 'web'",
                 "merge": {"metadata": {"annotations": {"tiered": "web"}}}}]),
            false,
        ),
        (
            json!([{"forEach": "spec.containers", "when": "element.name == 'app'",
                 "merge": {"imagePullPolicy": "IfNotPresent", "securityContext": {"readOnlyRootFilesystem": true}}, "overwrite": true}]),
            false,
        ),
        // Named elements merged into an existing element, nested.
        (
            json!([{"merge": {"spec": {"containers": [{"name": "app", "env": [{"name": "A", "value": "z"}, {"name": "D", "value": "d"}]}]}}}]),
            false,
        ),
        (
            json!([{"merge": {"spec": {"containers": [{"name": "app", "securityContext": {"capabilities": {"drop": ["ALL"]}}}]}}, "overwrite": true}]),
            false,
        ),
        // Under Ignore, a guard that fails skips its mutation only.
        (
            json!([
                {"when": "object.metadata.labels.tier == 'web'", "merge": {"metadata": {"annotations": {"guarded": "yes"}}}},
                {"merge": {"metadata": {"annotations": {"always": "yes"}}}},
            ]),
            true,
        ),
    ]
}

pub(crate) fn config_maps() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"a": "1"}}, "data": {"x": "1", "y": "2"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "annotations": {"k/v": "q"}}, "data": {"z": ""}}),
    ]
}

pub(crate) fn config_map_mutations() -> Vec<(Value, bool)> {
    vec![
        (
            json!([{"merge": {"data": {"x": "default", "w": "w"}}}]),
            false,
        ),
        (
            json!([{"merge": {"data": {"x": "forced", "y": null}}, "overwrite": true}]),
            false,
        ),
        (
            json!([{"merge": {"metadata": {"annotations": {"k/v": "r", "a~b": "s"}, "labels": {"a": "2"}}}}]),
            false,
        ),
        (
            json!([{"when": "has(object.data) && 'x' in object.data", "merge": {"data": {"seen": "x"}}},
                {"merge": {"data": {"x": "later"}}}]),
            false,
        ),
    ]
}

fn corpus() -> Vec<Case> {
    let mut cases = Vec::new();
    for (mutate, ignore) in pod_mutations() {
        for object in pods() {
            cases.push(Case {
                mutate: mutate.clone(),
                ignore,
                object,
                gatehouse: false,
            });
        }
    }
    for (mutate, ignore) in config_map_mutations() {
        for object in config_maps() {
            cases.push(Case {
                mutate: mutate.clone(),
                ignore,
                object,
                gatehouse: false,
            });
        }
    }
    cases
}

fn gatehouse_policy(n: usize, case: &Case) -> anyhow::Result<Policy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": format!("case-{n}")},
        "spec": {
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods", "configmaps"], "scope": "Namespaced"}]},
            "failurePolicy": if case.ignore { "Ignore" } else { "Fail" },
            "mutate": case.mutate,
        },
    }))?)
}

/// A case's mutations: the translated list, repeated as many passes as the engine makes at most
/// (a pass that changes nothing is a no-op), each guarded by the case's label: the guard is the
/// condition of a conditional, so the other cases' expressions are never evaluated.
fn case_mutations(n: usize, case: &Case) -> anyhow::Result<Vec<Value>> {
    let policy = gatehouse_policy(n, case)?;
    let compiled = policy::compile(&policy).map_err(|e| anyhow::anyhow!("case {n}: {e:?}"))?;
    let guard = format!(
        "has(object.metadata.labels) && {CASE_LABEL:?} in object.metadata.labels && object.metadata.labels[{CASE_LABEL:?}] == \"{n}\""
    );
    let mut mutations = Vec::new();
    if case.gatehouse {
        let footprints = mutating_policy::footprints_of(&policy, None);
        for m in mutating_policy::policy_mutations(&policy, &footprints, false)
            .map_err(|e| anyhow::anyhow!("case {n} does not run in-process: {e}"))?
        {
            let mut m = serde_json::to_value(m)?;
            let expression = m["jsonPatch"]["expression"].as_str().unwrap_or_default();
            m["jsonPatch"]["expression"] = json!(format!("{guard} ? ({expression}) : []"));
            mutations.push(m);
        }
        return Ok(mutations);
    }
    for _ in 0..mutate::max_passes(&compiled) {
        for m in &compiled.spec().mutate {
            if let Some(expression) = jsonpatch_cel::mutation_expression(m, case.ignore)
                .with_context(|| format!("case {n} has no exact translation"))?
            {
                let expression = format!("{guard} ? ({expression}) : []");
                mutations.push(
                    json!({"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}),
                );
            }
        }
    }
    Ok(mutations)
}

/// Cases per MutatingAdmissionPolicy. The API server compiles a policy's expressions when it is
/// written and recompiles its policies after every write, so neither one policy per case nor one
/// for all (its create outlasts the request timeout) is workable.
const CASES_PER_POLICY: usize = 8;

/// MutatingAdmissionPolicies and bindings holding the cases' mutations, one failurePolicy each.
fn admission_policies(
    cases: &[(usize, &Case)],
    namespace: &str,
    prefix: &str,
) -> anyhow::Result<Vec<Value>> {
    let mut objects = Vec::new();
    for (ignore, failure_policy) in [(false, "Fail"), (true, "Ignore")] {
        let numbered: Vec<(usize, &Case)> = cases
            .iter()
            .filter(|(_, c)| c.ignore == ignore)
            .copied()
            .collect();
        for (chunk, members) in numbered.chunks(CASES_PER_POLICY).enumerate() {
            let mut mutations = Vec::new();
            for (n, case) in members {
                mutations.extend(case_mutations(*n, case)?);
            }
            let name = format!("{prefix}-{}-{chunk}", failure_policy.to_lowercase());
            // Last, the probe: once it mutates its ConfigMap the API server runs the policy.
            mutations.push(json!({"patchType": "JSONPatch", "jsonPatch": {"expression": format!(
                "object.kind == \"ConfigMap\" && has(object.metadata.labels) && {CASE_LABEL:?} in object.metadata.labels && object.metadata.labels[{CASE_LABEL:?}] == {:?} ? [JSONPatch{{op: \"add\", path: \"/data\", value: {{\"ready\": \"yes\"}}}}] : []",
                probe_label(&name)
            )}}));
            objects.push(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
                "metadata": {"name": name},
                "spec": {
                    "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods", "configmaps"]}]},
                    "failurePolicy": failure_policy,
                    "reinvocationPolicy": "Never",
                    "mutations": mutations,
                },
            }));
            objects.push(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
                },
            }));
        }
    }
    Ok(objects)
}

/// The case label of the probe ConfigMap of the admission policy `name`.
fn probe_label(name: &str) -> String {
    format!("probe-{:08x}", fnv(name) as u32)
}

fn fnv(s: &str) -> usize {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) as usize
}

/// Waits until the API server runs the admission policy `name`: its probe mutates.
async fn await_in_effect(client: &Client, name: &str, namespace: &str) -> anyhow::Result<()> {
    let probe = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "probe", "namespace": namespace, "labels": {CASE_LABEL: probe_label(name)}},
    });
    gatehouse_e2e::await_condition(
        &format!("{name} in effect"),
        Duration::from_secs(120),
        || async {
            let stored = create(client, &probe, true).await?;
            Ok(stored
                .ok()
                .filter(|s| s["data"]["ready"] == "yes")
                .map(|_| ()))
        },
    )
    .await
}

fn labelled(object: &Value, n: usize, namespace: &str) -> Value {
    let mut o = object.clone();
    o["metadata"]["namespace"] = json!(namespace);
    if !o["metadata"]["labels"].is_object() {
        o["metadata"]["labels"] = json!({});
    }
    o["metadata"]["labels"][CASE_LABEL] = json!(n.to_string());
    o
}

/// The kinds the test writes, as the client addresses them.
fn resource(object: &Value) -> anyhow::Result<ApiResource> {
    let (group, version, kind, plural) = match object["kind"].as_str().unwrap_or_default() {
        "Pod" => ("", "v1", "Pod", "pods"),
        "ConfigMap" => ("", "v1", "ConfigMap", "configmaps"),
        "MutatingAdmissionPolicy" => (
            ADMISSION,
            "v1",
            "MutatingAdmissionPolicy",
            "mutatingadmissionpolicies",
        ),
        "MutatingAdmissionPolicyBinding" => (
            ADMISSION,
            "v1",
            "MutatingAdmissionPolicyBinding",
            "mutatingadmissionpolicybindings",
        ),
        other => bail!("no resource for kind {other:?}"),
    };
    Ok(ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, version, kind),
        plural,
    ))
}

/// A create (a server dry run if `dry_run`): the stored object, or the API server's refusal.
async fn create(
    client: &Client,
    object: &Value,
    dry_run: bool,
) -> anyhow::Result<Result<Value, String>> {
    let ar = resource(object)?;
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let params = PostParams {
        dry_run,
        ..PostParams::default()
    };
    match api
        .create(&params, &serde_json::from_value(object.clone())?)
        .await
    {
        Ok(stored) => Ok(Ok(serde_json::to_value(stored)?)),
        Err(kube::Error::Api(status)) => Ok(Err(status.message)),
        Err(e) => Err(e.into()),
    }
}

/// What two creates in different namespaces may differ in.
fn comparable(mut stored: Value) -> Value {
    if let Some(meta) = stored["metadata"].as_object_mut() {
        meta.retain(|k, _| matches!(k.as_str(), "name" | "labels" | "annotations"));
    }
    stored
}

/// What the webhook path stores: the engine's result on the defaulted object, defaulted again.
async fn through_the_engine(
    client: &Client,
    n: usize,
    case: &Case,
    object: &Value,
) -> anyhow::Result<Result<Value, String>> {
    let defaulted = match create(client, object, true).await? {
        Ok(d) => d,
        Err(e) => bail!("case {n}: the object itself is refused: {e}"),
    };
    let compiled = policy::compile(&gatehouse_policy(n, case)?)
        .map_err(|e| anyhow::anyhow!("case {n}: {e:?}"))?;
    let mut mutated = defaulted;
    let request = json!({"operation": "CREATE", "namespace": object["metadata"]["namespace"], "name": object["metadata"]["name"]});
    match mutate::settle(&compiled, &mut mutated, None, &request) {
        Ok(_) => {}
        Err(e) => return Ok(Err(format!("engine: {e}"))),
    }
    for key in [
        "uid",
        "creationTimestamp",
        "resourceVersion",
        "managedFields",
        "generation",
    ] {
        if let Some(meta) = mutated["metadata"].as_object_mut() {
            meta.remove(key);
        }
    }
    create(client, &mutated, true).await
}

/// One case: the engine's path and the API server's agree, within [`SETTLE`] of the policies
/// being written. Returns whether the case changed its object.
async fn check(
    client: &Client,
    n: usize,
    case: &Case,
    engine_ns: &str,
    api_ns: &str,
    written: Instant,
) -> anyhow::Result<bool> {
    let plain = labelled(&case.object, n, engine_ns);
    let expected = through_the_engine(client, n, case, &plain)
        .await?
        .map(comparable);
    let object = labelled(&case.object, n, api_ns);
    loop {
        let actual = create(client, &object, true).await?.map(comparable);
        let agree = match (&expected, &actual) {
            (Ok(e), Ok(a)) => e == a,
            (Err(_), Err(_)) => true,
            _ => false,
        };
        if agree {
            let unmutated = create(client, &plain, true).await?.map(comparable);
            return Ok(expected.as_ref().ok() != unmutated.as_ref().ok());
        }
        if written.elapsed() > SETTLE {
            let show = |r: &Result<Value, String>| match r {
                Ok(v) => serde_json::to_string_pretty(v).unwrap_or_default(),
                Err(e) => format!("refused: {e}"),
            };
            bail!(
                "case {n} ({}) on {}: the API server stores\n{}\nthe engine's path\n{}",
                case.mutate,
                case.object,
                show(&actual),
                show(&expected)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Cases whose admission policies are in the cluster together: every write makes the API
/// server recompile all of them, so a large corpus is checked round by round.
const ROUND: usize = 48;

/// Checks every case ([`check`]) with its admission policies named `<prefix>-…`, round by round;
/// returns how many changed their object.
async fn check_corpus(
    cluster: &'static gatehouse_e2e::Cluster,
    cases: &[Case],
    prefix: &str,
) -> anyhow::Result<usize> {
    let engine_ns = TestNamespace::new(cluster, &format!("{prefix}-engine")).await?;
    let api_ns = TestNamespace::new(cluster, &format!("{prefix}-api")).await?;
    let client = cluster.client().await?;
    let numbered: Vec<(usize, &Case)> = cases.iter().enumerate().collect();
    let mut changed = 0;
    for (r, round) in numbered.chunks(ROUND).enumerate() {
        let started = Instant::now();
        let mut guards = Vec::new();
        let mut written_policies = Vec::new();
        for object in admission_policies(round, api_ns.name(), &format!("{prefix}-{r}"))? {
            let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            guards.push(cluster.delete_on_drop(&kind, &name, None));
            if let Err(refused) = create(&client, &object, false).await? {
                bail!("the API server refuses {kind} {name}: {refused}");
            }
            if kind == "mutatingadmissionpolicy" {
                written_policies.push(name);
            }
        }
        let took = started.elapsed();
        for name in &written_policies {
            await_in_effect(&client, name, api_ns.name()).await?;
        }
        let written = Instant::now();
        eprintln!(
            "the admission policies of {} cases written in {took:?}, in effect {:?} later",
            round.len(),
            written - started - took
        );
        let (engine, api) = (engine_ns.name(), api_ns.name());
        let round_changed: Vec<bool> = futures::stream::iter(round.iter())
            .map(|(n, case)| check(&client, *n, case, engine, api, written))
            .buffer_unordered(8)
            .try_collect()
            .await?;
        changed += round_changed.into_iter().filter(|c| *c).count();
        drop(guards);
    }
    engine_ns.cleanup().await?;
    api_ns.cleanup().await?;
    Ok(changed)
}

#[tokio::test]
async fn translated_mutations_store_what_the_engine_stores() {
    run_test(|cluster| async move {
        let cases = corpus();
        ensure!(cases.len() >= 60, "the corpus has {} cases", cases.len());
        let changed = check_corpus(cluster, &cases, "gatehouse-e2e-translation").await?;
        // The corpus is only worth something if it mutates.
        ensure!(
            changed * 2 > cases.len(),
            "only {changed} of {} cases changed their object",
            cases.len()
        );
        eprintln!(
            "{} cases agree ({changed} mutated their object)",
            cases.len()
        );
        Ok(())
    })
    .await;
}

/// The property: for generated merges and Pods (`PROPERTY_CASES`, default 240, from
/// `PROPERTY_SEED`, default the day's number, printed), the API server running the mutations
/// Gatehouse generates for the Policy (match guard, passes) stores what the engine's path
/// stores. Lists without an exact translation, or that
/// the engine's validation refuses, or that Gatehouse keeps on the webhook for another reason
/// (a mutation depending on what another may append), are counted and left out.
#[tokio::test]
async fn generated_merges_store_what_the_engine_stores() {
    run_test(|cluster| async move {
        let count = std::env::var("PROPERTY_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(240usize);
        let seed = std::env::var("PROPERTY_SEED")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() / 86_400)
                    .unwrap_or(1)
            });
        eprintln!("PROPERTY_SEED={seed}");
        // The structs the real Pod schema says may be absent, as Gatehouse reads them.
        let core: Value = serde_json::from_str(
            &cluster
                .kubectl_ok(["get", "--raw", "/openapi/v3/api/v1"], None)
                .await?,
        )?;
        let pod_schema = kind_schema(&core, "", "v1", "Pod").context("no Pod schema")?;
        let mut generator = crate::generated_merges::Generator::new(seed);
        let mut cases = Vec::new();
        let mut left_out = 0;
        while cases.len() < count {
            let case = Case {
                mutate: generator.mutate_list(),
                ignore: false,
                object: generator.pod(),
                gatehouse: true,
            };
            // What Gatehouse would run in-process: fitting the schema, translated, and no
            // mutation depending on what another may append or create.
            let exact = gatehouse_policy(0, &case)
                .ok()
                .filter(|p| policy::compile(p).is_ok())
                .is_some_and(|p| {
                    let fit = match fits(&p.spec.mutate, &pod_schema) {
                        Ok(optional) => SchemaFit::Fits(optional),
                        Err(reason) => SchemaFit::Unfit(reason),
                    };
                    let footprints = mutating_policy::footprints_of(&p, Some(&fit));
                    matches!(fit, SchemaFit::Fits(_))
                        && mutating_policy::policy_mutations(&p, &footprints, false).is_ok()
                });
            if exact {
                cases.push(case);
            } else {
                left_out += 1;
            }
        }
        let changed = check_corpus(cluster, &cases, "gatehouse-e2e-property").await?;
        ensure!(
            changed * 2 > cases.len(),
            "only {changed} of {} generated cases changed their object",
            cases.len()
        );
        eprintln!(
            "{} generated cases agree ({changed} mutated their object; {left_out} generated lists left out as not exact or invalid)",
            cases.len()
        );
        Ok(())
    })
    .await;
}
