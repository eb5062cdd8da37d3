//! The shared test control plane and kubectl helpers.

use std::ffi::OsStr;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Once, OnceLock};

use anyhow::{Context, bail};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// Environment variable naming the kubeconfig of an already running test control plane.
pub const KUBECONFIG_ENV: &str = "GATEHOUSE_TEST_KUBECONFIG";

/// Lines of each control-plane log shown by [`dump_logs`] and the panic hook.
const LOG_TAIL_LINES: usize = 30;

/// A running control plane the tests talk to.
#[derive(Debug)]
pub struct Cluster {
    kubeconfig: PathBuf,
    repo_root: PathBuf,
    state_dir: PathBuf,
    bin_dir: PathBuf,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// The shared control plane; panics (failing the test) when it cannot be started.
///
/// The first call in a test process runs `tests/cluster/up` unless `GATEHOUSE_TEST_KUBECONFIG` is
/// set; later calls return the same cluster.
pub async fn cluster() -> &'static Cluster {
    match try_cluster() {
        Ok(cluster) => cluster,
        Err(err) => panic!("test control plane unavailable: {err:#}"),
    }
}

/// Like [`cluster()`], but returns the error instead of panicking. Blocks while the control plane
/// starts.
pub fn try_cluster() -> anyhow::Result<&'static Cluster> {
    let result = CLUSTER.get_or_init(|| {
        let cluster = Cluster::discover().map_err(|err| format!("{err:#}"))?;
        install_panic_hook();
        Ok(cluster)
    });
    result.as_ref().map_err(|err| anyhow::anyhow!("{err}"))
}

/// Held shared by every test, and exclusively by one that restarts or stops a control-plane
/// component ([`run_disruptive_test`]), so that no other test sees its outage. (tokio's RwLock
/// is not tied to a runtime, and queues new readers behind a waiting writer.)
static DISRUPTION: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Runs an e2e test body against the shared cluster and turns an error into a panic. The panic
/// hook installed by [`cluster()`] then prints the tails of the control-plane logs.
pub async fn run_test<F, Fut>(test: F)
where
    F: FnOnce(&'static Cluster) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let _shared = DISRUPTION.read().await;
    let cluster = cluster().await;
    if let Err(err) = test(cluster).await {
        panic!("{err:#}");
    }
}

/// Like [`run_test`], alone on the cluster: for tests that restart or stop the API server or
/// etcd ([`Cluster::restart`]).
pub async fn run_disruptive_test<F, Fut>(test: F)
where
    F: FnOnce(&'static Cluster) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let _alone = DISRUPTION.write().await;
    let cluster = cluster().await;
    if let Err(err) = test(cluster).await {
        panic!("{err:#}");
    }
}

/// Prints the tails of the control-plane logs to stderr (captured per test by libtest).
pub fn dump_logs() {
    if let Some(Ok(cluster)) = CLUSTER.get() {
        eprintln!("{}", cluster.log_tail(LOG_TAIL_LINES));
    }
}

fn install_panic_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            // libtest shows a test's output only when it fails, so printing here is cheap.
            dump_logs();
        }));
    });
}

fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

impl Cluster {
    fn discover() -> anyhow::Result<Self> {
        let repo_root = repo_root();
        let kubeconfig = match std::env::var_os(KUBECONFIG_ENV) {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => Self::start(&repo_root)?,
        };
        if !kubeconfig.is_file() {
            bail!("kubeconfig {} does not exist", kubeconfig.display());
        }
        let kubeconfig = kubeconfig.canonicalize().unwrap_or(kubeconfig);
        let state_dir = kubeconfig
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| repo_root.join("target/cluster"));
        let bin_dir = [state_dir.join("bin"), repo_root.join("target/cluster/bin")]
            .into_iter()
            .find(|dir| dir.join("kubectl").exists())
            .unwrap_or_else(|| state_dir.join("bin"));
        Ok(Self {
            kubeconfig,
            repo_root,
            state_dir,
            bin_dir,
        })
    }

    /// Runs `tests/cluster/up` and returns the kubeconfig path it prints last.
    fn start(repo_root: &Path) -> anyhow::Result<PathBuf> {
        let up = repo_root.join("tests/cluster/up");
        let output = Command::new(&up)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // Progress (a first build takes minutes) goes straight to the terminal.
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", up.display()))?;
        if !output.status.success() {
            bail!("{} failed with {}", up.display(), output.status);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let last = stdout.lines().rev().find(|line| !line.trim().is_empty());
        match last {
            Some(path) => Ok(PathBuf::from(path.trim())),
            None => bail!("{} printed no kubeconfig path", up.display()),
        }
    }

    /// Path of the admin kubeconfig.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Root of the Gatehouse repository.
    pub fn repo_root(&self) -> &Path {
        &self.repo_root
    }

    /// Directory holding the kubeconfig and the control-plane logs (`target/cluster`).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Directory of the control-plane binaries (`target/cluster/bin`).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// A new client for the admin identity. Create it inside the test's runtime; do not share it
    /// between tests.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::install_crypto_provider();
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .context("loading the test kubeconfig")?;
        kube::Client::try_from(config).context("building a kube client")
    }

    fn kubectl_path(&self) -> PathBuf {
        let bundled = self.bin_dir.join("kubectl");
        if bundled.exists() {
            bundled
        } else {
            PathBuf::from("kubectl")
        }
    }

    /// A `kubectl` command for the test cluster (`--kubeconfig` already set).
    pub fn kubectl<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(self.kubectl_path());
        cmd.arg("--kubeconfig").arg(&self.kubeconfig).args(args);
        cmd
    }

    /// Runs kubectl without blocking the runtime, feeding `stdin` if given, and returns its
    /// status and output whatever the exit status.
    pub async fn kubectl_output<I, S>(&self, args: I, stdin: Option<&str>) -> anyhow::Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        use tokio::io::AsyncWriteExt;

        let mut cmd = tokio::process::Command::from(self.kubectl(args));
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .await
                .context("writing kubectl's stdin")?;
        }
        child.wait_with_output().await.context("running kubectl")
    }

    /// Blocking variant of [`Cluster::kubectl_output`].
    pub fn kubectl_output_blocking<I, S>(
        &self,
        args: I,
        stdin: Option<&str>,
    ) -> anyhow::Result<Output>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        use std::io::Write;

        let mut cmd = self.kubectl(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("starting kubectl")?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())
                .context("writing kubectl's stdin")?;
        }
        child.wait_with_output().context("running kubectl")
    }

    /// Runs kubectl and returns its stdout; fails with its stderr when it exits non-zero.
    pub async fn kubectl_ok<I, S>(&self, args: I, stdin: Option<&str>) -> anyhow::Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let output = self.kubectl_output(&args, stdin).await?;
        if !output.status.success() {
            bail!(
                "kubectl {} failed ({}): {}",
                args.iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" "),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Restarts control-plane component `name` (`tests/cluster/restart`), after `pause` without
    /// it (an outage); returns once the API server is ready again. Only from
    /// [`run_disruptive_test`].
    pub async fn restart(&self, name: &str, pause: std::time::Duration) -> anyhow::Result<()> {
        let script = self.repo_root.join("tests/cluster/restart");
        let out = tokio::process::Command::new(&script)
            .arg(name)
            .arg(pause.as_secs().to_string())
            .output()
            .await
            .with_context(|| format!("running {}", script.display()))?;
        if !out.status.success() {
            bail!(
                "restarting {name} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// A kubeconfig for this cluster that authenticates as the ServiceAccount `namespace/name`
    /// with a TokenRequest token (an hour long), written to `file` in the state directory: the
    /// API server then enforces exactly that account's RBAC.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
        file: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = self
            .kubectl_ok(
                ["create", "token", name, "-n", namespace, "--duration=1h"],
                None,
            )
            .await?;
        let text = fs::read_to_string(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let mut config: serde_json::Value = serde_saphyr::from_str(&text)?;
        let users = config["users"]
            .as_array_mut()
            .context("the kubeconfig has no users")?;
        for user in users {
            user["user"] = serde_json::json!({"token": token.trim()});
        }
        let out = self.state_dir.join(file);
        fs::write(&out, serde_saphyr::to_string(&config)?)
            .with_context(|| format!("writing {}", out.display()))?;
        Ok(out)
    }

    /// kubectl with another kubeconfig (e.g. [`Cluster::service_account_kubeconfig`]'s).
    pub async fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Output> {
        // The later --kubeconfig wins over the admin one that kubectl() sets.
        let mut full = vec![OsStr::new("--kubeconfig"), kubeconfig.as_os_str()];
        full.extend(args.iter().map(OsStr::new));
        self.kubectl_output(full, None).await
    }

    /// A guard that deletes the named object with kubectl when dropped (best effort, without
    /// waiting), unless [`DeleteGuard::delete`] ran first.
    pub fn delete_on_drop(
        &self,
        resource: &str,
        name: &str,
        namespace: Option<&str>,
    ) -> DeleteGuard {
        let mut args = vec![
            "delete".to_owned(),
            resource.to_owned(),
            name.to_owned(),
            "--ignore-not-found".to_owned(),
        ];
        if let Some(ns) = namespace {
            args.push("-n".to_owned());
            args.push(ns.to_owned());
        }
        DeleteGuard {
            kubectl: self.kubectl_path(),
            kubeconfig: self.kubeconfig.clone(),
            args: Some(args),
        }
    }

    /// The last `lines` lines of each control-plane log (`*.log` in the state directory).
    pub fn log_tail(&self, lines: usize) -> String {
        let mut logs: Vec<PathBuf> = fs::read_dir(&self.state_dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|ext| ext == "log"))
                    .collect()
            })
            .unwrap_or_default();
        logs.sort();
        let mut out = String::new();
        for log in logs {
            let text = fs::read_to_string(&log).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            let tail = &all[all.len().saturating_sub(lines)..];
            out.push_str(&format!("----- last lines of {} -----\n", log.display()));
            for line in tail {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

/// Deletes an object with kubectl when dropped; see [`Cluster::delete_on_drop`].
#[derive(Debug)]
pub struct DeleteGuard {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    args: Option<Vec<String>>,
}

impl DeleteGuard {
    /// Deletes the object now and waits for kubectl; disarms the guard.
    pub async fn delete(mut self) -> anyhow::Result<()> {
        let Some(args) = self.args.take() else {
            return Ok(());
        };
        let output = tokio::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .await
            .context("running kubectl delete")?;
        if !output.status.success() {
            bail!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }

    /// Leaves the object in place.
    pub fn disarm(mut self) {
        self.args = None;
    }
}

impl Drop for DeleteGuard {
    fn drop(&mut self) {
        let Some(args) = self.args.take() else {
            return;
        };
        let child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(&args)
            .arg("--wait=false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut child) = child {
            // Reap it without blocking the (possibly async) caller.
            std::thread::spawn(move || {
                let _ = child.wait();
            });
        }
    }
}
