//! The AdmissionReview request the API server would send for an object, built offline for
//! `gatehouse eval` and `gatehouse test`.
use serde_json::Value;

use gatehouse_api::v1alpha1::Operation;
use gatehouse_engine::Request;
use gatehouse_engine::admission::{GroupVersionKind, GroupVersionResource, UserInfo};

/// The uid of a synthesised request: fixed so that output is reproducible.
pub const SYNTHETIC_UID: &str = "00000000-0000-0000-0000-000000000000";
/// The user of a synthesised request.
pub const SYNTHETIC_USER: &str = "gatehouse-eval";

/// What a synthesised request says beyond its objects.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestDetails {
    pub operation: Operation,
    /// The request's namespace; the object's (or `default`) when `None`.
    pub namespace: Option<String>,
    /// `resource` or `resource/subresource`; guessed from the kind when `None`.
    pub resource: Option<String>,
    /// Who asks; [`SYNTHETIC_USER`] in `system:authenticated` when `None`.
    pub user_info: Option<UserInfo>,
}

/// The request the API server would send for `object` (and `old_object`), or what is missing
/// from the object to build it.
pub fn synthesized(
    object: Value,
    old_object: Option<Value>,
    details: &RequestDetails,
) -> Result<Request, String> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| "apiVersion: must be set".to_string())?;
    let kind = object
        .get("kind")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| "kind: must be set".to_string())?
        .to_string();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (group, version) = (group.to_string(), version.to_string());
    let (resource, sub_resource) = match &details.resource {
        Some(r) => match r.split_once('/') {
            Some((res, sub)) => (res.to_string(), Some(sub.to_string())),
            None => (r.clone(), None),
        },
        None => (plural(&kind), None),
    };
    let namespace = namespace_of(details.namespace.clone(), &object, &kind);
    let name = metadata_field(&object, "name").unwrap_or_default();
    let (object, old_object) = match details.operation {
        // The API server sends the object being deleted as oldObject.
        Operation::Delete => (None, Some(old_object.unwrap_or(object))),
        _ => (Some(object), old_object),
    };
    let user_info = details.user_info.clone().unwrap_or_else(|| UserInfo {
        username: SYNTHETIC_USER.to_string(),
        groups: vec!["system:authenticated".to_string()],
        ..UserInfo::default()
    });
    Ok(Request {
        uid: SYNTHETIC_UID.to_string(),
        kind: GroupVersionKind {
            group: group.clone(),
            version: version.clone(),
            kind,
        },
        resource: GroupVersionResource {
            group,
            version,
            resource,
        },
        sub_resource,
        request_kind: None,
        request_resource: None,
        request_sub_resource: None,
        name,
        namespace,
        operation: details.operation,
        user_info,
        object,
        old_object,
        dry_run: false,
        options: None,
    })
}

/// `field` of `object`'s metadata, when it is a string.
fn metadata_field(object: &Value, field: &str) -> Option<String> {
    object
        .pointer(&format!("/metadata/{field}"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The request's namespace: the one given, else the object's, else `default` for a namespaced
/// kind (as `kubectl create` does) and none for a cluster-scoped one.
fn namespace_of(namespace: Option<String>, object: &Value, kind: &str) -> String {
    namespace
        .or_else(|| metadata_field(object, "namespace"))
        .unwrap_or_else(|| {
            if CLUSTER_SCOPED.contains(&kind) {
                String::new()
            } else {
                "default".to_string()
            }
        })
}

/// Kinds of the built-in cluster-scoped resources, for the default namespace.
pub(crate) const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "StorageClass",
    "PriorityClass",
    "RuntimeClass",
    "IngressClass",
    "CustomResourceDefinition",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "APIService",
    "CertificateSigningRequest",
    "CSIDriver",
    "CSINode",
    "VolumeAttachment",
    "Policy",
];

/// The resource name for a kind: the lowercase plural, with English spelling rules and a table
/// of the irregular built-ins. Use `--resource` for anything it gets wrong.
pub fn plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    const IRREGULAR: &[(&str, &str)] = &[("endpoints", "endpoints")];
    if let Some((_, p)) = IRREGULAR.iter().find(|(k, _)| *k == lower) {
        return (*p).to_string();
    }
    let consonant_y = lower.ends_with('y')
        && !lower.ends_with("ay")
        && !lower.ends_with("ey")
        && !lower.ends_with("oy")
        && !lower.ends_with("uy");
    if consonant_y {
        format!("{}ies", &lower[..lower.len() - 1])
    } else if ["s", "x", "z", "ch", "sh"]
        .iter()
        .any(|s| lower.ends_with(s))
    {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    }
}
