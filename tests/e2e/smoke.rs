//! Smoke tests of the test control plane itself: version, CRD installation, and webhook calls from
//! the API server to this machine (by URL and through an ExternalName Service).

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::{
    Cluster, TestNamespace, TestWebhook, await_condition, await_resource, deny, run_test,
};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::wait::conditions::is_crd_established;
use serde_json::{Value, json};

const DENY_MESSAGE: &str = "denied by smoke test";

/// The Kubernetes version the control plane is built from (`tests/cluster/k8s/go.mod`).
fn expected_kubernetes_version(cluster: &Cluster) -> anyhow::Result<String> {
    let go_mod = cluster.repo_root().join("tests/cluster/k8s/go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("reading {}", go_mod.display()))?;
    text.lines()
        .filter_map(|line| {
            let line = line.trim().trim_start_matches("require").trim();
            line.strip_prefix("k8s.io/kubernetes ")
        })
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_owned)
        .next()
        .with_context(|| format!("no k8s.io/kubernetes requirement in {}", go_mod.display()))
}

#[tokio::test]
async fn server_version_matches_build() {
    run_test(|cluster| async move {
        let expected = expected_kubernetes_version(cluster)?;
        ensure!(
            expected == "v1.37.2",
            "go.mod pins {expected}, the suite expects v1.37.2"
        );

        let info = cluster.client().await?.apiserver_version().await?;
        ensure!(
            info.git_version == expected,
            "API server reports {}, want {expected}",
            info.git_version
        );

        let out = cluster.kubectl_ok(["version", "-o", "json"], None).await?;
        let version: Value = serde_json::from_str(&out).context("kubectl version output")?;
        let server = version["serverVersion"]["gitVersion"].as_str();
        ensure!(
            server == Some(expected.as_str()),
            "kubectl reports serverVersion {server:?}, want {expected}"
        );
        let client = version["clientVersion"]["gitVersion"].as_str();
        ensure!(
            client == Some(expected.as_str()),
            "kubectl reports clientVersion {client:?}, want {expected}"
        );
        Ok(())
    })
    .await
}

/// The CRD manifests in `crds/` and the CRD names they define.
fn crd_manifests(cluster: &Cluster) -> anyhow::Result<(Vec<PathBuf>, Vec<String>)> {
    let dir = cluster.repo_root().join("crds");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            (name.ends_with(".yaml") || name.ends_with(".yml"))
                && !name.starts_with("kustomization.")
        })
        .collect();
    files.sort();
    let mut names = Vec::new();
    for file in &files {
        let text =
            fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let docs = serde_saphyr::from_multiple::<serde_json::Value>(&text)
            .with_context(|| format!("parsing {}", file.display()))?;
        for value in docs {
            if value["kind"].as_str() == Some("CustomResourceDefinition") {
                let name = value["metadata"]["name"]
                    .as_str()
                    .with_context(|| format!("CRD without a name in {}", file.display()))?;
                names.push(name.to_owned());
            }
        }
    }
    ensure!(
        !names.is_empty(),
        "no CustomResourceDefinitions found in {}",
        dir.display()
    );
    Ok((files, names))
}

#[tokio::test]
async fn crds_install_and_become_established() {
    run_test(|cluster| async move {
        let (files, names) = crd_manifests(cluster)?;
        let mut args = vec!["apply".to_owned(), "--server-side".to_owned()];
        for file in &files {
            args.push("-f".to_owned());
            args.push(file.display().to_string());
        }
        cluster.kubectl_ok(&args, None).await?;

        let crds: Api<CustomResourceDefinition> = Api::all(cluster.client().await?);
        for name in &names {
            await_resource(
                crds.clone(),
                name,
                is_crd_established(),
                Duration::from_secs(60),
            )
            .await
            .with_context(|| format!("CRD {name} to become Established"))?;
        }
        Ok(())
    })
    .await
}

/// Registers a validating webhook with `client_config` for CREATE of ConfigMaps in `ns` only,
/// then checks that creating a ConfigMap there is denied by `hook` and that `hook` saw the review.
/// The webhook configuration is removed afterwards, also on failure.
async fn expect_configmap_denied(
    cluster: &Cluster,
    ns: &TestNamespace,
    hook: &TestWebhook,
    client_config: Value,
) -> anyhow::Result<()> {
    let name = format!("gatehouse-e2e-{}", ns.name());
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": name, "labels": { "gatehouse.dev/e2e": "true" } },
        "webhooks": [{
            "name": "smoke.e2e.gatehouse.dev",
            "clientConfig": client_config,
            "rules": [{
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["configmaps"],
                "scope": "Namespaced",
            }],
            "namespaceSelector": { "matchExpressions": [{
                "key": "kubernetes.io/metadata.name",
                "operator": "In",
                "values": [ns.name()],
            }]},
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    }))?;
    Api::<ValidatingWebhookConfiguration>::all(cluster.client().await?)
        .create(&PostParams::default(), &config)
        .await
        .with_context(|| format!("creating ValidatingWebhookConfiguration {name}"))?;
    let guard = cluster.delete_on_drop("validatingwebhookconfiguration", &name, None);

    // The API server picks up new webhook configurations asynchronously: retry until denied.
    let stderr = await_condition(
        "the webhook to deny a ConfigMap create",
        Duration::from_secs(60),
        || async {
            let out = cluster
                .kubectl_output(["create", "configmap", "x", "-n", ns.name()], None)
                .await?;
            if out.status.success() {
                cluster
                    .kubectl_ok(["delete", "configmap", "x", "-n", ns.name()], None)
                    .await?;
                bail!("the ConfigMap was created: webhook not active yet");
            }
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            if stderr.contains(DENY_MESSAGE) {
                Ok(Some(stderr))
            } else {
                bail!(
                    "kubectl create failed without the webhook's message: {}",
                    stderr.trim()
                )
            }
        },
    )
    .await?;
    ensure!(
        stderr.contains("denied the request"),
        "unexpected denial: {stderr}"
    );

    let reviews = hook.reviews();
    let seen = reviews.iter().any(|review| {
        review["request"]["kind"]["kind"] == "ConfigMap"
            && review["request"]["namespace"] == ns.name()
            && review["request"]["operation"] == "CREATE"
    });
    ensure!(
        seen,
        "no ConfigMap CREATE review for {} among {} received: {reviews:#?}",
        ns.name(),
        reviews.len()
    );
    guard.delete().await
}

#[tokio::test]
async fn apiserver_calls_webhook_by_url() {
    run_test(|cluster| async move {
        let ns = TestNamespace::new(cluster, "smoke-url").await?;
        let hook = TestWebhook::start(&["127.0.0.1"], deny(DENY_MESSAGE))?;
        let client_config = json!({ "url": hook.url("/validate"), "caBundle": hook.ca_bundle() });
        expect_configmap_denied(cluster, &ns, &hook, client_config).await?;
        ns.cleanup().await
    })
    .await
}

#[tokio::test]
async fn apiserver_calls_webhook_through_externalname_service() {
    run_test(|cluster| async move {
        let ns = TestNamespace::new(cluster, "smoke-svc").await?;
        let service_name = "smoke-webhook";
        let dns = format!("{service_name}.{}.svc", ns.name());
        let hook = TestWebhook::start(&[dns.as_str()], deny(DENY_MESSAGE))?;

        // Without kube-proxy, the API server reaches a Service webhook only via ExternalName: it
        // dials <externalName>:<service.port> and verifies TLS for <name>.<namespace>.svc.
        let service: Service = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": service_name, "namespace": ns.name() },
            "spec": { "type": "ExternalName", "externalName": "localhost" },
        }))?;
        Api::<Service>::namespaced(cluster.client().await?, ns.name())
            .create(&PostParams::default(), &service)
            .await
            .context("creating the ExternalName Service")?;

        let client_config = json!({
            "service": {
                "namespace": ns.name(),
                "name": service_name,
                "port": hook.port(),
                "path": "/validate",
            },
            "caBundle": hook.ca_bundle(),
        });
        expect_configmap_denied(cluster, &ns, &hook, client_config).await?;
        ns.cleanup().await
    })
    .await
}
