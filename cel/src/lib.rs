//! CEL for Policies, one job a file:
//!
//! * [`environment`]: the shared environment, [`compile`] and [`eval_bool`];
//! * [`expression`]: a compiled expression as a Policy keeps it ([`Expression`]);
//! * [`check`]: which variables an expression may use where ([`Site`], [`unknown_variables`]);
//! * [`functions`]: the functions an expression calls that the environment lacks
//!   ([`unknown_functions`]);
//! * [`types`]: a type checker for what the API server refuses when written (overloads, literals);
//! * [`extensions`]: cel-go's strings (version 2) and lists (version 3) extensions;
//! * [`lists`]: Kubernetes' `isSorted`, `sum`, `min`, `max`, `indexOf` and `lastIndexOf` on lists;
//! * [`format`]: Kubernetes' `format.<name>()` and `validate()`;
//! * [`comprehensions`]: cel-go's two-variable comprehensions, as macros;
//! * [`semver`]: Kubernetes' `semver()` and its methods;
//! * [`url`]: Kubernetes' `url()` and its methods, with Go's parsing rules;
//! * [`sets`]: cel-go's `sets.contains`, `sets.equivalent` and `sets.intersects`;
//! * [`net`]: Kubernetes' `ip()` and `cidr()` and their methods;
//! * [`quantity`]: Kubernetes' `quantity()` and its methods;
//! * [`refusals`]: everything the API server refuses when an expression is written;
//! * [`time`]: `duration()` and `timestamp()` with Go's grammars, as cel-go parses them;
//! * [`regex`]: Kubernetes' `find` and `findAll`, and constant patterns checked when written;
//! * [`convert`]: JSON to CEL values ([`to_val`]);
//! * [`activation`]: the variables of one evaluation ([`Activation`]);
//! * `scope`: the AST walks, with comprehension scoping for [`check`].
//!
//! Expressions are compiled once per Policy generation ([`compile`]) and the resulting
//! [`Program`](::cel::Program)s are evaluated on every request against borrowed views of the
//! request's JSON ([`Activation`]), so the hot path converts the reviewed object into CEL values
//! once per review and copies no strings.
#![forbid(unsafe_code)]

pub mod activation;
mod ast;
pub mod check;
pub mod comprehensions;
pub mod convert;
pub mod cost;
pub mod environment;
pub mod expression;
pub mod extensions;
pub mod format;
pub mod functions;
pub mod k8s_names;
pub mod lists;
pub mod net;
mod opaque;
pub mod optional;
#[cfg(test)]
mod parity;
pub mod quantity;
pub mod refusals;
pub mod regex;
pub mod semver;
pub mod sets;
pub mod time;
pub mod types;
pub mod url;

pub use activation::{Activation, Bindings, ElementActivation};
pub use check::{Site, reads_variable, unknown_variables};
pub use convert::to_val;
pub use environment::{compile, eval_bool, eval_json};
pub use expression::Expression;
pub use functions::unknown_functions;
pub use refusals::refusals;

/// Why an expression could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CelError {
    /// Building the shared environment (stdlib plus extensions) failed; a bug, not a user error.
    #[error("the CEL environment could not be built: {0}")]
    Environment(String),
    /// The source does not parse.
    #[error("does not compile: {0}")]
    Parse(String),
    /// Evaluation raised an error (missing key, no matching overload, ...).
    #[error("evaluation failed: {0}")]
    Execute(String),
    /// Evaluation succeeded but did not produce a bool.
    #[error("returned {0}, want bool")]
    NotBool(String),
    /// Not evaluated: with the collections of this request, the estimated cost exceeds the
    /// budget ([`super::cost`]).
    #[error("{0}")]
    OverBudget(String),
}
