//! The apply step's writes: records made, their status after each call, records deleted,
//! results written to the objects, gates opened, the finalizer, Events. Every write is fenced
//! by the leader's term.
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions};
use kube::core::ApiResource;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::warn;

use super::plan::{GatedPod, Send};
use super::{CallsContext, CallsError};
use crate::effects::finalizers;
use crate::effects::gates::{self, AtGate};
use crate::effects::settled::settled;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::fenced;
use gatehouse_api::v1alpha1::{
    CALL_OBJECT_LABEL, CALL_POLICY_LABEL, CALLS_FINALIZER, CALLS_GATE, ExternalCall, Policy,
    call_record_name,
};
use k8s_openapi::api::core::v1::ObjectReference;

/// Makes the record of `send` before its first Apply; one that exists already is fine.
pub async fn create_record(
    ctx: &CallsContext,
    send: &Send,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CallsError> {
    let name = call_record_name(&send.key);
    let record: ExternalCall = serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1",
        "kind": "ExternalCall",
        "metadata": {
            "name": name,
            "labels": {CALL_POLICY_LABEL: send.policy_uid, CALL_OBJECT_LABEL: send.object.uid},
        },
        "spec": {
            "key": send.key,
            "policy": send.policy,
            "effect": send.effect,
            "url": send.url,
            "object": send.object,
        },
    }))
    .map_err(|e| CallsError::Writes {
        count: 1,
        first: e.to_string(),
    })?;
    let api: Api<ExternalCall> = Api::all(ctx.client.clone());
    let created = fenced(
        leader,
        || format!("making ExternalCall {name}"),
        api.create(&PostParams::default(), &record),
    )
    .await?;
    Ok(settled(created, &[409]))
}

/// Merges `status` into record `name`'s status.
pub async fn write_status(
    ctx: &CallsContext,
    name: &str,
    status: Value,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CallsError> {
    let api: Api<ExternalCall> = Api::all(ctx.client.clone());
    let patch = json!({"status": status});
    let written = fenced(
        leader,
        || format!("status of ExternalCall {name}"),
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    Ok(settled(written, &[404]))
}

/// Deletes a record, only while it is the one with its UID (a released call's, or one refused
/// for good on its only Apply).
pub async fn delete_record(
    ctx: &CallsContext,
    name: &str,
    uid: Option<&str>,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CallsError> {
    let api: Api<ExternalCall> = Api::all(ctx.client.clone());
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let deleted = fenced(
        leader,
        || format!("deleting ExternalCall {name}"),
        api.delete(name, &params),
    )
    .await?;
    Ok(settled(deleted, &[404, 409]))
}

/// Writes the receiver's result to `annotation` of the object, only while it is the object the
/// call was for.
pub async fn annotate(
    ctx: &CallsContext,
    resource: &ApiResource,
    send: &Send,
    annotation: &str,
    result: &str,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CallsError> {
    let object = &send.object;
    let api: Api<DynamicObject> = if object.namespace.is_empty() {
        Api::all_with(ctx.client.clone(), resource)
    } else {
        Api::namespaced_with(ctx.client.clone(), &object.namespace, resource)
    };
    let patch = json!({"metadata": {"uid": object.uid, "annotations": {annotation: result}}});
    let written = fenced(
        leader,
        || format!("result of {} on {} {}", send.key, object.kind, object.name),
        api.patch(&object.name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await?;
    Ok(settled(written, &[404, 409]))
}

/// Removes the gate from a Pod whose effects are in place.
pub async fn ungate(
    ctx: &CallsContext,
    pod: &GatedPod,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CallsError> {
    let at_gate = AtGate {
        namespace: &pod.namespace,
        name: &pod.name,
        uid: &pod.uid,
        index: pod.gate_index,
        gate: CALLS_GATE,
    };
    Ok(gates::open(&ctx.client, at_gate, leader).await?)
}

/// Adds (`hold`) or removes the calls finalizer of `policy`.
pub async fn set_finalizer(
    ctx: &CallsContext,
    policy: &Policy,
    hold: bool,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CallsError> {
    finalizers::set(&ctx.client, policy, CALLS_FINALIZER, hold, leader)
        .await?
        .map_err(|e| CallsError::Finalize {
            policy: policy.name_any(),
            why: e.to_string(),
        })
}

/// A Warning Event on the object a call is for, and on its Policy, saying the receiver
/// refused it for good: an Event is a courtesy, failing to record one fails nothing.
pub async fn publish_refused(ctx: &CallsContext, send: &Send, why: &str) {
    let note = format!("{:?} of {} refused: {why}", send.action, send.key);
    let event = Event {
        type_: EventType::Warning,
        reason: "CallRefused".into(),
        note: Some(note.chars().take(1000).collect()),
        action: format!("{:?}", send.action),
        secondary: None,
    };
    let object = &send.object;
    let reference = ObjectReference {
        api_version: Some(object.api_version.clone()),
        kind: Some(object.kind.clone()),
        namespace: (!object.namespace.is_empty()).then(|| object.namespace.clone()),
        name: Some(object.name.clone()),
        uid: Some(object.uid.clone()),
        ..Default::default()
    };
    let policy = policy_reference(&send.policy, &send.policy_uid);
    for target in [reference, policy] {
        if let Err(e) = ctx.recorder.publish(&event, &target).await {
            warn!(key = %send.key, error = %e, "recording event failed");
        }
    }
}

/// A reference to Policy `name` for an Event.
fn policy_reference(name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(Policy::api_version(&()).to_string()),
        kind: Some(Policy::kind(&()).to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}
