//! `Policy`: what Gatehouse serves as admission webhooks.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of every Gatehouse resource.
pub const GROUP: &str = "gatehouse.dev";

/// A Policy mutates and/or validates the objects it matches.
///
/// Policies share webhook entries, so many Policies cost the API server about what a couple of
/// webhooks cost: the mutating entries are the runs of consecutive Policies, in
/// (`priority`, name) order, that share `failurePolicy` and `reinvocationPolicy`; the validating
/// entries are one per `failurePolicy`. Gatehouse matches each Policy itself exactly as the API
/// server would (rules, selectors, conditions) and runs the matching mutating Policies of an
/// entry in order on one copy of the object, so the order across Policies is exact. A Policy
/// whose `match.conditions` use `authorizer` keeps an entry of its own, since only the API
/// server can evaluate `authorizer`; its status says so.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "Policy",
    plural = "policies",
    shortname = "gpol",
    status = "PolicyStatus",
    doc = "A Policy: mutations and CEL validations that Gatehouse serves as admission webhooks.",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Enforcement","type":"string","jsonPath":".status.enforcement"}"#,
    printcolumn = r#"{"name":"Audited","type":"string","jsonPath":".status.conditions[?(@.type==\"Audited\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = kube::core::Rule::new(
        "(has(self.mutate) && size(self.mutate) > 0) || (has(self.validate) && size(self.validate) > 0) || (has(self.effects) && size(self.effects) > 0)"
    )
        .message("a Policy needs at least one of mutate, validate or effects"),
    validation = kube::core::Rule::new(
        "self.reinvocationPolicy == 'Never' || (has(self.mutate) && size(self.mutate) > 0)"
    )
        .message("reinvocationPolicy IfNeeded is only meaningful for a Policy with mutate")
)]
pub struct PolicySpec {
    /// Order among mutating Policies: lower runs first, ties are broken by name. Exact across
    /// all Policies, whichever webhook entries they share.
    #[serde(default = "default_priority")]
    pub priority: i32,

    /// Which requests this Policy applies to.
    #[serde(rename = "match")]
    pub match_: MatchSpec,

    /// What happens when the webhook cannot be reached or one of this Policy's expressions fails
    /// at run time: `Fail` rejects the request, `Ignore` skips this Policy (with a warning and
    /// the metric gatehouse_policy_decisions_total{decision="ignored"}). Decided per Policy: one
    /// Policy's error never affects the others in its entry. A Warn rule never refuses: its
    /// run-time error is a warning, as in the API server, and a Policy of Warn rules only is
    /// called with `Ignore`.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// How long the API server waits for this Policy's webhook, in seconds. A shared entry waits
    /// as long as the longest of its Policies.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,

    /// `IfNeeded` asks the API server to call this Policy's mutating webhook again when a later
    /// mutating webhook changed the object; inside its entry, the Policy also runs again after a
    /// later Policy changed the object. Gatehouse mutations are idempotent, so this is safe.
    #[serde(default)]
    pub reinvocation_policy: ReinvocationPolicy,

    /// Mutations, applied in order. Each is idempotent: applying it twice equals applying it once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mutate: Vec<Mutation>,

    /// CEL rules the (final, mutated) object must satisfy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<ValidationRule>,

    /// Side effects, performed by Gatehouse's effects loop after the object is stored (never at
    /// admission, so `sideEffects: None` stays true and a dry run allocates nothing). A Policy
    /// with effects gets a mutating entry: admission marks the object for the loop.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub effects: Vec<super::Effect>,

    /// Where the API server enforces this Policy. `Auto` (default): in-process when the API
    /// server can run it exactly (no webhook call, nothing to fail while Gatehouse is
    /// unreachable), otherwise Gatehouse's webhook. A validating Policy then becomes a
    /// ValidatingAdmissionPolicy and its binding; a mutating one joins a generated
    /// MutatingAdmissionPolicy `gatehouse-mutating-<first member>` shared with the in-process
    /// mutating Policies that can match the same requests, in (priority, name) order, which
    /// requires every such Policy before it to run in-process too and its merges to fit the
    /// schemas of the kinds it matches; under `Auto`, a generated policy that would make a
    /// request pay more than one mutation (after joining the merges of Policies with one match)
    /// leaves its Policies on the webhook, which costs less; and past the operator's
    /// `--max-admission-policies` generated policies (default 32; the API server matches each
    /// against every request of the cluster), the later Policies in (priority, name) order stay
    /// on the webhook. `Webhook`: always the webhook. `InProcess`: in-process, or
    /// `Ready=False` with the reason it cannot be. `status.enforcement` says where it runs and,
    /// on the webhook, the `Ready` condition's message says why not in-process.
    #[serde(default)]
    pub enforcement: Enforcement,
}

impl PolicySpec {
    /// Whether nothing this Policy says can refuse a request: Warn rules only, no mutation, no
    /// effect.
    pub fn warns_only(&self) -> bool {
        self.mutate.is_empty()
            && self.effects.is_empty()
            && !self.validate.is_empty()
            && self
                .validate
                .iter()
                .all(|r| r.action == ValidationAction::Warn)
    }

    /// The failure policy acted on: `Ignore` for a Policy that [warns only](Self::warns_only)
    /// (its failures are warnings, and an unreachable webhook refuses nothing), otherwise
    /// `failurePolicy`.
    pub fn effective_failure_policy(&self) -> FailurePolicy {
        if self.warns_only() {
            FailurePolicy::Ignore
        } else {
            self.failure_policy
        }
    }
}

/// The spec the API server's defaulting produces for an empty object.
impl Default for PolicySpec {
    fn default() -> Self {
        Self {
            priority: default_priority(),
            match_: MatchSpec::default(),
            failure_policy: FailurePolicy::default(),
            timeout_seconds: default_timeout_seconds(),
            reinvocation_policy: ReinvocationPolicy::default(),
            mutate: Vec::new(),
            validate: Vec::new(),
            effects: Vec::new(),
            enforcement: Enforcement::default(),
        }
    }
}

/// A spec for unit tests (of the crates that use these types): `priority`, a label merge when
/// `mutate`, an always-true rule when `validate`, the defaults otherwise.
#[doc(hidden)]
pub fn sample_spec(priority: i32, mutate: bool, validate: bool) -> PolicySpec {
    let mut spec = PolicySpec {
        priority,
        ..PolicySpec::default()
    };
    if mutate {
        spec.mutate.push(Mutation {
            merge: serde_json::json!({"metadata": {"labels": {"a": "b"}}}),
            ..Mutation::default()
        });
    }
    if validate {
        spec.validate.push(ValidationRule {
            expression: "true".into(),
            message: "m".into(),
            action: Default::default(),
        });
    }
    spec
}

fn default_priority() -> i32 {
    100
}

fn default_timeout_seconds() -> i32 {
    10
}

/// Which requests a Policy applies to. Same meaning as the matching fields of an
/// admissionregistration.k8s.io/v1 webhook.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchSpec {
    /// Operations and resources this Policy matches; a request matches when any rule matches.
    #[schemars(length(min = 1))]
    pub rules: Vec<Rule>,

    /// Only objects in namespaces whose labels match (a Namespace itself by its own labels;
    /// other cluster-scoped objects always match). Gatehouse never touches kube-system and its
    /// own namespace, whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,

    /// Only objects whose labels match: the new object's or, on UPDATE and DELETE, the old
    /// one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_selector: Option<LabelSelector>,

    /// CEL match conditions (`object`, `oldObject`, `request`; `authorizer` too), with the
    /// meaning of a webhook's `matchConditions`. All must be true for the Policy to apply.
    /// Gatehouse evaluates them; a Policy whose conditions use `authorizer` gets a webhook entry of
    /// its own and the API server evaluates them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<MatchCondition>,
}

/// Operations and resources, with the meaning of admissionregistration.k8s.io/v1
/// RuleWithOperations.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Operations matched: CREATE, UPDATE, DELETE, CONNECT or `*` for all.
    #[schemars(length(min = 1))]
    pub operations: Vec<Operation>,
    /// API groups matched; `""` is the core group, `*` all groups.
    #[schemars(length(min = 1))]
    pub api_groups: Vec<String>,
    /// API versions matched; `*` for all.
    #[schemars(length(min = 1))]
    pub api_versions: Vec<String>,
    /// Resources matched, e.g. `pods`, `pods/status`, `*`, `*/scale`.
    #[schemars(length(min = 1))]
    pub resources: Vec<String>,
    /// Cluster, Namespaced, or `*` for both.
    #[serde(default)]
    pub scope: Scope,
}

/// An admission operation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Operation {
    #[serde(rename = "CREATE")]
    Create,
    #[serde(rename = "UPDATE")]
    Update,
    #[serde(rename = "DELETE")]
    Delete,
    #[serde(rename = "CONNECT")]
    Connect,
    #[serde(rename = "*")]
    All,
}

impl Operation {
    /// The wire form, as admissionregistration.k8s.io/v1 spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
            Operation::All => "*",
        }
    }
}

/// Resource scope a rule matches.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Scope {
    Cluster,
    Namespaced,
    #[default]
    #[serde(rename = "*")]
    All,
}

impl Scope {
    /// The wire form, as admissionregistration.k8s.io/v1 spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Cluster => "Cluster",
            Scope::Namespaced => "Namespaced",
            Scope::All => "*",
        }
    }
}

/// A CEL condition evaluated by the API server before calling the webhook.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchCondition {
    /// Unique name of the condition within the Policy.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// CEL expression over `object`, `oldObject`, `request`, `authorizer`; must return bool.
    #[schemars(length(min = 1))]
    pub expression: String,
}

/// Failure policy of the webhook entry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum FailurePolicy {
    #[default]
    Fail,
    Ignore,
}

impl FailurePolicy {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Fail => "Fail",
            FailurePolicy::Ignore => "Ignore",
        }
    }
}

/// Reinvocation policy of a mutating webhook entry.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ReinvocationPolicy {
    #[default]
    Never,
    IfNeeded,
}

impl ReinvocationPolicy {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            ReinvocationPolicy::Never => "Never",
            ReinvocationPolicy::IfNeeded => "IfNeeded",
        }
    }
}

/// One mutation: merge an object into the reviewed object, or into each element of an array.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Mutation {
    /// Dotted path to an array in the object (e.g. `spec.containers`); `merge` is then applied to
    /// each element. An absent path is a no-op.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_each: Option<String>,

    /// CEL guard over `object`, `oldObject`, `request` and, with `forEach`, `element`: the merge
    /// applies only where it is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,

    /// The object merged in. Objects recurse; arrays of objects with a `name` key merge by name;
    /// arrays of scalars are unioned; `null` removes a key (with `overwrite`).
    #[schemars(schema_with = "preserved_object")]
    pub merge: serde_json::Value,

    /// false (default): defaulting, only absent fields are set. true: existing scalars are
    /// replaced and `null` removes keys.
    #[serde(default)]
    pub overwrite: bool,
}

/// Where a Policy asks to be enforced.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum Enforcement {
    /// In-process when the Policy can be expressed there exactly, else the webhook.
    #[default]
    Auto,
    /// Always Gatehouse's webhook.
    Webhook,
    /// In-process, or not at all (`Ready=False` with the reason).
    InProcess,
}

/// Where a Policy is enforced.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EnforcementPoint {
    /// Gatehouse's webhook entries.
    Webhook,
    /// The API server itself: a ValidatingAdmissionPolicy, or the generated
    /// MutatingAdmissionPolicy.
    InProcess,
}

impl EnforcementPoint {
    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            EnforcementPoint::Webhook => "Webhook",
            EnforcementPoint::InProcess => "InProcess",
        }
    }
}

/// A CEL rule the object must satisfy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ValidationRule {
    /// CEL expression over `object`, `oldObject` (null on CREATE) and `request`; must return bool.
    /// true means the object complies.
    #[schemars(length(min = 1))]
    pub expression: String,
    /// Shown to the user when the expression is false.
    #[schemars(length(min = 1))]
    pub message: String,
    /// Deny rejects the request; Warn admits it and returns the message as a warning.
    #[serde(default)]
    pub action: ValidationAction,
}

/// What a failed validation rule does.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum ValidationAction {
    #[default]
    Deny,
    Warn,
}

/// Observed state of a Policy, written by the Gatehouse controller.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Kubernetes-style conditions; `Ready` says whether the Policy is wired into the webhook
    /// configurations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Where the Policy is enforced, once it is: `Webhook` or `InProcess`. Webhook servers skip
    /// a Policy whose status says `InProcess` at its current generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcement: Option<EnforcementPoint>,
    /// When the last audit pass judged the stored objects this Policy matches (validating
    /// Policies; the `Audited` condition says whether it covered every kind the Policy names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_audit_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Companions of the Policy's object effects: how many are wanted and how many are in
    /// place (the `CompanionsInPlace` condition names one that cannot be written, and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub companions: Option<super::CompanionCounts>,
    /// Calls of the Policy's call effects: how many are wanted, applied and refused for good
    /// (the `CallsApplied` condition says which were refused, and why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<super::CallCounts>,
}

fn preserved_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}
