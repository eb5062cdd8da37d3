//! Harness for Gatehouse's end-to-end tests against a real kube-apiserver.
//!
//! [`cluster()`] hands out the shared test control plane: the one named by the
//! `GATEHOUSE_TEST_KUBECONFIG` environment variable, or else the one `tests/cluster/up` starts (or
//! reuses) on first use. Tests get isolation from [`TestNamespace`], poll with [`await_condition`],
//! and run an in-process HTTPS admission webhook with [`TestWebhook`].
//!
//! Every `#[tokio::test]` runs its own runtime, and a `kube::Client` must live in the runtime that
//! created it, so [`Cluster::client`] builds a fresh client on each call.

mod cluster;
pub mod cpu;
pub mod documented;
pub mod instance;
pub mod kubectl;
pub mod latency;
pub mod lease;
mod namespace;
pub mod pods;
pub mod proxy;
pub mod receiver;
mod tls;
mod wait;
mod webhook;

pub use cluster::{
    Cluster, DeleteGuard, KUBECONFIG_ENV, cluster, dump_logs, run_disruptive_test, run_test,
    try_cluster,
};
pub use namespace::{E2E_LABEL, TestNamespace};
pub use tls::{Http1, TlsClient, tls_client};
pub use wait::{await_condition, await_resource};
pub use webhook::{Responder, TestWebhook, allow, deny, install_crypto_provider};
