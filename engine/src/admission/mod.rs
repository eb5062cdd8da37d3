//! AdmissionReview in, AdmissionReview out, one job a file:
//!
//! * [`request`]: the wire types of the request, [`parse_request`] and the CEL [`Variables`] of a
//!   request;
//! * [`response`]: the [`Response`] for one Policy ([`admit_one`]) and for Gatehouse's own Policy
//!   webhook ([`admit_policy_object`]);
//! * [`encode`]: the AdmissionReview answering a request ([`encoded_review`], [`review_value`]).
pub mod encode;
pub mod request;
pub mod response;

pub use encode::{encoded_review, review_value};
pub use request::{
    API_VERSION, GroupVersionKind, GroupVersionResource, KIND, Request, ReviewError, UserInfo,
    Variables, parse_request,
};
pub use response::{
    Phase, Response, RuleEvaluation, Status, admit_in_place, admit_one, admit_policy_object,
    evaluate_rules, validating_with,
};
