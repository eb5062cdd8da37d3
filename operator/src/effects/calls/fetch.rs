//! The fetch step: every Policy with call effects compiled, its triggers discovered and
//! watched, its receivers' clients made and their tokens read, into [`LivePolicy`]s for the
//! decide step.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::core::ApiResource;
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;

use super::plan::{LiveCall, LivePolicy};
use super::receiver::{ReceiverId, Receivers};
use super::{CallsContext, has_calls, holds_finalizer};
use crate::audit::judge::audit_copy;
use crate::effects::kinds::Kinds;
use crate::effects::triggers::{TriggerObjects, left_gated_pods, trigger_watches};
use crate::effects::watches::{WatchKey, Watches};
use gatehouse_api::v1alpha1::{CallEffect, Policy};
use gatehouse_engine::call::ca_pem;
use gatehouse_engine::policy::gates_calls;

/// What one leader term keeps between passes.
pub struct LeaderState {
    pub(super) kinds: Kinds,
    pub(super) watches: Watches,
    pub(super) receivers: Receivers,
    pub(super) written: super::written::Written,
}

impl LeaderState {
    pub fn new(client: Client, trigger: Arc<Notify>, per_receiver: usize) -> Self {
        LeaderState {
            kinds: Kinds::new(client.clone()),
            watches: Watches::new(client, trigger),
            receivers: Receivers::new(per_receiver),
            written: super::written::Written::default(),
        }
    }
}

/// How one effect's calls are sent.
#[derive(Clone, Debug)]
pub struct Route {
    pub receiver: ReceiverId,
    pub token: Option<String>,
    pub timeout: Duration,
}

/// What the fetch step made of the Policies.
#[derive(Default)]
pub(super) struct Fetched {
    pub live: Vec<LivePolicy>,
    /// Problems by Policy name.
    pub problems: BTreeMap<String, Vec<String>>,
    /// UIDs of Policies whose records must not be released this pass.
    pub unplanned: BTreeSet<String>,
    /// By (Policy UID, effect index).
    pub routes: HashMap<(String, usize), Route>,
    /// By URL, for releases whose effect is gone.
    pub routes_by_url: HashMap<String, Route>,
    /// The Pods of going Policies that gated Pods ([`super::plan::World::left_gated`]).
    pub left_gated: Vec<TriggerObjects>,
    /// Whether a Policy that gates Pods could not be planned.
    pub gating_unplanned: bool,
}

/// Fetches what the pass decides on.
pub(super) async fn fetch(
    ctx: &CallsContext,
    policies: &[Arc<Policy>],
    state: &mut LeaderState,
) -> Fetched {
    let mut fetched = Fetched::default();
    let mut wanted = BTreeMap::new();
    let mut named = BTreeSet::new();
    let mut prepared = Vec::new();
    for policy in policies
        .iter()
        .filter(|p| has_calls(p) || holds_finalizer(p))
    {
        let uid = policy.uid().unwrap_or_default();
        match prepare(ctx, policy, state, &mut wanted, &mut named, &mut fetched).await {
            Ok(Some(p)) => prepared.push(p),
            Ok(None) => {}
            Err(problems) => {
                fetched.gating_unplanned |= gates_calls(&policy.spec);
                fetched.unplanned.insert(uid);
                let name = policy.name_any();
                fetched.problems.entry(name).or_default().extend(problems);
            }
        }
    }
    state.watches.keep(&wanted);
    state.receivers.keep(&named);
    for (live, keys) in prepared {
        read_watches(live, keys, state, &mut fetched);
    }
    fetched
}

/// One Policy: its routes recorded, and, unless it is being deleted, its matcher and trigger
/// watches.
async fn prepare(
    ctx: &CallsContext,
    policy: &Policy,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    named: &mut BTreeSet<ReceiverId>,
    fetched: &mut Fetched,
) -> Result<Option<(LivePolicy, Vec<crate::effects::triggers::TriggerWatch>)>, Vec<String>> {
    let uid = policy.uid().unwrap_or_default();
    let mut problems = Vec::new();
    let mut calls = Vec::new();
    for (index, effect) in policy.spec.effects.iter().enumerate() {
        let Some(call) = &effect.call else {
            continue;
        };
        let path = format!("spec.effects[{index}].call");
        match route(ctx, &path, call, &mut state.receivers).await {
            Ok(route) => {
                named.insert(route.receiver.clone());
                fetched
                    .routes_by_url
                    .insert(call.url.clone(), route.clone());
                fetched.routes.insert((uid.clone(), index), route);
                calls.push(LiveCall {
                    index,
                    url: call.url.clone(),
                    gate: call.gate,
                });
            }
            Err(why) => problems.push(why),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let going = policy.metadata.deletion_timestamp.is_some() || !has_calls(policy);
    if going || !gates_calls(&policy.spec) {
        watch_left_gated(policy, state, wanted, fetched).await;
    }
    if going {
        return Ok(None);
    }
    let matcher = audit_copy(policy).map_err(|e| vec![e.to_string()])?;
    let triggers = trigger_watches(policy, &mut state.kinds, wanted).await;
    let (triggers, problems): (Vec<_>, Vec<_>) = triggers.into_iter().partition(Result::is_ok);
    if !problems.is_empty() {
        return Err(problems.into_iter().filter_map(Result::err).collect());
    }
    let live = LivePolicy {
        name: policy.name_any(),
        uid,
        generation: policy.metadata.generation.unwrap_or_default(),
        matcher,
        calls,
        triggers: Vec::new(),
    };
    Ok(Some((live, triggers.into_iter().flatten().collect())))
}

/// How `call` is sent: its receiver's client made (its roots parsed) and its token read.
async fn route(
    ctx: &CallsContext,
    path: &str,
    call: &CallEffect,
    receivers: &mut Receivers,
) -> Result<Route, String> {
    let ca_pem = match &call.ca_bundle {
        None => None,
        Some(bundle) => Some(ca_pem(bundle).map_err(|why| format!("{path}.caBundle: {why}"))?),
    };
    let origin = call
        .url
        .parse::<http::Uri>()
        .ok()
        .and_then(|u| u.authority().map(|a| format!("https://{a}")))
        .ok_or_else(|| format!("{path}.url: {:?} is not an https URL", call.url))?;
    let receiver = ReceiverId { origin, ca_pem };
    receivers
        .prepare(&receiver)
        .map_err(|e| format!("{path}.caBundle: {e}"))?;
    let token = match &call.token_secret {
        None => None,
        Some(name) => Some(
            read_token(ctx, name)
                .await
                .map_err(|why| format!("{path}.tokenSecret: {why}"))?,
        ),
    };
    let seconds = u64::try_from(call.timeout_seconds)
        .unwrap_or(5)
        .clamp(1, 30);
    Ok(Route {
        receiver,
        token,
        timeout: Duration::from_secs(seconds),
    })
}

/// The `token` of Secret `name` in Gatehouse's namespace.
async fn read_token(ctx: &CallsContext, name: &str) -> Result<String, String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) if status.code == 403 => format!(
                "Gatehouse may not get Secret {}/{name}: grant it by name (a Role with \
                 resourceNames, bound to Gatehouse's ServiceAccount)",
                ctx.namespace
            ),
            other => format!("reading Secret {}/{name}: {other}", ctx.namespace),
        })?
        .ok_or_else(|| format!("Secret {}/{name} does not exist", ctx.namespace))?;
    let token = secret
        .data
        .as_ref()
        .and_then(|d| d.get("token"))
        .ok_or_else(|| format!("Secret {}/{name} has no `token`", ctx.namespace))?;
    let token = String::from_utf8(token.0.clone())
        .map_err(|_| format!("the token of Secret {}/{name} is not text", ctx.namespace))?;
    Ok(token.trim().to_string())
}

/// The Pods a Policy that does not gate (any more) may have left at the gate, read into
/// [`Fetched::left_gated`] once their watch has listed.
async fn watch_left_gated(
    policy: &Policy,
    state: &mut LeaderState,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
    fetched: &mut Fetched,
) {
    match left_gated_pods(policy, &mut state.kinds, &state.watches, wanted).await {
        Ok(pods) => fetched.left_gated.extend(pods),
        Err(()) => fetched.gating_unplanned = true,
    }
}

/// The live Policy with what its trigger watches hold, or unplanned while one has not listed.
fn read_watches(
    mut live: LivePolicy,
    triggers: Vec<crate::effects::triggers::TriggerWatch>,
    state: &LeaderState,
    fetched: &mut Fetched,
) {
    for trigger in triggers {
        match state.watches.objects(&trigger.key) {
            Some(objects) => live.triggers.push(TriggerObjects {
                kind: trigger.kind,
                objects,
            }),
            None => {
                fetched.unplanned.insert(live.uid.clone());
                return;
            }
        }
    }
    fetched.live.push(live);
}
