//! Gatehouse: a Kubernetes operator that manages admission webhooks and their side effects.
#![forbid(unsafe_code)]

pub mod audit;
pub mod cli;
pub mod controller;
pub mod effects;
pub mod policies;
pub mod runtime;
pub mod tls;
pub mod webhook;
