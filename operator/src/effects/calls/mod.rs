//! The calls loop: calls to external systems for the stored objects a Policy selects, after
//! they are stored, keyed by `<object UID>/<Policy UID>/<effect index>`, never at admission.
//!
//! Each pass, on the leader: fetch (the Policies; their triggers discovered and watched; their
//! receivers' clients and tokens) → decide ([`plan::plan`], pure: which calls are due) → apply
//! (an ExternalCall record made before the first Apply, each receiver called within its slots,
//! each answer written to the record; results to the object; gates opened) → finalizers. The
//! records are the loop's memory: a record exists from before its first Apply until its
//! Release was accepted, so a crash, a leader change or Gatehouse being down loses nothing, and
//! a record whose object is gone is released (the orphan sweep).
use crate::policies::{PolicyStores, reflect_policies};
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::Recorder;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio::sync::{Notify, watch};

use super::companions::BlockedPolicies;
use super::effect_loop::{EffectKind, run_effect};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{Failure, Next, NotLeading, Pacing, ReconcileMetrics, Window};
use crate::webhook::NamespaceLabels;
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::call::Action;
use receiver::Answer;

mod fetch;
mod pass;
pub mod plan;
pub mod receiver;
pub mod records;
mod status;
mod writes;
mod written;

/// A burst of triggers is one pass, not a thousand.
const COALESCE: Window = Window {
    quiet: Duration::from_millis(100),
    max: Duration::from_millis(500),
};

/// Level-triggered safety net, and how soon a new kind or a grant is seen.
const RESYNC: Duration = Duration::from_secs(20);

/// What the loop needs, passed explicitly.
pub struct CallsContext {
    pub client: Client,
    /// Gatehouse's namespace, where token Secrets are.
    pub namespace: String,
    pub namespaces: NamespaceLabels,
    /// What wakes the loop: its watches' events and the Namespaces'.
    pub trigger: Arc<Notify>,
    pub blocked: BlockedPolicies,
    pub loops: Arc<ReconcileMetrics>,
    pub metrics: CallsMetrics,
    pub recorder: Recorder,
    /// Calls in flight to one receiver at most (`--calls-per-receiver`).
    pub per_receiver: usize,
    /// The namespaces PolicyExceptions are honoured from: an exempted object gets no call.
    pub exception_namespaces: Vec<String>,
}

/// The labels of `gatehouse_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `Apply` or `Release`.
    pub action: String,
    /// `done`, `retry`, `refused` or `skipped` (not sent: the receiver rests).
    pub answer: String,
}

/// The loop's own metrics (`gatehouse_calls_*`).
pub struct CallsMetrics {
    pub calls: Family<CallLabels, Counter>,
    pub failed_writes: Counter,
}

impl CallsMetrics {
    /// Registers the loop's metrics in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = CallsMetrics {
            calls: Family::default(),
            failed_writes: Counter::default(),
        };
        let calls = registry.sub_registry_with_prefix("calls");
        calls.register(
            "sent",
            "Calls sent to receivers, by action and by what the receiver answered",
            metrics.calls.clone(),
        );
        calls.register(
            "failed_writes",
            "Writes of ExternalCall records, results or gates the API server refused",
            metrics.failed_writes.clone(),
        );
        metrics
    }

    /// Counts one call.
    pub fn count(&self, action: Action, answer: &Answer) {
        let answer = match answer {
            Answer::Done { .. } => "done",
            Answer::Retry(_) => "retry",
            Answer::Refused(_) => "refused",
            Answer::Skipped => "skipped",
        };
        let labels = CallLabels {
            action: format!("{action:?}"),
            answer: answer.to_string(),
        };
        self.calls.get_or_create(&labels).inc();
    }
}

/// Errors of one pass, named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum CallsError {
    #[error("writing the calls finalizer of Policy {policy}: {why}")]
    Finalize { policy: String, why: String },
    #[error("writing the calls status of Policy {policy}: {why}")]
    WriteStatus { policy: String, why: String },
    #[error("{count} writes failed, the first: {first}")]
    Writes { count: usize, first: String },
    #[error(transparent)]
    NotLeading(#[from] NotLeading),
}

impl Failure for CallsError {
    fn step(&self) -> &'static str {
        match self {
            CallsError::Finalize { .. } => "Finalize",
            CallsError::WriteStatus { .. } => "WriteStatus",
            CallsError::Writes { .. } => "Writes",
            CallsError::NotLeading(_) => "NotLeading",
        }
    }
}

/// The caches every replica keeps.
struct Caches {
    policies: PolicyStores,
    records: records::Records,
    namespaces: NamespaceLabels,
}

/// Runs the loop until `shutdown`. Only the leader watches the kinds its Policies name, calls
/// and writes.
pub async fn run(
    ctx: Arc<CallsContext>,
    mut leader: watch::Receiver<Leadership>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let trigger = ctx.trigger.clone();
    let (policies, policies_watch) =
        reflect_policies(&ctx.client, &trigger, &ctx.exception_namespaces);
    let (records, records_watch) = records::watch(ctx.client.clone(), trigger.clone());
    let caches = Caches {
        policies,
        records,
        namespaces: ctx.namespaces.clone(),
    };
    let policies_task = tokio::spawn(policies_watch);
    let records_task = tokio::spawn(records_watch);
    let work = async {
        let _ = tokio::join!(
            caches.policies.wait_until_ready(),
            caches.records.wait_until_listed(),
            caches.namespaces.wait_until_listed()
        );
        let mut kind = CallsKind {
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
    policies_task.abort();
    records_task.abort();
}

/// Calls as the effects skeleton runs them.
struct CallsKind<'a> {
    ctx: &'a CallsContext,
    caches: Caches,
    trigger: Arc<Notify>,
}

impl EffectKind for CallsKind<'_> {
    /// The term's discovery answers, watches and receivers, made by its first pass.
    type Memory = Option<fetch::LeaderState>;
    type Error = CallsError;
    const NAME: &'static str = "calls";

    async fn pass(
        &mut self,
        memory: &mut Self::Memory,
        leader: &watch::Receiver<Leadership>,
    ) -> Result<Next, CallsError> {
        let state = memory.get_or_insert_with(|| {
            fetch::LeaderState::new(
                self.ctx.client.clone(),
                self.trigger.clone(),
                self.ctx.per_receiver,
            )
        });
        pass::run_pass(self.ctx, &self.caches, state, leader).await
    }

    fn not_leading(error: &CallsError) -> Option<&NotLeading> {
        match error {
            CallsError::NotLeading(e) => Some(e),
            _ => None,
        }
    }
}

/// Whether `policy` has call effects.
fn has_calls(policy: &Policy) -> bool {
    policy.spec.effects.iter().any(|e| e.call.is_some())
}

/// Whether `policy` holds the calls finalizer.
fn holds_finalizer(policy: &Policy) -> bool {
    super::finalizers::holds(policy, gatehouse_api::v1alpha1::CALLS_FINALIZER)
}
