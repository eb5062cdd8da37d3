//! The decide step, pure: from the Policies, their triggers and the companions stored, the
//! companions to apply, to delete and to release, with each Policy's counts and problems.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use crate::effects::watches::StoredJson;

use crate::effects::triggers::matches_stored;
use gatehouse_api::v1alpha1::{COMPANION_POLICY_LABEL, COMPANION_TRIGGER_LABEL, COMPANIONS_GATE};
use gatehouse_engine::companion::{self, CompiledObjectEffect, RenderInput, Trigger};
use gatehouse_engine::policy::CompiledPolicy;

/// Where a companion is: its kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CompanionKey {
    pub api_version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl CompanionKey {
    /// The key of a rendered or stored companion of `api_version`/`kind`.
    pub fn of(api_version: &str, kind: &str, object: &Value) -> Self {
        let metadata = &object["metadata"];
        CompanionKey {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            namespace: metadata["namespace"].as_str().map(str::to_string),
            name: metadata["name"].as_str().unwrap_or_default().to_string(),
        }
    }
}

impl std::fmt::Display for CompanionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// One object effect of a Policy, with what discovery and the caches said of it.
pub struct PreparedEffect {
    /// Its index in `spec.effects`.
    pub index: usize,
    pub compiled: CompiledObjectEffect,
    /// Whether the companion's kind is namespaced.
    pub namespaced: bool,
    /// The clone source as stored, for an effect with `cloneFrom`.
    pub clone_source: Option<Value>,
}

/// A live Policy with object effects, ready to plan.
pub struct LivePolicy {
    pub name: String,
    pub uid: String,
    /// The Policy as the audit matches it (stored objects as UPDATEs onto themselves).
    pub matcher: CompiledPolicy,
    pub effects: Vec<PreparedEffect>,
    pub triggers: Vec<TriggerObjects>,
}

/// A stored companion: its key and its text, shared with its watch's table. What its metadata
/// says of where it comes from is read only when a pass needs it ([`Self::provenance`]).
#[derive(Clone, Debug)]
pub struct StoredCompanion {
    pub key: CompanionKey,
    pub json: StoredJson,
}

/// Where a stored companion comes from, as its metadata says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Provenance {
    pub uid: String,
    /// The UID of its Policy (label `gatehouse.dev/companion-of-policy`).
    pub policy_uid: String,
    /// The UID of the object it was made for (label `gatehouse.dev/companion-of`).
    pub trigger_uid: String,
}

/// A stored companion to delete or release, only while it is the object with `uid`.
#[derive(Clone, Debug)]
pub struct Collected {
    pub key: CompanionKey,
    pub uid: String,
}

impl StoredCompanion {
    /// Its UID and labels, parsed from its text.
    pub fn provenance(&self) -> Provenance {
        let Ok(Labelled { metadata }) = serde_json::from_str::<Labelled>(&self.json) else {
            return Provenance::default();
        };
        let label = |name: &str| metadata.labels.get(name).cloned().unwrap_or_default();
        Provenance {
            policy_uid: label(COMPANION_POLICY_LABEL),
            trigger_uid: label(COMPANION_TRIGGER_LABEL),
            uid: metadata.uid,
        }
    }

    /// Whether it holds everything `desired` says ([`companion::in_place`]); apiVersion and
    /// kind are the key's, and a listed object's text may lack them.
    fn holds(&self, desired: &Value) -> bool {
        let (Some(fields), Ok(Value::Object(stored))) = (
            desired.as_object(),
            serde_json::from_str::<Value>(&self.json),
        ) else {
            return false;
        };
        fields.iter().all(|(field, value)| match field.as_str() {
            "apiVersion" | "kind" => true,
            _ => stored
                .get(field)
                .is_some_and(|stored| companion::in_place(value, stored)),
        })
    }
}

/// What [`StoredCompanion::provenance`] reads of a companion's text.
#[derive(serde::Deserialize)]
struct Labelled {
    metadata: StoredMetadata,
}

pub use crate::effects::triggers::{LabelsOf, TriggerObjects};

/// What the loop knows besides the live Policies.
pub struct World<'a> {
    /// Labels of every Namespace, by name.
    pub namespaces: LabelsOf<'a>,
    /// Every stored companion of every kind a Policy names.
    pub stored: &'a [StoredCompanion],
    /// UIDs of the Policies being deleted, with the kinds (`apiVersion`, `kind`) whose
    /// companions they keep (`keepOnPolicyDelete`).
    pub deleting: &'a HashMap<String, BTreeSet<(String, String)>>,
    /// UIDs of Policies whose companions must not be collected this pass: they exist but could
    /// not be planned in full (a kind not discovered, a cache not synced).
    pub unplanned: &'a BTreeSet<String>,
    /// Whether a Policy that gates Pods could not be planned: then no Pod leaves the gate, as
    /// its companions are not known.
    pub gating_unplanned: bool,
    /// The Pods of going Policies that may have gated them ([`gated_pods`] lets go of those no
    /// live Policy holds).
    pub left_gated: &'a [TriggerObjects],
}

/// A companion to server-side apply.
#[derive(Clone, Debug)]
pub struct Desired {
    pub key: CompanionKey,
    pub policy: String,
    /// The UID of the object it is made for.
    pub trigger: String,
    pub object: Value,
}

/// A Pod held at the companions gate, and the companions not in place before this pass.
#[derive(Clone, Debug, PartialEq)]
pub struct GatedPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Where the gate is in `spec.schedulingGates`.
    pub gate_index: usize,
    pub waiting_for: Vec<CompanionKey>,
}

/// What one pass does, and what it makes of each Policy.
#[derive(Debug, Default)]
pub struct Plan {
    pub apply: Vec<Desired>,
    pub delete: Vec<Collected>,
    /// Companions left in place for a deleted Policy with `keepOnPolicyDelete`: their labels
    /// are removed, so no later pass collects them.
    pub release: Vec<Collected>,
    /// By Policy name: companions wanted, and in place before this pass.
    pub counts: BTreeMap<String, (i64, i64)>,
    /// By Policy name: why a companion could not be rendered.
    pub problems: BTreeMap<String, Vec<String>>,
    /// Pods at the companions gate whose companions are all known.
    pub gated: Vec<GatedPod>,
    /// Whether companions beyond [`APPLIES_PER_PASS`] wait for the next pass.
    pub more: bool,
}

/// How many companions one pass applies at most: what a pass holds rendered at once, and so
/// the loop's memory, stays bounded however many triggers arrive together. The next pass
/// follows at once.
pub const APPLIES_PER_PASS: usize = 1000;

/// Plans one pass.
pub fn plan(policies: &[LivePolicy], world: &World<'_>) -> Plan {
    let mut plan = Plan::default();
    let stored: HashMap<&CompanionKey, &StoredCompanion> =
        world.stored.iter().map(|s| (&s.key, s)).collect();
    let mut wanted: HashMap<CompanionKey, &str> = HashMap::new();
    // Companions of a trigger whose rendering failed stay as they are.
    let mut held: BTreeSet<(String, String)> = BTreeSet::new();
    let mut waiting: BTreeMap<String, Vec<CompanionKey>> = BTreeMap::new();
    let mut problems = BTreeMap::new();
    for policy in policies {
        let mut counts = (0, 0);
        let mut duplicates = Vec::new();
        let mut each = |desired: Desired| {
            if let Some(owner) = wanted.get(&desired.key) {
                duplicates.push(format!(
                    "{} is wanted by Policy {owner} already; names of companions must differ",
                    desired.key
                ));
                return;
            }
            counts.0 += 1;
            if stored
                .get(&desired.key)
                .is_some_and(|s| s.holds(&desired.object))
            {
                counts.1 += 1;
                wanted.insert(desired.key, &policy.name);
                return;
            }
            wanted.insert(desired.key.clone(), &policy.name);
            waiting
                .entry(desired.trigger.clone())
                .or_default()
                .push(desired.key.clone());
            if plan.apply.len() < APPLIES_PER_PASS {
                plan.apply.push(desired);
            } else {
                plan.more = true;
            }
        };
        desired_of(policy, world, &mut problems, &mut held, &mut each);
        if !duplicates.is_empty() {
            let found: &mut Vec<String> = problems.entry(policy.name.clone()).or_default();
            found.extend(duplicates);
        }
        plan.counts.insert(policy.name.clone(), counts);
    }
    plan.problems = problems;
    if !world.gating_unplanned {
        let blocked: BTreeSet<&str> = held.iter().map(|(_, trigger)| trigger.as_str()).collect();
        plan.gated = gated_pods(policies, world.left_gated)
            .into_iter()
            .filter(|pod| !blocked.contains(pod.uid.as_str()))
            .map(|pod| GatedPod {
                waiting_for: waiting.remove(&pod.uid).unwrap_or_default(),
                ..pod
            })
            .collect();
    }
    collect(world, &wanted, &held, &mut plan);
    plan
}

/// The sweep: every stored companion no live Policy wants goes (or, for a deleted Policy that
/// keeps its kind, is released), unless its Policy could not be planned or its trigger's
/// rendering failed.
fn collect(
    world: &World<'_>,
    wanted: &HashMap<CompanionKey, &str>,
    held: &BTreeSet<(String, String)>,
    plan: &mut Plan,
) {
    for s in world.stored.iter().filter(|s| !wanted.contains_key(&s.key)) {
        let from = s.provenance();
        if world.unplanned.contains(&from.policy_uid)
            || held.contains(&(from.policy_uid.clone(), from.trigger_uid.clone()))
        {
            continue;
        }
        let kept = world
            .deleting
            .get(&from.policy_uid)
            .is_some_and(|kinds| kinds.contains(&(s.key.api_version.clone(), s.key.kind.clone())));
        let collected = Collected {
            key: s.key.clone(),
            uid: from.uid,
        };
        if kept {
            plan.release.push(collected);
        } else {
            plan.delete.push(collected);
        }
    }
}

/// Hands `each` the companions `policy` wants, one at a time: one per effect for every live
/// trigger it matches. Each trigger is parsed from its text only while it is rendered.
fn desired_of(
    policy: &LivePolicy,
    world: &World<'_>,
    problems: &mut BTreeMap<String, Vec<String>>,
    held: &mut BTreeSet<(String, String)>,
    each: &mut impl FnMut(Desired),
) {
    let mut problem = |text: String| problems.entry(policy.name.clone()).or_default().push(text);
    for triggers in &policy.triggers {
        let api_version = triggers.kind.api_version();
        for text in &triggers.objects {
            let Ok(value) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            if !value["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let trigger = Trigger {
                api_version: &api_version,
                kind: &triggers.kind.kind,
                object: &value,
                namespaced: triggers.kind.namespaced,
            };
            match matches_stored(&triggers.kind, &value, &policy.matcher, world.namespaces) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(why) => {
                    held.insert((policy.uid.clone(), trigger.uid().to_string()));
                    problem(why);
                    continue;
                }
            }
            for effect in &policy.effects {
                let input = RenderInput {
                    policy_uid: &policy.uid,
                    namespaced: effect.namespaced,
                    clone_source: effect.clone_source.as_ref(),
                };
                match companion::render(&effect.compiled, trigger, input) {
                    Ok(object) => each(Desired {
                        trigger: trigger.uid().to_string(),
                        key: CompanionKey::of(
                            effect.compiled.api_version(),
                            effect.compiled.kind(),
                            &object,
                        ),
                        policy: policy.name.clone(),
                        object,
                    }),
                    Err(e) => {
                        held.insert((policy.uid.clone(), trigger.uid().to_string()));
                        problem(format!(
                            "spec.effects[{}].object for {} {}: {e}",
                            effect.index,
                            triggers.kind.kind,
                            value["metadata"]["name"].as_str().unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
}

/// The live Pods at the companions gate among the triggers of `policies` and the Pods going
/// Policies left, once each.
fn gated_pods(policies: &[LivePolicy], left_gated: &[TriggerObjects]) -> Vec<GatedPod> {
    let mut seen = BTreeSet::new();
    let mut gated = Vec::new();
    for triggers in policies.iter().flat_map(|p| &p.triggers).chain(left_gated) {
        if !(triggers.kind.group.is_empty() && triggers.kind.kind == "Pod") {
            continue;
        }
        for text in &triggers.objects {
            let Ok(pod) = serde_json::from_str::<GatedPodFields>(text) else {
                continue;
            };
            let gate_index = pod
                .spec
                .scheduling_gates
                .iter()
                .position(|gate| gate.name == COMPANIONS_GATE);
            let Some(gate_index) = gate_index else {
                continue;
            };
            let metadata = pod.metadata;
            if metadata.deletion_timestamp.is_none() && seen.insert(metadata.uid.clone()) {
                gated.push(GatedPod {
                    gate_index,
                    namespace: metadata.namespace.unwrap_or_default(),
                    name: metadata.name,
                    uid: metadata.uid,
                    waiting_for: Vec::new(),
                });
            }
        }
    }
    gated
}

/// What [`gated_pods`] reads of a Pod's text: the rest is skipped unparsed.
#[derive(serde::Deserialize)]
struct GatedPodFields {
    metadata: StoredMetadata,
    #[serde(default)]
    spec: GatedPodSpec,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct GatedPodSpec {
    #[serde(default)]
    scheduling_gates: Vec<GateName>,
}

#[derive(serde::Deserialize)]
struct GateName {
    name: String,
}

/// The metadata a pass reads of a stored object's text.
#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct StoredMetadata {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: String,
    pub deletion_timestamp: Option<String>,
    pub labels: BTreeMap<String, String>,
}

#[cfg(test)]
mod tests;
