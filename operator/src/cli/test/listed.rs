//! The effects a stored resource would get, listed and never performed: the address pool, the
//! companion objects rendered with their computed fields, the calls with their bodies.
use serde::Serialize;
use serde_json::Value;

use crate::cli::synthetic::{CLUSTER_SCOPED, SYNTHETIC_UID};
use gatehouse_api::v1alpha1::Effect;
use gatehouse_engine::call::{self, Action, CalledObject};
use gatehouse_engine::companion::{self, RenderInput, Trigger};
use gatehouse_engine::{CompiledPolicy, Namespace, Request, matches};

/// The UID a listed effect gives the Policy, where a cluster would give its own.
pub const POLICY_UID: &str = "policy-uid";

/// One effect the effects loop would carry out.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed {
    pub policy: String,
    pub resource: String,
    /// `ipam`, `object` or `call`; `unknown` when the Policy's match could not be decided.
    pub effect: String,
    /// One line: what would be done.
    pub summary: String,
    /// The companion object, or the call's body; null for an address.
    pub detail: Value,
}

/// The effects of every Policy of `policies` that selects the stored object.
pub fn listed_effects(
    policies: &[CompiledPolicy],
    request: &Request,
    stored: &Value,
    resource: &str,
    namespace: Namespace<'_>,
) -> Vec<Listed> {
    if !matches!(
        request.operation,
        gatehouse_api::v1alpha1::Operation::Create | gatehouse_api::v1alpha1::Operation::Update
    ) {
        return Vec::new();
    }
    let mut stored = stored.clone();
    if !stored["metadata"]["uid"].is_string() {
        stored["metadata"]["uid"] = Value::from(SYNTHETIC_UID);
    }
    let mut request = request.clone();
    request.object = Some(stored.clone());
    let mut listed = Vec::new();
    for policy in policies {
        if policy.spec().effects.is_empty() {
            continue;
        }
        match matches(&request, policy, namespace) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                listed.push(Listed {
                    policy: policy.name().to_string(),
                    resource: resource.to_string(),
                    effect: "unknown".to_string(),
                    summary: format!("cannot tell whether it selects the object: {e}"),
                    detail: Value::Null,
                });
                continue;
            }
        }
        for (index, effect) in policy.spec().effects.iter().enumerate() {
            let (kind, summary, detail) = describe(index, effect, &request, &stored);
            listed.push(Listed {
                policy: policy.name().to_string(),
                resource: resource.to_string(),
                effect: kind.to_string(),
                summary,
                detail,
            });
        }
    }
    listed
}

/// An effect's kind, one line on it, and its detail.
fn describe(
    index: usize,
    effect: &Effect,
    request: &Request,
    stored: &Value,
) -> (&'static str, String, Value) {
    if let Some(ipam) = &effect.ipam {
        let annotation = ipam.annotation.as_deref().unwrap_or("gatehouse.dev/ip");
        let summary = format!(
            "an address from IPPool {}, written to the annotation {annotation}",
            ipam.pool
        );
        return ("ipam", summary, Value::Null);
    }
    if let Some(object) = &effect.object {
        return companion(index, object, request, stored);
    }
    if let Some(call) = &effect.call {
        let object = CalledObject {
            api_version: api_version(request),
            kind: request.kind.kind.clone(),
            namespace: request.namespace.clone(),
            name: stored["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            uid: stored["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        };
        let key = format!("{}.{POLICY_UID}.{index}", object.uid);
        let body = call::body(Action::Apply, &key, &object, Some(stored));
        return (
            "call",
            format!("POST {} (Apply, key {key})", call.url),
            body,
        );
    }
    (
        "none",
        "an effect of no known kind".to_string(),
        Value::Null,
    )
}

fn api_version(request: &Request) -> String {
    let gvk = &request.kind;
    if gvk.group.is_empty() {
        gvk.version.clone()
    } else {
        format!("{}/{}", gvk.group, gvk.version)
    }
}

/// A companion object, rendered as the companions loop would (a clone's data is read in the
/// cluster, so it is left out here).
fn companion(
    index: usize,
    effect: &gatehouse_api::v1alpha1::ObjectEffect,
    request: &Request,
    stored: &Value,
) -> (&'static str, String, Value) {
    let path = format!("spec.effects[{index}].object");
    let mut problems = Vec::new();
    let Some(compiled) = companion::check(&path, effect, &mut problems) else {
        let why: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return (
            "object",
            format!("cannot be rendered: {}", why.join("; ")),
            Value::Null,
        );
    };
    let trigger_kind = request.kind.kind.clone();
    let trigger_version = api_version(request);
    let trigger = Trigger {
        api_version: &trigger_version,
        kind: &trigger_kind,
        object: stored,
        namespaced: !CLUSTER_SCOPED.contains(&trigger_kind.as_str()),
    };
    let input = RenderInput {
        policy_uid: POLICY_UID,
        namespaced: !CLUSTER_SCOPED.contains(&compiled.kind()),
        clone_source: None,
    };
    match companion::render(&compiled, trigger, input) {
        Ok(rendered) => {
            let metadata = &rendered["metadata"];
            let name = metadata["name"].as_str().unwrap_or_default();
            let at = match metadata["namespace"].as_str() {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            };
            let clone = if effect.clone_from.is_some() {
                " (a clone: its source's data is read in the cluster)"
            } else {
                ""
            };
            (
                "object",
                format!("{} {at}{clone}", compiled.kind()),
                rendered,
            )
        }
        Err(e) => ("object", format!("cannot be rendered: {e}"), Value::Null),
    }
}
