//! The Policy controller: fetch → validate (pure) → build desired configurations (pure) →
//! server-side apply → status. One coalescing loop owns both webhook configurations, so a burst
//! of Policy changes costs a handful of writes, not one per Policy.
mod configurations;
mod confirm;
mod exceptions;
mod generated;
mod in_process;
mod in_process_mutating;
pub mod isolate;
mod pass;
mod schemas;
pub mod status;
pub mod wiring;
mod writes;

use crate::policies::{PolicyStores, reflect_policies};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::events::Recorder;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};
use tracing::{Instrument, info, info_span, warn};

use crate::effects::companions::BlockedPolicies;
use crate::runtime::admin::Readiness;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{
    Failure, Next, NotLeading, Pacing, ReconcileMetrics, Term, Window, reflect, run_loop,
};
use crate::webhook::PolicyStore;
use gatehouse_api::v1alpha1::{IPPool, Policy};
use in_process::{GeneratedCaches, InProcessMemory};
use wiring::{CONFIGURATION_NAME, Wiring};

pub use crate::runtime::reconcile::FIELD_MANAGER;

/// Every configuration write costs the API server a webhook-informer update: a burst of Policy
/// changes is worth collecting into one (200 Policies: one write, see the e2e test).
const COALESCE: Window = Window {
    quiet: Duration::from_millis(500),
    max: Duration::from_secs(3),
};
/// Level-triggered safety net in case a watch event was missed.
const RESYNC: Duration = Duration::from_secs(60);

/// A pass's failure, by the step of [`pass`] that failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("checking the Policies' match conditions with the API server")]
    Check(#[source] WriteError),
    #[error("enforcing Policies in-process")]
    EnforceInProcess(#[source] WriteError),
    #[error("writing the webhook configurations")]
    WriteConfigurations(#[source] WriteError),
    #[error("removing generated objects no Policy stands for")]
    RemoveStale(#[source] WriteError),
    #[error("writing the Policies' statuses")]
    WriteStatuses(#[source] WriteError),
    #[error("not leading any more: {what} not written")]
    NotLeading { what: String },
    #[error("asking the API server whether it serves the admission policy kinds")]
    Discover(#[source] kube::Error),
}

impl Failure for ReconcileError {
    fn step(&self) -> &'static str {
        match self {
            ReconcileError::Check(_) => "Check",
            ReconcileError::EnforceInProcess(_) => "EnforceInProcess",
            ReconcileError::WriteConfigurations(_) => "WriteConfigurations",
            ReconcileError::RemoveStale(_) => "RemoveStale",
            ReconcileError::WriteStatuses(_) => "WriteStatuses",
            ReconcileError::NotLeading { .. } => "NotLeading",
            ReconcileError::Discover(_) => "Discover",
        }
    }
}

/// What failed inside a step: one call to the API server, or what it answered.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
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
    #[error("writing status of PolicyException {name}")]
    WriteExceptionStatus { name: String, source: kube::Error },
    #[error("serializing {what}")]
    Serialize {
        what: &'static str,
        source: serde_json::Error,
    },
    #[error("not leading any more: {what} not written")]
    NotLeading { what: String },
    #[error("confirming that the API server enforces the generated admission policies: {reason}")]
    Probe { reason: String },
}

impl From<NotLeading> for WriteError {
    fn from(e: NotLeading) -> Self {
        WriteError::NotLeading { what: e.what }
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
    /// Policies whose object effects cannot run as written (the companions loop's finding).
    pub blocked: BlockedPolicies,
    /// The namespaces PolicyExceptions are honoured from (`--exception-namespaces`).
    pub exception_namespaces: Vec<String>,
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
            blocked: BlockedPolicies::default(),
            exception_namespaces: Vec::new(),
        }
    }

    /// The context reading what the companions loop finds blocked.
    pub fn with_blocked(self, blocked: BlockedPolicies) -> Self {
        Self { blocked, ..self }
    }

    /// The context honouring PolicyExceptions from `namespaces` (none by default).
    pub fn with_exception_namespaces(self, namespaces: Vec<String>) -> Self {
        Self {
            exception_namespaces: namespaces,
            ..self
        }
    }
}

/// What one pass is given.
struct PassInput<'a> {
    pub ctx: &'a ControllerContext,
    pub caches: &'a PolicyCaches,
    /// The CA bundle the entries carry.
    pub bundle: &'a str,
    /// Whether this pass was told this replica leads; writes check `leader` again.
    pub leading: bool,
    pub leader: &'a watch::Receiver<Leadership>,
}

/// What the loop remembers of its own term as leader.
#[derive(Default)]
struct LeaderMemory {
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

/// Which spec of a Policy a judgement was about: the same name may be a new object (uid), a new
/// spec (generation) or the same spec with other PolicyExceptions written in (`effective`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct SpecVersion {
    uid: Option<String>,
    generation: Option<i64>,
    /// A hash of the spec the loops run.
    effective: u64,
}

impl SpecVersion {
    fn of(policy: &Policy) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        serde_json::to_string(&policy.spec)
            .unwrap_or_default()
            .hash(&mut hasher);
        SpecVersion {
            uid: policy.metadata.uid.clone(),
            generation: policy.metadata.generation,
            effective: hasher.finish(),
        }
    }
}

/// The API server refused a Policy's entries.
struct Refusal {
    spec: SpecVersion,
    /// The API server's message.
    message: String,
}

/// Records the Policies a search of refusals blamed in `rejected`, each with the API server's
/// message; `what` names what the API server refused of them, for the log.
fn record_refusals(
    rejected: &mut HashMap<String, Refusal>,
    culprits: Vec<isolate::Culprit<&Policy>>,
    what: &str,
) {
    for isolate::Culprit { candidate, reason } in culprits {
        warn!(policy = %candidate.name_any(), %reason, "the API server refuses this Policy's {what}; leaving it out");
        rejected.insert(
            candidate.name_any(),
            Refusal {
                spec: SpecVersion::of(candidate),
                message: reason,
            },
        );
    }
}

/// The caches a pass reads.
struct PolicyCaches {
    policies: PolicyStores,
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
    leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let trigger = Arc::new(Notify::new());
    let Watched {
        mut caches,
        watches,
    } = watch_all(&ctx.client, &trigger, &ctx.exception_namespaces);
    let work = async {
        caches.synced().await;
        if ca_bundle.wait_for(|b| b.is_some()).await.is_err() {
            return;
        }
        info!("caches synced and certificate known; reconciling");
        reconcile_loop(&ctx, &mut caches, ca_bundle, leader, &trigger).await;
    };
    let blocked = async {
        loop {
            ctx.blocked.changed().await;
            trigger.notify_one();
        }
    };
    tokio::select! {
        () = work => {}
        () = blocked => {}
        () = &mut shutdown => {}
    }
    watches.abort();
}

/// The caches of a pass with the task that keeps them current.
struct Watched {
    caches: PolicyCaches,
    watches: tokio::task::JoinHandle<()>,
}

/// Starts the watches a pass reads, each change notifying `trigger`; the generated admission
/// policies' ones are started by the first pass ([`discover`]).
fn watch_all(client: &Client, trigger: &Arc<Notify>, exception_namespaces: &[String]) -> Watched {
    let every = watcher::Config::default;
    let (policies, policy_watch) = reflect_policies(client, trigger, exception_namespaces);
    let by_name = every().fields(&format!("metadata.name={CONFIGURATION_NAME}"));
    let (mutating, mutating_watch) =
        reflect::<MutatingWebhookConfiguration>(client.clone(), by_name.clone(), trigger.clone());
    let (validating, validating_watch) =
        reflect::<ValidatingWebhookConfiguration>(client.clone(), by_name, trigger.clone());
    let (pools, pools_watch) = reflect::<IPPool>(client.clone(), every(), trigger.clone());
    let watches = tokio::spawn(async move {
        tokio::join!(policy_watch, mutating_watch, validating_watch, pools_watch);
    });
    Watched {
        caches: PolicyCaches {
            policies,
            mutating,
            validating,
            pools,
            generated: None,
        },
        watches,
    }
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Step 0, discover (once, retried with the loop's backoff until the API server answers):
/// whether it serves ValidatingAdmissionPolicy and MutatingAdmissionPolicy; the watches of the
/// generated ones, when it does, started and synced into `caches`.
async fn discover(
    client: &Client,
    caches: &mut PolicyCaches,
    trigger: &Arc<Notify>,
) -> Result<AbortOnDrop, ReconcileError> {
    let served = in_process::admission_policies_served(client)
        .await
        .map_err(ReconcileError::Discover)?;
    let (generated, watches) = in_process::watch(client, trigger, served);
    let watches = AbortOnDrop(tokio::spawn(watches));
    if let Some(g) = &generated {
        let _ = tokio::join!(g.policies.wait_until_ready(), g.bindings.wait_until_ready());
    }
    caches.generated = generated;
    Ok(watches)
}

impl PolicyCaches {
    /// Waits until every cache holds its first list.
    async fn synced(&self) {
        let _ = tokio::join!(
            self.policies.wait_until_ready(),
            self.mutating.wait_until_ready(),
            self.validating.wait_until_ready(),
            self.pools.wait_until_ready(),
            async {
                if let Some(g) = &self.generated {
                    let _ =
                        tokio::join!(g.policies.wait_until_ready(), g.bindings.wait_until_ready());
                }
            }
        );
    }
}

/// The Policy controller's passes on the one reconcile loop, until the leader's channel closes.
async fn reconcile_loop(
    ctx: &ControllerContext,
    caches: &mut PolicyCaches,
    mut ca_bundle: watch::Receiver<Option<String>>,
    mut leader: watch::Receiver<Leadership>,
    trigger: &Arc<Notify>,
) {
    let ca_bundle_now = ca_bundle.clone();
    // A new bundle is a change like any other: it reaches the loop through the trigger.
    let bundle_changes = async {
        while ca_bundle.changed().await.is_ok() {
            trigger.notify_one();
        }
    };
    let leader_view = leader.clone();
    let mut memory = LeaderMemory::default();
    let mut generated_watches: Option<AbortOnDrop> = None;
    let pacing = Pacing {
        window: COALESCE,
        resync: RESYNC,
    };
    let passes = run_loop(
        "policy",
        &ctx.loops,
        trigger,
        &mut leader,
        pacing,
        async |term| {
            // A new term must not trust what an earlier one remembered.
            if term != Term::Continuing {
                memory = LeaderMemory::default();
            }
            if generated_watches.is_none() {
                generated_watches = Some(discover(&ctx.client, caches, trigger).await?);
            }
            let bundle = ca_bundle_now.borrow().clone().unwrap_or_default();
            let input = PassInput {
                ctx,
                caches,
                bundle: &bundle,
                leading: term.is_leading(),
                leader: &leader_view,
            };
            let result = pass::reconcile_all(&input, &mut memory)
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
}
