//! The stored objects a Policy's effects act on (its triggers): the kinds its rules name,
//! discovered and watched, and whether a stored object matches the Policy, judged as the audit
//! judges it (an UPDATE of the object onto itself).
use std::collections::BTreeMap;

use kube::core::ApiResource;
use serde_json::Value;

use super::kinds::Kinds;
use super::resource_of;
use super::watches::{StoredJson, WatchKey, Watches};
use crate::audit::judge::{AuditedKind, audit_request};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::matcher::{self, Namespace};
use gatehouse_engine::policy::CompiledPolicy;

/// The stored objects of one trigger kind.
pub struct TriggerObjects {
    pub kind: AuditedKind,
    pub objects: Vec<StoredJson>,
}

/// One trigger kind and its watch.
pub struct TriggerWatch {
    pub kind: AuditedKind,
    pub key: WatchKey,
}

/// The labels of a Namespace by its name; `None` for one not seen.
pub type LabelsOf<'a> = &'a dyn Fn(&str) -> Option<BTreeMap<String, String>>;

/// Whether the stored object `value` of `kind` matches `policy`; `Err` with why it cannot be
/// told (its Namespace not seen yet, a condition failing).
pub fn matches_stored(
    kind: &AuditedKind,
    value: &Value,
    policy: &CompiledPolicy,
    namespaces: LabelsOf<'_>,
) -> Result<bool, String> {
    let request = audit_request(kind, value);
    let labels = namespaces(&request.namespace);
    let namespace = match &labels {
        Some(labels) => Namespace::Labels(labels),
        None if kind.namespaced || kind.is_namespace() => {
            Namespace::Unknown("its Namespace is not in the cache yet")
        }
        None => Namespace::Assumed,
    };
    matcher::matches(&request, policy, namespace)
        .map_err(|e| format!("matching {} {}: {e}", kind.kind, request.name))
}

/// The kinds `policy`'s rules name, each discovered, its list and watch checked and its watch
/// wanted; a problem for each that cannot be.
pub async fn trigger_watches(
    policy: &Policy,
    kinds: &mut Kinds,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
) -> Vec<Result<TriggerWatch, String>> {
    let mut triggers = Vec::new();
    for rule in &policy.spec.match_.rules {
        for group in &rule.api_groups {
            for version in &rule.api_versions {
                for resource in &rule.resources {
                    triggers.push(trigger_watch(group, version, resource, kinds, wanted).await);
                }
            }
        }
    }
    triggers
}

async fn trigger_watch(
    group: &str,
    version: &str,
    resource: &str,
    kinds: &mut Kinds,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
) -> Result<TriggerWatch, String> {
    let problem = |why: String| format!("spec.match.rules: {why}");
    let kind = kinds
        .trigger(group, version, resource)
        .await
        .map_err(problem)?;
    kinds
        .may(&["list", "watch"], group, resource, None)
        .await
        .map_err(problem)?;
    let ar = resource_of(&kind);
    let key = WatchKey::all(&ar, None);
    wanted.insert(key.clone(), ar);
    Ok(TriggerWatch { kind, key })
}

/// The Pods a Policy that no longer gates (deleted, or its gating effects gone) may have left
/// at a gate: the stored Pods of its Pod rules, once their watch has listed; `Err(())` while
/// one has not (a later pass looks again).
pub async fn left_gated_pods(
    policy: &Policy,
    kinds: &mut Kinds,
    watches: &Watches,
    wanted: &mut BTreeMap<WatchKey, ApiResource>,
) -> Result<Vec<TriggerObjects>, ()> {
    let names_pods = policy.spec.match_.rules.iter().any(|rule| {
        rule.api_groups.iter().any(String::is_empty) && rule.resources.iter().any(|r| r == "pods")
    });
    if !names_pods {
        return Ok(Vec::new());
    }
    let mut pods = Vec::new();
    let mut listed = true;
    for trigger in trigger_watches(policy, kinds, wanted)
        .await
        .into_iter()
        .flatten()
    {
        let TriggerWatch { kind, key } = trigger;
        if !(kind.group.is_empty() && kind.kind == "Pod") {
            continue;
        }
        match watches.objects(&key) {
            Some(objects) => pods.push(TriggerObjects { kind, objects }),
            None => listed = false,
        }
    }
    if listed { Ok(pods) } else { Err(()) }
}
