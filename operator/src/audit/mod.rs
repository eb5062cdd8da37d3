//! The background audit: the leader judges the stored objects every validating Policy names
//! (webhook or in-process alike, Deny and Warn rules) with the admission engine, and writes the
//! results as reports (per namespace, and for cluster-scoped objects) in `wgpolicyk8s.io` or
//! `openreports.io` (`--report-api`), one report per Policy and scope, replaced whole by every
//! pass.
//!
//! A pass runs every `--audit-interval`, and soon after a Policy's generation changes. Objects
//! are read with paginated LISTs of just the kinds the Policies name, at most `--audit-qps`
//! calls per second, so the audit never crowds admission out of the API server. A kind
//! Gatehouse may not list leaves its Policies `Audited=False` with the reason, never a silent
//! gap; the grant is the aggregated ClusterRole `gatehouse-audit`.
mod audited;
pub(crate) mod judge;
mod pass;
mod report;
pub mod report_api;
pub(crate) mod source;
mod writes;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{Failure, Next, Pacing, ReconcileMetrics, Term, Window, run_loop};
use crate::webhook::Namespaces;
use gatehouse_api::v1alpha1::Policy;

pub use judge::{AuditedKind, Judgement, NotAuditable, audit_copy, audit_request, judge_excepting};
pub use report::{
    POLICY_ANNOTATION, POLICY_UID_LABEL, ReportLocation, TRUNCATED_ANNOTATION, Tally, report_name,
    report_object,
};

/// Condition type saying whether the last audit pass covered every kind the Policy names.
pub const AUDITED: &str = "Audited";

/// The audit's settings (`gatehouse run` flags).
#[derive(Clone, Debug)]
pub struct AuditConfig {
    /// Time between passes.
    pub interval: Duration,
    /// How long after a Policy's generation changes the next pass starts (changes close
    /// together share one pass).
    pub settle: Duration,
    /// LIST calls per second, at most.
    pub qps: f64,
    /// Objects per LIST page.
    pub page_size: u32,
    /// Results listed per report, at most (the summary counts them all).
    pub max_results: usize,
    /// Namespaces admission never touches: not audited either.
    pub excluded_namespaces: Vec<String>,
    /// The report API written in.
    pub report_api: report_api::ReportApiChoice,
    /// The namespaces PolicyExceptions are honoured from.
    pub exception_namespaces: Vec<String>,
}

/// Labels of `gatehouse_audit_objects_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuditLabels {
    pub policy: String,
    /// `pass`, `fail`, `warn` or `error`: the worst of the object's results.
    pub result: &'static str,
}

/// The audit's metrics.
pub struct AuditMetrics {
    pub objects: Family<AuditLabels, Counter>,
    pub duration: Histogram,
}

impl AuditMetrics {
    /// Registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = AuditMetrics {
            objects: Family::default(),
            duration: Histogram::new(exponential_buckets(0.1, 2.0, 14)),
        };
        let audit = registry.sub_registry_with_prefix("audit");
        audit.register(
            "objects",
            "Objects judged by the audit, by Policy and the worst result",
            metrics.objects.clone(),
        );
        audit.register(
            "duration_seconds",
            "Duration of an audit pass",
            metrics.duration.clone(),
        );
        metrics
    }
}

/// Errors of the audit.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("listing Policies")]
    ListPolicies(#[source] kube::Error),
    #[error("listing PolicyExceptions")]
    ListExceptions(#[source] kube::Error),
    #[error("asking whether Gatehouse may list {resource}")]
    AccessReview {
        resource: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "Gatehouse may not list {resource}{}: grant it through a ClusterRole labelled \
         gatehouse.dev/aggregate-to-audit=\"true\" (aggregated into gatehouse-audit)",
        if reason.is_empty() { String::new() } else { format!(" ({reason})") }
    )]
    NotAllowed { resource: String, reason: String },
    #[error("listing {resource}")]
    List {
        resource: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing report {name}")]
    WriteReport {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting report {name}")]
    DeleteReport {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("asking discovery which report APIs are served")]
    Discovery(#[source] kube::Error),
    #[error("leadership ended during the pass")]
    NotLeading,
}

impl Failure for AuditError {
    fn step(&self) -> &'static str {
        match self {
            AuditError::ListPolicies(_) => "ListPolicies",
            AuditError::ListExceptions(_) => "ListExceptions",
            AuditError::AccessReview { .. } => "AccessReview",
            AuditError::NotAllowed { .. } => "NotAllowed",
            AuditError::List { .. } => "List",
            AuditError::WriteReport { .. } => "WriteReport",
            AuditError::DeleteReport { .. } => "DeleteReport",
            AuditError::Discovery(_) => "Discovery",
            AuditError::NotLeading => "NotLeading",
        }
    }
}

/// What the audit loop shares.
pub struct AuditContext {
    pub client: Client,
    /// Namespace labels for the Policies' namespaceSelectors: admission's reflector.
    pub namespaces: Namespaces,
    pub config: AuditConfig,
    pub metrics: AuditMetrics,
    /// The reconcile loops' metrics, which the audit's loop counts its passes in.
    pub loops: Arc<ReconcileMetrics>,
}

/// Runs the audit until `shutdown`, on the one reconcile loop ([`run_loop`]): passes on the
/// leader only, `settle` after a validating Policy's generation changes (a burst shares one
/// pass) or this replica began leading, every `interval` otherwise, and after a failed pass
/// with kube's backoff. Shutdown does not wait for a pass.
pub async fn run(
    ctx: Arc<AuditContext>,
    mut leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let trigger = Notify::new();
    let pacing = Pacing {
        window: Window {
            quiet: ctx.config.settle,
            max: ctx.config.settle * 4,
        },
        resync: ctx.config.interval,
    };
    let view = leader.clone();
    let passes = run_loop(
        "audit",
        &ctx.loops,
        &trigger,
        &mut leader,
        pacing,
        async |term| {
            match term {
                Term::Following => Ok::<_, AuditError>(Next::Resync),
                // A new term audits soon, not at once: the last leader's passes say nothing of
                // when, and a starting process lets its caches fill first.
                Term::Began => Ok(Next::By(Instant::now() + ctx.config.settle)),
                Term::Continuing => {
                    let started = Instant::now();
                    let outcome = pass::run_pass(&ctx, &view).await;
                    ctx.metrics
                        .duration
                        .observe(started.elapsed().as_secs_f64());
                    let summary = outcome?;
                    info!(%summary, "audit pass done");
                    // Passes start every interval, however long one takes (a long pass is
                    // followed at once), as they did before the audit ran on this loop.
                    Ok(Next::By(started + ctx.config.interval))
                }
            }
        },
    );
    tokio::select! {
        () = passes => {}
        () = generation_changes(&ctx, &trigger) => {}
        () = shutdown => {}
    }
}

/// Pokes `trigger` when a Policy that validates, or did, changes generation (one that stopped
/// validating loses its audit status in the next pass); ends when the watch does.
async fn generation_changes(ctx: &AuditContext, trigger: &Notify) {
    let policies: Api<Policy> = Api::all(ctx.client.clone());
    // Backoff: a failing watch (API server away, CRD missing) must not spin.
    let mut events = watcher::watcher(policies, watcher::Config::default())
        .default_backoff()
        .boxed();
    // Generation seen and whether it validates, by Policy.
    let mut generations: HashMap<String, (Option<i64>, bool)> = HashMap::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Apply(p) | Event::InitApply(p)) => {
                let name = p.metadata.name.clone().unwrap_or_default();
                let validates = !p.spec.validate.is_empty();
                let seen = generations.insert(name, (p.metadata.generation, validates));
                let changed = seen.map(|(g, _)| g) != Some(p.metadata.generation);
                let validated = seen.is_some_and(|(_, v)| v);
                if changed && (validates || validated) {
                    trigger.notify_one();
                }
            }
            Ok(Event::Delete(p)) => {
                generations.remove(&p.metadata.name.unwrap_or_default());
            }
            Ok(Event::Init | Event::InitDone) => {}
            Err(e) => warn!(error = %chain(&e), "watching Policies for the audit"),
        }
    }
}
