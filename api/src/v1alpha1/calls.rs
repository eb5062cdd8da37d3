//! Calls to external systems: the third side effect. For every stored object a Policy selects,
//! the effects loop calls a receiver with `Apply` once, keyed by `<object UID>/<Policy UID>/
//! <effect index>`, and with `Release` when the object goes or stops matching. Each call is an
//! `ExternalCall` record, so nothing is lost across crashes, leader changes and restarts.
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Owner;

/// Scheduling gate that holds a Pod until its calls succeeded (`gate: true`).
pub const CALLS_GATE: &str = "gatehouse.dev/calls";
/// Finalizer that holds a deleted Policy until the calls it applied are released.
pub const CALLS_FINALIZER: &str = "gatehouse.dev/calls";
/// Condition type on a Policy with call effects: whether every call was applied.
pub const CALLS_CONDITION: &str = "CallsApplied";
/// Label on every ExternalCall: the UID of its Policy.
pub const CALL_POLICY_LABEL: &str = "gatehouse.dev/call-of-policy";
/// Label on every ExternalCall: the UID of the object it calls for.
pub const CALL_OBJECT_LABEL: &str = "gatehouse.dev/call-of";

/// A call to an external system for every stored object the Policy selects (its rules name the
/// object's kind; selectors and `match.conditions` are judged on the stored object, as for
/// companion objects). Nothing is called at admission: after the object is stored, the loop
/// POSTs `{"action": "Apply", "key", "object", "snapshot"}` to `url` until the receiver answers
/// 2xx, and `{"action": "Release", ...}` with the same key once the object is deleted, stops
/// matching or the Policy goes. Calls are at least once: the key makes a repeat harmless.
/// 408, 429, 5xx and timeouts are retried with exponential backoff; any other 4xx is permanent
/// (the ExternalCall says `Failed`, an Event says why; it is tried again when the Policy
/// changes).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallEffect {
    /// The receiver, an `https://` URL.
    #[schemars(length(min = 1), regex(pattern = r"^https://"))]
    pub url: String,

    /// PEM certificates (base64, as a webhook's `caBundle`) that the receiver's certificate
    /// must chain to; without it, the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,

    /// A Secret in Gatehouse's namespace whose `token` is sent as `Authorization: Bearer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<String>,

    /// How long one call may take, in seconds; a call that takes longer is retried.
    #[serde(default = "default_call_timeout")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: i32,

    /// An annotation of the object the receiver's `result` (a string in its JSON answer to
    /// Apply) is written to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_annotation: Option<String>,

    /// Pods only: admission adds the scheduling gate `gatehouse.dev/calls` to each Pod the
    /// Policy matches on CREATE, and the loop removes it once the receiver accepted the Apply,
    /// so the Pod never runs before the external system knows it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gate: bool,
}

fn default_call_timeout() -> i32 {
    5
}

/// Where one call stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum CallState {
    /// Apply not yet accepted: waiting, or retrying after a retryable failure.
    #[default]
    Pending,
    /// The receiver accepted Apply.
    Applied,
    /// The object went: Release not yet accepted.
    Releasing,
    /// The receiver refused for good (a 4xx other than 408 and 429); tried again when the
    /// Policy changes.
    Failed,
}

/// One call of one Policy's effect for one object: the record that keeps it from being lost.
/// Its name is `<object UID>.<Policy UID>.<effect index>`, so there is only ever one.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gatehouse.dev",
    version = "v1alpha1",
    kind = "ExternalCall",
    plural = "externalcalls",
    shortname = "gcall",
    status = "ExternalCallStatus",
    doc = "A call to an external system for one object and one effect of a Policy, keyed by the object's UID.",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.object.kind"}"#,
    printcolumn = r#"{"name":"Namespace","type":"string","jsonPath":".spec.object.namespace"}"#,
    printcolumn = r#"{"name":"Object","type":"string","jsonPath":".spec.object.name"}"#,
    printcolumn = r#"{"name":"Attempts","type":"integer","jsonPath":".status.attempts"}"#,
    printcolumn = r#"{"name":"Error","type":"string","priority":1,"jsonPath":".status.lastError"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ExternalCallSpec {
    /// `<object UID>/<Policy UID>/<effect index>`: what the receiver is told, the same on
    /// every call.
    pub key: String,
    /// The Policy whose effect this is.
    pub policy: String,
    /// The effect's index in the Policy's `spec.effects`.
    pub effect: i32,
    /// The receiver when the record was made.
    pub url: String,
    /// The object the call is for.
    pub object: Owner,
}

/// What the loop last did and heard.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalCallStatus {
    /// Pending, Applied, Releasing or Failed.
    #[serde(default)]
    pub state: CallState,
    /// Calls made for the current state.
    #[serde(default)]
    pub attempts: i64,
    /// Why the last call failed; on an Applied call, why its answer had no readable result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The receiver's `result` to Apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// When the next call is due (RFC 3339), after a retryable failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<String>,
    /// The receiver the last call went to: Release goes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The Policy's generation when the call failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_generation: Option<i64>,
}

/// The key of `object_uid`'s call for `policy_uid`'s effect `index`.
pub fn call_key(object_uid: &str, policy_uid: &str, index: usize) -> String {
    format!("{object_uid}/{policy_uid}/{index}")
}

/// The ExternalCall name of a key: its `/` as `.` (UIDs are DNS labels).
pub fn call_record_name(key: &str) -> String {
    key.replace('/', ".")
}

/// How many calls a Policy's call effects want, how many were applied, how many were refused
/// for good.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallCounts {
    /// Calls the stored objects the Policy selects call for.
    pub wanted: i64,
    /// Of those, the ones the receiver accepted.
    pub applied: i64,
    /// Of those, the ones the receiver refused for good (the `CallsApplied` condition says
    /// why).
    pub failed: i64,
}
