//! The admission engine: pure functions from (Policy, AdmissionReview) to a decision.
//!
//! Nothing here does I/O, so the webhook server, the controller and `gatehouse eval` share one
//! implementation and the tests need no cluster:
//!
//! * [`policy`]: [`validate`] (every problem, with its field path) and [`compile`] (CEL compiled
//!   once per Policy generation into a `Send + Sync` [`CompiledPolicy`]);
//! * [`merge`](mod@merge): the idempotent JSON merge every mutation is made of;
//! * [`mutate`]: a Policy's `mutate` list applied to a fixed point;
//! * [`cel`]: the CEL environment, its libraries, type checks, JSON conversion and activation;
//! * [`admission`]: AdmissionReview wire types and [`parse_request`], the decision for one Policy
//!   ([`admit_one`]) and its encoding ([`encoded_review`]);
//! * [`matcher`]: whether a request reaches a Policy: rules, selectors and match conditions;
//! * [`mark`]: the scheduling gate and label that hand a Pod to the effects loop;
//! * [`companion`]: companion objects' checks, rendering and in-place comparison;
//! * [`call`]: calls to external systems: their checks and the body a receiver gets.
#![forbid(unsafe_code)]
pub mod admission;
pub mod call;
pub mod chain;
pub mod companion;
pub mod coverage;
pub mod entry;
pub mod exception;
pub mod group;
pub mod mark;
pub mod matcher;
pub mod merge;
pub mod mutate;
pub mod policy;
pub mod problem;

pub use admission::{
    Phase, Request, Response, ReviewError, Status, admit_one, admit_policy_object, encoded_review,
    parse_request,
};
pub use matcher::{MatchError, Namespace, matches};
pub use merge::merge;
pub use policy::{CompiledPolicy, InvalidPolicy, Problem, compile, is_mutating, validate};
