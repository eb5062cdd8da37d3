//! NamespacedPolicies: a namespace's own team, with the namespace `admin` role only, writes
//! Policies that apply in its namespace and nowhere else, and the platform's Policies have the
//! last word.

use anyhow::{Context, ensure};
use gatehouse_e2e::instance::Options;
use gatehouse_e2e::{Cluster, await_condition};
use serde_json::{Value, json};

use crate::fixtures::*;
use crate::scene::{Scene, scenario};

/// The user a scenario's tenant acts as: `admin` of the scenario's namespace, nothing more.
async fn tenant_admin(scene: &Scene) -> anyhow::Result<String> {
    let cluster = scene.cluster;
    let user = format!("tenant-{}", scene.id());
    // The install's tenant role, as `kubectl apply -k config/default` puts it in place.
    let role = cluster
        .repo_root()
        .join("config/rbac/tenant_cluster_role.yaml");
    cluster
        .kubectl_ok(
            ["apply", "--server-side", "-f", &role.to_string_lossy()],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(
            [
                "create",
                "rolebinding",
                "tenant-admin",
                "--clusterrole=admin",
                &format!("--user={user}"),
                "-n",
                scene.ns(),
            ],
            None,
        )
        .await?;
    // The ClusterRole aggregation controller folds gatehouse-tenant into admin.
    let (ns, who) = (scene.ns(), user.as_str());
    await_condition("admin may write NamespacedPolicies", WAIT, || async move {
        let out = as_user(
            cluster,
            who,
            &["auth", "can-i", "create", "namespacedpolicies", "-n", ns],
        )
        .await?;
        Ok((String::from_utf8_lossy(&out.stdout).trim() == "yes").then_some(()))
    })
    .await?;
    Ok(user)
}

/// `kubectl --as=<user> args…`.
async fn as_user(
    cluster: &Cluster,
    user: &str,
    args: &[&str],
) -> anyhow::Result<std::process::Output> {
    let mut all = vec![format!("--as={user}")];
    all.extend(args.iter().map(ToString::to_string));
    cluster.kubectl_output(&all, None).await
}

/// `kubectl --as=<user> apply -f -` of `object`.
async fn apply_as(
    cluster: &Cluster,
    user: &str,
    object: &Value,
) -> anyhow::Result<std::process::Output> {
    let args = [
        format!("--as={user}"),
        "apply".into(),
        "-f".into(),
        "-".into(),
    ];
    cluster
        .kubectl_output(&args, Some(&object.to_string()))
        .await
}

/// A NamespacedPolicy `name` in `ns` for Pods (CREATE and UPDATE), `spec` merged over that.
fn namespaced(name: &str, ns: &str, spec: Value) -> Value {
    let mut full = json!({
        "match": {"rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                             "apiVersions": ["v1"], "resources": ["pods"]}]},
    });
    merge(&mut full, spec);
    json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "NamespacedPolicy",
           "metadata": {"name": name, "namespace": ns}, "spec": full})
}

/// Waits until the NamespacedPolicy reports `Ready=True` for its current generation; returns its
/// status.
async fn await_namespaced_ready(cluster: &Cluster, ns: &str, name: &str) -> anyhow::Result<Value> {
    let what = format!("NamespacedPolicy {ns}/{name} Ready=True");
    await_condition(&what, WAIT, || async {
        let Some(p) = get_json(cluster, &["namespacedpolicy", name, "-n", ns]).await? else {
            return Ok(None);
        };
        let generation = &p["metadata"]["generation"];
        let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        Ok(
            (ready && &p["status"]["observedGeneration"] == generation)
                .then(|| p["status"].clone()),
        )
    })
    .await
}

/// A Pod `name` in `ns` with `labels`.
fn labelled_pod(name: &str, ns: &str, labels: Value) -> String {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "labels": labels},
           "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0",
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}]}})
    .to_string()
}

const TEAM_LABEL: &str = "every Pod of this team carries the label team";

/// Test 1: the tenant writes its Policy with `admin` only; it applies in its namespace alone;
/// reaching further is refused with the field; stopped, Gatehouse blocks only that namespace.
#[tokio::test]
async fn a_tenant_policy_applies_in_its_namespace_only() {
    scenario("gh-tenant", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let user = tenant_admin(scene).await?;
        let elsewhere = scene.namespace("gh-other").await?;
        let require_team = namespaced(
            "require-team",
            scene.ns(),
            json!({"enforcement": "Webhook", "failurePolicy": "Fail", "validate": [{
                "expression": "has(object.metadata.labels) && 'team' in object.metadata.labels",
                "message": TEAM_LABEL}]}),
        );
        let out = apply_as(cluster, &user, &require_team).await?;
        ensure!(out.status.success(), "the tenant's apply: {}", stderr(&out));
        let status = await_namespaced_ready(cluster, scene.ns(), "require-team").await?;
        ensure!(status["enforcement"] == "Webhook", "status: {status}");

        create_expecting(cluster, &labelled_pod("bare", scene.ns(), json!({})), Err(TEAM_LABEL)).await?;
        create_expecting(cluster, &labelled_pod("teamed", scene.ns(), json!({"team": "a"})), Ok(())).await?;
        create_expecting(cluster, &labelled_pod("bare", &elsewhere, json!({})), Ok(())).await?;

        // Reaching past the namespace is refused at apply, with the field.
        for (spec, field) in [
            (json!({"match": {"namespaceSelector": {}}}), "namespaceSelector"),
            (json!({"match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                         "resources": ["pods"], "scope": "Cluster"}]}}), "spec.match.rules"),
            (json!({"match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                         "resources": ["namespaces"]}]}}), "spec.match.rules[0].resources[0]"),
        ] {
            let mut wider = require_team.clone();
            wider["metadata"]["name"] = json!("wider");
            merge(&mut wider["spec"], spec);
            let out = apply_as(cluster, &user, &wider).await?;
            ensure!(!out.status.success() && stderr(&out).contains(field), "{field}: {}", stderr(&out));
        }
        // And RBAC holds the rest: no Policy, no NamespacedPolicy elsewhere.
        let mut other_ns = require_team.clone();
        other_ns["metadata"]["namespace"] = json!(elsewhere);
        let cluster_wide = policy_object("tenant-wide", require_team["spec"].clone());
        for object in [&other_ns, &cluster_wide] {
            let out = apply_as(cluster, &user, object).await?;
            ensure!(!out.status.success() && stderr(&out).contains("forbidden"), "{}", stderr(&out));
        }

        // Gatehouse stopped: the tenant's Fail Policy blocks its own namespace, nothing else.
        // First that it is down (the tenant's own namespace is refused), then that nothing
        // else is.
        // First that it is down (its own namespace is refused), then that nothing else is.
        scene.gh.stop().await?;
        let out = create_expecting(
            cluster,
            &labelled_pod("after", scene.ns(), json!({"team": "a"})),
            Err("failed calling webhook"),
        )
        .await?;
        ensure!(stderr(&out).contains("gatehouse.dev"), "{}", stderr(&out));
        let elsewhere_pod = labelled_pod("after", &elsewhere, json!({}));
        let admitted = cluster
            .kubectl_output(["create", "-f", "-"], Some(&elsewhere_pod))
            .await?;
        ensure!(admitted.status.success(), "elsewhere: {}", stderr(&admitted));
        Ok(())
    })
    .await;
}

/// Test 2: the tenant mutates first and the platform last; validations judge the final object.
/// In-process (one generated MutatingAdmissionPolicy, its mutations in that order) and on the
/// webhook.
#[tokio::test]
async fn the_platform_has_the_last_word_in_process() {
    scenario("gh-tenant-order", Options::service(), async |scene| {
        last_word(scene, "InProcess", "InProcess").await
    })
    .await;
}

#[tokio::test]
async fn the_platform_has_the_last_word_on_the_webhook() {
    scenario("gh-tenant-order", Options::service(), async |scene| {
        last_word(scene, "Webhook", "Webhook").await
    })
    .await;
}

async fn last_word(scene: &mut Scene, enforcement: &str, enforced: &str) -> anyhow::Result<()> {
    let cluster = scene.cluster;
    let ns = scene.ns();
    // The platform's Policies come first by priority, yet mutate after the tenant's. Mutations
    // and validations in Policies of their own: in-process, each is one admission policy.
    let (platform_tier, platform_rule) =
        (scene.policy("platform-tier"), scene.policy("platform-rule"));
    let at = |priority: i32, spec: Value| {
        let mut full = json!({"enforcement": enforcement, "priority": priority});
        merge(&mut full, spec);
        full
    };
    apply_ready(
        cluster,
        &policy(
            &platform_tier,
            ns,
            at(
                -1000,
                json!({
        "mutate": [{"merge": {"metadata": {"labels": {"tier": "platform"}}}, "overwrite": true}]}),
            ),
        ),
    )
    .await?;
    apply_ready(cluster, &policy(&platform_rule, ns, at(-1000, json!({
        "validate": [{"expression": "!has(object.metadata.labels) || !('forbidden' in object.metadata.labels)",
                      "message": "the platform forbids the label forbidden"}]}))))
    .await?;
    let tenant_tier = namespaced(
        "tenant-tier",
        ns,
        at(
            1000,
            json!({
        "mutate": [{"merge": {"metadata": {"labels": {"tier": "tenant", "owner-set": "yes"}}}, "overwrite": true}]}),
        ),
    );
    let tenant_rule = namespaced(
        "tenant-rule",
        ns,
        at(
            1000,
            json!({
        "validate": [{"expression": "has(object.metadata.labels) && 'owner' in object.metadata.labels",
                      "message": "the tenant requires the label owner"}]}),
        ),
    );
    for tenant in [&tenant_tier, &tenant_rule] {
        apply(cluster, tenant).await?;
        let name = tenant["metadata"]["name"].as_str().context("a name")?;
        await_namespaced_ready(cluster, ns, name).await?;
    }

    let refusals = [
        ("no-owner", json!({}), "the tenant requires the label owner"),
        (
            "forbidden",
            json!({"owner": "me", "forbidden": "x"}),
            "the platform forbids the label forbidden",
        ),
    ];
    for (name, labels, refusal) in refusals {
        create_expecting(cluster, &labelled_pod(name, ns, labels), Err(refusal)).await?;
    }
    create_expecting(
        cluster,
        &labelled_pod("stored", ns, json!({"owner": "me"})),
        Ok(()),
    )
    .await?;
    let stored = get_json(cluster, &["pod", "stored", "-n", ns])
        .await?
        .context("the Pod")?;
    let labels = &stored["metadata"]["labels"];
    ensure!(
        labels["tier"] == "platform",
        "the platform's value is stored: {labels}"
    );
    ensure!(
        labels["owner-set"] == "yes",
        "the tenant's own mutation ran: {labels}"
    );
    let mut placed = Vec::new();
    for name in ["tenant-tier", "tenant-rule"] {
        placed.push(get_json(cluster, &["namespacedpolicy", name, "-n", ns]).await?);
    }
    for name in [&platform_tier, &platform_rule] {
        placed.push(get_json(cluster, &["policy", name]).await?);
    }
    for p in placed {
        let p = p.context("a Policy")?;
        ensure!(
            p["status"]["enforcement"] == enforced,
            "{}: {}",
            p["metadata"]["name"],
            p["status"]
        );
    }
    Ok(())
}

/// Test 4: a Policy and a NamespacedPolicy of one name coexist, and the listings say where each
/// runs.
#[tokio::test]
async fn a_policy_and_a_namespaced_policy_share_a_name() {
    scenario("gh-tenant-names", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let name = scene.policy("same");
        let rule = json!({"validate": [{"expression": "true", "message": "never"}]});
        let mut in_process = rule.clone();
        in_process["enforcement"] = json!("Auto");
        apply_ready(cluster, &policy(&name, scene.ns(), in_process)).await?;
        let mut on_webhook = rule;
        on_webhook["enforcement"] = json!("Webhook");
        apply(cluster, &namespaced(&name, scene.ns(), on_webhook)).await?;
        await_namespaced_ready(cluster, scene.ns(), &name).await?;

        let policies = cluster.kubectl_ok(["get", "policies", &name], None).await?;
        let row = policies.lines().nth(1).context("no row")?;
        ensure!(
            row.starts_with(&name) && row.contains("InProcess"),
            "{policies}"
        );
        let namespaced = cluster
            .kubectl_ok(["get", "namespacedpolicies", "-A"], None)
            .await?;
        let row = namespaced
            .lines()
            .find(|l| l.starts_with(scene.ns()))
            .with_context(|| format!("no row of {}: {namespaced}", scene.ns()))?;
        ensure!(
            row.contains(&name) && row.contains("Webhook") && row.contains("True"),
            "{namespaced}"
        );
        ensure!(
            namespaced
                .lines()
                .next()
                .is_some_and(|h| h.starts_with("NAMESPACE")),
            "{namespaced}"
        );
        Ok(())
    })
    .await;
}

/// A tenant's companions: made in its namespace, counted in its NamespacedPolicy's status, held
/// by its finalizer and collected with it.
#[tokio::test]
async fn a_tenant_policy_keeps_its_companions_in_its_namespace() {
    scenario("gh-tenant-companions", Options::service(), async |scene| {
        let cluster = scene.cluster;
        let ns = scene.ns();
        let mirror = namespaced(
            "mirror",
            ns,
            json!({
                "match": {"rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                                     "apiVersions": ["v1"], "resources": ["configmaps"]}],
                          "objectSelector": {"matchLabels": {"mirror": "yes"}}},
                "effects": [{"object": {
                    "template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"},
                                 "data": {"mirrored": "yes"}},
                    "fields": [{"path": "metadata.name", "expression": "object.metadata.name + '-mirror'"}],
                }}],
            }),
        );
        apply(cluster, &mirror).await?;
        let source = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings", "namespace": ns, "labels": {"mirror": "yes"}}});
        apply(cluster, &source).await?;
        let what = "the companion, counted in the NamespacedPolicy's status";
        let held = await_condition(what, WAIT, || async {
            let companion = get_json(cluster, &["configmap", "settings-mirror", "-n", ns]).await?;
            let policy = get_json(cluster, &["namespacedpolicy", "mirror", "-n", ns]).await?;
            Ok(policy.filter(|p| {
                companion.is_some() && p["status"]["companions"]["inPlace"] == 1
            }))
        })
        .await?;
        let finalizers = held["metadata"]["finalizers"].to_string();
        ensure!(finalizers.contains("gatehouse.dev/companions"), "{finalizers}");

        cluster
            .kubectl_ok(["delete", "namespacedpolicy", "mirror", "-n", ns, "--wait=true"], None)
            .await?;
        await_condition("the companion collected", WAIT, || async {
            let companion = get_json(cluster, &["configmap", "settings-mirror", "-n", ns]).await?;
            Ok(companion.is_none().then_some(()))
        })
        .await?;
        Ok(())
    })
    .await;
}
