//! The TLS webhook server: a thin edge around the pure engine. It parses the AdmissionReview,
//! looks the compiled Policy up in an in-memory snapshot, asks the engine, and writes the answer.
//! Nothing here writes anywhere else, which is what makes `sideEffects: None` true.
mod handler;
mod namespaces;
mod serve;
mod store;

pub use handler::{BODY_READ_TIMEOUT, Route, WebhookState, handle};
pub use namespaces::Namespaces;
pub use serve::{Handler, serve_http, serve_tls};
pub use store::{Lookup, PolicyStore, RETIRED_GRACE};

/// Largest AdmissionReview body accepted. The API server caps request objects at 3 MiB; 8 MiB
/// leaves room for oldObject on UPDATE while bounding memory per connection.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Path prefix of a mutating entry.
pub const MUTATE_PREFIX: &str = "/mutate/";
/// Path prefix of a validating entry.
pub const VALIDATE_PREFIX: &str = "/validate/";
/// Path of Gatehouse's own validation of Policy objects.
pub const VALIDATE_POLICY_PATH: &str = "/policy-validation";
