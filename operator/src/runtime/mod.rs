//! The plumbing every part of the operator stands on: the one reconcile loop with its backoff
//! and leadership fence, the lease, the HTTPS server, the admin endpoints, telemetry and error
//! chains, and the compact tables some caches are.
pub mod admin;
pub mod error_chain;
pub mod lease;
pub mod reconcile;
pub mod serve;
pub mod table;
pub mod telemetry;
