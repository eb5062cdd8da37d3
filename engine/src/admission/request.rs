//! The wire types of an `admission.k8s.io/v1` AdmissionReview request, and parsing a body into
//! them.
use serde::{Deserialize, Serialize};
use serde_json::Value;

use gatehouse_api::v1alpha1::Operation;
use gatehouse_cel::Activation;

/// The only AdmissionReview version Gatehouse registers for.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of the review object.
pub const KIND: &str = "AdmissionReview";

/// Why a request body is not an AdmissionReview; the server answers HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON. The message is the HTTP 400 body, so the decoder's error is part
    /// of it rather than a `source` that a chain would print a second time (likewise below).
    #[error("malformed AdmissionReview: not JSON: {0}")]
    Json(serde_json::Error),
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
    Request(serde_json::Error),
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
    /// Whether the object is a Namespace, which selectors judge by its own labels.
    pub fn is_namespace(&self) -> bool {
        self.kind.group.is_empty() && self.kind.kind == "Namespace"
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

/// The CEL variables of one request: `object`, `oldObject` and `request`
/// ([`Request::cel_variable`]).
pub struct Variables<'r> {
    req: &'r Request,
    request: Value,
}

impl<'r> Variables<'r> {
    pub fn new(req: &'r Request) -> Self {
        Variables {
            req,
            request: req.cel_variable(),
        }
    }

    /// The `request` variable.
    pub fn request(&self) -> &Value {
        &self.request
    }

    /// The activation binding the three, each converted to CEL on first use.
    pub fn activation(&self) -> Activation<'_> {
        Activation::new(
            self.req.object.as_ref(),
            self.req.old_object.as_ref(),
            &self.request,
        )
    }
}

/// Parses an AdmissionReview body and returns its request: the JSON value first, then the
/// request, so that every malformed body is reported with what is wrong.
pub fn parse_request(body: &[u8]) -> Result<Request, ReviewError> {
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
    let Some(Value::Object(mut fields)) = review.remove("request") else {
        return Err(ReviewError::MissingRequest);
    };
    if fields
        .get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(ReviewError::MissingUid);
    }
    // The objects move into the request as they are: deserialising them from the parsed value
    // would build every map of them again.
    let mut take = |name: &str| fields.remove(name).filter(|v| !v.is_null());
    let (object, old_object, options) = (take("object"), take("oldObject"), take("options"));
    let mut request: Request =
        serde_json::from_value(Value::Object(fields)).map_err(ReviewError::Request)?;
    request.object = object;
    request.old_object = old_object;
    request.options = options;
    if request.operation == Operation::All {
        return Err(ReviewError::Operation);
    }
    Ok(request)
}
