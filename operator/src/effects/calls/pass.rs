//! One pass of the calls loop: fetch → decide → make the records of first calls → send, each
//! receiver within its slots → record each answer → open gates → finalizers.
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::{StreamExt, stream};
use kube::ResourceExt;
use kube::core::ApiResource;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::fetch::{Fetched, LeaderState, Route, fetch};
use super::plan::{Plan, SENDS_PER_PASS, Send, World, plan};
use super::receiver::{Answer, Outgoing, ReceiverId, backoff};
use super::records::Record;
use super::status;
use super::writes;
use super::written::{Change, Written};
use super::{Caches, CallsContext, CallsError, has_calls, holds_finalizer};
use crate::effects::resource_of;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::Next;
use crate::runtime::table::ObjectName;
use gatehouse_api::v1alpha1::{CallState, ExternalCallStatus, Policy, call_record_name};
use gatehouse_engine::call::{Action, CalledObject, body};

/// How many writes a pass has in flight at once.
const WRITES_IN_FLIGHT: usize = 32;

/// One call and what came back.
struct Sent {
    send: Send,
    answer: Answer,
}

pub(super) async fn run_pass(
    ctx: &CallsContext,
    caches: &Caches,
    state: &mut LeaderState,
    leader: &watch::Receiver<Leadership>,
) -> Result<Next, CallsError> {
    let policies = caches.policies.state();
    let fetched = fetch(ctx, &policies, state).await;
    ctx.blocked.replace("calls", fetched.problems.clone());
    let records = state
        .written
        .overlay(caches.records.values(), Instant::now());
    let labels = |name: &str| {
        let found = caches.namespaces.get(&ObjectName::cluster(name));
        found.map(|labels| labels.to_map())
    };
    let now = Utc::now();
    let world = World {
        namespaces: &labels,
        records: &records,
        unplanned: &fetched.unplanned,
        now,
        left_gated: &fetched.left_gated,
        gating_unplanned: fetched.gating_unplanned,
    };
    let plan = plan(&fetched.live, &world);
    let resources = trigger_resources(&fetched);
    let generations = generations(&policies);
    let sent = send_all(ctx, state, &fetched, plan.send.clone(), leader).await?;
    let mut failures = Vec::new();
    record_answers(
        ctx,
        &sent,
        &resources,
        &generations,
        leader,
        &mut state.written,
        &mut failures,
    )
    .await?;
    for record in &plan.drop {
        // A record this term made and its watch has not shown has no UID yet: no precondition.
        let uid = Some(record.uid.as_str()).filter(|uid| !uid.is_empty());
        match writes::delete_record(ctx, &record.name, uid, leader).await? {
            Ok(()) => state
                .written
                .note(Change::Deleted(record.key.clone()), Instant::now()),
            Err(why) => failures.push(why),
        }
    }
    for pod in &plan.ungate {
        if let Err(why) = writes::ungate(ctx, pod, leader).await? {
            failures.push(why);
        }
    }
    status::write_all(ctx, &policies, &plan, leader).await?;
    if !fetched.gating_unplanned {
        // A Pod a going Policy left at the gate is let go before the Policy lets go of it.
        finalizers(ctx, &policies, &records, leader).await?;
    }
    ctx.metrics.failed_writes.inc_by(failures.len() as u64);
    if let Some(first) = failures.first() {
        return Err(CallsError::Writes {
            count: failures.len(),
            first: first.clone(),
        });
    }
    Ok(next_pass(&plan, state, now))
}

/// When the next pass is due: at once when calls wait beyond this pass's share, else when the
/// first call or resting receiver is due.
fn next_pass(plan: &Plan, state: &LeaderState, now: DateTime<Utc>) -> Next {
    if plan.more {
        return Next::By(Instant::now());
    }
    let mut at: Option<Instant> = state.receivers.next_wake();
    if let Some(due) = plan.next {
        let wait = (due - now).to_std().unwrap_or_default();
        let due = Instant::now() + wait;
        at = Some(at.map_or(due, |at| at.min(due)));
    }
    at.map_or(Next::Resync, Next::By)
}

/// By (apiVersion, kind): the resources of the triggers, for writing results.
fn trigger_resources(fetched: &Fetched) -> HashMap<(String, String), ApiResource> {
    fetched
        .live
        .iter()
        .flat_map(|p| &p.triggers)
        .map(|t| {
            (
                (t.kind.api_version(), t.kind.kind.clone()),
                resource_of(&t.kind),
            )
        })
        .collect()
}

/// By Policy UID: its generation and, by effect index, its result annotation.
fn generations(policies: &[Arc<Policy>]) -> HashMap<String, (i64, BTreeMap<usize, String>)> {
    policies
        .iter()
        .map(|p| {
            let annotations = p
                .spec
                .effects
                .iter()
                .enumerate()
                .filter_map(|(i, e)| Some((i, e.call.as_ref()?.result_annotation.clone()?)))
                .collect();
            let generation = p.metadata.generation.unwrap_or_default();
            (p.uid().unwrap_or_default(), (generation, annotations))
        })
        .collect()
}

/// How a call goes: its effect's route, or for a release whose effect is gone, a route to the
/// same URL, or the system's roots and no token.
fn route_of(send: &Send, fetched: &Fetched) -> Option<Route> {
    if send.action == Action::Apply {
        return fetched
            .routes
            .get(&(send.policy_uid.clone(), send.effect))
            .cloned();
    }
    let own = fetched
        .routes
        .get(&(send.policy_uid.clone(), send.effect))
        .filter(|r| send.url.starts_with(&r.receiver.origin));
    if let Some(route) = own.or_else(|| fetched.routes_by_url.get(&send.url)) {
        return Some(route.clone());
    }
    let origin = send
        .url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| format!("https://{a}")))?;
    Some(Route {
        receiver: ReceiverId {
            origin,
            ca_pem: None,
        },
        token: None,
        timeout: std::time::Duration::from_secs(5),
    })
}

/// Sends the calls each receiver takes this pass (records made first for first calls), all
/// receivers at once, each within its slots.
async fn send_all(
    ctx: &CallsContext,
    state: &mut LeaderState,
    fetched: &Fetched,
    sends: Vec<Send>,
    leader: &watch::Receiver<Leadership>,
) -> Result<Vec<Sent>, CallsError> {
    let mut by_receiver: BTreeMap<ReceiverId, Vec<(Send, Route)>> = BTreeMap::new();
    for send in sends {
        if let Some(route) = route_of(&send, fetched) {
            by_receiver
                .entry(route.receiver.clone())
                .or_default()
                .push((send, route));
        }
    }
    let now = Instant::now();
    let mut admitted = Vec::new();
    for (id, mut calls) in by_receiver {
        if state.receivers.prepare(&id).is_err() {
            continue;
        }
        calls.truncate(state.receivers.admits(&id, calls.len(), now));
        admitted.extend(calls);
    }
    let made = stream::iter(admitted)
        .map(|(send, route)| async move {
            if send.record.is_some() {
                return Ok(Some((send, route)));
            }
            match writes::create_record(ctx, &send, leader).await? {
                Ok(()) => Ok(Some((send, route))),
                Err(why) => {
                    warn!(key = %send.key, %why, "making the ExternalCall failed");
                    Ok(None)
                }
            }
        })
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<Result<Option<(Send, Route)>, CallsError>>>()
        .await;
    let mut ready = Vec::new();
    for made in made {
        if let Some(call) = made? {
            ready.push(call);
        }
    }
    let receivers = &state.receivers;
    let sent: Vec<Sent> = stream::iter(ready)
        .filter_map(|(send, route)| async move {
            let sender = receivers.sender(&route.receiver)?;
            Some((send, route, sender))
        })
        .map(|(send, route, sender)| async move {
            let answer = sender.send(outgoing(&send, &route)).await;
            Sent { send, answer }
        })
        .buffer_unordered(SENDS_PER_PASS)
        .collect()
        .await;
    for s in &sent {
        ctx.metrics.count(s.send.action, &s.answer);
    }
    Ok(sent
        .into_iter()
        .filter(|s| s.answer != Answer::Skipped)
        .collect())
}

/// The request of one call.
fn outgoing(send: &Send, route: &Route) -> Outgoing {
    let snapshot = send
        .snapshot
        .as_ref()
        .and_then(|text| serde_json::from_str::<Value>(text).ok());
    let object = CalledObject {
        api_version: send.object.api_version.clone(),
        kind: send.object.kind.clone(),
        namespace: send.object.namespace.clone(),
        name: send.object.name.clone(),
        uid: send.object.uid.clone(),
    };
    let body = body(send.action, &send.key, &object, snapshot.as_ref());
    Outgoing {
        url: send.url.clone(),
        token: route.token.clone(),
        body: serde_json::to_vec(&body).unwrap_or_default(),
        timeout: route.timeout,
    }
}

/// What each answer makes of its record (and, for an applied call, of its object).
async fn record_answers(
    ctx: &CallsContext,
    sent: &[Sent],
    resources: &HashMap<(String, String), ApiResource>,
    generations: &HashMap<String, (i64, BTreeMap<usize, String>)>,
    leader: &watch::Receiver<Leadership>,
    written: &mut Written,
    failures: &mut Vec<String>,
) -> Result<(), CallsError> {
    let outcomes = stream::iter(sent)
        .map(|s| record_answer(ctx, s, resources, generations, leader))
        .buffer_unordered(WRITES_IN_FLIGHT)
        .collect::<Vec<_>>()
        .await;
    let now = Instant::now();
    for outcome in outcomes {
        match outcome? {
            Ok(Some(change)) => written.note(change, now),
            Ok(None) => {}
            Err(why) => failures.push(why),
        }
    }
    Ok(())
}

async fn record_answer(
    ctx: &CallsContext,
    sent: &Sent,
    resources: &HashMap<(String, String), ApiResource>,
    generations: &HashMap<String, (i64, BTreeMap<usize, String>)>,
    leader: &watch::Receiver<Leadership>,
) -> Result<Result<Option<Change>, String>, CallsError> {
    let Sent { send, answer, .. } = sent;
    let name = call_record_name(&send.key);
    let record = send.record.as_deref();
    let record_uid = record.map(|r| r.uid.as_str()).filter(|uid| !uid.is_empty());
    let attempts = record.map_or(0, |r| r.attempts);
    let url = &send.url;
    let status = match (send.action, answer) {
        (_, Answer::Skipped) => return Ok(Ok(None)),
        (Action::Release, Answer::Done { .. } | Answer::Refused(_)) => {
            if let Answer::Refused(why) = answer {
                warn!(key = %send.key, %why, "release refused for good; the record goes");
                writes::publish_refused(ctx, send, why).await;
            } else {
                info!(key = %send.key, "released");
            }
            let deleted = writes::delete_record(ctx, &name, record_uid, leader).await?;
            return Ok(deleted.map(|()| Some(Change::Deleted(send.key.clone()))));
        }
        (Action::Release, Answer::Retry(why)) => {
            let releasing = record.is_some_and(|r| r.state == CallState::Releasing);
            let attempts = if releasing { attempts + 1 } else { 1 };
            retry_status(CallState::Releasing, attempts, why, &send.key, url)
        }
        (Action::Apply, Answer::Done { result, unreadable }) => {
            let annotation = generations
                .get(&send.policy_uid)
                .and_then(|(_, a)| a.get(&send.effect));
            let resource =
                resources.get(&(send.object.api_version.clone(), send.object.kind.clone()));
            if let (Some(annotation), Some(result), Some(resource)) = (annotation, result, resource)
                && let Err(why) =
                    writes::annotate(ctx, resource, send, annotation, result, leader).await?
            {
                return Ok(Err(why));
            }
            // Done all the same (2xx); an answer that says nothing readable is noted.
            json!({
                "state": CallState::Applied, "attempts": attempts + 1, "lastError": unreadable,
                "result": result, "nextAttempt": null, "url": url,
            })
        }
        (Action::Apply, Answer::Retry(why)) => {
            retry_status(CallState::Pending, attempts + 1, why, &send.key, url)
        }
        (Action::Apply, Answer::Refused(why)) => {
            warn!(key = %send.key, %why, "apply refused for good");
            writes::publish_refused(ctx, send, why).await;
            let generation = generations.get(&send.policy_uid).map(|(g, _)| *g);
            json!({
                "state": CallState::Failed, "attempts": attempts + 1, "lastError": why,
                "nextAttempt": null, "failedGeneration": generation, "url": url,
            })
        }
    };
    let written = writes::write_status(ctx, &name, status.clone(), leader).await?;
    Ok(written.map(|()| Some(Change::Wrote(Arc::new(record_after(send, &status))))))
}

/// The record of `send` once `status` is written.
fn record_after(send: &Send, status: &Value) -> Record {
    let mut record = send.record.as_deref().cloned().unwrap_or_else(|| Record {
        name: call_record_name(&send.key),
        uid: String::new(),
        key: send.key.clone(),
        policy: send.policy.clone(),
        policy_uid: send.policy_uid.clone(),
        effect: send.effect,
        url: send.url.clone(),
        object: send.object.clone(),
        state: CallState::Pending,
        attempts: 0,
        next_attempt: None,
        failed_generation: None,
        result: None,
        last_error: None,
    });
    let written: ExternalCallStatus = serde_json::from_value(status.clone()).unwrap_or_default();
    record.state = written.state;
    record.attempts = written.attempts;
    record.next_attempt = written
        .next_attempt
        .as_deref()
        .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
        .map(|at| at.with_timezone(&Utc));
    record.result = written.result;
    record.failed_generation = written.failed_generation;
    record.last_error = written.last_error;
    record.url = send.url.clone();
    record
}

/// The status of a call to try again after a backoff.
fn retry_status(state: CallState, attempts: i64, why: &str, key: &str, url: &str) -> Value {
    let failures = u32::try_from(attempts.saturating_sub(1)).unwrap_or(u32::MAX);
    let wait = backoff(failures, key);
    let next = Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default();
    json!({
        "state": state, "attempts": attempts, "lastError": why,
        "nextAttempt": next.to_rfc3339_opts(chrono::SecondsFormat::Millis, true), "url": url,
    })
}

/// Every Policy with call effects holds the calls finalizer; one deleted, or without call
/// effects now, lets go of it once none of its records is left.
async fn finalizers(
    ctx: &CallsContext,
    policies: &[Arc<Policy>],
    records: &[Arc<super::records::Record>],
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CallsError> {
    for policy in policies {
        let holds = holds_finalizer(policy);
        let live = has_calls(policy) && policy.metadata.deletion_timestamp.is_none();
        if live && !holds {
            writes::set_finalizer(ctx, policy, true, leader).await?;
        } else if holds && !live {
            let uid = policy.uid().unwrap_or_default();
            let left = records.iter().any(|r| r.policy_uid == uid);
            if !left {
                writes::set_finalizer(ctx, policy, false, leader).await?;
            }
        }
    }
    Ok(())
}
