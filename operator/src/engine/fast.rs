//! Speed layers over the simple engine. Each is here only because the end-to-end benchmark
//! (`tests/bench/admission-load`, Gatehouse's CPU per review) showed what it saves, with the
//! figure in `operator/benches/README.md`, and `operator/tests/engine_fast_props.rs` compares
//! each with the simple path it stands in for.
use serde::Deserialize;

use super::admission::{API_VERSION, KIND, Request, ReviewError};
use crate::api::v1alpha1::Operation;

/// [`parse_request`](super::parse_request) in one typed pass: saves decoding the body into a JSON
/// value and then again into the request. A body it does not take whole (every malformed one, a
/// repeated key, a wrong `apiVersion`) goes to the simple path, which says what is wrong. One
/// difference, on no body the API server sends: a number too large for a float in a field
/// Gatehouse does not read is skipped here, where the simple path refuses the body.
pub fn parse_request(body: &[u8]) -> Result<Request, ReviewError> {
    #[derive(Deserialize)]
    struct Review {
        #[serde(rename = "apiVersion")]
        api_version: String,
        kind: String,
        request: Request,
    }
    match serde_json::from_slice::<Review>(body) {
        Ok(review)
            if review.api_version == API_VERSION
                && review.kind == KIND
                && !review.request.uid.is_empty()
                && review.request.operation != Operation::All =>
        {
            Ok(review.request)
        }
        _ => super::parse_request(body),
    }
}
