//! The fetch step: every Policy with object effects compiled, the kinds it names discovered and
//! its access checked, the watches it needs started (and the others stopped), and what they
//! hold read into [`LivePolicy`]s for the decide step.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::Value;
use tokio::sync::Notify;

use super::plan::{LivePolicy, PreparedEffect, TriggerObjects};
use super::{has_companions, holds_finalizer};
use crate::audit::judge::audit_copy;
use crate::effects::kinds::Kinds;
use crate::effects::triggers::{TriggerWatch, left_gated_pods, trigger_watches};
use crate::effects::watches::{WatchKey, Watches};
use gatehouse_api::v1alpha1::{COMPANION_POLICY_LABEL, ObjectEffect, Policy, parse_companion_kind};
use gatehouse_engine::companion;

/// What one leader term keeps between passes.
pub struct LeaderState {
    pub(super) kinds: Kinds,
    pub(super) watches: Watches,
}

impl LeaderState {
    pub fn new(client: Client, trigger: Arc<Notify>) -> Self {
        LeaderState {
            kinds: Kinds::new(client.clone()),
            watches: Watches::new(client, trigger),
        }
    }
}

/// What the fetch step made of the Policies.
#[derive(Default)]
pub(super) struct Fetched {
    pub live: Vec<LivePolicy>,
    /// Problems by Policy name: the Policy cannot be planned (in full) this pass.
    pub problems: BTreeMap<String, Vec<String>>,
    /// UIDs of Policies whose companions must not be collected this pass.
    pub unplanned: BTreeSet<String>,
    /// Deleting Policies by UID, with the kinds whose companions they keep.
    pub deleting: HashMap<String, BTreeSet<(String, String)>>,
    /// The companion kinds by (apiVersion, kind).
    pub companion_kinds: BTreeMap<(String, String), ApiResource>,
    /// Whether a watch the pass needs has not listed yet.
    pub waiting: bool,
    /// The Pods of Policies that gated Pods and are going (deleted, or without object effects
    /// now): a Pod they left at the gate that no live Policy holds is let go.
    pub left_gated: Vec<TriggerObjects>,
}

/// One object effect and the watch of its clone source.
struct EffectWatch {
    effect: PreparedEffect,
    source: Option<WatchKey>,
}

/// A live Policy before its watches are read.
struct Prepared {
    live: LivePolicy,
    effects: Vec<EffectWatch>,
    triggers: Vec<TriggerWatch>,
}

/// Fetches what the pass decides on.
pub(super) async fn fetch(policies: &[Arc<Policy>], state: &mut LeaderState) -> Fetched {
    let mut fetched = Fetched::default();
    let mut wanted = BTreeMap::new();
    let mut prepared = Vec::new();
    for policy in policies
        .iter()
        .filter(|p| has_companions(p) || holds_finalizer(p))
    {
        match prepare(policy, state, &mut wanted, &mut fetched).await {
            Ok(Some(p)) => prepared.push(p),
            Ok(None) => {}
            Err(problems) => {
                fetched.unplanned.insert(policy.uid().unwrap_or_default());
                let name = policy.name_any();
                fetched.problems.entry(name).or_default().extend(problems);
            }
        }
    }
    state.watches.keep(&wanted);
    for p in prepared {
        if let Some(live) = read_watches(p, state, &mut fetched) {
            fetched.live.push(live);
        }
    }
    fetched
}

/// Prepares one Policy; `Ok(None)` for a deleting Policy (whose companion kinds are watched so
/// its companions can be collected), `Err` with the problems that keep it from being planned.
async fn prepare(
    policy: &Policy,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    fetched: &mut Fetched,
) -> Result<Option<Prepared>, Vec<String>> {
    let uid = policy.uid().unwrap_or_default();
    let mut problems = Vec::new();
    let mut effects = Vec::new();
    let mut kept = BTreeSet::new();
    for (index, effect) in policy.spec.effects.iter().enumerate() {
        let Some(object) = &effect.object else {
            continue;
        };
        match prepare_effect(index, object, state, wanted, fetched).await {
            Ok(prepared) => {
                if object.keep_on_policy_delete {
                    let compiled = &prepared.effect.compiled;
                    kept.insert((compiled.api_version().into(), compiled.kind().into()));
                }
                effects.push(prepared);
            }
            Err(found) => problems.extend(found),
        }
    }
    let named: BTreeSet<(String, String)> = effects
        .iter()
        .map(|e| {
            let compiled = &e.effect.compiled;
            (
                compiled.api_version().to_string(),
                compiled.kind().to_string(),
            )
        })
        .collect();
    sweep_left_kinds(policy, &named, state, wanted, fetched).await;
    if policy.metadata.deletion_timestamp.is_some() || !has_companions(policy) {
        fetched.deleting.insert(uid, kept);
        watch_left_gated(policy, state, wanted, fetched).await;
        return Ok(None);
    }
    let matcher = match audit_copy(policy) {
        Ok(matcher) => matcher,
        Err(e) => {
            problems.push(e.to_string());
            return Err(problems);
        }
    };
    let triggers = trigger_watches(policy, &mut state.kinds, wanted).await;
    problems.extend(triggers.iter().filter_map(|t| t.as_ref().err().cloned()));
    if !problems.is_empty() {
        return Err(problems);
    }
    let live = LivePolicy {
        name: policy.name_any(),
        uid,
        matcher,
        effects: Vec::new(),
        triggers: Vec::new(),
    };
    Ok(Some(Prepared {
        live,
        effects,
        triggers: triggers.into_iter().flatten().collect(),
    }))
}

/// One object effect at `spec.effects[index]`: compiled, its kind discovered, Gatehouse's
/// access to it checked, its companions' and clone source's watches wanted.
async fn prepare_effect(
    index: usize,
    object: &ObjectEffect,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    fetched: &mut Fetched,
) -> Result<EffectWatch, Vec<String>> {
    let path = format!("spec.effects[{index}].object");
    let mut found = Vec::new();
    let Some(compiled) = companion::check(&path, object, &mut found) else {
        return Err(found
            .into_iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect());
    };
    let (api_version, kind_name) = (compiled.api_version(), compiled.kind());
    let kind = state
        .kinds
        .companion(api_version, kind_name)
        .await
        .map_err(|why| vec![format!("{path}.template: {why}")])?;
    if !kind.namespaced && compiled.namespace().is_some() {
        return Err(vec![format!(
            "{path}.template.metadata.namespace: {kind_name} is cluster-scoped: a companion of it has no namespace"
        )]);
    }
    let (group, plural) = (&kind.resource.group, &kind.resource.plural);
    let verbs = ["list", "watch", "create", "patch", "delete"];
    state
        .kinds
        .may(&verbs, group, plural, None)
        .await
        .map_err(|why| vec![format!("{path}: {why}")])?;
    let source = match &object.clone_from {
        None => None,
        Some(source) => {
            let namespace = (!source.namespace.is_empty()).then_some(source.namespace.as_str());
            state
                .kinds
                .may(&["get", "list", "watch"], group, plural, namespace)
                .await
                .map_err(|why| vec![format!("{path}.cloneFrom: {why}")])?;
            let key = WatchKey::one(&kind.resource, namespace, &source.name);
            wanted.insert(key.clone(), kind.resource.clone());
            Some(key)
        }
    };
    let companions = WatchKey::all(&kind.resource, Some(COMPANION_POLICY_LABEL));
    wanted.insert(companions, kind.resource.clone());
    fetched.companion_kinds.insert(
        (api_version.to_string(), kind_name.to_string()),
        kind.resource.clone(),
    );
    let effect = PreparedEffect {
        index,
        compiled,
        namespaced: kind.namespaced,
        clone_source: None,
    };
    Ok(EffectWatch { effect, source })
}

/// Watches the kinds `policy`'s status says it has companions of and its effects no longer
/// name (`named`), so the pass collects those companions. A kind discovery no longer serves, or
/// Gatehouse may not list, watch and delete, has none it could collect.
async fn sweep_left_kinds(
    policy: &Policy,
    named: &BTreeSet<(String, String)>,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    fetched: &mut Fetched,
) {
    let recorded = policy
        .status
        .as_ref()
        .and_then(|s| s.companions.as_ref())
        .map(|c| c.kinds.as_slice())
        .unwrap_or_default();
    for name in recorded {
        let Some((api_version, kind_name)) = parse_companion_kind(name) else {
            continue;
        };
        let key = (api_version.to_string(), kind_name.to_string());
        if named.contains(&key) || fetched.companion_kinds.contains_key(&key) {
            continue;
        }
        let Ok(kind) = state.kinds.companion(api_version, kind_name).await else {
            continue;
        };
        let (group, plural) = (&kind.resource.group, &kind.resource.plural);
        let verbs = ["list", "watch", "delete"];
        if state.kinds.may(&verbs, group, plural, None).await.is_err() {
            continue;
        }
        let companions = WatchKey::all(&kind.resource, Some(COMPANION_POLICY_LABEL));
        wanted.insert(companions, kind.resource.clone());
        fetched.companion_kinds.insert(key, kind.resource.clone());
    }
}

/// The Pods a going Policy may have left at the gate, read into [`Fetched::left_gated`] once
/// their watch has listed (until then, a later pass looks again).
async fn watch_left_gated(
    policy: &Policy,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    fetched: &mut Fetched,
) {
    match left_gated_pods(policy, &mut state.kinds, &state.watches, wanted).await {
        Ok(pods) => fetched.left_gated.extend(pods),
        Err(()) => fetched.waiting = true,
    }
}

/// The live Policy with what its watches hold, or `None` (the Policy unplanned) while one has
/// not listed yet or a clone source does not exist.
fn read_watches(
    prepared: Prepared,
    state: &LeaderState,
    fetched: &mut Fetched,
) -> Option<LivePolicy> {
    let Prepared {
        live,
        effects,
        triggers,
    } = prepared;
    let mut ready = true;
    let mut objects = Vec::new();
    for TriggerWatch { kind, key } in triggers {
        match state.watches.objects(&key) {
            Some(found) => objects.push(TriggerObjects {
                kind,
                objects: found,
            }),
            None => ready = false,
        }
    }
    let mut with_sources = Vec::new();
    for EffectWatch { effect, source } in effects {
        let clone_source = match &source {
            None => None,
            Some(key) => match state.watches.objects(key) {
                Some(found) => Some(
                    found
                        .first()
                        .and_then(|text| serde_json::from_str(text).ok())
                        .unwrap_or(Value::Null),
                ),
                None => {
                    ready = false;
                    None
                }
            },
        };
        with_sources.push((effect, clone_source));
    }
    if !ready {
        fetched.waiting = true;
        fetched.unplanned.insert(live.uid.clone());
        return None;
    }
    let mut effects = Vec::new();
    for (effect, source) in with_sources {
        if source.as_ref().is_some_and(Value::is_null) {
            let clone = effect
                .compiled
                .effect
                .clone_from
                .clone()
                .unwrap_or_default();
            fetched.unplanned.insert(live.uid.clone());
            fetched
                .problems
                .entry(live.name.clone())
                .or_default()
                .push(format!(
                    "spec.effects[{}].object.cloneFrom: the source {} {}/{} does not exist",
                    effect.index,
                    effect.compiled.kind(),
                    clone.namespace,
                    clone.name
                ));
            continue;
        }
        effects.push(PreparedEffect {
            clone_source: source,
            ..effect
        });
    }
    Some(LivePolicy {
        effects,
        triggers: objects,
        ..live
    })
}
