//! The Policy controller: fetch → validate (pure) → build desired configurations (pure) →
//! server-side apply → status. One coalescing loop owns both webhook configurations, so a burst
//! of Policy changes costs a handful of writes, not one per Policy.
pub mod lease;
pub mod status;
pub mod wiring;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, watch};
use tracing::{Instrument, debug, info, info_span, warn};

use crate::api::v1alpha1::Policy;
use crate::engine;
use crate::telemetry::{Metrics, ReconcileLabels};
use crate::webhook::PolicyStore;
use status::Outcome;
use wiring::{CONFIGURATION_NAME, Wiring};

/// The one field manager of every write Gatehouse makes.
pub const FIELD_MANAGER: &str = "gatehouse";

/// A burst of changes is collected until it has been quiet this long...
const QUIET: Duration = Duration::from_millis(500);
/// ...but never longer than this, so a steady trickle still gets wired.
const MAX_COALESCE: Duration = Duration::from_secs(3);
/// Level-triggered safety net in case a watch event was missed.
const RESYNC: Duration = Duration::from_secs(60);

/// Errors of one reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("applying {kind}/{name}: {source}")]
    ApplyConfiguration {
        kind: String,
        name: String,
        source: kube::Error,
    },
    #[error("writing status of Policy {name}: {source}")]
    WriteStatus { name: String, source: kube::Error },
    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        source: serde_json::Error,
    },
}

/// Readiness of the whole process, as `/readyz` reports it.
#[derive(Default)]
pub struct Readiness {
    pub caches_synced: AtomicBool,
    pub certificate_loaded: AtomicBool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.caches_synced.load(Ordering::Acquire)
            && self.certificate_loaded.load(Ordering::Acquire)
    }
}

/// Everything the controller needs, passed explicitly.
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub policies: Arc<PolicyStore>,
    pub wiring: Wiring,
    pub readiness: Arc<Readiness>,
    pub recorder: Recorder,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        policies: Arc<PolicyStore>,
        wiring: Wiring,
        readiness: Arc<Readiness>,
    ) -> Self {
        let reporter = Reporter {
            controller: "gatehouse".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            metrics,
            policies,
            wiring,
            readiness,
            recorder,
        }
    }
}

/// What the loop remembers of its own last write, to tell drift from its own echo.
#[derive(Default)]
struct Applied {
    mutating: Option<(serde_json::Value, Option<String>)>,
    validating: Option<(serde_json::Value, Option<String>)>,
}

/// Runs the controller until `shutdown` fires. `ca_bundle` carries the PEM bundle the TLS manager
/// publishes; nothing is written before the caches are synced and a bundle is known, so a
/// half-started operator never empties the cluster's configurations. Every replica compiles
/// Policies for its own webhook server; only the one `leader` says leads writes anything.
pub async fn run(
    ctx: Arc<Context>,
    mut ca_bundle: watch::Receiver<Option<String>>,
    mut leader: watch::Receiver<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let trigger = Arc::new(Notify::new());
    let (policies, policy_watch) = reflect::<Policy>(ctx.client.clone(), None, trigger.clone());
    let by_name = format!("metadata.name={CONFIGURATION_NAME}");
    let (mutating, mutating_watch) = reflect::<MutatingWebhookConfiguration>(
        ctx.client.clone(),
        Some(by_name.clone()),
        trigger.clone(),
    );
    let (validating, validating_watch) = reflect::<ValidatingWebhookConfiguration>(
        ctx.client.clone(),
        Some(by_name.clone()),
        trigger.clone(),
    );
    let watches = tokio::spawn(async move {
        tokio::join!(policy_watch, mutating_watch, validating_watch);
    });

    let work = async {
        // Ready means: every cache listed once and a certificate to put in caBundle.
        let synced = async {
            let _ = tokio::join!(
                policies.wait_until_ready(),
                mutating.wait_until_ready(),
                validating.wait_until_ready()
            );
        };
        synced.await;
        let bundle_known = ca_bundle.wait_for(|b| b.is_some()).await.is_ok();
        if !bundle_known {
            return;
        }
        ctx.readiness.caches_synced.store(true, Ordering::Release);
        info!("caches synced and certificate known; reconciling");

        let mut applied = Applied::default();
        loop {
            let bundle = ca_bundle.borrow_and_update().clone().unwrap_or_default();
            let leading = *leader.borrow_and_update();
            let started = Instant::now();
            let labels = ReconcileLabels {
                controller: "webhook-configurations".into(),
            };
            let span = info_span!("reconcile", controller = "webhook-configurations");
            let result = reconcile_all(
                &ctx,
                &policies,
                &mutating,
                &validating,
                &bundle,
                leading,
                &mut applied,
            )
            .instrument(span)
            .await;
            ctx.metrics.reconcile_runs.get_or_create(&labels).inc();
            ctx.metrics
                .reconcile_duration
                .get_or_create(&labels)
                .observe(started.elapsed().as_secs_f64());
            let retry = match result {
                Ok(()) => RESYNC,
                Err(e) => {
                    ctx.metrics.reconcile_failures.get_or_create(&labels).inc();
                    warn!(error = %e, "reconcile failed; retrying");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                () = trigger.notified() => {}
                changed = ca_bundle.changed() => if changed.is_err() { return; },
                changed = leader.changed() => if changed.is_err() { return; },
                () = tokio::time::sleep(retry) => {}
            }
            coalesce(&trigger).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = shutdown => {}
    }
    watches.abort();
}

/// Waits until no trigger arrived for `QUIET`, or `MAX_COALESCE` passed.
async fn coalesce(trigger: &Notify) {
    let deadline = tokio::time::Instant::now() + MAX_COALESCE;
    loop {
        let quiet = tokio::time::sleep(QUIET);
        tokio::select! {
            () = trigger.notified() => {
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
            }
            () = quiet => return,
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// A reflector of `K` (optionally one object by field selector) that pokes `trigger` on every
/// change. Returns the store and the future driving the watch.
fn reflect<K>(
    client: Client,
    fields: Option<String>,
    trigger: Arc<Notify>,
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + use<K>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let mut config = watcher::Config::default();
    if let Some(fields) = fields {
        config = config.fields(&fields);
    }
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
    let kind = K::kind(&()).to_string();
    let fut = async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(_event)) => trigger.notify_one(),
                Ok(None) => return,
                Err(e) => warn!(%kind, error = %e, "watch failed; backing off"),
            }
        }
    };
    (store, fut)
}

async fn reconcile_all(
    ctx: &Context,
    policies: &Store<Policy>,
    mutating: &Store<MutatingWebhookConfiguration>,
    validating: &Store<ValidatingWebhookConfiguration>,
    bundle: &str,
    leading: bool,
    applied: &mut Applied,
) -> Result<(), ReconcileError> {
    let all = policies.state();
    let mut outcomes: Vec<(Arc<Policy>, Outcome)> = Vec::with_capacity(all.len());
    let mut valid: Vec<Arc<Policy>> = Vec::new();
    for policy in &all {
        // The server's store is the cache: CEL is compiled once per spec, not once per pass.
        let served = ctx
            .policies
            .get(&policy.name_any())
            .is_some_and(|c| c.spec() == &policy.spec);
        let result = if served {
            Ok(())
        } else {
            // Serve it before the API server is told about it.
            engine::compile(policy).map(|c| ctx.policies.upsert(Arc::new(c)))
        };
        match result {
            Ok(()) => {
                valid.push(policy.clone());
                outcomes.push((policy.clone(), Outcome::Wired));
            }
            Err(invalid) => {
                let problems = invalid.problems.iter().map(|p| p.to_string()).collect();
                outcomes.push((policy.clone(), Outcome::Invalid(problems)));
            }
        }
    }

    if leading {
        let refs: Vec<&Policy> = valid.iter().map(|p| p.as_ref()).collect();
        let desired = wiring::desired(&refs, &ctx.wiring, bundle);
        apply_if_changed(ctx, mutating, desired.mutating, &mut applied.mutating).await?;
        apply_if_changed(ctx, validating, desired.validating, &mut applied.validating).await?;
    } else {
        // A new leader must not trust what an earlier term remembered.
        *applied = Applied::default();
    }

    // Only now that the API server no longer calls them may the server forget them.
    let keep: HashSet<String> = valid.iter().map(|p| p.name_any()).collect();
    for name in ctx.policies.names() {
        if !keep.contains(&name) {
            ctx.policies.retire(&name);
        }
    }

    if !leading {
        return Ok(());
    }
    let now = Time(Timestamp::now());
    for (policy, outcome) in outcomes {
        write_status(ctx, &policy, &outcome, now.clone()).await?;
    }
    Ok(())
}

async fn apply_if_changed<K>(
    ctx: &Context,
    live: &Store<K>,
    desired: K,
    last: &mut Option<(serde_json::Value, Option<String>)>,
) -> Result<(), ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let desired_json =
        serde_json::to_value(&desired).map_err(|source| ReconcileError::Serialize {
            what: "webhook configuration",
            source,
        })?;
    let live_rv = live
        .state()
        .into_iter()
        .find(|o| o.meta().name.as_deref() == Some(CONFIGURATION_NAME))
        .and_then(|o| o.meta().resource_version.clone());
    if let Some((json, rv)) = last.as_ref() {
        // Our own last write is still what is stored: nothing drifted, nothing to do.
        if json == &desired_json && live_rv.is_some() && &live_rv == rv {
            return Ok(());
        }
    }
    let api: Api<K> = Api::all(ctx.client.clone());
    let mut body = desired_json.clone();
    body["apiVersion"] = K::api_version(&()).into_owned().into();
    body["kind"] = kind.clone().into_owned().into();
    let result = api
        .patch(
            CONFIGURATION_NAME,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| ReconcileError::ApplyConfiguration {
            kind: kind.to_string(),
            name: CONFIGURATION_NAME.to_string(),
            source,
        })?;
    ctx.metrics.webhook_config_writes.inc();
    let rv = result.meta().resource_version.clone();
    debug!(%kind, ?rv, "applied");
    *last = Some((desired_json, rv));
    Ok(())
}

async fn write_status(
    ctx: &Context,
    policy: &Policy,
    outcome: &Outcome,
    now: Time,
) -> Result<(), ReconcileError> {
    let Some(status) = status::desired_status(policy, outcome, now) else {
        return Ok(());
    };
    let name = policy.name_any();
    let api: Api<Policy> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({ "status": status });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {}
        // Deleted meanwhile: nothing left to report on.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(source) => return Err(ReconcileError::WriteStatus { name, source }),
    }
    if let Outcome::Invalid(problems) = outcome {
        let note: String = problems.join("; ").chars().take(1000).collect();
        let event = Event {
            type_: EventType::Warning,
            reason: status::REASON_INVALID.into(),
            note: Some(note),
            action: "Validate".into(),
            secondary: None,
        };
        // An Event is a courtesy; failing to record one must not fail the reconcile.
        if let Err(e) = ctx.recorder.publish(&event, &policy.object_ref(&())).await {
            warn!(policy = %name, error = %e, "recording event failed");
        }
    }
    Ok(())
}
