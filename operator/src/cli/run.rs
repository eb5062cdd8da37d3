//! `gatehouse run`: the operator process. One shutdown signal fans out to every task; the
//! webhook server stops accepting and lets in-flight reviews finish before the process exits.
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, bail};
use kube::runtime::events::{Recorder, Reporter};
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tracing::{error, info};

use crate::audit::report_api::ReportApiChoice;
use crate::audit::{self, AuditConfig, AuditContext, AuditMetrics};
use crate::controller::wiring::{CONFIGURATION_NAME, Endpoint, Wiring};
use crate::controller::{self, ControllerContext};
use crate::effects::calls::{self, CallsContext, CallsMetrics};
use crate::effects::companions::{self, BlockedPolicies, CompanionsContext, CompanionsMetrics};
use crate::effects::ipam::{self, IpamConfig, IpamContext, IpamMetrics};
use crate::runtime::admin::{self, AdminState, Readiness};
use crate::runtime::error_chain::chain;
use crate::runtime::lease::{self, Leadership, LeaseConfig};
use crate::runtime::reconcile::ReconcileMetrics;
use crate::runtime::serve;
use crate::runtime::telemetry;
use crate::tls::{self, CertResolver, Coordination, San, TlsConfig, TlsManager, TlsMetrics};
use crate::webhook::{self, AdmissionMetrics, PolicyStore, WebhookState};

/// Flags of `gatehouse run`; every flag is also an environment variable.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Address of the TLS webhook server.
    #[arg(long, env = "GATEHOUSE_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// Address of the plain-HTTP admin server (/livez, /readyz, /metrics).
    #[arg(long, env = "GATEHOUSE_ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,

    /// Namespace of the TLS Secret, Events and Lease; always excluded from every webhook.
    #[arg(long, env = "POD_NAMESPACE", default_value = "gatehouse-system")]
    pub namespace: String,

    /// Service mode: name of the Service in front of the webhook server.
    #[arg(
        long,
        env = "GATEHOUSE_SERVICE_NAME",
        default_value = "gatehouse-webhook"
    )]
    pub service_name: String,

    /// Service mode: port of that Service.
    #[arg(long, env = "GATEHOUSE_SERVICE_PORT", default_value_t = 443)]
    pub service_port: u16,

    /// URL mode (out of cluster): base URL the API server calls, e.g. https://127.0.0.1:9443.
    /// Overrides service mode.
    #[arg(long, env = "GATEHOUSE_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Namespaces no webhook ever touches, in addition to --namespace.
    #[arg(
        long,
        env = "GATEHOUSE_EXCLUDE_NAMESPACES",
        value_delimiter = ',',
        default_value = "kube-system,kube-node-lease"
    )]
    pub exclude_namespaces: Vec<String>,

    /// Namespaces whose PolicyExceptions are honoured (default: --namespace, Gatehouse's own).
    /// An exception anywhere else changes nothing; its Honoured condition says so.
    #[arg(long, env = "GATEHOUSE_EXCEPTION_NAMESPACES", value_delimiter = ',')]
    pub exception_namespaces: Vec<String>,

    /// Lifetime of the generated CA (e.g. 1y, 90d, 30s).
    #[arg(long, env = "GATEHOUSE_CA_VALIDITY", default_value = "1y", value_parser = super::duration::parse)]
    pub ca_validity: Duration,

    /// Lifetime of the serving certificate (e.g. 30d, 10s).
    #[arg(long, env = "GATEHOUSE_CERT_VALIDITY", default_value = "30d", value_parser = super::duration::parse)]
    pub cert_validity: Duration,

    /// How long a new CA bundle is given to reach the API server before certificates signed by
    /// the new CA are served.
    #[arg(long, env = "GATEHOUSE_BUNDLE_PROPAGATION", default_value = "10s", value_parser = super::duration::parse)]
    pub bundle_propagation: Duration,

    /// On SIGTERM, how long to keep serving with /readyz failing before the webhook port stops
    /// accepting: the time the Service's endpoints need to drop this replica, so the API server
    /// never dials a closed port (in a Deployment: a few seconds).
    #[arg(long, env = "GATEHOUSE_SHUTDOWN_DELAY", default_value = "0s", value_parser = super::duration::parse_or_zero)]
    pub shutdown_delay: Duration,

    /// On shutdown, how long in-flight reviews may take to finish.
    #[arg(long, env = "GATEHOUSE_DRAIN_TIMEOUT", default_value = "20s", value_parser = super::duration::parse)]
    pub drain_timeout: Duration,

    /// Identity in the leader-election Lease (default: the pod name, else host name and PID).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// A leader that has not renewed the Lease for this long is replaced.
    #[arg(long, env = "GATEHOUSE_LEASE_DURATION", default_value = "15s", value_parser = super::duration::parse)]
    pub lease_duration: Duration,

    /// How often the effects loop looks for IP allocations whose owner Pod is gone.
    #[arg(long, env = "GATEHOUSE_GC_INTERVAL", default_value = "60s", value_parser = super::duration::parse)]
    pub gc_interval: Duration,

    /// How old an orphaned IP allocation must be before it is collected.
    #[arg(long, env = "GATEHOUSE_GC_GRACE", default_value = "30s", value_parser = super::duration::parse)]
    pub gc_grace: Duration,

    /// Calls of call effects in flight to one receiver at most.
    #[arg(long, env = "GATEHOUSE_CALLS_PER_RECEIVER", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub calls_per_receiver: u16,

    /// How many generated admission policies (a ValidatingAdmissionPolicy per validating
    /// Policy, a MutatingAdmissionPolicy per group of mutating ones) `enforcement: Auto` keeps
    /// in-process, at most. The API server matches every admission policy against every
    /// namespaced request, selected or not; past this number, the later ones in (priority,
    /// name) order run on the webhook, with the reason in their status.
    #[arg(long, env = "GATEHOUSE_MAX_ADMISSION_POLICIES", default_value_t = crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES)]
    pub max_admission_policies: usize,

    /// Time between audit passes over the stored objects the validating Policies match (a
    /// pass also runs soon after a Policy's generation changes).
    #[arg(long, env = "GATEHOUSE_AUDIT_INTERVAL", default_value = "1h", value_parser = super::duration::parse)]
    pub audit_interval: Duration,

    /// The audit's calls per second (LISTs and report writes), at most: it must never crowd
    /// admission out.
    #[arg(long, env = "GATEHOUSE_AUDIT_QPS", default_value_t = 5.0)]
    pub audit_qps: f64,

    /// Objects per audit LIST page: the audit holds one page at a time.
    #[arg(long, env = "GATEHOUSE_AUDIT_PAGE_SIZE", default_value_t = 500)]
    pub audit_page_size: u32,

    /// Results listed per report, at most (the summary counts them all, and a report listing
    /// fewer says so in its gatehouse.dev/results-truncated annotation). Every pass applies each
    /// report whole: the API server's cost grows with this number.
    #[arg(long, env = "GATEHOUSE_AUDIT_MAX_RESULTS", default_value_t = 100)]
    pub audit_max_results: usize,

    /// The API the audit writes its reports in: wgpolicyk8s (PolicyReport,
    /// ClusterPolicyReport), openreports (Report, ClusterReport), or auto: whichever the API
    /// server serves, openreports when both. Gatehouse's reports in the other API are deleted.
    #[arg(long, env = "GATEHOUSE_REPORT_API", value_enum, default_value_t = ReportApiChoice::Auto)]
    pub report_api: ReportApiChoice,

    /// Log format: `plain` text or `json` lines. The level comes from RUST_LOG (default info).
    #[arg(long, env = "GATEHOUSE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,

    /// The ClusterRole of the installation, made owner of the webhook configurations so that
    /// uninstalling removes them; empty for none.
    #[arg(
        long,
        env = "GATEHOUSE_OWNER_CLUSTER_ROLE",
        default_value = "gatehouse"
    )]
    pub owner_cluster_role: String,
}

/// How `gatehouse run` logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

impl RunArgs {
    /// How the API server reaches us, and the SANs the serving certificate needs for that.
    pub fn endpoint(&self) -> anyhow::Result<(Endpoint, Vec<San>)> {
        match &self.webhook_url {
            Some(url) => {
                let uri: http::Uri = url
                    .parse()
                    .with_context(|| format!("--webhook-url {url:?} is not a URL"))?;
                if uri.scheme_str() != Some("https") {
                    bail!(
                        "--webhook-url {url:?} must use https: the API server only calls webhooks over TLS"
                    );
                }
                let Some(host) = uri.host() else {
                    bail!("--webhook-url {url:?} has no host");
                };
                if uri.query().is_some() {
                    bail!("--webhook-url {url:?} must not have a query");
                }
                let base = url.trim_end_matches('/').to_string();
                Ok((Endpoint::Url { base }, vec![San::parse(host)]))
            }
            None => {
                let (svc, ns) = (&self.service_name, &self.namespace);
                if svc.is_empty() {
                    bail!("--service-name must not be empty (or give --webhook-url)");
                }
                let sans = [
                    svc.clone(),
                    format!("{svc}.{ns}"),
                    format!("{svc}.{ns}.svc"),
                    format!("{svc}.{ns}.svc.cluster.local"),
                ]
                .into_iter()
                .map(San::Dns)
                .collect();
                Ok((
                    Endpoint::Service {
                        namespace: ns.clone(),
                        name: svc.clone(),
                        port: i32::from(self.service_port),
                    },
                    sans,
                ))
            }
        }
    }

    /// This replica's name in the Lease.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME")
                .ok()
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "gatehouse".into());
            format!("{host}-{}", std::process::id())
        })
    }

    /// The excluded namespaces: the flag's list plus our own namespace, always.
    pub fn excluded_namespaces(&self) -> Vec<String> {
        let mut out = names_in(&self.exclude_namespaces);
        out.push(self.namespace.clone());
        sorted(out)
    }

    /// The namespaces PolicyExceptions are honoured from: the flag's list, or our own namespace.
    pub fn honoured_exception_namespaces(&self) -> Vec<String> {
        let mut out = names_in(&self.exception_namespaces);
        if out.is_empty() {
            out.push(self.namespace.clone());
        }
        sorted(out)
    }

    /// What the TLS manager keeps: the Secret's namespace, the SANs and the lifetimes.
    pub fn tls_config(&self, sans: Vec<San>) -> TlsConfig {
        let mut config = TlsConfig::new(self.namespace.clone(), sans);
        config.ca_validity = self.ca_validity;
        config.cert_validity = self.cert_validity;
        config.bundle_propagation = self.bundle_propagation;
        config
    }

    /// How the configurations reach this server, what they leave out and who owns them.
    pub fn wiring(&self, endpoint: Endpoint) -> Wiring {
        Wiring {
            endpoint,
            excluded_namespaces: self.excluded_namespaces(),
            home_namespace: self.namespace.clone(),
            owner_cluster_role: Some(self.owner_cluster_role.clone()).filter(|n| !n.is_empty()),
            owner: None,
            max_admission_policies: self.max_admission_policies,
        }
    }

    /// The audit's settings.
    pub fn audit_config(&self) -> AuditConfig {
        AuditConfig {
            interval: self.audit_interval,
            settle: Duration::from_secs(3),
            qps: self.audit_qps,
            page_size: self.audit_page_size.max(1),
            max_results: self.audit_max_results,
            excluded_namespaces: self.excluded_namespaces(),
            report_api: self.report_api,
            exception_namespaces: self.honoured_exception_namespaces(),
        }
    }

    /// The effects loop's timings.
    pub fn ipam_config(&self) -> IpamConfig {
        IpamConfig {
            gc_interval: self.gc_interval,
            gc_grace: self.gc_grace,
        }
    }
}

/// The names a comma-separated flag gave, trimmed, the empty ones left out.
fn names_in(flag: &[String]) -> Vec<String> {
    flag.iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `names` sorted, each once.
fn sorted(mut names: Vec<String>) -> Vec<String> {
    names.sort();
    names.dedup();
    names
}

/// Runs the operator until SIGTERM or SIGINT: builds the components and joins them.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    telemetry::init_logging(args.log_format == LogFormat::Json);
    let (endpoint, sans) = args.endpoint()?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API (in-cluster config or KUBECONFIG)")?;
    let process = Process::new(client, args.identity());
    let mut registry = telemetry::registry();
    let policies = Arc::new(PolicyStore::new());
    let shutdown = Shutdown::new();
    let stopped = || shutdown.stopped();

    let loops = Arc::new(ReconcileMetrics::register(&mut registry));
    let resolver = CertResolver::new();
    let tls = TlsManager::new(
        args.tls_config(sans),
        process.client.clone(),
        resolver.clone(),
        process.coordination(args.lease_duration, loops.clone(), &mut registry),
    );
    let ca_bundle = tls.ca_bundle();
    let tls_task = async move {
        if let Err(e) = tls.run(stopped()).await {
            error!(error = %chain(&e), "TLS manager stopped");
        }
    };

    let (leader_rx, lease_task) = process.lease(&args, &mut registry, stopped());
    let blocked = BlockedPolicies::default();
    let controller = ControllerContext::new(
        process.client.clone(),
        &mut registry,
        loops.clone(),
        policies.clone(),
        args.wiring(endpoint),
        process.readiness.clone(),
        process.recorder.clone(),
    )
    .with_blocked(blocked.clone())
    .with_exception_namespaces(args.honoured_exception_namespaces());
    let controller_task = controller::run(
        Arc::new(controller),
        ca_bundle,
        leader_rx.clone(),
        stopped(),
    );
    let effects = process.effects(&args, &loops, blocked, &mut registry)?;
    let namespaces = effects.namespaces.clone();
    let audit_context = AuditContext {
        client: process.client.clone(),
        namespaces: namespaces.clone(),
        config: args.audit_config(),
        metrics: AuditMetrics::register(&mut registry),
        loops,
    };
    let audit_task = audit_on_own_thread(audit_context, leader_rx.clone(), stopped());
    let companions = Arc::new(effects.companions);
    let companions_task = companions::run(companions, leader_rx.clone(), stopped());
    let calls_task = calls::run(Arc::new(effects.calls), leader_rx.clone(), stopped());
    let ipam_task = ipam::run(Arc::new(effects.ipam), leader_rx, stopped());

    let ports = process.ports(&args, policies, namespaces, resolver, registry)?;
    let servers = serve::spawn(ports, stopped)?;
    info!(listen = %args.listen, admin = %args.admin_listen, "gatehouse running");
    tokio::join!(
        shutdown.on_signal(&process.readiness, args.shutdown_delay),
        tls_task,
        servers,
        lease_task,
        controller_task,
        ipam_task,
        companions_task,
        calls_task,
        audit_task,
        until(effects.namespaces_watch, stopped()),
    );
    info!("stopped");
    Ok(())
}

/// The contexts of the effects loops.
struct EffectsContexts {
    ipam: IpamContext,
    companions: CompanionsContext,
    calls: CallsContext,
    /// The process's one Namespace watch, shared with admission and the audit.
    namespaces: webhook::Namespaces,
    namespaces_watch: futures::future::BoxFuture<'static, ()>,
}

impl Process {
    /// The effects loops' contexts and the process's one Namespace watch; `blocked` is what
    /// the companions loop tells the Policy controller.
    fn effects(
        &self,
        args: &RunArgs,
        loops: &Arc<ReconcileMetrics>,
        blocked: BlockedPolicies,
        registry: &mut Registry,
    ) -> anyhow::Result<EffectsContexts> {
        // A Namespace's labels decide which of its objects get companions: their changes wake
        // the companions loop.
        let companions_trigger = Arc::new(Notify::new());
        let calls_trigger = Arc::new(Notify::new());
        let (namespaces, namespaces_watch) = webhook::Namespaces::watch(
            self.client.clone(),
            vec![companions_trigger.clone(), calls_trigger.clone()],
        );
        let labels = namespaces
            .table()
            .context("the webhook's Namespace labels")?;
        let ipam = IpamContext {
            client: self.client.clone(),
            loops: loops.clone(),
            metrics: IpamMetrics::register(registry),
            recorder: self.recorder.clone(),
            config: args.ipam_config(),
        };
        let calls = CallsContext {
            client: self.client.clone(),
            namespace: args.namespace.clone(),
            namespaces: labels.clone(),
            trigger: calls_trigger,
            blocked: blocked.clone(),
            loops: loops.clone(),
            metrics: CallsMetrics::register(registry),
            recorder: self.recorder.clone(),
            per_receiver: usize::from(args.calls_per_receiver),
            exception_namespaces: args.honoured_exception_namespaces(),
        };
        let companions = CompanionsContext {
            namespaces: labels,
            trigger: companions_trigger,
            client: self.client.clone(),
            blocked,
            loops: loops.clone(),
            metrics: CompanionsMetrics::register(registry),
            recorder: self.recorder.clone(),
            exception_namespaces: args.honoured_exception_namespaces(),
        };
        Ok(EffectsContexts {
            ipam,
            companions,
            calls,
            namespaces,
            namespaces_watch: Box::pin(namespaces_watch),
        })
    }
}

/// What every component of the process shares.
struct Process {
    client: kube::Client,
    /// This replica's name in the Lease, its rotation records and its Events.
    identity: String,
    recorder: Recorder,
    readiness: Arc<Readiness>,
}

impl Process {
    fn new(client: kube::Client, identity: String) -> Self {
        let reporter = Reporter {
            controller: "gatehouse".into(),
            instance: Some(identity.clone()),
        };
        Process {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            identity,
            readiness: Arc::new(Readiness::default()),
        }
    }

    /// This replica's part in leader election: the leadership it publishes, and the task that
    /// keeps the Lease until `stopped`.
    fn lease<S: Future<Output = ()>>(
        &self,
        args: &RunArgs,
        registry: &mut Registry,
        stopped: S,
    ) -> (
        watch::Receiver<Leadership>,
        impl Future<Output = ()> + use<S>,
    ) {
        let (leader_tx, leader_rx) = watch::channel(Leadership::default());
        let config = LeaseConfig::new(
            args.namespace.clone(),
            self.identity.clone(),
            args.lease_duration,
        );
        let gauge = lease::leader_gauge(registry);
        let task = lease::run(self.client.clone(), config, leader_tx, gauge, stopped);
        (leader_rx, task)
    }

    /// What the TLS manager needs to take part in rotations; its metrics go to `registry`.
    fn coordination(
        &self,
        replica_ttl: Duration,
        loops: Arc<ReconcileMetrics>,
        registry: &mut Registry,
    ) -> Coordination {
        Coordination {
            identity: self.identity.clone(),
            replica_ttl,
            configuration_name: CONFIGURATION_NAME.to_string(),
            metrics: TlsMetrics::register(registry),
            recorder: self.recorder.clone(),
            readiness: self.readiness.clone(),
            loops,
        }
    }

    /// The webhook port over the store's Policies, and the admin port serving `registry` once
    /// the webhook's own metrics are in it too.
    fn ports(
        &self,
        args: &RunArgs,
        policies: Arc<PolicyStore>,
        namespaces: webhook::Namespaces,
        resolver: Arc<CertResolver>,
        mut registry: Registry,
    ) -> anyhow::Result<serve::Ports> {
        let admission = Arc::new(AdmissionMetrics::register(&mut registry));
        let mut webhook_state = WebhookState::new(policies, admission);
        webhook_state.namespaces = namespaces;
        Ok(serve::Ports {
            webhook: args.listen,
            webhook_handler: webhook::handler(Arc::new(webhook_state)),
            tls: Arc::new(tls::server_config(resolver)?),
            drain: args.drain_timeout,
            handshakes: serve::handshake_counter(&mut registry),
            admin: args.admin_listen,
            admin_handler: admin::handler(Arc::new(AdminState {
                readiness: self.readiness.clone(),
                registry: Arc::new(registry),
            })),
        })
    }
}

/// The audit on a thread of its own: a pass decodes LIST pages and judges objects in bursts of
/// CPU, which must not hold up the webhook's reviews on the main runtime's workers (nor the
/// lease, the controller and the effects loop); the OS shares the cores between them instead.
fn audit_on_own_thread(
    ctx: AuditContext,
    leader: watch::Receiver<Leadership>,
    stopped: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> {
    let ctx = Arc::new(ctx);
    serve::on_own_thread("gatehouse-audit", move || audit::run(ctx, leader, stopped))
}

/// Runs `work` until `stopped`.
async fn until(work: impl Future<Output = ()>, stopped: impl Future<Output = ()>) {
    tokio::select! { () = work => {}, () = stopped => {} }
}

/// The one shutdown signal every task watches.
struct Shutdown {
    stop: watch::Sender<bool>,
}

impl Shutdown {
    fn new() -> Self {
        Shutdown {
            stop: watch::Sender::new(false),
        }
    }

    /// Resolves once shutdown began.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.stop.subscribe();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    }

    /// Waits for SIGTERM or SIGINT, reports not ready for `delay` while still serving (so the
    /// Service withdraws this replica first), then begins the shutdown.
    async fn on_signal(&self, readiness: &Readiness, delay: Duration) {
        wait_for_signal().await;
        readiness.shutting_down.store(true, Ordering::Release);
        if !delay.is_zero() {
            info!(?delay, "shutdown requested; not ready, still serving");
            tokio::time::sleep(delay).await;
        }
        info!("shutdown requested; draining");
        self.stop.send_replace(true);
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers we can still stop on Ctrl-C.
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> RunArgs {
        T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .unwrap()
            .run
    }

    #[test]
    fn service_mode_is_the_default_with_cluster_dns_sans() {
        let args = parse(&["--namespace", "gh"]);
        let (endpoint, sans) = args.endpoint().unwrap();
        assert_eq!(
            endpoint,
            Endpoint::Service {
                namespace: "gh".into(),
                name: "gatehouse-webhook".into(),
                port: 443
            }
        );
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            names,
            [
                "gatehouse-webhook",
                "gatehouse-webhook.gh",
                "gatehouse-webhook.gh.svc",
                "gatehouse-webhook.gh.svc.cluster.local"
            ]
        );
        assert_eq!(
            args.excluded_namespaces(),
            ["gh", "kube-node-lease", "kube-system"]
        );
        // Out of a Deployment nothing withdraws endpoints: stop at once by default.
        assert_eq!(args.shutdown_delay, Duration::ZERO);
        assert_eq!(
            parse(&["--shutdown-delay", "5s"]).shutdown_delay,
            Duration::from_secs(5)
        );
    }

    #[test]
    fn url_mode_uses_the_host_as_san() {
        let args = parse(&["--webhook-url", "https://127.0.0.1:9443/"]);
        let (endpoint, sans) = args.endpoint().unwrap();
        assert_eq!(
            endpoint,
            Endpoint::Url {
                base: "https://127.0.0.1:9443".into()
            }
        );
        assert_eq!(sans, vec![San::parse("127.0.0.1")]);
    }

    #[test]
    fn bad_urls_and_durations_are_refused_with_reasons() {
        let http = parse(&["--webhook-url", "http://127.0.0.1:9443"]);
        assert!(
            http.endpoint()
                .unwrap_err()
                .to_string()
                .contains("must use https")
        );
        let err = T::try_parse_from(["t", "--cert-validity", "10"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("lacks a unit"));
    }
}
