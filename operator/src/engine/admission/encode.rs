//! The AdmissionReview answering a request, as the API server expects it.
//!
//! The response type is our own rather than kube-core's: kube-core 5 serialises `patch` as an
//! array of numbers, while the API server expects what `admission.k8s.io/v1` documents, a base64
//! string with `"patchType": "JSONPatch"`.
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value};

use super::decision::Response;
use super::request::{API_VERSION, KIND, Request};

/// The AdmissionReview answering `req`, as bytes for the HTTP body: `apiVersion`/`kind` mirror the
/// request (only `admission.k8s.io/v1` is accepted), the uid is always echoed, and a patch is
/// sent as base64 with `patchType: JSONPatch`, omitted when empty.
pub fn encoded_review(req: &Request, resp: &Response) -> Vec<u8> {
    review_value(req, resp).to_string().into_bytes()
}

/// [`encoded_review`] as a JSON value.
pub fn review_value(req: &Request, resp: &Response) -> Value {
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
                return review_value(req, &denial);
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
