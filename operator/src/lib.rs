//! Gatehouse: a Kubernetes operator that manages admission webhooks and their side effects.
#![forbid(unsafe_code)]

pub mod admin;
pub mod audit;
pub mod cli;
pub mod controller;
pub mod effects;
pub mod error_chain;
pub mod lease;
pub mod reconcile;
pub mod serve;
pub mod telemetry;
pub mod tls;
pub mod webhook;
