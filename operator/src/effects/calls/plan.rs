//! The decide step, pure: from the Policies with call effects, their triggers and the
//! ExternalCall records, which calls to send this pass, which records to make first and which to
//! drop, which Pods leave the calls gate, and when the next call is due.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::records::Record;
use crate::effects::companions::plan::StoredMetadata;
use crate::effects::triggers::{LabelsOf, TriggerObjects, matches_stored};
use crate::effects::watches::StoredJson;
use gatehouse_api::v1alpha1::{CALLS_GATE, CallCounts, CallState, Owner, call_key};
use gatehouse_engine::call::Action;
use gatehouse_engine::policy::CompiledPolicy;

/// How many calls one pass sends at most; the next pass follows at once.
pub const SENDS_PER_PASS: usize = 256;

/// One call effect of a live Policy.
#[derive(Clone, Debug)]
pub struct LiveCall {
    /// Its index in `spec.effects`.
    pub index: usize,
    pub url: String,
    pub gate: bool,
}

/// A live Policy with call effects, ready to plan.
pub struct LivePolicy {
    pub name: String,
    pub uid: String,
    pub generation: i64,
    /// The Policy as the audit matches it.
    pub matcher: CompiledPolicy,
    pub calls: Vec<LiveCall>,
    pub triggers: Vec<TriggerObjects>,
}

/// What the loop knows besides the live Policies.
pub struct World<'a> {
    pub namespaces: LabelsOf<'a>,
    pub records: &'a [Arc<Record>],
    /// UIDs of Policies whose records must not be released this pass: they exist but could not
    /// be planned (a kind not discovered, a watch not listed, a receiver not usable).
    pub unplanned: &'a BTreeSet<String>,
    pub now: DateTime<Utc>,
    /// The Pods of Policies that gated Pods and are going (deleted, or without gating calls
    /// now): a Pod they left at the gate that no live Policy gates is let go.
    pub left_gated: &'a [TriggerObjects],
    /// Whether a Policy that gates Pods could not be planned: then no Pod is let go for want
    /// of a live Policy gating it.
    pub gating_unplanned: bool,
}

/// One call to send.
#[derive(Clone, Debug)]
pub struct Send {
    pub action: Action,
    pub key: String,
    pub policy: String,
    pub policy_uid: String,
    pub effect: usize,
    /// Where it goes: the effect's receiver for Apply, the record's for Release.
    pub url: String,
    pub object: Owner,
    /// The object as stored, when it still is.
    pub snapshot: Option<StoredJson>,
    /// The record, when there is one (none: make it before sending).
    pub record: Option<Arc<Record>>,
}

/// A Pod held at the calls gate whose gating calls were all applied.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Where the gate is in `spec.schedulingGates`.
    pub gate_index: usize,
}

/// What one pass does.
#[derive(Debug, Default)]
pub struct Plan {
    pub send: Vec<Send>,
    /// Records to delete without a call: Apply was refused for good on the first try.
    pub drop: Vec<Arc<Record>>,
    pub ungate: Vec<GatedPod>,
    /// By Policy name.
    pub counts: BTreeMap<String, CallCounts>,
    /// By Policy name: why a trigger could not be judged.
    pub problems: BTreeMap<String, Vec<String>>,
    /// By Policy name: the calls refused for good, and why.
    pub refused: BTreeMap<String, Vec<String>>,
    /// When the first call that is not due yet is.
    pub next: Option<DateTime<Utc>>,
    /// Whether calls beyond [`SENDS_PER_PASS`] wait for the next pass.
    pub more: bool,
}

impl Plan {
    fn push(&mut self, send: Send) {
        if self.send.len() < SENDS_PER_PASS {
            self.send.push(send);
        } else {
            self.more = true;
        }
    }

    fn later(&mut self, at: DateTime<Utc>) {
        self.next = Some(self.next.map_or(at, |next| next.min(at)));
    }
}

/// Whether `record`'s next call is due at `now`; if not, notes when it is.
fn due(record: &Record, now: DateTime<Utc>, plan: &mut Plan) -> bool {
    match record.next_attempt {
        Some(at) if at > now => {
            plan.later(at);
            false
        }
        _ => true,
    }
}

/// Plans one pass.
pub fn plan(policies: &[LivePolicy], world: &World<'_>) -> Plan {
    let mut plan = Plan::default();
    let records: HashMap<&str, &Arc<Record>> =
        world.records.iter().map(|r| (r.key.as_str(), r)).collect();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    let mut stored: HashMap<String, StoredJson> = HashMap::new();
    // By Pod UID: whether every gating call of it is applied.
    let mut gating: HashMap<String, bool> = HashMap::new();
    let mut gated: Vec<(String, GatedPod)> = Vec::new();
    for policy in policies {
        let mut counts = CallCounts::default();
        for triggers in &policy.triggers {
            for text in &triggers.objects {
                let Ok(value) = serde_json::from_str::<Value>(text) else {
                    continue;
                };
                if !value["metadata"]["deletionTimestamp"].is_null() {
                    continue;
                }
                match matches_stored(&triggers.kind, &value, &policy.matcher, world.namespaces) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(why) => {
                        let problems = plan.problems.entry(policy.name.clone()).or_default();
                        problems.push(why);
                        continue;
                    }
                }
                let object = owner_of(&triggers.kind.api_version(), &triggers.kind.kind, &value);
                stored.insert(object.uid.clone(), text.clone());
                let pod = gated_pod(&triggers.kind, &value);
                for call in &policy.calls {
                    let key = call_key(&object.uid, &policy.uid, call.index);
                    let record = records.get(key.as_str()).copied();
                    let applied = record.is_some_and(|r| r.state == CallState::Applied);
                    if call.gate && pod.is_some() {
                        let all = gating.entry(object.uid.clone()).or_insert(true);
                        *all &= applied;
                    }
                    counts.wanted += 1;
                    let send = Send {
                        action: Action::Apply,
                        key: key.clone(),
                        policy: policy.name.clone(),
                        policy_uid: policy.uid.clone(),
                        effect: call.index,
                        url: call.url.clone(),
                        object: object.clone(),
                        snapshot: Some(text.clone()),
                        record: record.cloned(),
                    };
                    wanted.insert(key);
                    apply_step(policy, record, send, world.now, &mut counts, &mut plan);
                }
                if let Some(pod) = pod {
                    gated.push(pod);
                }
            }
        }
        plan.counts.insert(policy.name.clone(), counts);
    }
    if !world.gating_unplanned {
        left_gated(world.left_gated, &mut gating, &mut gated);
    }
    plan.ungate = gated
        .into_iter()
        .filter(|(uid, _)| gating.get(uid).copied().unwrap_or(false))
        .collect::<BTreeMap<_, _>>()
        .into_values()
        .collect();
    release_step(world, &wanted, &stored, &mut plan);
    plan
}

/// Adds the Pods going Policies left at the gate that no live Policy gates, as free to go.
fn left_gated(
    left: &[TriggerObjects],
    gating: &mut HashMap<String, bool>,
    gated: &mut Vec<(String, GatedPod)>,
) {
    for triggers in left {
        for text in &triggers.objects {
            let Ok(value) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if !value["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let pod =
                gated_pod(&triggers.kind, &value).filter(|(uid, _)| !gating.contains_key(uid));
            if let Some((uid, pod)) = pod {
                gating.insert(uid.clone(), true);
                gated.push((uid, pod));
            }
        }
    }
}

/// What a wanted call needs: Apply when it has no record, its record is pending and due, or
/// it was refused for good by an earlier generation of the Policy.
fn apply_step(
    policy: &LivePolicy,
    record: Option<&Arc<Record>>,
    send: Send,
    now: DateTime<Utc>,
    counts: &mut CallCounts,
    plan: &mut Plan,
) {
    let Some(record) = record else {
        plan.push(send);
        return;
    };
    match record.state {
        CallState::Applied => counts.applied += 1,
        CallState::Failed if record.failed_generation == Some(policy.generation) => {
            counts.failed += 1;
            let object = &record.object;
            let why = record.last_error.as_deref().unwrap_or("refused");
            let refused = plan.refused.entry(policy.name.clone()).or_default();
            refused.push(format!(
                "{} {}/{}: {why}",
                object.kind, object.namespace, object.name
            ));
        }
        // Released first; the next pass applies again.
        CallState::Releasing => {
            if due(record, now, plan) {
                plan.push(Send {
                    action: Action::Release,
                    url: record.url.clone(),
                    ..send
                });
            }
        }
        CallState::Pending | CallState::Failed => {
            if due(record, now, plan) {
                plan.push(send);
            }
        }
    }
}

/// Every record no live Policy wants is released, unless its Policy could not be planned;
/// one refused on its only Apply is dropped.
fn release_step(
    world: &World<'_>,
    wanted: &BTreeSet<String>,
    stored: &HashMap<String, StoredJson>,
    plan: &mut Plan,
) {
    for record in world.records {
        if wanted.contains(&record.key) || world.unplanned.contains(&record.policy_uid) {
            continue;
        }
        if record.state == CallState::Failed && record.attempts <= 1 {
            plan.drop.push(record.clone());
            continue;
        }
        if !due(record, world.now, plan) && record.state == CallState::Releasing {
            continue;
        }
        plan.push(Send {
            action: Action::Release,
            key: record.key.clone(),
            policy: record.policy.clone(),
            policy_uid: record.policy_uid.clone(),
            effect: record.effect,
            url: record.url.clone(),
            object: record.object.clone(),
            snapshot: stored.get(&record.object.uid).cloned(),
            record: Some(record.clone()),
        });
    }
}

/// The object a call is for, from its stored JSON.
fn owner_of(api_version: &str, kind: &str, value: &Value) -> Owner {
    let metadata = &value["metadata"];
    let text = |field: &str| metadata[field].as_str().unwrap_or_default().to_string();
    Owner {
        api_version: api_version.to_string(),
        kind: kind.to_string(),
        namespace: text("namespace"),
        name: text("name"),
        uid: text("uid"),
    }
}

/// The Pod `value` with where the calls gate is, if it is a Pod held at it.
fn gated_pod(kind: &crate::audit::judge::AuditedKind, value: &Value) -> Option<(String, GatedPod)> {
    if !(kind.group.is_empty() && kind.kind == "Pod") {
        return None;
    }
    let gates = value["spec"]["schedulingGates"].as_array()?;
    let gate_index = gates.iter().position(|g| g["name"] == CALLS_GATE)?;
    let metadata: StoredMetadata = serde_json::from_value(value["metadata"].clone()).ok()?;
    Some((
        metadata.uid.clone(),
        GatedPod {
            namespace: metadata.namespace.unwrap_or_default(),
            name: metadata.name,
            uid: metadata.uid,
            gate_index,
        },
    ))
}

#[cfg(test)]
mod tests;
