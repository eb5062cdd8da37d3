//! AdmissionReview in, AdmissionReview out: the wire types and the decision for one Policy.
//!
//! The response type is our own rather than kube-core's: kube-core 5 serialises `patch` as an
//! array of numbers, while the API server expects what `admission.k8s.io/v1` documents, a base64
//! string with `"patchType": "JSONPatch"`.
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::cel::{self, Activation, Needs};
use super::policy::{self, CompiledPolicy};
use super::{diff, mark, mutate};
use crate::api::v1alpha1::{FailurePolicy, Operation, Policy, ValidationAction};

/// The only AdmissionReview version Gatehouse registers for.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of the review object.
pub const KIND: &str = "AdmissionReview";

/// Why a request body is not an AdmissionReview; the server answers HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON.
    #[error("malformed AdmissionReview: not JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The body is JSON but not an object.
    #[error("malformed AdmissionReview: not a JSON object")]
    NotAnObject,
    /// `apiVersion` is not `admission.k8s.io/v1`.
    #[error("unsupported AdmissionReview apiVersion {0:?}: want \"admission.k8s.io/v1\"")]
    ApiVersion(String),
    /// `kind` is not `AdmissionReview`.
    #[error("unsupported kind {0:?}: want \"AdmissionReview\"")]
    Kind(String),
    /// No `request` object.
    #[error("malformed AdmissionReview: missing \"request\"")]
    MissingRequest,
    /// No `request.uid`.
    #[error("malformed AdmissionReview: missing \"request.uid\"")]
    MissingUid,
    /// `request` does not decode.
    #[error("malformed AdmissionReview: request: {0}")]
    Request(#[source] serde_json::Error),
    /// `request.operation` is `*`, which only rules may say.
    #[error("malformed AdmissionReview: request.operation \"*\" is not an operation")]
    Operation,
}

/// `{group, version, kind}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// `{group, version, resource}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub resource: String,
}

/// Who is asking.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The `request` of an `admission.k8s.io/v1` AdmissionReview.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_kind: Option<GroupVersionKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_resource: Option<GroupVersionResource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_sub_resource: Option<String>,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub operation: Operation,
    #[serde(default)]
    pub user_info: UserInfo,
    /// Absent (or null) for DELETE and most CONNECTs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// Absent (or null) for CREATE and CONNECT.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub options: Option<Value>,
}

impl Request {
    /// `request.uid`, echoed in every response.
    pub fn uid(&self) -> &str {
        &self.uid
    }
    /// `request.kind.kind`.
    pub fn kind_name(&self) -> &str {
        &self.kind.kind
    }
    /// `request.namespace`, empty for cluster-scoped objects.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
    /// `request.name`, possibly empty on CREATE with generateName.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// `request.operation` in its wire form.
    pub fn operation(&self) -> &'static str {
        self.operation.as_str()
    }
    /// `request.subResource`, empty for the main resource.
    pub fn sub_resource(&self) -> &str {
        self.sub_resource.as_deref().unwrap_or_default()
    }

    /// The CEL `request` variable: the request without `object` and `oldObject`, as Kubernetes'
    /// CEL environments expose it.
    pub fn cel_variable(&self) -> Value {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct View<'a> {
            uid: &'a str,
            kind: &'a GroupVersionKind,
            resource: &'a GroupVersionResource,
            sub_resource: &'a str,
            #[serde(skip_serializing_if = "Option::is_none")]
            request_kind: Option<&'a GroupVersionKind>,
            #[serde(skip_serializing_if = "Option::is_none")]
            request_resource: Option<&'a GroupVersionResource>,
            #[serde(skip_serializing_if = "Option::is_none")]
            request_sub_resource: Option<&'a str>,
            name: &'a str,
            namespace: &'a str,
            operation: &'a str,
            user_info: &'a UserInfo,
            dry_run: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            options: Option<&'a Value>,
        }
        let view = View {
            uid: &self.uid,
            kind: &self.kind,
            resource: &self.resource,
            sub_resource: self.sub_resource(),
            request_kind: self.request_kind.as_ref(),
            request_resource: self.request_resource.as_ref(),
            request_sub_resource: self.request_sub_resource.as_deref(),
            name: &self.name,
            namespace: &self.namespace,
            operation: self.operation(),
            user_info: &self.user_info,
            dry_run: self.dry_run,
            options: self.options.as_ref(),
        };
        // Plain structs of strings always serialise; null keeps the expressions' errors readable.
        serde_json::to_value(view).unwrap_or(Value::Null)
    }
}

/// Parses an AdmissionReview body and returns its request.
pub fn parse_review(body: &[u8]) -> Result<Request, ReviewError> {
    // What the API server sends decodes in one typed pass; anything else (including every
    // malformed body) takes the generic path below, which reports what is wrong.
    match wire::parse(body) {
        Some(request) => Ok(request),
        None => parse_review_generic(body),
    }
}

/// [`parse_review`] without the typed fast path: JSON value first, then the request. The
/// reference the fast path must agree with, and the benchmark's baseline for it.
pub fn parse_review_generic(body: &[u8]) -> Result<Request, ReviewError> {
    let value: Value = serde_json::from_slice(body).map_err(ReviewError::Json)?;
    let Value::Object(mut review) = value else {
        return Err(ReviewError::NotAnObject);
    };
    let field = |name: &str| {
        review
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != API_VERSION {
        return Err(ReviewError::ApiVersion(api_version));
    }
    if kind != KIND {
        return Err(ReviewError::Kind(kind));
    }
    let request = match review.remove("request") {
        Some(r @ Value::Object(_)) => r,
        _ => return Err(ReviewError::MissingRequest),
    };
    if request
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ReviewError::MissingUid);
    }
    let request: Request = serde_json::from_value(request).map_err(ReviewError::Request)?;
    if request.operation == Operation::All {
        return Err(ReviewError::Operation);
    }
    Ok(request)
}

/// The typed fast path of [`parse_review`]: decodes the body straight into the request, without
/// first building it as a generic JSON value.
///
/// It only answers when the generic path would produce the very same request: the review and
/// its request must be JSON objects (not arrays, which typed decoding would also accept), every
/// field must be a known one (an unknown one would be skipped unchecked, while the generic path
/// parses it and may reject it), and no field may repeat (the generic path keeps the last).
/// Otherwise it returns `None` and the generic path decides, errors included.
mod wire {
    use serde::de::{Deserialize, Deserializer, Visitor};
    use serde_json::Value;

    use super::{API_VERSION, GroupVersionKind, GroupVersionResource, KIND, Request, UserInfo};
    use crate::api::v1alpha1::Operation;

    pub(super) fn parse(body: &[u8]) -> Option<Request> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let Object(review) = Object::<Review>::deserialize(&mut de).ok()?;
        de.end().ok()?;
        let Object(r) = review.request;
        let ok = review.api_version == API_VERSION
            && review.kind == KIND
            && !r.uid.is_empty()
            && r.operation != Operation::All;
        ok.then(|| Request {
            uid: r.uid,
            kind: r.kind.into(),
            resource: r.resource.into(),
            sub_resource: r.sub_resource,
            request_kind: r.request_kind.map(Into::into),
            request_resource: r.request_resource.map(Into::into),
            request_sub_resource: r.request_sub_resource,
            name: r.name,
            namespace: r.namespace,
            operation: r.operation,
            user_info: r.user_info.into(),
            object: r.object,
            old_object: r.old_object,
            dry_run: r.dry_run,
            options: r.options,
        })
    }

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Review {
        api_version: String,
        kind: String,
        request: Object<WireRequest>,
    }

    /// [`Request`]'s fields and defaults, minus its tolerance of unknown fields.
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct WireRequest {
        uid: String,
        kind: Gvk,
        resource: Gvr,
        #[serde(default)]
        sub_resource: Option<String>,
        #[serde(default)]
        request_kind: Option<Gvk>,
        #[serde(default)]
        request_resource: Option<Gvr>,
        #[serde(default)]
        request_sub_resource: Option<String>,
        #[serde(default)]
        name: String,
        #[serde(default)]
        namespace: String,
        operation: Operation,
        #[serde(default)]
        user_info: User,
        #[serde(default)]
        object: Option<Value>,
        #[serde(default)]
        old_object: Option<Value>,
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        options: Option<Value>,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gvk {
        #[serde(default)]
        group: String,
        version: String,
        kind: String,
    }

    impl From<Gvk> for GroupVersionKind {
        fn from(g: Gvk) -> Self {
            GroupVersionKind {
                group: g.group,
                version: g.version,
                kind: g.kind,
            }
        }
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Gvr {
        #[serde(default)]
        group: String,
        version: String,
        resource: String,
    }

    impl From<Gvr> for GroupVersionResource {
        fn from(g: Gvr) -> Self {
            GroupVersionResource {
                group: g.group,
                version: g.version,
                resource: g.resource,
            }
        }
    }

    #[derive(serde::Deserialize, Default)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct User {
        #[serde(default)]
        username: String,
        #[serde(default)]
        uid: String,
        #[serde(default)]
        groups: Vec<String>,
        #[serde(default)]
        extra: std::collections::BTreeMap<String, Vec<String>>,
    }

    impl From<User> for UserInfo {
        fn from(u: User) -> Self {
            UserInfo {
                username: u.username,
                uid: u.uid,
                groups: u.groups,
                extra: u.extra,
            }
        }
    }

    /// A `T` that must be written as a JSON object: derived struct decoding also takes arrays.
    struct Object<T>(T);

    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            T::deserialize(MapOnly(deserializer)).map(Object)
        }
    }

    /// A deserializer that only decodes maps.
    struct MapOnly<D>(D);

    impl<'de, D: Deserializer<'de>> Deserializer<'de> for MapOnly<D> {
        type Error = D::Error;

        fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.0.deserialize_map(visitor)
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map struct enum identifier ignored_any
        }
    }
}

/// Which webhook configuration the request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Mutating,
    Validating,
}

impl Phase {
    /// For paths, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Mutating => "mutating",
            Phase::Validating => "validating",
        }
    }
}

/// `metav1.Status` of a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

/// The decision for one request. The uid is not part of it: [`response_review`] echoes the
/// request's.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    pub allowed: bool,
    /// Set when denied.
    pub status: Option<Status>,
    /// RFC 6902 operations from the original object to the mutated one; empty for none.
    pub patch: json_patch::Patch,
    pub warnings: Vec<String>,
    /// A run-time error was skipped because the failurePolicy is `Ignore` (a warning says
    /// which); not part of the wire response, for the per-Policy metrics.
    pub ignored: bool,
    /// An expression was not evaluated because its cost budget was exceeded (for the metric).
    pub over_budget: bool,
}

impl Response {
    /// Admit unchanged.
    pub fn allow() -> Self {
        Response {
            allowed: true,
            status: None,
            patch: json_patch::Patch::default(),
            warnings: Vec::new(),
            ignored: false,
            over_budget: false,
        }
    }

    /// Reject with a `metav1.Status`.
    pub fn deny(code: u16, reason: &str, message: String) -> Self {
        Response {
            allowed: false,
            status: Some(Status {
                code,
                reason: reason.to_string(),
                message,
            }),
            ..Response::allow()
        }
    }

    /// For tracing and metrics.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the response carries a patch.
    pub fn patched(&self) -> bool {
        !self.patch.0.is_empty()
    }

    /// The denial message, if denied.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref().map(|s| s.message.as_str())
    }
}

/// Decides `req` for one Policy in one phase. The API server only sends requests the Policy's
/// webhook entry matches (rules, selectors, match conditions), so this does not match again.
pub fn review(req: &Request, policy: &CompiledPolicy, phase: Phase) -> Response {
    match phase {
        Phase::Mutating => mutating(req, policy),
        Phase::Validating => validating(req, policy),
    }
}

fn prefix(policy: &CompiledPolicy) -> String {
    format!("policy {:?}", policy.name())
}

fn mutating(req: &Request, policy: &CompiledPolicy) -> Response {
    // DELETE and CONNECT carry no object to mutate.
    let Some(object) = req.object.as_ref().filter(|_| policy.is_mutating()) else {
        return Response::allow();
    };
    let mut resp = if policy.has_mutations() {
        match mutations(req, policy, object) {
            Ok(resp) => resp,
            Err(e) => {
                let mut denial =
                    Response::deny(500, "InternalError", format!("{}: {e}", prefix(policy)));
                denial.over_budget = e.is_over_budget();
                return denial;
            }
        }
    } else {
        Response::allow()
    };
    if let Some(ipam) = policy.ipam().filter(|_| mark::marks(req)) {
        // The mark may touch what the mutations touched (labels): one copy, one diff.
        let mut marked = object.clone();
        if let Err(e) = json_patch::patch(&mut marked, &resp.patch) {
            return Response::deny(500, "InternalError", format!("{}: {e}", prefix(policy)));
        }
        if mark::mark_for_ipam(&mut marked, &ipam.pool) {
            resp.patch = diff::diff(object, &marked);
        }
    }
    resp
}

fn mutations(
    req: &Request,
    policy: &CompiledPolicy,
    object: &Value,
) -> Result<Response, mutate::MutateError> {
    // Guards that do not mention `request` never resolve it.
    let request = if policy.when_needs.iter().any(Needs::reads_request) {
        req.cel_variable()
    } else {
        Value::Null
    };
    let outcome = mutate::patch(policy, object, req.old_object.as_ref(), &request)?;
    let mut resp = mutated_answer(policy, &outcome.ignored, outcome.settled);
    // Equal to json_patch::diff(object, mutated object).
    resp.patch = outcome.patch;
    Ok(resp)
}

/// The answer of a mutating Policy whose mutations ran, without its patch: the warnings for
/// the guards `ignored` under `failurePolicy: Ignore`, and for a list that did not settle.
fn mutated_answer(
    policy: &CompiledPolicy,
    ignored: &[mutate::MutateError],
    settled: bool,
) -> Response {
    let mut resp = Response::allow();
    resp.ignored = !ignored.is_empty();
    resp.over_budget = ignored.iter().any(mutate::MutateError::is_over_budget);
    resp.warnings = ignored
        .iter()
        .map(|e| format!("{}: {e} (skipped: failurePolicy is Ignore)", prefix(policy)))
        .collect();
    if !settled {
        resp.warnings.push(format!(
            "{}: mutations did not settle after {} passes; a when guard probably reads a \
             field another mutation writes",
            prefix(policy),
            mutate::max_passes(policy)
        ));
    }
    resp
}

/// [`review`] of a mutating Policy that changes `req.object` itself, as a member of a mutating
/// group does to the group's working copy: the answer (never with a patch) and whether the
/// object changed. A denial may leave the object half-mutated.
pub fn review_in_place(req: &mut Request, policy: &CompiledPolicy) -> (Response, bool) {
    if req.object.is_none() || !policy.is_mutating() {
        return (Response::allow(), false);
    }
    let request = if policy.when_needs.iter().any(Needs::reads_request) {
        req.cel_variable()
    } else {
        Value::Null
    };
    let marks = mark::marks(req);
    let Request {
        object: Some(object),
        old_object,
        ..
    } = req
    else {
        return (Response::allow(), false);
    };
    let (resp, mut changed) = if policy.has_mutations() {
        match mutate::apply_in_place(policy, object, old_object.as_ref(), &request) {
            Ok(outcome) => (
                mutated_answer(policy, &outcome.ignored, outcome.settled),
                outcome.changed,
            ),
            Err(e) => {
                let mut denial =
                    Response::deny(500, "InternalError", format!("{}: {e}", prefix(policy)));
                denial.over_budget = e.is_over_budget();
                return (denial, false);
            }
        }
    } else {
        (Response::allow(), false)
    };
    if let Some(ipam) = policy.ipam().filter(|_| marks) {
        changed |= mark::mark_for_ipam(object, &ipam.pool);
    }
    (resp, changed)
}

fn validating(req: &Request, policy: &CompiledPolicy) -> Response {
    if !policy.has_validations() {
        return Response::allow();
    }
    let needs = &policy.validation_needs;
    let request = if needs.reads_request() {
        req.cel_variable()
    } else {
        Value::Null
    };
    let vars = Activation::with_needs(
        req.object.as_ref(),
        req.old_object.as_ref(),
        &request,
        needs,
    );
    let (mut denials, mut failures, mut warnings) = (Vec::new(), Vec::new(), Vec::new());
    let mut ignored = false;
    let mut over_budget = false;
    for (i, (rule, program)) in policy
        .spec()
        .validate
        .iter()
        .zip(&policy.validations)
        .enumerate()
    {
        match cel::eval_bool(program, &vars) {
            Ok(true) => {}
            Ok(false) => {
                let message = format!("{}: {}", prefix(policy), rule.message);
                match rule.action {
                    ValidationAction::Deny => denials.push(message),
                    ValidationAction::Warn => warnings.push(message),
                }
            }
            Err(e) => {
                over_budget |= matches!(e, cel::CelError::OverBudget(_));
                let message = format!("{}: spec.validate[{i}].expression: {e}", prefix(policy));
                match policy.spec().failure_policy {
                    FailurePolicy::Fail => failures.push(message),
                    FailurePolicy::Ignore => {
                        warnings.push(format!("{message} (ignored: failurePolicy is Ignore)"));
                        ignored = true;
                    }
                }
            }
        }
    }
    let mut resp = if !denials.is_empty() {
        denials.extend(failures);
        Response::deny(403, "Forbidden", denials.join("; "))
    } else if !failures.is_empty() {
        Response::deny(500, "InternalError", failures.join("; "))
    } else {
        Response::allow()
    };
    resp.warnings = warnings;
    resp.ignored = ignored;
    resp.over_budget = over_budget;
    resp
}

/// Gatehouse's own validating webhook for Policy objects: denies a Policy that [`policy::validate`]
/// finds problems with, listing every one, so `kubectl apply` fails the way the controller's
/// status would otherwise report later.
pub fn review_policy_object(req: &Request) -> Response {
    let Some(object) = &req.object else {
        return Response::allow();
    };
    let name = object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or(&req.name);
    let invalid = |message: String| {
        Response::deny(
            422,
            "Invalid",
            format!("Policy {name:?} is invalid: {message}"),
        )
    };
    match serde_json::from_value::<Policy>(object.clone()) {
        Err(e) => invalid(format!("spec: {e}")),
        Ok(policy) => {
            let problems = policy::validate(&policy);
            if problems.is_empty() {
                Response::allow()
            } else {
                let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
                invalid(list.join("; "))
            }
        }
    }
}

/// The AdmissionReview answering `req`, as bytes for the HTTP body: `apiVersion`/`kind` mirror the
/// request (only `admission.k8s.io/v1` is accepted), the uid is always echoed, and a patch is
/// sent as base64 with `patchType: JSONPatch`, omitted when empty.
pub fn response_review(req: &Request, resp: &Response) -> Vec<u8> {
    review_json(req, resp).to_string().into_bytes()
}

/// [`response_review`] as a JSON value.
pub fn review_json(req: &Request, resp: &Response) -> Value {
    let mut response = Map::new();
    response.insert("uid".into(), Value::String(req.uid.clone()));
    response.insert("allowed".into(), Value::Bool(resp.allowed));
    if resp.patched() {
        match serde_json::to_vec(&resp.patch) {
            Ok(bytes) => {
                response.insert("patch".into(), Value::String(BASE64.encode(bytes)));
                response.insert("patchType".into(), Value::String("JSONPatch".into()));
            }
            // Never admit without the patch the Policy asked for.
            Err(e) => {
                let denial = Response::deny(
                    500,
                    "InternalError",
                    format!("encoding the patch failed: {e}"),
                );
                return review_json(req, &denial);
            }
        }
    }
    if let Some(status) = &resp.status {
        let mut s = Map::new();
        s.insert("status".into(), Value::String("Failure".into()));
        s.insert("code".into(), Value::from(status.code));
        s.insert("reason".into(), Value::String(status.reason.clone()));
        s.insert("message".into(), Value::String(status.message.clone()));
        response.insert("status".into(), Value::Object(s));
    }
    if !resp.warnings.is_empty() {
        let warnings = resp.warnings.iter().cloned().map(Value::String).collect();
        response.insert("warnings".into(), Value::Array(warnings));
    }
    let mut review = Map::new();
    review.insert("apiVersion".into(), Value::String(API_VERSION.into()));
    review.insert("kind".into(), Value::String(KIND.into()));
    review.insert("response".into(), Value::Object(response));
    Value::Object(review)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_path_decodes_like_the_generic_one() {
        for body in [
            include_str!("../../testdata/reviews/pod-create.json"),
            include_str!("../../benches/fixtures/pod-create.json"),
        ] {
            let fast =
                wire::parse(body.as_bytes()).expect("an API server review takes the typed path");
            assert_eq!(fast, parse_review_generic(body.as_bytes()).unwrap());
        }
        // Shapes the typed decoding would accept but the generic path rejects or reads otherwise.
        let request = r#"{"uid":"u","kind":{"version":"v1","kind":"Pod"},"resource":{"version":"v1","resource":"pods"},"operation":"CREATE"}"#;
        for body in [
            format!(r#"["admission.k8s.io/v1","AdmissionReview",{request}]"#),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":["u",{"version":"v1","kind":"Pod"},{"version":"v1","resource":"pods"},null,null,null,null,"","","CREATE"]}"#.to_string(),
            format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request},"x":1e999}}"#),
            format!(r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request},"request":{{"uid":"v"}}}}"#),
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{}}}"#,
                request.replace(r#""kind":"Pod""#, r#""kind":"Pod","x":"\ud800""#)
            ),
        ] {
            assert!(wire::parse(body.as_bytes()).is_none(), "{body}");
        }
    }
}
