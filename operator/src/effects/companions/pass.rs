//! One pass of the companions loop: fetch → decide → apply → status.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::core::ApiResource;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::warn;

use super::fetch::{Fetched, LeaderState, fetch};
use super::plan::{CompanionKey, Plan, StoredCompanion, World, plan};
use super::writes::{self, Outcome};
use super::{
    Caches, CompanionsContext, CompanionsError, WRITES_IN_FLIGHT, has_companions, holds_finalizer,
};
use crate::effects::watches::WatchKey;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::Next;
use crate::runtime::table::ObjectName;
use gatehouse_api::v1alpha1::{
    COMPANION_POLICY_LABEL, CompanionCounts, Policy, companion_kind_name,
};
use gatehouse_engine::policy::gates_companions;

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
    ctx.blocked.replace("companions", fetched.problems.clone());
    let labels_of = |name: &str| {
        let found = caches.namespaces.get(&ObjectName::cluster(name));
        found.map(|labels| labels.to_map())
    };
    // Until every companion watch has listed, nothing is known of what exists: no apply (all
    // would look missing), no delete, no finalizer released.
    let Some(stored) = stored_companions(state, &fetched.companion_kinds) else {
        return Ok(Next::By(Instant::now() + WATCH_WAIT));
    };
    let mut plan = plan(
        &fetched.live,
        &World {
            namespaces: &labels_of,
            stored: &stored,
            deleting: &fetched.deleting,
            unplanned: &fetched.unplanned,
            left_gated: &fetched.left_gated,
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
    release_finalizers(ctx, &policies, &fetched, &remaining, leader).await?;
    let statuses = Statuses {
        fetched: &fetched,
        applied: &applied,
        remaining: &remaining,
    };
    write_statuses(ctx, &policies, &statuses, &mut plan, leader).await?;
    Ok(if plan.more {
        Next::By(Instant::now())
    } else if fetched.waiting {
        Next::By(Instant::now() + WATCH_WAIT)
    } else {
        Next::Resync
    })
}

/// Releases the finalizer of every deleting Policy (or one without object effects any more)
/// whose companions are all collected or released, once the pass knew all of them.
async fn release_finalizers(
    ctx: &CompanionsContext,
    policies: &[Arc<Policy>],
    fetched: &Fetched,
    remaining: &BTreeMap<String, BTreeSet<String>>,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CompanionsError> {
    if fetched.waiting {
        return Ok(());
    }
    for policy in policies.iter().filter(|p| holds_finalizer(p)) {
        let Some(uid) = policy.uid() else { continue };
        let going = policy.metadata.deletion_timestamp.is_some() || !has_companions(policy);
        let done = !fetched.unplanned.contains(&uid) && !remaining.contains_key(&uid);
        if going && done {
            writes::set_finalizer(ctx, policy, false, leader).await?;
        }
    }
    Ok(())
}

/// What the status step reads besides the plan.
struct Statuses<'a> {
    fetched: &'a Fetched,
    /// By Policy name: companions this pass got in place.
    applied: &'a BTreeMap<String, i64>,
    /// By Policy UID: the kinds of the companions left.
    remaining: &'a BTreeMap<String, BTreeSet<String>>,
}

/// The status step: each live Policy's counts, kinds and `CompanionsInPlace`.
async fn write_statuses(
    ctx: &CompanionsContext,
    policies: &[Arc<Policy>],
    statuses: &Statuses<'_>,
    plan: &mut Plan,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CompanionsError> {
    for policy in policies
        .iter()
        .filter(|p| has_companions(p) && p.metadata.deletion_timestamp.is_none())
    {
        let name = policy.name_any();
        let (wanted, in_place) = plan.counts.get(&name).copied().unwrap_or_default();
        let applied = statuses.applied.get(&name).copied().unwrap_or_default();
        let outcome = Outcome {
            counts: CompanionCounts {
                wanted,
                in_place: in_place + applied,
                kinds: kinds_of(policy, statuses.remaining),
            },
            problems: plan.problems.remove(&name).unwrap_or_default(),
        };
        // A Policy waiting for its watches has nothing to report yet.
        if statuses.fetched.waiting && outcome.problems.is_empty() && wanted == 0 {
            continue;
        }
        writes::write_status(ctx, policy, &outcome, leader).await?;
    }
    Ok(())
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
        for json in state.watches.objects(&key)? {
            let Ok(Named { metadata }) = serde_json::from_str::<Named>(&json) else {
                continue;
            };
            stored.push(StoredCompanion {
                key: CompanionKey {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    namespace: metadata.namespace,
                    name: metadata.name,
                },
                json,
            });
        }
    }
    Some(stored)
}

/// What a pass reads of every stored companion's text: where it is.
#[derive(serde::Deserialize)]
struct Named {
    metadata: Name,
}

#[derive(serde::Deserialize)]
struct Name {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
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

/// By Policy UID, the kinds (as `status.companions.kinds` names them) of the companions left
/// after this pass's deletes and releases.
fn remaining_by_policy(
    stored: &[StoredCompanion],
    plan: &Plan,
) -> BTreeMap<String, BTreeSet<String>> {
    let gone: BTreeSet<&CompanionKey> = plan
        .delete
        .iter()
        .chain(&plan.release)
        .map(|c| &c.key)
        .collect();
    let mut remaining: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in stored.iter().filter(|s| !gone.contains(&s.key)) {
        let policy_uid = s.provenance().policy_uid;
        if policy_uid.is_empty() {
            continue;
        }
        remaining
            .entry(policy_uid)
            .or_default()
            .insert(companion_kind_name(&s.key.api_version, &s.key.kind));
    }
    remaining
}

/// The kinds `policy`'s object effects name and its companions left still are.
fn kinds_of(policy: &Policy, remaining: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let named = policy.spec.effects.iter().filter_map(|e| {
        let template = &e.object.as_ref()?.template;
        let (api_version, kind) = (template["apiVersion"].as_str()?, template["kind"].as_str()?);
        Some(companion_kind_name(api_version, kind))
    });
    let left = policy
        .uid()
        .and_then(|uid| remaining.get(&uid))
        .into_iter()
        .flatten()
        .cloned();
    named
        .chain(left)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}
