//! The AdmissionReview answering a request, as the API server expects it.
//!
//! The response type is our own rather than kube-core's: kube-core 5 serialises `patch` as an
//! array of numbers, while the API server expects what `admission.k8s.io/v1` documents, a base64
//! string with `"patchType": "JSONPatch"`.
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;
use serde_json::Value;

use super::request::{API_VERSION, KIND, Request};
use super::response::Response;

/// The AdmissionReview on the wire, serialised straight from the answer.
#[derive(Serialize)]
struct Review<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    response: ReviewResponse<'a>,
}

#[derive(Serialize)]
struct ReviewResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(rename = "patchType", skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<StatusBody<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

/// `metav1.Status` of a denial.
#[derive(Serialize)]
struct StatusBody<'a> {
    status: &'static str,
    code: u16,
    reason: &'a str,
    message: &'a str,
}

/// The AdmissionReview answering `req`, as bytes for the HTTP body: `apiVersion`/`kind` mirror the
/// request (only `admission.k8s.io/v1` is accepted), the uid is always echoed, and a patch is
/// sent as base64 with `patchType: JSONPatch`, omitted when empty.
pub fn encoded_review(req: &Request, resp: &Response) -> Vec<u8> {
    let denial;
    let (resp, patch) = match encoded_patch(resp) {
        Ok(patch) => (resp, patch),
        Err(e) => {
            denial = patch_failed(&e);
            (&denial, None)
        }
    };
    // Strings, numbers and bools into a Vec always serialise; should that ever change, the
    // answer is a denial that says so, never a panic and never an allow without the patch.
    serde_json::to_vec(&review(req, resp, patch)).unwrap_or_else(|e| {
        serde_json::json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "response": {
                "uid": req.uid,
                "allowed": false,
                "status": {"status": "Failure", "code": 500, "message": format!("encoding the answer failed: {e}")},
            },
        })
        .to_string()
        .into_bytes()
    })
}

/// [`encoded_review`] as a JSON value.
pub fn review_value(req: &Request, resp: &Response) -> Value {
    serde_json::from_slice(&encoded_review(req, resp)).unwrap_or(Value::Null)
}

/// The base64 of the patch, `None` without one.
fn encoded_patch(resp: &Response) -> Result<Option<String>, serde_json::Error> {
    if !resp.patched() {
        return Ok(None);
    }
    Ok(Some(BASE64.encode(serde_json::to_vec(&resp.patch)?)))
}

/// Never admit without the patch the Policy asked for.
fn patch_failed(e: &serde_json::Error) -> Response {
    Response::deny(
        500,
        "InternalError",
        format!("encoding the patch failed: {e}"),
    )
}

fn review<'a>(req: &'a Request, resp: &'a Response, patch: Option<String>) -> Review<'a> {
    Review {
        api_version: API_VERSION,
        kind: KIND,
        response: ReviewResponse {
            uid: &req.uid,
            allowed: resp.allowed,
            patch_type: patch.as_ref().map(|_| "JSONPatch"),
            patch,
            status: resp.status.as_ref().map(|s| StatusBody {
                status: "Failure",
                code: s.code,
                reason: &s.reason,
                message: &s.message,
            }),
            warnings: &resp.warnings,
        },
    }
}
