//! The writes of a pass: the configurations (memory, or dry-run to find a refused Policy) and
//! the Policies' status.
use crate::policies::{PolicyObject, event_reference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{debug, warn};

use super::isolate::{DryRun, SearchError};
use super::status::{self, Verdict};
use super::wiring::{self, CONFIGURATION_NAME};
use super::{ControllerContext, LastWrite, LeaderMemory, PolicyCaches, WriteError};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{FIELD_MANAGER, fenced};
use gatehouse_api::v1alpha1::Policy;

pub(super) async fn apply_both(
    ctx: &ControllerContext,
    caches: &PolicyCaches,
    desired: wiring::Desired,
    memory: &mut LeaderMemory,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError> {
    let LeaderMemory {
        mutating,
        validating,
        ..
    } = memory;
    apply_if_changed(ctx, &caches.mutating, desired.mutating, mutating, leader).await?;
    apply_if_changed(
        ctx,
        &caches.validating,
        desired.validating,
        validating,
        leader,
    )
    .await
}

/// Whether the API server would accept both configurations.
pub(super) async fn dry_run_both(
    ctx: &ControllerContext,
    desired: wiring::Desired,
) -> Result<DryRun, WriteError> {
    let mutating = dry_run(ctx, desired.mutating, CONFIGURATION_NAME).await?;
    if mutating != DryRun::Accepted {
        return Ok(mutating);
    }
    dry_run(ctx, desired.validating, CONFIGURATION_NAME).await
}

/// A search that blamed no Policy, as the pass's error.
pub(super) fn search_failed(e: SearchError<WriteError>) -> WriteError {
    match e {
        SearchError::RefusedWithoutCandidates(reason) => {
            WriteError::RefusedWithoutPolicies { reason }
        }
        SearchError::DryRun(e) => e,
    }
}

pub(super) async fn dry_run<K>(
    ctx: &ControllerContext,
    desired: K,
    name: &str,
) -> Result<DryRun, WriteError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let body = apply_body(&desired, None)?;
    let api: Api<K> = Api::all(ctx.client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    match api.patch(name, &params, &Patch::Apply(&body)).await {
        Ok(_) => Ok(DryRun::Accepted),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(DryRun::Refused(e.message)),
        Err(source) => Err(WriteError::DryRunConfiguration {
            kind: kind.to_string(),
            name: name.to_string(),
            source,
        }),
    }
}

/// The server-side apply body of `desired`; with `resource_version`, the API server refuses it
/// (409) unless the stored object is still at that version.
pub(super) fn apply_body<K>(
    desired: &K,
    resource_version: Option<&str>,
) -> Result<serde_json::Value, WriteError>
where
    K: Resource<DynamicType = ()> + Serialize,
{
    let mut body = serde_json::to_value(desired).map_err(|source| WriteError::Serialize {
        what: "webhook configuration",
        source,
    })?;
    body["apiVersion"] = K::api_version(&()).into_owned().into();
    body["kind"] = K::kind(&()).into_owned().into();
    if let Some(rv) = resource_version {
        body["metadata"]["resourceVersion"] = rv.into();
    }
    Ok(body)
}

pub(super) async fn apply_if_changed<K>(
    ctx: &ControllerContext,
    live: &Store<K>,
    desired: K,
    last: &mut Option<LastWrite>,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&());
    let desired_json = serde_json::to_value(&desired).map_err(|source| WriteError::Serialize {
        what: "webhook configuration",
        source,
    })?;
    let live_rv = live
        .state()
        .into_iter()
        .find(|o| o.meta().name.as_deref() == Some(CONFIGURATION_NAME))
        .and_then(|o| o.meta().resource_version.clone());
    if let Some(written) = last.as_ref() {
        // Our own last write is still what is stored: nothing drifted, nothing to do.
        if written.body == desired_json && live_rv.is_some() && live_rv == written.resource_version
        {
            return Ok(());
        }
    }
    let api: Api<K> = Api::all(ctx.client.clone());
    let body = apply_body(&desired, live_rv.as_deref())?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let result = fenced(
        leader,
        || format!("{kind}/{CONFIGURATION_NAME}"),
        api.patch(CONFIGURATION_NAME, &params, &Patch::Apply(&body)),
    )
    .await?
    .map_err(|source| WriteError::ApplyConfiguration {
        kind: kind.to_string(),
        name: CONFIGURATION_NAME.to_string(),
        source,
    })?;
    ctx.configuration_writes.inc();
    let rv = result.meta().resource_version.clone();
    debug!(%kind, ?rv, "memory");
    *last = Some(LastWrite {
        body: desired_json,
        resource_version: rv,
    });
    Ok(())
}

pub(super) async fn write_status(
    ctx: &ControllerContext,
    policy: &Policy,
    outcome: &Verdict,
    now: Time,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), WriteError> {
    let Some(status) = status::desired_status(policy, outcome, now) else {
        return Ok(());
    };
    let name = policy.name_any();
    let object = PolicyObject::of(&ctx.client, policy);
    // The precondition fences a write that outlives our term, and skips a Policy that changed
    // since we read it (its watch event brings the next pass).
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": policy.metadata.resource_version},
        "status": status,
    });
    let written = fenced(
        leader,
        || format!("status of {}", object.source()),
        object.patch_status(&patch),
    )
    .await?;
    match written {
        Ok(_) => {}
        // Deleted or changed meanwhile: nothing to report on this version.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(source) => return Err(WriteError::WriteStatus { name, source }),
    }
    let (reason, note) = match outcome {
        Verdict::Wired { .. } | Verdict::InProcess { .. } | Verdict::EffectsOnly => return Ok(()),
        Verdict::Invalid(problems) => (status::REASON_INVALID, problems.join("; ")),
        Verdict::NotInProcess(reason) => (status::REASON_NOT_IN_PROCESS, reason.clone()),
        Verdict::Rejected(message) => (status::REASON_REJECTED, message.clone()),
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Validate".into(),
        secondary: None,
    };
    // An Event is a courtesy; failing to record one must not fail the reconcile.
    if let Err(e) = ctx.recorder.publish(&event, &event_reference(policy)).await {
        warn!(policy = %name, error = %e, "recording event failed");
    }
    Ok(())
}
