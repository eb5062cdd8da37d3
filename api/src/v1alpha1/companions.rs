//! Companion objects: the second side effect. For every stored object a Policy selects (its
//! trigger), the effects loop keeps companion objects in place, server-side applied under
//! Gatehouse's field manager, and collects them when the trigger, its match or the Policy goes.
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on every companion: the UID of the Policy it was made for.
pub const COMPANION_POLICY_LABEL: &str = "gatehouse.dev/companion-of-policy";
/// Label on every companion: the UID of the stored object it was made for.
pub const COMPANION_TRIGGER_LABEL: &str = "gatehouse.dev/companion-of";
/// Finalizer that holds a deleted Policy until its companions are collected (or, with
/// `keepOnPolicyDelete`, released).
pub const COMPANIONS_FINALIZER: &str = "gatehouse.dev/companions";
/// Scheduling gate that holds a Pod until its companions exist (`gate: true`).
pub const COMPANIONS_GATE: &str = "gatehouse.dev/companions";
/// Condition type on a Policy with object effects: whether every companion is in place.
pub const COMPANIONS_CONDITION: &str = "CompanionsInPlace";

/// A companion object kept in place for every stored object the Policy selects (its rules name
/// the trigger's kind; the selectors and `match.conditions` are judged on the stored object as
/// an UPDATE onto itself, as the audit does). Nothing happens at admission: the companion is
/// server-side applied after the trigger is stored, keyed by the trigger's UID, so a dry run or a
/// denied request creates nothing. Fields Gatehouse sets are held (a hand edit is reverted);
/// fields others add are kept. The companion carries an owner reference to its trigger where
/// Kubernetes allows one (same namespace, or a cluster-scoped trigger) and the labels
/// `gatehouse.dev/companion-of` (the trigger's UID) and `gatehouse.dev/companion-of-policy`
/// (the Policy's UID); what no owner reference collects (another namespace, a trigger that
/// stopped matching, a deleted Policy) the loop deletes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectEffect {
    /// The companion: `apiVersion`, `kind`, `metadata.name` (unless a field sets it) and the
    /// rest. A namespaced companion goes into the trigger's namespace (a Namespace trigger: into
    /// that Namespace) unless `metadata.namespace` names one.
    #[schemars(schema_with = "embedded_object")]
    pub template: serde_json::Value,

    /// Values computed from the trigger: each CEL expression over `object` (the stored trigger)
    /// is written at its dotted `path` of the template, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<ComputedField>,

    /// Copy the data of this object, of the template's kind, under the template (the template's
    /// fields win). A change to the source reaches every copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone_from: Option<CloneSource>,

    /// Pods only: admission adds the scheduling gate `gatehouse.dev/companions` to each Pod the
    /// Policy matches on CREATE, and the loop removes it once all of the Pod's companions exist,
    /// so the Pod never runs before them (a ConfigMap it mounts, a NetworkPolicy fencing it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gate: bool,

    /// Leave the companions in place when the Policy is deleted (their labels stay; nothing
    /// keeps them in sync any more). Default false: they are deleted with the Policy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_on_policy_delete: bool,
}

/// One value of a companion computed from its trigger.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputedField {
    /// Dotted path in the companion, e.g. `metadata.labels.team`: inside `metadata` (name,
    /// labels, annotations) or under a top-level field the template has.
    #[schemars(length(min = 1))]
    pub path: String,
    /// CEL over `object`, the stored trigger, e.g. `object.metadata.labels['team']`. Its value
    /// (string, number, bool, list or map) is written at `path`.
    #[schemars(length(min = 1))]
    pub expression: String,
}

/// The object a companion's data is copied from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloneSource {
    /// Namespace of the source (empty for a cluster-scoped kind).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name of the source.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// How many companions a Policy's object effects want, how many are in place, and of which
/// kinds it has any.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompanionCounts {
    /// Companions the stored objects the Policy selects call for.
    pub wanted: i64,
    /// Of those, the ones that exist as the Policy says.
    pub in_place: i64,
    /// The kinds (`<apiVersion>/<kind>`) its object effects name or its companions still are:
    /// a kind the Policy stops naming is swept until none of its companions is left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<String>,
}

/// How `status.companions.kinds` names the kind `kind` of `api_version`.
pub fn companion_kind_name(api_version: &str, kind: &str) -> String {
    format!("{api_version}/{kind}")
}

/// The `(apiVersion, kind)` of a name in `status.companions.kinds`.
pub fn parse_companion_kind(name: &str) -> Option<(&str, &str)> {
    let (api_version, kind) = name.rsplit_once('/')?;
    (!api_version.is_empty() && !kind.is_empty()).then_some((api_version, kind))
}

fn embedded_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-embedded-resource": true
    })
}
