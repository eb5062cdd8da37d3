//! AdmissionReview in, AdmissionReview out, one job a file:
//!
//! * [`request`]: the wire types of the request, [`parse_request`] and the CEL [`Variables`] of a
//!   request;
//! * [`decision`]: the [`Response`] for one Policy ([`decide`]) and for Gatehouse's own Policy
//!   webhook ([`decide_policy_object`]);
//! * [`encode`]: the AdmissionReview answering a request ([`encoded_review`], [`review_value`]).
pub mod decision;
pub mod encode;
pub mod request;

pub use decision::{
    Phase, Response, RuleOutcome, Status, decide, decide_in_place, decide_policy_object,
    rule_outcomes, validating_with,
};
pub use encode::{encoded_review, review_value};
pub use request::{
    API_VERSION, GroupVersionKind, GroupVersionResource, KIND, Request, ReviewError, UserInfo,
    Variables, parse_request,
};
