//! The Helm chart (`charts/gatehouse`) against the kustomize installation it must not drift from:
//! `helm lint`, `helm template` compared object by object with `kubectl kustomize`, the values
//! reaching the objects, and `values.schema.json` refusing wrong types by the field's name.
//! Rendering needs no API server; helm and kubectl are the ones `tests/cluster/up` links (built
//! from their Go modules by `tests/cluster/build --helm`). Installing the chart on a node is
//! tests/node's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;

use anyhow::{Context, bail, ensure};
use gatehouse_e2e::{Cluster, run_test};
use serde_json::{Value, json};

/// Labels Helm's release bookkeeping adds; everything else must be the kustomize objects'.
const RELEASE_LABELS: [&str; 4] = [
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
];
const NAMESPACE: &str = "gatehouse-system";

/// Rendered objects by `Kind namespace/name`.
type Objects = BTreeMap<String, Value>;

fn chart(cluster: &Cluster) -> String {
    path(cluster.repo_root(), "charts/gatehouse")
}

fn path(root: &Path, relative: &str) -> String {
    root.join(relative).to_string_lossy().into_owned()
}

fn tool(cluster: &Cluster, name: &str) -> anyhow::Result<PathBuf> {
    let path = cluster.bin_dir().join(name);
    ensure!(
        path.exists(),
        "{} missing: tests/cluster/up links it (tests/cluster/build --helm)",
        path.display()
    );
    Ok(path)
}

async fn run(cluster: &Cluster, name: &str, args: &[&str]) -> anyhow::Result<Output> {
    tokio::process::Command::new(tool(cluster, name)?)
        .args(args)
        .current_dir(cluster.repo_root())
        .output()
        .await
        .with_context(|| format!("running {name} {}", args.join(" ")))
}

async fn run_ok(cluster: &Cluster, name: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = run(cluster, name, args).await?;
    ensure!(
        out.status.success(),
        "{name} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The objects of a multi-document YAML stream, keyed by kind, namespace and name.
fn objects(yaml: &str) -> anyhow::Result<Objects> {
    let mut out = Objects::new();
    for doc in serde_saphyr::from_multiple::<Value>(yaml).context("parsing rendered YAML")? {
        if doc.is_null() {
            continue;
        }
        let key = format!(
            "{} {}/{}",
            doc["kind"].as_str().unwrap_or_default(),
            doc["metadata"]["namespace"].as_str().unwrap_or_default(),
            doc["metadata"]["name"].as_str().unwrap_or_default()
        );
        ensure!(
            out.insert(key.clone(), doc).is_none(),
            "{key} rendered twice"
        );
    }
    Ok(out)
}

/// `helm template` of the chart as release `gatehouse` in gatehouse-system, with `values`
/// (`--set` pairs) and any other flags.
async fn template(cluster: &Cluster, values: &[&str], flags: &[&str]) -> anyhow::Result<Objects> {
    let chart = chart(cluster);
    let mut args = vec!["template", "gatehouse", chart.as_str(), "-n", NAMESPACE];
    for v in values {
        args.extend(["--set", v]);
    }
    args.extend_from_slice(flags);
    objects(&run_ok(cluster, "helm", &args).await?)
}

/// `kubectl kustomize` of `dir`, without what the chart leaves to Helm: the Namespace
/// (`--create-namespace`) and the CRDs (the chart's crds/, compared on their own).
async fn kustomize(cluster: &Cluster, dir: &str) -> anyhow::Result<Objects> {
    let mut objects = objects(&run_ok(cluster, "kubectl", &["kustomize", dir]).await?)?;
    objects.retain(|_, o| o["kind"] != "Namespace" && o["kind"] != "CustomResourceDefinition");
    Ok(objects)
}

/// The object without Helm's release labels (on it and on its Pod template).
fn without_release_labels(mut object: Value) -> Value {
    for at in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(map) = object.pointer_mut(at).and_then(Value::as_object_mut) {
            for label in RELEASE_LABELS {
                map.remove(label);
            }
        }
    }
    object
}

/// The two sets of objects are the same, up to Helm's release labels; a difference names the
/// object and shows both sides.
fn ensure_same(helm: Objects, kustomize: Objects, what: &str) -> anyhow::Result<()> {
    let helm: Objects = helm
        .into_iter()
        .map(|(k, o)| (k, without_release_labels(o)))
        .collect();
    let only_helm: Vec<&String> = helm
        .keys()
        .filter(|k| !kustomize.contains_key(*k))
        .collect();
    let only_kustomize: Vec<&String> = kustomize
        .keys()
        .filter(|k| !helm.contains_key(*k))
        .collect();
    ensure!(
        only_helm.is_empty() && only_kustomize.is_empty(),
        "{what}: objects only the chart renders: {only_helm:?}; only kustomize: {only_kustomize:?}"
    );
    for (key, object) in &helm {
        if object != &kustomize[key] {
            bail!(
                "{what}: {key} differs\nhelm:\n{}\nkustomize:\n{}",
                serde_json::to_string_pretty(object)?,
                serde_json::to_string_pretty(&kustomize[key])?
            );
        }
    }
    Ok(())
}

/// The value following `flag` in the container's args.
fn flag<'a>(deployment: &'a Value, flag: &str) -> Option<&'a str> {
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array()?;
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1)?.as_str()
}

#[tokio::test]
async fn helm_lint_is_clean() {
    run_test(|cluster| async move {
        let chart = chart(cluster);
        for values in [
            vec![],
            vec!["--set", "cni.enabled=true,samples.enabled=true"],
            vec![
                "--set",
                "metrics.serviceMonitor.enabled=true,podDisruptionBudget.enabled=false",
            ],
        ] {
            let mut args = vec!["lint", "--strict", chart.as_str()];
            args.extend_from_slice(&values);
            let out = run(cluster, "helm", &args).await?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            ensure!(
                out.status.success() && !text.contains("[WARNING]") && !text.contains("[ERROR]"),
                "helm lint --strict {values:?}: {text}"
            );
        }
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn the_chart_renders_what_kustomize_installs() {
    run_test(|cluster| async move {
        let root = cluster.repo_root();
        // Default values: config/default's Deployment, RBAC, Service and PodDisruptionBudget.
        let helm = template(cluster, &[], &[]).await?;
        ensure!(
            helm.contains_key(&format!("Deployment {NAMESPACE}/gatehouse")),
            "the chart rendered no Deployment: {:?}",
            helm.keys()
        );
        ensure_same(
            helm.clone(),
            kustomize(cluster, &path(root, "config/default")).await?,
            "default values against config/default",
        )?;

        // cni.enabled: config/default with the config/cni component, as an overlay adds it.
        let overlay = root.join("target/chart-test/cni");
        std::fs::create_dir_all(&overlay)?;
        std::fs::write(
            overlay.join("kustomization.yaml"),
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [../../../config/default]\ncomponents: [../../../config/cni]\n",
        )?;
        ensure_same(
            template(cluster, &["cni.enabled=true"], &[]).await?,
            kustomize(cluster, &overlay.to_string_lossy()).await?,
            "cni.enabled=true against config/default + config/cni",
        )?;

        // samples.enabled: config/samples, besides the installation.
        let mut samples = template(cluster, &["samples.enabled=true"], &[]).await?;
        samples.retain(|key, _| !helm.contains_key(key));
        ensure_same(
            samples,
            kustomize(cluster, &path(root, "config/samples")).await?,
            "samples.enabled=true against config/samples",
        )?;

        // The chart's appVersion is Gatehouse's version.
        let chart_yaml: Value = serde_saphyr::from_str(&std::fs::read_to_string(
            root.join("charts/gatehouse/Chart.yaml"),
        )?)?;
        ensure!(
            chart_yaml["appVersion"] == env!("CARGO_PKG_VERSION"),
            "Chart.yaml's appVersion {} is not the workspace version {}",
            chart_yaml["appVersion"],
            env!("CARGO_PKG_VERSION")
        );

        // The CRDs Helm installs are the generated ones in crds/ (read as written: kustomize
        // would print 1.0 as 1).
        let crds = objects(&run_ok(cluster, "helm", &["show", "crds", &chart(cluster)]).await?)?;
        let mut generated = Objects::new();
        for entry in std::fs::read_dir(root.join("crds"))? {
            let file = entry?.path();
            if file.file_name().is_some_and(|n| n != "kustomization.yaml") {
                generated.extend(objects(&std::fs::read_to_string(&file)?)?);
            }
        }
        ensure!(crds.len() == 6, "helm show crds: {:?}", crds.keys());
        ensure!(crds == generated, "the chart's CRDs differ from crds/");
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn values_reach_the_objects() {
    run_test(|cluster| async move {
        let values = [
            "replicaCount=3",
            "image.repository=registry.example/platform/gatehouse",
            "image.tag=0.1.0",
            "image.pullPolicy=Always",
            "resources.requests.cpu=250m",
            "resources.limits.memory=512Mi",
            "podDisruptionBudget.minAvailable=50%",
            "excludeNamespaces={team-a,kube-system}",
            "leaseDuration=30s",
            "certificates.caValidity=2y",
            "certificates.certValidity=7d",
            "logFormat=json",
            "logLevel=debug",
            "audit.interval=6h,audit.qps=2.5,audit.pageSize=200,audit.maxResults=50,audit.reportApi=openreports",
            "nodeSelector.kubernetes\\.io/os=linux",
            "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "priorityClassName=system-cluster-critical",
            "imagePullSecrets[0].name=regcred",
            "cni.enabled=true",
            "cni.binDir=/var/lib/cni/bin",
        ];
        let objects = template(cluster, &values, &["-n", "platform"]).await?;
        let d = objects
            .get("Deployment platform/gatehouse")
            .context("no Deployment in the release namespace")?;
        let pod = &d["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        ensure!(d["spec"]["replicas"] == 3, "replicas: {}", d["spec"]["replicas"]);
        ensure!(container["image"] == "registry.example/platform/gatehouse:0.1.0", "image: {}", container["image"]);
        ensure!(container["imagePullPolicy"] == "Always", "pullPolicy: {}", container["imagePullPolicy"]);
        ensure!(
            container["resources"] == json!({"requests": {"cpu": "250m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}),
            "resources: {}",
            container["resources"]
        );
        for (name, want) in [
            ("--exclude-namespaces", "kube-system,kube-node-lease,team-a"),
            ("--lease-duration", "30s"),
            ("--ca-validity", "2y"),
            ("--cert-validity", "7d"),
            ("--log-format", "json"),
            ("--audit-interval", "6h"),
            ("--audit-qps", "2.5"),
            ("--audit-page-size", "200"),
            ("--audit-max-results", "50"),
            ("--report-api", "openreports"),
        ] {
            ensure!(flag(d, name) == Some(want), "{name}: {:?}, want {want}", flag(d, name));
        }
        ensure!(
            container["env"].as_array().is_some_and(|env| env.iter().any(|e| e == &json!({"name": "RUST_LOG", "value": "debug"}))),
            "RUST_LOG: {}",
            container["env"]
        );
        ensure!(pod["nodeSelector"] == json!({"kubernetes.io/os": "linux"}), "nodeSelector: {}", pod["nodeSelector"]);
        ensure!(pod["tolerations"] == json!([{"key": "dedicated", "operator": "Exists"}]), "tolerations: {}", pod["tolerations"]);
        ensure!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
                == json!({"key": "pool", "operator": "Exists"}),
            "affinity: {}",
            pod["affinity"]
        );
        ensure!(pod["priorityClassName"] == "system-cluster-critical", "priorityClassName: {}", pod["priorityClassName"]);
        ensure!(pod["imagePullSecrets"] == json!([{"name": "regcred"}]), "imagePullSecrets: {}", pod["imagePullSecrets"]);
        let pdb = objects.get("PodDisruptionBudget platform/gatehouse").context("no PodDisruptionBudget")?;
        ensure!(pdb["spec"]["minAvailable"] == "50%", "minAvailable: {}", pdb["spec"]["minAvailable"]);
        let binding = objects.get("ClusterRoleBinding /gatehouse").context("no ClusterRoleBinding")?;
        ensure!(binding["subjects"][0]["namespace"] == "platform", "the binding's subject: {}", binding["subjects"]);
        let cni = objects.get("DaemonSet kube-system/gatehouse-cni").context("no CNI DaemonSet")?;
        ensure!(
            cni["spec"]["template"]["spec"]["volumes"][0]["hostPath"]["path"] == "/var/lib/cni/bin",
            "binDir: {}",
            cni["spec"]["template"]["spec"]["volumes"]
        );
        ensure!(
            cni["spec"]["template"]["spec"]["initContainers"][0]["image"] == "registry.example/platform/gatehouse:0.1.0",
            "the DaemonSet runs another image"
        );
        ensure!(
            cni["spec"]["template"]["spec"]["imagePullSecrets"] == json!([{"name": "regcred"}]),
            "the DaemonSet pulls without the secrets"
        );

        // Turned off: no PodDisruptionBudget, no DaemonSet (cni.enabled defaults to false).
        let off = template(cluster, &["podDisruptionBudget.enabled=false"], &[]).await?;
        ensure!(
            !off.keys().any(|k| k.starts_with("PodDisruptionBudget ") || k.starts_with("DaemonSet ")),
            "rendered with podDisruptionBudget.enabled=false: {:?}",
            off.keys()
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_service_monitor_only_where_the_crd_is_served() {
    run_test(|cluster| async move {
        let enabled = [
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.interval=30s",
            "metrics.serviceMonitor.labels.release=prometheus",
        ];
        let without = template(cluster, &enabled, &[]).await?;
        ensure!(
            !without
                .keys()
                .any(|k| k.starts_with("ServiceMonitor ") || k.contains("gatehouse-metrics")),
            "a ServiceMonitor where the API server serves none: {:?}",
            without.keys()
        );
        let with = template(
            cluster,
            &enabled,
            &["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"],
        )
        .await?;
        let monitor = with
            .get(&format!("ServiceMonitor {NAMESPACE}/gatehouse"))
            .context("no ServiceMonitor")?;
        let service = with
            .get(&format!("Service {NAMESPACE}/gatehouse-metrics"))
            .context("no metrics Service")?;
        ensure!(
            monitor["metadata"]["labels"]["release"] == "prometheus",
            "labels: {}",
            monitor["metadata"]["labels"]
        );
        ensure!(
            monitor["spec"]["endpoints"]
                == json!([{"port": "metrics", "path": "/metrics", "interval": "30s"}]),
            "endpoints: {}",
            monitor["spec"]["endpoints"]
        );
        // The monitor selects the metrics Service, whose port reaches the Pods' admin port.
        for (label, value) in monitor["spec"]["selector"]["matchLabels"]
            .as_object()
            .context("no selector")?
        {
            ensure!(
                &service["metadata"]["labels"][label] == value,
                "the ServiceMonitor does not select the metrics Service ({label})"
            );
        }
        ensure!(
            service["spec"]["ports"]
                == json!([{"name": "metrics", "port": 8080, "targetPort": "admin"}]),
            "ports: {}",
            service["spec"]["ports"]
        );
        let disabled = template(
            cluster,
            &[],
            &["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"],
        )
        .await?;
        ensure!(
            !disabled.keys().any(|k| k.starts_with("ServiceMonitor ")),
            "a ServiceMonitor though disabled"
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn a_wrong_value_is_refused_by_the_schema_with_the_field_name() {
    run_test(|cluster| async move {
        let chart = chart(cluster);
        for (value, field) in [
            ("replicaCount=two", "/replicaCount"),
            (
                "podDisruptionBudget.enabled=sometimes",
                "/podDisruptionBudget/enabled",
            ),
            ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
            ("leaseDuration=soon", "/leaseDuration"),
            ("certificates.certValidity=30", "/certificates/certValidity"),
            ("logFormat=xml", "/logFormat"),
            ("excludeNamespaces={Team_A}", "/excludeNamespaces/0"),
            ("cni.binDir=opt/cni/bin", "/cni/binDir"),
            (
                "metrics.serviceMonitor.enabled=1",
                "/metrics/serviceMonitor/enabled",
            ),
            ("leaseDuration=0s", "/leaseDuration"),
            ("audit.qps=0", "/audit/qps"),
            ("audit.pageSize=0", "/audit/pageSize"),
            ("audit.reportApi=policyreports", "/audit/reportApi"),
            ("leaseDuration=null", "leaseDuration"),
            ("replicas=3", "'replicas'"),
        ] {
            let out = run(
                cluster,
                "helm",
                &["template", "gatehouse", &chart, "--set", value],
            )
            .await?;
            let err = String::from_utf8_lossy(&out.stderr);
            ensure!(
                !out.status.success() && err.contains(field),
                "--set {value} was not refused naming {field}: {}",
                err.trim()
            );
        }
        Ok(())
    })
    .await;
}
