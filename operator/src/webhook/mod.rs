//! The TLS webhook server: a thin edge around the pure engine. It parses the AdmissionReview,
//! looks the entry's Policies up in an in-memory snapshot, asks the engine, and writes the
//! answer. Nothing here writes anywhere else, which is what makes `sideEffects: None` true.
//!
//! **No Policy can stall admission.** Two protections, both needed:
//! * *Bounded work*: every CEL expression has a cost budget ([`gatehouse_cel::cost`]), checked
//!   when the Policy is written (estimated with an assumed collection size) and again before
//!   each evaluation with the sizes the request actually holds. Past it the expression is not
//!   run; it fails like any run-time error and the Policy's failurePolicy decides.
//! * *Isolation*: the admin port (`/readyz`, `/livez`, `/metrics`) and the webhook port's accept
//!   loop run on threads and runtimes of their own ([`crate::runtime::serve::on_own_thread`]); accepted connections are
//!   handed to the main runtime's workers. A review for an entry with a heavy Policy (an expression
//!   estimated over [`gatehouse_cel::cost::HEAVY`] at the assumed collection size) is evaluated
//!   on the blocking pool, taking turns on half the CPUs, never on the async workers that
//!   accept connections; so however many slow reviews arrive, a cheap review and a probe still
//!   find a CPU (`tests/webhook_isolation.rs`). A review with only cheap Policies (each
//!   expression below `HEAVY`, so at most a few hundred microseconds) is evaluated on the worker
//!   that parsed it, never on the accepting or admin threads: a hop to the blocking pool costs
//!   more than such a review (`operator/benches/README.md`).
mod handler;
mod metrics;
mod namespaces;
mod store;

pub use handler::{
    BODY_READ_TIMEOUT, Route, WebhookState, handle, handler, heavy_evaluations_in_flight,
};
pub use metrics::{AdmissionLabels, AdmissionMetrics, DecisionLabels, MemberMeters, PolicyLabels};
pub use namespaces::{CompactLabels, NO_SUCH_NAMESPACE, NamespaceLabels, Namespaces};
pub use store::{Lookup, Members, PolicyStore, RETIRED_GRACE};

/// Largest AdmissionReview body accepted. The API server caps request objects at 3 MiB; 8 MiB
/// leaves room for oldObject on UPDATE while bounding memory per connection.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
