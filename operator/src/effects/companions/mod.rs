//! The companions loop: companion objects for the stored objects a Policy selects, reconciled
//! from what is stored, keyed by the trigger's UID, never at admission.
//!
//! Each pass, on the leader: fetch (the Policies; discovery and access checks of every kind
//! their object effects name; watches of the triggers, of the companions by Gatehouse's label
//! and of clone sources, started and stopped with the Policies) → decide ([`plan::plan`], pure:
//! what to apply, delete and release) → apply (server-side apply under Gatehouse's field
//! manager, deletes guarded by UID) → status (`status.companions` and `CompanionsInPlace`).
//! A Policy with object effects holds a finalizer, so its companions are collected even when it
//! is deleted while Gatehouse is down; `keepOnPolicyDelete` releases them instead.
use crate::policies::{PolicyStores, reflect_policies};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Recorder;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};

use super::effect_loop::{EffectKind, run_effect};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{Failure, Next, NotLeading, Pacing, ReconcileMetrics, Window};
use crate::webhook::NamespaceLabels;
use gatehouse_api::v1alpha1::{COMPANIONS_FINALIZER, Policy};

pub use blocked::BlockedPolicies;

mod blocked;
mod fetch;
mod pass;
pub mod plan;
mod writes;

/// A burst of triggers (a thousand Namespaces at once) is one pass, not a thousand.
const COALESCE: Window = Window {
    quiet: Duration::from_millis(100),
    max: Duration::from_millis(500),
};

/// Level-triggered safety net, and how soon a grant or a new kind is seen.
const RESYNC: Duration = Duration::from_secs(20);

/// How many writes a pass has in flight at once.
const WRITES_IN_FLIGHT: usize = 32;

/// What the loop needs, passed explicitly.
pub struct CompanionsContext {
    pub client: Client,
    /// The labels of the process's one Namespace watch (the webhook's), for
    /// namespaceSelectors; it pokes `trigger` on every change.
    pub namespaces: NamespaceLabels,
    /// What wakes the loop: its watches' events and the Namespaces'.
    pub trigger: Arc<Notify>,
    /// What the Policy controller reads into `Ready=False`.
    pub blocked: BlockedPolicies,
    pub loops: Arc<ReconcileMetrics>,
    pub metrics: CompanionsMetrics,
    /// Events on a Policy whose companions cannot be written.
    pub recorder: Recorder,
    /// The namespaces PolicyExceptions are honoured from: an exempted object gets no companion.
    pub exception_namespaces: Vec<String>,
}

/// The loop's own metrics (`gatehouse_companions_*`).
pub struct CompanionsMetrics {
    pub applied: Counter,
    pub deleted: Counter,
    pub failed: Counter,
}

impl CompanionsMetrics {
    /// Registers the loop's counters in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = CompanionsMetrics {
            applied: Counter::default(),
            deleted: Counter::default(),
            failed: Counter::default(),
        };
        let companions = registry.sub_registry_with_prefix("companions");
        companions.register(
            "applied",
            "Companion objects created or brought back in line by server-side apply",
            metrics.applied.clone(),
        );
        companions.register(
            "deleted",
            "Companion objects deleted: their trigger, its match or their Policy went",
            metrics.deleted.clone(),
        );
        companions.register(
            "failed",
            "Writes of companion objects the API server refused",
            metrics.failed.clone(),
        );
        metrics
    }
}

/// Errors of one pass, named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum CompanionsError {
    #[error("writing the finalizer of Policy {policy}")]
    Finalize { policy: String, source: kube::Error },
    #[error("writing the companions status of Policy {policy}")]
    WriteStatus { policy: String, source: kube::Error },
    #[error("{count} companion writes failed, the first: {first}")]
    Writes { count: usize, first: String },
    #[error(transparent)]
    NotLeading(#[from] NotLeading),
}

impl Failure for CompanionsError {
    fn step(&self) -> &'static str {
        match self {
            CompanionsError::Finalize { .. } => "Finalize",
            CompanionsError::WriteStatus { .. } => "WriteStatus",
            CompanionsError::Writes { .. } => "Writes",
            CompanionsError::NotLeading(_) => "NotLeading",
        }
    }
}

/// The caches every replica keeps.
struct Caches {
    policies: PolicyStores,
    namespaces: NamespaceLabels,
}

/// Runs the loop until `shutdown`. Only the leader watches the kinds its Policies name and
/// writes.
pub async fn run(
    ctx: Arc<CompanionsContext>,
    mut leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let trigger = ctx.trigger.clone();
    let (policies, policies_watch) =
        reflect_policies(&ctx.client, &trigger, &ctx.exception_namespaces);
    let caches = Caches {
        policies,
        namespaces: ctx.namespaces.clone(),
    };
    let watches_task = tokio::spawn(policies_watch);
    let work = async {
        let _ = tokio::join!(
            caches.policies.wait_until_ready(),
            caches.namespaces.wait_until_listed()
        );
        let mut kind = CompanionsKind {
            ctx: &ctx,
            caches,
            trigger: trigger.clone(),
        };
        let pacing = Pacing {
            window: COALESCE,
            resync: RESYNC,
        };
        run_effect(&mut kind, &ctx.loops, &trigger, &mut leader, pacing).await;
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
    watches_task.abort();
}

/// Companion objects as the effects skeleton runs them.
struct CompanionsKind<'a> {
    ctx: &'a CompanionsContext,
    caches: Caches,
    trigger: Arc<Notify>,
}

impl EffectKind for CompanionsKind<'_> {
    /// The term's discovery answers and watches, started by its first pass.
    type Memory = Option<fetch::LeaderState>;
    type Error = CompanionsError;
    const NAME: &'static str = "companions";

    async fn pass(
        &mut self,
        memory: &mut Self::Memory,
        leader: &watch::Receiver<Leadership>,
    ) -> Result<Next, CompanionsError> {
        let state = memory.get_or_insert_with(|| {
            fetch::LeaderState::new(self.ctx.client.clone(), self.trigger.clone())
        });
        pass::run_pass(self.ctx, &self.caches, state, leader).await
    }

    fn not_leading(error: &CompanionsError) -> Option<&NotLeading> {
        match error {
            CompanionsError::NotLeading(e) => Some(e),
            _ => None,
        }
    }
}

/// Whether `policy` has object effects.
fn has_companions(policy: &Policy) -> bool {
    policy.spec.effects.iter().any(|e| e.object.is_some())
}

/// Whether `policy` holds the companions finalizer.
fn holds_finalizer(policy: &Policy) -> bool {
    super::finalizers::holds(policy, COMPANIONS_FINALIZER)
}
