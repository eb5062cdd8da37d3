//! Runs the real `gatehouse` binary against the test control plane, the way a user would, in
//! URL mode or in service mode (through an ExternalName Service → localhost).

use std::fs::File;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::{Cluster, await_condition};
use gatehouse_api::reports::{ReportApi, ReportKind};

/// Environment variable naming the `gatehouse` binary under test.
pub const BIN_ENV: &str = "GATEHOUSE_BIN";
/// Name of the ExternalName Service of service mode (the production default).
pub const SERVICE_NAME: &str = "gatehouse-webhook";

/// An ExternalName Service `name` in `namespace` through which the API server reaches a webhook
/// listening on localhost at `port`, as YAML. The API server's resolver dials
/// `<externalName>:<service port>` and verifies the certificate for `<name>.<namespace>.svc`; it
/// speaks HTTP/1.1 to a webhook behind a Service, as it does in a real cluster, where a loopback
/// URL would get HTTP/2.
pub fn localhost_service(name: &str, namespace: &str, port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {namespace}}}\nspec:\n  type: ExternalName\n  externalName: localhost\n  ports: [{{name: https, port: {port}}}]\n"
    )
}

/// How the API server reaches the Gatehouse under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Url,
    Service,
}

/// Options of one Gatehouse process.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: Mode,
    pub extra_args: Vec<String>,
    /// Reach the API server through this kubeconfig instead of the cluster's (e.g. a proxy).
    pub kubeconfig: Option<PathBuf>,
    /// `RUST_LOG` for the process; `None` leaves Gatehouse at its own default, as users run it.
    pub log_filter: Option<String>,
}

/// Tests log Gatehouse's decisions too: a failing scenario's log then shows what each member did.
const TEST_LOG_FILTER: &str = "info,gatehouse=debug";

impl Options {
    pub fn service() -> Self {
        Self {
            mode: Mode::Service,
            extra_args: vec![],
            kubeconfig: None,
            log_filter: Some(TEST_LOG_FILTER.into()),
        }
    }

    pub fn url() -> Self {
        Self {
            mode: Mode::Url,
            extra_args: vec![],
            kubeconfig: None,
            log_filter: Some(TEST_LOG_FILTER.into()),
        }
    }

    pub fn kubeconfig(mut self, path: PathBuf) -> Self {
        self.kubeconfig = Some(path);
        self
    }

    /// Gatehouse logs at its own default level, as users run it: what benchmarks measure (a
    /// debug line per member and request is most of the CPU at 256 Policies).
    pub fn default_logging(mut self) -> Self {
        self.log_filter = None;
        self
    }

    pub fn arg(mut self, flag: &str, value: &str) -> Self {
        self.extra_args.push(flag.to_string());
        self.extra_args.push(value.to_string());
        self
    }
}

/// Only one Gatehouse may own `*WebhookConfiguration/gatehouse` at a time: tests that run one
/// hold this lock. (tokio's Mutex is not tied to a runtime, so every test's runtime can use it.)
pub async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// A running `gatehouse run`.
pub struct Gatehouse {
    cluster: &'static Cluster,
    child: Option<Child>,
    pub namespace: String,
    pub port: u16,
    pub admin_port: u16,
    args: Vec<String>,
    kubeconfig: PathBuf,
    log_filter: Option<String>,
    pub log_path: PathBuf,
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn binary(cluster: &Cluster) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os(BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| cluster.repo_root().join("target/debug/gatehouse"));
    if !path.exists() {
        bail!(
            "gatehouse binary not found at {} (build it with `cargo build -p gatehouse` or set {BIN_ENV})",
            path.display()
        );
    }
    Ok(path)
}

/// Installs the CRDs from `crds/` (once per test process), as a user does before running the
/// operator: without them Gatehouse's Policy cache never syncs and it never becomes ready.
pub async fn ensure_crds(cluster: &Cluster) -> anyhow::Result<()> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| async {
            let dir = cluster.repo_root().join("crds");
            let dir = dir.to_string_lossy();
            let applied = cluster
                .kubectl_output(
                    ["apply", "--server-side", "--force-conflicts", "-k", &dir],
                    None,
                )
                .await?;
            let stderr = String::from_utf8_lossy(&applied.stderr);
            // The first thing a user sees of an install is this apply: it must not warn
            // (e.g. a schema format Kubernetes does not know).
            anyhow::ensure!(
                applied.status.success() && stderr.trim().is_empty(),
                "kubectl apply of crds/ ({}): {stderr}",
                applied.status
            );
            await_established(
                cluster,
                &[
                    "policies.gatehouse.dev",
                    "namespacedpolicies.gatehouse.dev",
                    "policyexceptions.gatehouse.dev",
                    "ippools.gatehouse.dev",
                    "ipallocations.gatehouse.dev",
                    "externalcalls.gatehouse.dev",
                ],
            )
            .await
        })
        .await?;
    Ok(())
}

/// Installs the PolicyReport CRDs from the opt-in component `config/reports` (once per test
/// process), as a user who wants the audit's reports does.
pub async fn ensure_report_crds(cluster: &Cluster) -> anyhow::Result<()> {
    static INSTALLED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_try_init(|| install_report_crds(cluster, ReportApi::Wgpolicyk8s))
        .await?;
    Ok(())
}

/// The CRD names of `api`'s two report kinds.
fn report_crd_names(api: ReportApi) -> Vec<String> {
    [ReportKind::Namespaced, ReportKind::Cluster]
        .iter()
        .map(|k| format!("{}.{}", api.plural(*k), api.group()))
        .collect()
}

/// Installs `api`'s report CRDs from their opt-in component (`config/reports`,
/// `config/openreports`) and waits until they are established.
pub async fn install_report_crds(cluster: &Cluster, api: ReportApi) -> anyhow::Result<()> {
    let component = match api {
        ReportApi::Wgpolicyk8s => "config/reports",
        ReportApi::Openreports => "config/openreports",
    };
    // A kustomize Component is no root of its own: its files, one by one.
    let dir = cluster.repo_root().join(component);
    let names = report_crd_names(api);
    for name in &names {
        let (plural, group) = name.split_once('.').unwrap_or((name, ""));
        let path = dir.join(format!("{group}_{plural}.yaml"));
        cluster
            .kubectl_ok(
                [
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    "-f",
                    &path.to_string_lossy(),
                ],
                None,
            )
            .await?;
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    await_established(cluster, &names).await
}

/// Deletes `api`'s report CRDs (and so every report in them) and waits until the API server
/// no longer serves the API.
pub async fn remove_report_crds(cluster: &Cluster, api: ReportApi) -> anyhow::Result<()> {
    let mut args = vec!["delete".to_string(), "crd".to_string()];
    args.extend(report_crd_names(api));
    args.extend(["--ignore-not-found".to_string(), "--wait=true".to_string()]);
    cluster.kubectl_ok(&args, None).await?;
    let path = format!("/apis/{}", api.api_version());
    await_condition(
        &format!("{} no longer served", api.api_version()),
        Duration::from_secs(60),
        || async {
            let out = cluster
                .kubectl_output(["get", "--raw", &path], None)
                .await?;
            Ok((!out.status.success()).then_some(()))
        },
    )
    .await
}

/// Waits until every CRD of `crds` is Established. Polled rather than `kubectl wait`: that
/// fails outright on a CRD whose status has no conditions yet, as one just applied may not.
async fn await_established(cluster: &Cluster, crds: &[&str]) -> anyhow::Result<()> {
    for crd in crds {
        await_condition(
            &format!("CRD {crd} established"),
            Duration::from_secs(60),
            || async {
                let established = cluster
                    .kubectl_ok(
                        [
                            "get",
                            "crd",
                            crd,
                            "-o",
                            "jsonpath={.status.conditions[?(@.type==\"Established\")].status}",
                        ],
                        None,
                    )
                    .await?;
                Ok((established.trim() == "True").then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

impl Gatehouse {
    /// Starts Gatehouse with its home in `namespace` and waits until `/readyz` says ready.
    pub async fn start(
        cluster: &'static Cluster,
        namespace: &str,
        options: Options,
    ) -> anyhow::Result<Self> {
        ensure_crds(cluster).await?;
        let port = free_port()?;
        let admin_port = free_port()?;
        let mut args = vec![
            "run".to_string(),
            "--namespace".into(),
            namespace.into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin_port}"),
        ];
        match options.mode {
            Mode::Url => {
                args.push("--webhook-url".into());
                args.push(format!("https://127.0.0.1:{port}"));
            }
            Mode::Service => {
                // The webhook port and the Service port are the same number (see
                // `localhost_service`).
                cluster
                    .kubectl_ok(
                        ["apply", "-f", "-"],
                        Some(&localhost_service(SERVICE_NAME, namespace, port)),
                    )
                    .await?;
                args.extend([
                    "--service-name".into(),
                    SERVICE_NAME.into(),
                    "--service-port".into(),
                    port.to_string(),
                ]);
            }
        }
        args.extend(options.extra_args);
        let log_path = cluster
            .state_dir()
            .join(format!("gatehouse-{namespace}-{port}.log"));
        let mut gatehouse = Self {
            cluster,
            child: None,
            namespace: namespace.to_string(),
            port,
            admin_port,
            args,
            kubeconfig: options
                .kubeconfig
                .unwrap_or_else(|| cluster.kubeconfig().to_path_buf()),
            log_filter: options.log_filter,
            log_path,
        };
        gatehouse.spawn().await?;
        Ok(gatehouse)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .with_context(|| format!("opening {}", self.log_path.display()))?;
        let mut command = Command::new(binary(self.cluster)?);
        match &self.log_filter {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let child = command
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting gatehouse")?;
        self.child = Some(child);
        let admin_port = self.admin_port;
        let ready = await_condition(
            "gatehouse /readyz",
            Duration::from_secs(60),
            || async move { Ok((http_get(admin_port, "/readyz").await?.0 == 200).then_some(())) },
        )
        .await;
        if let Err(e) = ready {
            bail!("{e:#}\n--- gatehouse log ---\n{}", self.log());
        }
        Ok(())
    }

    /// SIGTERM, then waits for the exit status (graceful shutdown).
    pub async fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else {
            bail!("gatehouse is not running");
        };
        if let Some(pid) = child.id() {
            let status = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .context("sending SIGTERM")?;
            if !status.success() {
                bail!("kill -TERM {pid} failed");
            }
        }
        match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                let _ = child.kill().await;
                bail!(
                    "gatehouse did not exit within 30s of SIGTERM\n{}",
                    self.log()
                )
            }
        }
    }

    /// SIGKILL: the crash case.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill().await.context("killing gatehouse")?;
        }
        Ok(())
    }

    /// Starts the same command again (same ports, same namespace).
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            self.kill().await?;
        }
        self.spawn().await
    }

    /// The control plane this Gatehouse runs against.
    pub fn cluster(&self) -> &'static Cluster {
        self.cluster
    }

    /// PID of the running process.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// Resident set size in KiB (VmRSS) of the running process.
    pub fn rss_kib(&self) -> Option<u64> {
        self.proc_kib("status", "VmRSS:")
    }

    /// Of [`Self::rss_kib`], what the allocator has given back lazily (`MADV_FREE`): counted
    /// until the kernel needs the pages, which it then takes without asking.
    pub fn lazy_free_kib(&self) -> Option<u64> {
        self.proc_kib("smaps_rollup", "LazyFree:")
    }

    /// The KiB figure of the line starting with `field` in `/proc/<pid>/<file>`.
    fn proc_kib(&self, file: &str, field: &str) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/{file}", self.pid()?)).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        let (code, body) = http_get(self.admin_port, "/metrics").await?;
        if code != 200 {
            bail!("/metrics answered {code}");
        }
        Ok(body)
    }

    /// Sum of a counter (all label sets whose line contains `filter`).
    pub async fn metric_sum(&self, name: &str, filter: &str) -> anyhow::Result<f64> {
        let text = self.metrics().await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// Everything Gatehouse logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Stops Gatehouse and removes what it owns cluster-wide, so no entry outlives its server.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        let stopped = self.stop().await;
        remove_configurations(self.cluster).await?;
        let status = stopped?;
        if !status.success() {
            bail!("gatehouse exited with {status}\n{}", self.log());
        }
        Ok(())
    }
}

/// Deletes both webhook configurations named `gatehouse`.
pub async fn remove_configurations(cluster: &Cluster) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(
            [
                "delete",
                "mutatingwebhookconfiguration/gatehouse",
                "validatingwebhookconfiguration/gatehouse",
                "--ignore-not-found",
            ],
            None,
        )
        .await?;
    // The admission policies Gatehouse generated, and its probe.
    cluster
        .kubectl_ok(
            [
                "delete",
                "validatingadmissionpolicybinding,validatingadmissionpolicy",
                "-l",
                "app.kubernetes.io/managed-by=gatehouse",
                "--ignore-not-found",
            ],
            None,
        )
        .await?;
    Ok(())
}

/// Removes the pool with whatever still holds it (the test's Gatehouse may be gone already).
pub async fn remove_pool(cluster: &Cluster, pool: &str, policy: &str) -> anyhow::Result<()> {
    cluster
        .kubectl_ok(
            [
                "delete",
                "policy",
                policy,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(
            [
                "delete",
                "ipallocations",
                "-l",
                &format!("gatehouse.dev/pool={pool}"),
                "--wait=false",
            ],
            None,
        )
        .await?;
    cluster
        .kubectl_ok(
            [
                "patch",
                "ippool",
                pool,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
            None,
        )
        .await
        .ok();
    cluster
        .kubectl_ok(
            [
                "delete",
                "ippool",
                pool,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        )
        .await?;
    Ok(())
}

impl Drop for Gatehouse {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
            // A test that failed half-way must not leave entries whose server is gone.
            let _ = self.cluster.kubectl_output_blocking(
                [
                    "delete",
                    "mutatingwebhookconfiguration/gatehouse",
                    "validatingwebhookconfiguration/gatehouse",
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            );
        }
    }
}

/// A minimal HTTP/1.0 GET against the admin port: status code and body.
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await?;
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no status line")?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((code, body.to_string()))
}
