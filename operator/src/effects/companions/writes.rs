//! The apply step: server-side apply of companions under Gatehouse's field manager, deletes
//! and releases guarded by the companion's UID, the Policies' finalizers and statuses.
use crate::policies::{PolicyObject, event_reference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;
use tracing::warn;

use super::plan::{Collected, CompanionKey, GatedPod};
use super::{CompanionsContext, CompanionsError};
use crate::effects::condition::{Said, first_five, replaced};
use crate::effects::finalizers;
use crate::effects::gates::{self, AtGate};
use crate::effects::settled::{reason, settled};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{FIELD_MANAGER, fenced};
use gatehouse_api::v1alpha1::{
    COMPANION_POLICY_LABEL, COMPANION_TRIGGER_LABEL, COMPANIONS_CONDITION, COMPANIONS_FINALIZER,
    COMPANIONS_GATE, CompanionCounts, Policy,
};
use kube::core::ApiResource;

fn api(
    ctx: &CompanionsContext,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, resource),
        None => Api::all_with(ctx.client.clone(), resource),
    }
}

/// Server-side applies `object` at `key`, taking over fields another manager set (a hand edit
/// of a field Gatehouse sets is reverted; fields only others set are kept). `Err` with the API
/// server's reason.
pub async fn apply(
    ctx: &CompanionsContext,
    resource: &ApiResource,
    key: &CompanionKey,
    object: &serde_json::Value,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CompanionsError> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let written = fenced(
        leader,
        || format!("applying {key}"),
        api(ctx, resource, key.namespace.as_deref()).patch(
            &key.name,
            &params,
            &Patch::Apply(object),
        ),
    )
    .await?;
    Ok(written.map(|_| ()).map_err(|e| reason(&e)))
}

/// Deletes a stored companion, only if it is still the object with its UID.
pub async fn delete(
    ctx: &CompanionsContext,
    resource: &ApiResource,
    stored: &Collected,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CompanionsError> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(stored.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    let key = &stored.key;
    let deleted = fenced(
        leader,
        || format!("deleting {key}"),
        api(ctx, resource, key.namespace.as_deref()).delete(&key.name, &params),
    )
    .await?;
    // Gone already, or another object by now: nothing of ours to delete.
    Ok(settled(deleted, &[404, 409]))
}

/// Removes Gatehouse's labels from a companion a deleted Policy keeps: nothing collects it
/// after.
pub async fn release(
    ctx: &CompanionsContext,
    resource: &ApiResource,
    stored: &Collected,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CompanionsError> {
    let key = &stored.key;
    let patch = json!({"metadata": {
        "uid": stored.uid,
        "labels": {COMPANION_POLICY_LABEL: null, COMPANION_TRIGGER_LABEL: null},
    }});
    let released = fenced(
        leader,
        || format!("releasing {key}"),
        api(ctx, resource, key.namespace.as_deref()).patch(
            &key.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        ),
    )
    .await?;
    Ok(settled(released, &[404, 409]))
}

/// Removes the gate from a Pod whose effects are in place.
pub async fn ungate(
    ctx: &CompanionsContext,
    pod: &GatedPod,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<(), String>, CompanionsError> {
    let at_gate = AtGate {
        namespace: &pod.namespace,
        name: &pod.name,
        uid: &pod.uid,
        index: pod.gate_index,
        gate: COMPANIONS_GATE,
    };
    Ok(gates::open(&ctx.client, at_gate, leader).await?)
}

/// Adds (`hold`) or removes the companions finalizer of `policy`.
pub async fn set_finalizer(
    ctx: &CompanionsContext,
    policy: &Policy,
    hold: bool,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CompanionsError> {
    finalizers::set(&ctx.client, policy, COMPANIONS_FINALIZER, hold, leader)
        .await?
        .map_err(|source| CompanionsError::Finalize {
            policy: policy.name_any(),
            source,
        })
}

/// What a pass found of one Policy's companions.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub counts: CompanionCounts,
    /// Why companions are missing, if any are.
    pub problems: Vec<String>,
}

/// Writes `status.companions` and the `CompanionsInPlace` condition when they changed, under
/// the Policy's resourceVersion (the conditions are one list shared with the controller).
pub async fn write_status(
    ctx: &CompanionsContext,
    policy: &Policy,
    outcome: &Outcome,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CompanionsError> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let Some(conditions) = companions_conditions(policy, outcome, now) else {
        return Ok(());
    };
    let in_place = conditions
        .last()
        .is_some_and(|c| c.type_ == COMPANIONS_CONDITION && c.status == "True");
    let name = policy.name_any();
    let patch = json!({
        "metadata": {"resourceVersion": policy.resource_version()},
        "status": {"conditions": conditions, "companions": &outcome.counts},
    });
    let object = PolicyObject::of(&ctx.client, policy);
    let written = fenced(
        leader,
        || format!("companions status of {}", object.source()),
        object.patch_status(&patch),
    )
    .await?;
    match written {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(source) => {
            return Err(CompanionsError::WriteStatus {
                policy: name,
                source,
            });
        }
    }
    if !in_place {
        publish_not_in_place(ctx, policy, &outcome.problems).await;
    }
    Ok(())
}

/// The Policy's conditions with `CompanionsInPlace` saying what `outcome` does (last), or
/// `None` when its status says so already (an unchanged Policy costs no write).
/// `lastTransitionTime` moves only when the condition's status flips.
fn companions_conditions(policy: &Policy, outcome: &Outcome, now: Time) -> Option<Vec<Condition>> {
    let status = policy.status.clone().unwrap_or_default();
    let said = if outcome.problems.is_empty() {
        let counts = &outcome.counts;
        Said {
            type_: COMPANIONS_CONDITION,
            status: "True",
            reason: "InPlace",
            message: format!(
                "{} of {} companions in place",
                counts.in_place, counts.wanted
            ),
        }
    } else {
        Said {
            type_: COMPANIONS_CONDITION,
            status: "False",
            reason: "NotWritten",
            message: first_five(&outcome.problems),
        }
    };
    let unchanged = status.companions.as_ref() == Some(&outcome.counts);
    replaced(
        &status.conditions,
        said,
        policy.meta().generation,
        unchanged,
        now,
    )
}

/// A Warning Event on `policy` naming what cannot be written, when its condition turns or
/// changes: an Event is a courtesy, failing to record one fails nothing.
async fn publish_not_in_place(ctx: &CompanionsContext, policy: &Policy, problems: &[String]) {
    let event = Event {
        type_: EventType::Warning,
        reason: "CompanionsNotInPlace".into(),
        note: Some(problems.join("; ").chars().take(1000).collect()),
        action: "Apply".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &event_reference(policy)).await {
        warn!(policy = %policy.name_any(), error = %e, "recording event failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::{PolicySpec, PolicyStatus};
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn outcome(wanted: i64, in_place: i64, problems: &[&str]) -> Outcome {
        Outcome {
            counts: CompanionCounts {
                wanted,
                in_place,
                kinds: Vec::new(),
            },
            problems: problems.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn the_condition_is_written_when_it_changes_and_keeps_the_others() {
        let mut policy = Policy::new("p", PolicySpec::default());
        policy.metadata.generation = Some(2);
        let ready = Condition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: "EffectsOnly".into(),
            message: String::new(),
            observed_generation: Some(2),
            last_transition_time: at(1),
        };
        policy.status = Some(PolicyStatus {
            conditions: vec![ready.clone()],
            ..Default::default()
        });
        let first = companions_conditions(
            &policy,
            &outcome(2, 1, &["ConfigMap a/b: forbidden"]),
            at(10),
        )
        .unwrap();
        assert_eq!(first[0], ready);
        assert_eq!(
            (
                first[1].status.as_str(),
                first[1].last_transition_time.clone()
            ),
            ("False", at(10))
        );
        policy.status.as_mut().unwrap().conditions = first;
        policy.status.as_mut().unwrap().companions = Some(CompanionCounts {
            wanted: 2,
            in_place: 1,
            kinds: Vec::new(),
        });
        assert_eq!(
            companions_conditions(
                &policy,
                &outcome(2, 1, &["ConfigMap a/b: forbidden"]),
                at(20)
            ),
            None,
            "unchanged: no write"
        );
        let healed = companions_conditions(&policy, &outcome(2, 2, &[]), at(30)).unwrap();
        assert_eq!(
            (healed[1].status.as_str(), healed[1].message.as_str()),
            ("True", "2 of 2 companions in place")
        );
        assert_eq!(healed[1].last_transition_time, at(30));
        let many: Vec<String> = (0..7).map(|i| format!("p{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let capped = companions_conditions(&policy, &outcome(7, 0, &many), at(40)).unwrap();
        assert_eq!(capped[1].message, "p0; p1; p2; p3; p4; and 2 more");
    }
}
