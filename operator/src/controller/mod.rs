//! The Policy controller: fetch → validate (pure) → build desired configurations (pure) →
//! server-side apply → status. One coalescing loop owns both webhook configurations, so a burst
//! of Policy changes costs a handful of writes, not one per Policy.
mod generated;
mod in_process;
mod in_process_mutating;
pub mod isolate;
mod schemas;
pub mod status;
#[cfg(test)]
mod tests;
mod wire;
pub mod wiring;
mod writes;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::runtime::admin::Readiness;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{
    Failure, Next, NotLeading, Pacing, ReconcileMetrics, Term, Window, fenced, reflect, run_loop,
};
use crate::webhook::PolicyStore;
use gatehouse_api::v1alpha1::{IPPool, Policy};
use gatehouse_engine as engine;
use in_process::{GeneratedCaches, InProcessMemory};
use isolate::{DryRun, SearchError};
use status::Verdict;
use wire::{Decided, owned_wiring, wire};
use wiring::placement::Served;
use wiring::{CONFIGURATION_NAME, Wiring};
use writes::*;

pub use crate::runtime::reconcile::FIELD_MANAGER;

/// Every configuration write costs the API server a webhook-informer update: a burst of Policy
/// changes is worth collecting into one (200 Policies: one write, see the e2e test).
const COALESCE: Window = Window {
    quiet: Duration::from_millis(500),
    max: Duration::from_secs(3),
};
/// Level-triggered safety net in case a watch event was missed.
const RESYNC: Duration = Duration::from_secs(60);

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("applying {kind}/{name}")]
    ApplyConfiguration {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("dry-running {kind}/{name} to find the Policy the API server refuses")]
    DryRunConfiguration {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("the API server refuses the configurations even without any Policy: {reason}")]
    RefusedWithoutPolicies { reason: String },
    #[error("writing status of Policy {name}")]
    WriteStatus { name: String, source: kube::Error },
    #[error("serializing {what}")]
    Serialize {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("not leading any more: {what} not written")]
    NotLeading { what: String },
    #[error("confirming that the API server enforces the generated admission policies: {reason}")]
    Probe { reason: String },
    #[error("asking the API server whether it serves ValidatingAdmissionPolicy")]
    Discover { source: kube::Error },
}

impl Failure for ReconcileError {
    fn step(&self) -> &'static str {
        match self {
            ReconcileError::ApplyConfiguration { .. } => "ApplyConfiguration",
            ReconcileError::DryRunConfiguration { .. } => "DryRunConfiguration",
            ReconcileError::RefusedWithoutPolicies { .. } => "RefusedWithoutPolicies",
            ReconcileError::WriteStatus { .. } => "WriteStatus",
            ReconcileError::Serialize { .. } => "Serialize",
            ReconcileError::NotLeading { .. } => "NotLeading",
            ReconcileError::Probe { .. } => "Probe",
            ReconcileError::Discover { .. } => "Discover",
        }
    }
}

impl From<NotLeading> for ReconcileError {
    fn from(e: NotLeading) -> Self {
        ReconcileError::NotLeading { what: e.what }
    }
}

/// Everything the controller needs, passed explicitly.
pub struct ControllerContext {
    pub client: Client,
    /// The reconcile loops' metrics, shared with the effects loop.
    pub loops: Arc<ReconcileMetrics>,
    /// Server-side applies of the webhook configurations.
    pub configuration_writes: Counter,
    pub policies: Arc<PolicyStore>,
    pub wiring: Wiring,
    pub readiness: Arc<Readiness>,
    pub recorder: Recorder,
}

impl ControllerContext {
    /// The controller's context; its own metric is registered in `registry`.
    pub fn new(
        client: Client,
        registry: &mut Registry,
        loops: Arc<ReconcileMetrics>,
        policies: Arc<PolicyStore>,
        wiring: Wiring,
        readiness: Arc<Readiness>,
        recorder: Recorder,
    ) -> Self {
        let configuration_writes = Counter::default();
        registry.sub_registry_with_prefix("reconcile").register(
            "webhook_configuration_writes",
            "Server-side applies of the webhook configurations",
            configuration_writes.clone(),
        );
        Self {
            client,
            loops,
            configuration_writes,
            policies,
            wiring,
            readiness,
            recorder,
        }
    }
}

/// What the loop remembers of its own term as leader.
#[derive(Default)]
struct Applied {
    /// Our own last writes, to tell drift from our own echo.
    mutating: Option<LastWrite>,
    validating: Option<LastWrite>,
    /// Policies the API server refused, by name. A new generation is tried again.
    rejected: HashMap<String, Refusal>,
    /// Policies whose match conditions the API server accepted, by name.
    conditions_checked: HashMap<String, SpecVersion>,
    /// The owner of the configurations, once read.
    owner: Option<OwnerReference>,
    /// In-process enforcement in this term.
    in_process: InProcessMemory,
    /// Whether mutating Policies' merges fit their kinds' schemas.
    schemas: schemas::SchemaMemory,
}

/// A configuration as this replica last wrote it.
struct LastWrite {
    body: serde_json::Value,
    /// What the API server stored it as.
    resource_version: Option<String>,
}

/// Which spec of a Policy a judgement was about: the same name may be a new object (uid) or a
/// new spec (generation).
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpecVersion {
    uid: Option<String>,
    generation: Option<i64>,
}

impl SpecVersion {
    fn of(policy: &Policy) -> Self {
        SpecVersion {
            uid: policy.metadata.uid.clone(),
            generation: policy.metadata.generation,
        }
    }
}

/// The API server refused a Policy's entries.
struct Refusal {
    spec: SpecVersion,
    /// The API server's message.
    message: String,
}

/// The caches a pass reads.
struct PolicyCaches {
    policies: Store<Policy>,
    mutating: Store<MutatingWebhookConfiguration>,
    validating: Store<ValidatingWebhookConfiguration>,
    /// Only to tell whether the pool an ipam effect names exists.
    pools: Store<IPPool>,
    /// The generated ValidatingAdmissionPolicies and bindings, when the API server serves them.
    generated: Option<GeneratedCaches>,
}

/// Runs the controller until `shutdown` fires. `ca_bundle` carries the PEM bundle the TLS manager
/// publishes; nothing is written before the caches are synced and a bundle is known, so a
/// half-started operator never empties the cluster's configurations. Every replica compiles
/// Policies for its own webhook server; only the one `leader` says leads writes anything, and
/// it checks its term immediately before every write.
pub async fn run(
    ctx: Arc<ControllerContext>,
    mut ca_bundle: watch::Receiver<Option<String>>,
    mut leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let trigger = Arc::new(Notify::new());
    let (policies, policy_watch) = reflect::<Policy>(
        ctx.client.clone(),
        watcher::Config::default(),
        trigger.clone(),
    );
    let by_name = watcher::Config::default().fields(&format!("metadata.name={CONFIGURATION_NAME}"));
    let (mutating, mutating_watch) = reflect::<MutatingWebhookConfiguration>(
        ctx.client.clone(),
        by_name.clone(),
        trigger.clone(),
    );
    let (validating, validating_watch) =
        reflect::<ValidatingWebhookConfiguration>(ctx.client.clone(), by_name, trigger.clone());
    let (pools, pools_watch) = reflect::<IPPool>(
        ctx.client.clone(),
        watcher::Config::default(),
        trigger.clone(),
    );
    let (generated, generated_watch) = tokio::select! {
        watched = in_process::watch(&ctx.client, &trigger) => watched,
        () = &mut shutdown => return,
    };
    let caches = PolicyCaches {
        policies,
        mutating,
        validating,
        pools,
        generated,
    };
    let watches = tokio::spawn(async move {
        tokio::join!(
            policy_watch,
            mutating_watch,
            validating_watch,
            pools_watch,
            generated_watch
        );
    });

    let work = async {
        let synced = async {
            let _ = tokio::join!(
                caches.policies.wait_until_ready(),
                caches.mutating.wait_until_ready(),
                caches.validating.wait_until_ready(),
                caches.pools.wait_until_ready(),
                async {
                    if let Some(g) = &caches.generated {
                        let _ = tokio::join!(
                            g.policies.wait_until_ready(),
                            g.bindings.wait_until_ready()
                        );
                    }
                }
            );
        };
        synced.await;
        let bundle_known = ca_bundle.wait_for(|b| b.is_some()).await.is_ok();
        if !bundle_known {
            return;
        }
        info!("caches synced and certificate known; reconciling");

        let ca_bundle_now = ca_bundle.clone();
        // A new bundle is a change like any other: it reaches the loop through the trigger.
        let bundle_changes = async {
            while ca_bundle.changed().await.is_ok() {
                trigger.notify_one();
            }
        };
        let leader_view = leader.clone();
        let mut applied = Applied::default();
        let pacing = Pacing {
            window: COALESCE,
            resync: RESYNC,
        };
        let passes = run_loop(
            "policy",
            &ctx.loops,
            &trigger,
            &mut leader,
            pacing,
            async |term| {
                // A new term must not trust what an earlier one remembered.
                if term != Term::Continuing {
                    applied = Applied::default();
                }
                let bundle = ca_bundle_now.borrow().clone().unwrap_or_default();
                let leading = term.is_leading();
                let result =
                    reconcile_all(&ctx, &caches, &bundle, leading, &leader_view, &mut applied)
                        .instrument(info_span!("reconcile", controller = "policy"))
                        .await;
                match result {
                    Err(ReconcileError::NotLeading { what }) => {
                        info!(%what, "leadership ended during the pass; stopped writing");
                        Ok(Next::Resync)
                    }
                    other => other,
                }
            },
        );
        tokio::select! {
            () = passes => {}
            () = bundle_changes => {}
        }
    };
    tokio::select! {
        () = work => {}
        () = &mut shutdown => {}
    }
    watches.abort();
}

async fn reconcile_all(
    ctx: &ControllerContext,
    caches: &PolicyCaches,
    bundle: &str,
    leading: bool,
    leader: &watch::Receiver<Leadership>,
    applied: &mut Applied,
) -> Result<Next, ReconcileError> {
    let all = caches.policies.state();
    let pool_exists = |name: &str| {
        caches
            .pools
            .get(&kube::runtime::reflector::ObjectRef::new(name))
            .is_some()
    };
    let Judged { valid, verdicts } =
        judge(&all, |policy| serve(&ctx.policies, policy), pool_exists);
    // Whoever leads: a Policy the API server enforces (its status says so, for its current
    // spec) is never evaluated by this replica's webhook server too.
    ctx.policies.set_in_process(
        valid
            .iter()
            .filter(|p| in_process::enforced_in_process(p))
            .map(|p| p.name_any())
            .collect(),
    );
    ctx.readiness.policies_loaded.store(true, Ordering::Release);

    // Writes are fenced by `leader`'s term; `leading` is what this pass was told.
    let wiring = if leading {
        Some(owned_wiring(ctx, applied).await)
    } else {
        None
    };
    // A Policy the API server refused runs nowhere, so it neither holds a place in the
    // in-process mutation order nor blocks one; a new spec of it is tried again.
    applied.rejected.retain(|name, refusal| {
        valid
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == refusal.spec)
    });
    let placeable: Vec<&Policy> = valid
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| !applied.rejected.contains_key(&p.name_any()))
        .collect();
    let served = Served {
        validating: caches.generated.is_some(),
        mutating: caches
            .generated
            .as_ref()
            .is_some_and(|g| g.mutating.is_some()),
    };
    let schema_fit = if wiring.is_some() && served.mutating {
        schemas::judge(&ctx.client, &placeable, &mut applied.schemas).await
    } else {
        HashMap::new()
    };
    let (placements, generated_mutation) = match &wiring {
        Some(wiring) => wiring::placement::place_all(&placeable, wiring, served, &schema_fit),
        None => (Vec::new(), Vec::new()),
    };
    let wired = match &wiring {
        Some(wiring) => {
            let decided = Decided {
                valid: &valid,
                placements: &placements,
                generated_mutation: &generated_mutation,
                schema_fit: &schema_fit,
                wiring,
                bundle,
            };
            wire(ctx, caches, &decided, leader, applied).await
        }
        None => Ok(None),
    };

    // Entries the API server may still call, as read back: never a 404 for those, whoever
    // leads. Anything else no longer valid may be forgotten once its grace is over.
    ctx.policies.set_wired(wiring::wired_groups(
        caches.mutating.state().iter().map(|c| c.as_ref()),
        caches.validating.state().iter().map(|c| c.as_ref()),
    ));
    let keep: HashSet<String> = valid.iter().map(|p| p.name_any()).collect();
    for name in ctx.policies.names() {
        if !keep.contains(&name) {
            ctx.policies.retire(&name);
        }
    }

    if !leading {
        return Ok(Next::Resync);
    }
    let now = Time(Timestamp::now());
    let verdicts = in_process::verdicts(verdicts, &placements, &applied.in_process);
    for (policy, verdict) in statuses(verdicts, &applied.rejected, wired.is_ok()) {
        write_status(ctx, &policy, &verdict, now.clone(), leader).await?;
    }
    wired.map(|wake| wake.map_or(Next::Resync, Next::By))
}

/// What a pass decides of every Policy before any write.
struct Judged {
    /// The Policies to wire, compiled into the server's store.
    valid: Vec<Arc<Policy>>,
    /// Every Policy with its verdict, in order.
    verdicts: Vec<(Arc<Policy>, Verdict)>,
}

/// Judges every Policy: `serve` compiles one into the server's store (or finds it there) or
/// lists its problems, and an ipam effect needs its IPPool (`pool_exists`) to be wired, since
/// wired it would hold every Pod it marks at its gate with no pool to serve them.
fn judge(
    all: &[Arc<Policy>],
    mut serve: impl FnMut(&Policy) -> Result<(), Vec<String>>,
    pool_exists: impl Fn(&str) -> bool,
) -> Judged {
    let mut judged = Judged {
        valid: Vec::new(),
        verdicts: Vec::with_capacity(all.len()),
    };
    for policy in all {
        let problems = match serve(policy) {
            Ok(()) => missing_pools(policy, &pool_exists),
            Err(problems) => problems,
        };
        let verdict = if problems.is_empty() {
            judged.valid.push(policy.clone());
            Verdict::Wired {
                own_entry: engine::policy::needs_own_entry(&policy.spec),
                // Said once the pass has placed it.
                webhook_because: String::new(),
            }
        } else {
            Verdict::Invalid(problems)
        };
        judged.verdicts.push((policy.clone(), verdict));
    }
    judged
}

/// Compiles `policy` into the server's store unless its spec is served already (the store is
/// the cache: CEL is compiled once per spec, not once per pass), or lists its problems. A
/// Policy is served before the API server is told about it.
fn serve(store: &PolicyStore, policy: &Policy) -> Result<(), Vec<String>> {
    let served = store
        .get(&policy.name_any())
        .is_some_and(|c| c.spec() == &policy.spec);
    if served {
        return Ok(());
    }
    match engine::compile(policy) {
        Ok(compiled) => {
            store.upsert(Arc::new(compiled));
            Ok(())
        }
        Err(invalid) => Err(invalid.problems.iter().map(ToString::to_string).collect()),
    }
}

/// The statuses a leader writes once the wiring is known: a Policy the API server refused says
/// so with its message, and one is reported wired only once the configurations were written.
fn statuses(
    verdicts: Vec<(Arc<Policy>, Verdict)>,
    rejected: &HashMap<String, Refusal>,
    wired: bool,
) -> Vec<(Arc<Policy>, Verdict)> {
    verdicts
        .into_iter()
        .map(|(policy, verdict)| match rejected.get(&policy.name_any()) {
            Some(refusal) => (policy, Verdict::Rejected(refusal.message.clone())),
            None => (policy, verdict),
        })
        .filter(|(_, verdict)| wired || !matches!(verdict, Verdict::Wired { .. }))
        .collect()
}

/// The ipam effects of `policy` whose IPPool does not exist, as problems.
fn missing_pools(policy: &Policy, pool_exists: impl Fn(&str) -> bool) -> Vec<String> {
    policy
        .spec
        .effects
        .iter()
        .enumerate()
        .filter_map(|(i, e)| Some((i, e.ipam.as_ref()?)))
        .filter(|(_, ipam)| !pool_exists(&ipam.pool))
        .map(|(i, ipam)| {
            format!(
                "spec.effects[{i}].ipam.pool: IPPool {:?} does not exist; the Policy is not wired until it does",
                ipam.pool
            )
        })
        .collect()
}
