//! One pass of the companions loop: fetch → decide → apply → status.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::warn;

use super::kinds::Kinds;
use super::plan::{
    CompanionKey, LivePolicy, Plan, PreparedEffect, StoredCompanion, TriggerObjects, World, plan,
};
use super::watches::{WatchKey, Watches};
use super::writes::{self, Outcome};
use super::{
    Caches, CompanionsContext, CompanionsError, WRITES_IN_FLIGHT, has_companions, holds_finalizer,
    resource_of,
};
use crate::audit::judge::audit_copy;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::Next;
use gatehouse_api::v1alpha1::{COMPANION_POLICY_LABEL, CompanionCounts, Policy};
use gatehouse_engine::companion;
use gatehouse_engine::policy::gates_companions;

/// What one leader term keeps between passes.
pub struct LeaderState {
    kinds: Kinds,
    watches: Watches,
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
struct Fetched {
    live: Vec<LivePolicy>,
    /// Problems by Policy name: the Policy cannot be planned (in full) this pass.
    problems: BTreeMap<String, Vec<String>>,
    /// UIDs of Policies whose companions must not be collected this pass.
    unplanned: BTreeSet<String>,
    /// Deleting Policies by UID, with the kinds whose companions they keep.
    deleting: HashMap<String, BTreeSet<(String, String)>>,
    /// The companion kinds by (apiVersion, kind).
    companion_kinds: BTreeMap<(String, String), ApiResource>,
    /// Whether a watch the pass needs has not listed yet.
    waiting: bool,
}

/// Runs one pass; returns when to look again.
pub async fn run_pass(
    ctx: &CompanionsContext,
    caches: &Caches,
    state: &mut LeaderState,
    leader: &watch::Receiver<Leadership>,
) -> Result<Next, CompanionsError> {
    let policies = caches.policies.state();
    for policy in policies.iter().filter(|p| {
        has_companions(p) && p.metadata.deletion_timestamp.is_none() && !holds_finalizer(p)
    }) {
        writes::set_finalizer(ctx, policy, true, leader).await?;
    }
    let fetched = fetch(&policies, state).await;
    ctx.blocked.replace(fetched.problems.clone());
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = caches
        .namespaces
        .state()
        .iter()
        .map(|ns| (ns.name_any(), ns.labels().clone()))
        .collect();
    // Until every companion watch has listed, nothing is known of what exists: no apply (all
    // would look missing), no delete, no finalizer released.
    let Some(stored) = stored_companions(state, &fetched.companion_kinds) else {
        return Ok(Next::By(Instant::now() + WATCH_WAIT));
    };
    let mut plan = plan(
        &fetched.live,
        &World {
            namespaces: &namespaces,
            stored: &stored,
            deleting: &fetched.deleting,
            unplanned: &fetched.unplanned,
            gating_unplanned: policies.iter().any(|p| {
                gates_companions(&p.spec)
                    && p.uid().is_some_and(|uid| fetched.unplanned.contains(&uid))
            }),
        },
    );
    for (name, problems) in &fetched.problems {
        plan.problems
            .entry(name.clone())
            .or_default()
            .extend(problems.iter().cloned());
    }
    let Applied {
        by_policy: applied,
        keys,
    } = apply_all(ctx, &fetched.companion_kinds, &mut plan, leader).await?;
    open_gates(ctx, &plan, &keys, leader).await?;
    let remaining = remaining_by_policy(&stored, &plan);
    for policy in &policies {
        let Some(uid) = policy.uid() else { continue };
        let deleting = policy.metadata.deletion_timestamp.is_some();
        let done = !fetched.unplanned.contains(&uid) && !remaining.contains(&uid);
        if holds_finalizer(policy)
            && (deleting || !has_companions(policy))
            && done
            && !fetched.waiting
        {
            writes::set_finalizer(ctx, policy, false, leader).await?;
        }
    }
    for policy in policies
        .iter()
        .filter(|p| has_companions(p) && p.metadata.deletion_timestamp.is_none())
    {
        let name = policy.name_any();
        let (wanted, in_place) = plan.counts.get(&name).copied().unwrap_or_default();
        let outcome = Outcome {
            counts: CompanionCounts {
                wanted,
                in_place: in_place + applied.get(&name).copied().unwrap_or_default(),
            },
            problems: plan.problems.remove(&name).unwrap_or_default(),
        };
        if fetched.waiting && outcome.problems.is_empty() && wanted == 0 {
            continue;
        }
        writes::write_status(ctx, policy, &outcome, leader).await?;
    }
    Ok(if fetched.waiting {
        Next::By(Instant::now() + WATCH_WAIT)
    } else {
        Next::Resync
    })
}

/// Fetch: every Policy with object effects compiled, its kinds discovered and its access
/// checked, the watches it needs started and their objects read.
async fn fetch(policies: &[Arc<Policy>], state: &mut LeaderState) -> Fetched {
    let mut fetched = Fetched::default();
    let mut wanted_watches: BTreeMap<WatchKey, ApiResource> = BTreeMap::new();
    let mut prepared = Vec::new();
    for policy in policies
        .iter()
        .filter(|p| has_companions(p) || holds_finalizer(p))
    {
        let name = policy.name_any();
        let uid = policy.uid().unwrap_or_default();
        match prepare(policy, state, &mut wanted_watches, &mut fetched).await {
            Ok(Some(p)) => prepared.push(p),
            Ok(None) => {}
            Err(problems) => {
                fetched.unplanned.insert(uid);
                fetched.problems.entry(name).or_default().extend(problems);
            }
        }
    }
    state.watches.keep(&wanted_watches);
    for (policy, effects, trigger_keys) in prepared {
        let mut triggers = Vec::new();
        let mut ready = true;
        for (kind, key) in trigger_keys {
            match state.watches.objects(&key) {
                Some(objects) => triggers.push(TriggerObjects { kind, objects }),
                None => ready = false,
            }
        }
        let mut with_sources = Vec::new();
        for (effect, source_key) in effects {
            let clone_source = match &source_key {
                None => None,
                Some(key) => match state.watches.objects(key) {
                    Some(objects) => objects
                        .first()
                        .and_then(|o| serde_json::to_value(o.as_ref()).ok())
                        .or(Some(serde_json::Value::Null)),
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
            fetched.unplanned.insert(policy.uid.clone());
            continue;
        }
        let mut effects = Vec::new();
        for (effect, source) in with_sources {
            if source.as_ref().is_some_and(serde_json::Value::is_null) {
                let clone = effect
                    .compiled
                    .effect
                    .clone_from
                    .clone()
                    .unwrap_or_default();
                fetched.unplanned.insert(policy.uid.clone());
                fetched
                    .problems
                    .entry(policy.name.clone())
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
        fetched.live.push(LivePolicy {
            effects,
            triggers,
            ..policy
        });
    }
    fetched
}

/// A live Policy before its watches are read: its effects (each with the watch of its clone
/// source) and its trigger kinds (each with its watch).
type Prepared = (
    LivePolicy,
    Vec<(PreparedEffect, Option<WatchKey>)>,
    Vec<(crate::audit::judge::AuditedKind, WatchKey)>,
);

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
        let path = format!("spec.effects[{index}].object");
        let mut found = Vec::new();
        let Some(compiled) = companion::check(&path, object, &mut found) else {
            problems.extend(
                found
                    .into_iter()
                    .map(|p| format!("{}: {}", p.path, p.message)),
            );
            continue;
        };
        let kind = match state
            .kinds
            .companion(compiled.api_version(), compiled.kind())
            .await
        {
            Ok(kind) => kind,
            Err(why) => {
                problems.push(format!("{path}.template: {why}"));
                continue;
            }
        };
        if !kind.namespaced && compiled.namespace().is_some() {
            problems.push(format!(
                "{path}.template.metadata.namespace: {} is cluster-scoped: a companion of it has no namespace",
                compiled.kind()
            ));
            continue;
        }
        let group = kind.resource.group.clone();
        let plural = kind.resource.plural.clone();
        if let Err(why) = state
            .kinds
            .may(
                &["list", "watch", "create", "patch", "delete"],
                &group,
                &plural,
                None,
            )
            .await
        {
            problems.push(format!("{path}: {why}"));
            continue;
        }
        if object.keep_on_policy_delete {
            kept.insert((
                compiled.api_version().to_string(),
                compiled.kind().to_string(),
            ));
        }
        let label = COMPANION_POLICY_LABEL;
        wanted.insert(
            WatchKey::all(&kind.resource, Some(label)),
            kind.resource.clone(),
        );
        fetched.companion_kinds.insert(
            (
                compiled.api_version().to_string(),
                compiled.kind().to_string(),
            ),
            kind.resource.clone(),
        );
        let source_key = match &object.clone_from {
            None => None,
            Some(source) => {
                let namespace = (!source.namespace.is_empty()).then_some(source.namespace.as_str());
                if let Err(why) = state
                    .kinds
                    .may(&["get", "list", "watch"], &group, &plural, namespace)
                    .await
                {
                    problems.push(format!("{path}.cloneFrom: {why}"));
                    continue;
                }
                let key = WatchKey::one(&kind.resource, namespace, &source.name);
                wanted.insert(key.clone(), kind.resource.clone());
                Some(key)
            }
        };
        effects.push((
            PreparedEffect {
                index,
                compiled,
                namespaced: kind.namespaced,
                clone_source: None,
            },
            source_key,
        ));
    }
    if policy.metadata.deletion_timestamp.is_some() || !has_companions(policy) {
        fetched.deleting.insert(uid, kept);
        return Ok(None);
    }
    let matcher = match audit_copy(policy) {
        Ok(matcher) => matcher,
        Err(e) => {
            problems.push(e.to_string());
            return Err(problems);
        }
    };
    let mut triggers = Vec::new();
    for rule in &policy.spec.match_.rules {
        for group in &rule.api_groups {
            for version in &rule.api_versions {
                for resource in &rule.resources {
                    let kind = match state.kinds.trigger(group, version, resource).await {
                        Ok(kind) => kind,
                        Err(why) => {
                            problems.push(format!("spec.match.rules: {why}"));
                            continue;
                        }
                    };
                    if let Err(why) = state
                        .kinds
                        .may(&["list", "watch"], group, resource, None)
                        .await
                    {
                        problems.push(format!("spec.match.rules: {why}"));
                        continue;
                    }
                    let ar = resource_of(&kind);
                    let key = WatchKey::all(&ar, None);
                    wanted.insert(key.clone(), ar);
                    triggers.push((kind, key));
                }
            }
        }
    }
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
    Ok(Some((live, effects, triggers)))
}

/// How soon a pass looks again at watches that have not listed yet.
const WATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Every companion the watches of `kinds` hold; `None` while one of them has not listed yet.
fn stored_companions(
    state: &LeaderState,
    kinds: &BTreeMap<(String, String), ApiResource>,
) -> Option<Vec<StoredCompanion>> {
    let mut stored = Vec::new();
    for ((api_version, kind), resource) in kinds {
        let key = WatchKey::all(resource, Some(COMPANION_POLICY_LABEL));
        for object in state.watches.objects(&key)? {
            stored.push(StoredCompanion {
                key: CompanionKey {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    namespace: object.metadata.namespace.clone(),
                    name: object.name_any(),
                },
                uid: object.uid().unwrap_or_default(),
                object,
            });
        }
    }
    Some(stored)
}

/// What the apply step got in place.
struct Applied {
    /// By Policy name: how many companions.
    by_policy: BTreeMap<String, i64>,
    /// Which companions.
    keys: BTreeSet<CompanionKey>,
}

/// Opens the gate of every Pod whose companions all exist now.
async fn open_gates(
    ctx: &CompanionsContext,
    plan: &Plan,
    applied: &BTreeSet<CompanionKey>,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CompanionsError> {
    let ready = plan
        .gated
        .iter()
        .filter(|pod| pod.waiting_for.iter().all(|key| applied.contains(key)));
    let opened = futures::stream::iter(ready)
        .map(|pod| writes::ungate(ctx, pod, leader))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    for outcome in opened {
        if let Err(why) = outcome? {
            warn!(error = %why, "opening a Pod's companions gate failed");
        }
    }
    Ok(())
}

/// Apply: every write of the plan, many at a time. Returns what each Policy got in place by
/// this pass; failures become its problems.
async fn apply_all(
    ctx: &CompanionsContext,
    kinds: &BTreeMap<(String, String), ApiResource>,
    plan: &mut Plan,
    leader: &watch::Receiver<Leadership>,
) -> Result<Applied, CompanionsError> {
    let resource = |key: &CompanionKey| kinds.get(&(key.api_version.clone(), key.kind.clone()));
    let applies = futures::stream::iter(&plan.apply)
        .map(|d| async move {
            let written = match resource(&d.key) {
                Some(r) => writes::apply(ctx, r, &d.key, &d.object, leader).await,
                None => Ok(Err("its kind was not discovered".to_string())),
            };
            (d, written)
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let mut applied = Applied {
        by_policy: BTreeMap::new(),
        keys: BTreeSet::new(),
    };
    let mut failures = Vec::new();
    for (desired, written) in applies {
        match written? {
            Ok(()) => {
                ctx.metrics.applied.inc();
                *applied.by_policy.entry(desired.policy.clone()).or_default() += 1;
                applied.keys.insert(desired.key.clone());
            }
            Err(why) => {
                ctx.metrics.failed.inc();
                let problem = format!("{}: {why}", desired.key);
                failures.push(problem.clone());
                plan.problems
                    .entry(desired.policy.clone())
                    .or_default()
                    .push(problem);
            }
        }
    }
    let deletes = futures::stream::iter(
        plan.delete
            .iter()
            .map(|s| (s, false))
            .chain(plan.release.iter().map(|s| (s, true))),
    )
    .map(|(s, release)| async move {
        match resource(&s.key) {
            Some(r) if release => writes::release(ctx, r, s, leader).await,
            Some(r) => writes::delete(ctx, r, s, leader).await,
            None => Ok(Ok(())),
        }
        .map(|r| (s, release, r))
    })
    .buffer_unordered(WRITES_IN_FLIGHT)
    .collect::<Vec<_>>()
    .await;
    for result in deletes {
        let (stored, release, outcome) = result?;
        match outcome {
            Ok(()) if !release => {
                ctx.metrics.deleted.inc();
            }
            Ok(()) => {}
            Err(why) => {
                ctx.metrics.failed.inc();
                failures.push(format!("{}: {why}", stored.key));
            }
        }
    }
    if let Some(first) = failures.first() {
        warn!(count = failures.len(), first = %first, "companion writes failed");
    }
    Ok(applied)
}

/// UIDs of the Policies that still have companions after this pass's deletes and releases.
fn remaining_by_policy(stored: &[StoredCompanion], plan: &Plan) -> BTreeSet<String> {
    let gone: BTreeSet<&str> = plan
        .delete
        .iter()
        .chain(&plan.release)
        .map(|s| s.uid.as_str())
        .collect();
    stored
        .iter()
        .filter(|s| !gone.contains(s.uid.as_str()))
        .map(|s| s.label(COMPANION_POLICY_LABEL).to_string())
        .filter(|uid| !uid.is_empty())
        .collect()
}
