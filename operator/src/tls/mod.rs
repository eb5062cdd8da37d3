//! Serving TLS for the webhook server: a self-managed CA and serving certificate, shared by
//! all replicas through one Secret, rotated without restarts or failed requests.
//!
//! * [`config`]: what to maintain ([`TlsConfig`], [`San`]).
//! * [`rotation`]: the pure state machine ([`plan`], [`perform`]) over the stored
//!   [`TlsMaterial`].
//! * [`resolver`]: the hot-swappable [`CertResolver`] and the rustls [`server_config`].
//! * [`manager`]: the [`TlsManager`] that ties the Secret, the resolver and the published
//!   [`TlsState`] together.
//!
//! * [`replicas`]: the per-replica records of which CA each replica serves.
//!
//! Timeline (defaults CA 1 year, serving 30 days; `g` = effective bundle propagation):
//! serving renewed at 2/3 of its lifetime; at 2/3 of the CA lifetime a new CA joins the
//! bundle; once every live webhook configuration's `caBundle` is read back holding it, and `g`
//! later, it signs the serving certificate; once every live replica reports serving that
//! certificate, and `g` later, the old CA leaves the bundle.
pub mod config;
pub mod manager;
mod pki;
pub mod replicas;
pub mod resolver;
pub mod rotation;

#[cfg(test)]
mod tests;

pub use config::{
    DEFAULT_BUNDLE_PROPAGATION, DEFAULT_CA_VALIDITY, DEFAULT_CERT_VALIDITY, DEFAULT_SECRET_NAME,
    San, TlsConfig,
};
pub use manager::{Coordination, TlsManager, TlsMetrics};
pub use pki::CertKeyPem;
pub use resolver::{CertResolver, server_config};
pub use rotation::{
    Action, Confirmed, Reason, SecretPlan, TlsMaterial, TlsState, perform, plan, plan_secret,
};

/// Everything that can go wrong in this module, named after the failing step.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("invalid TLS configuration: {reason}")]
    InvalidConfig { reason: String },
    #[error("generating the {what} key pair")]
    GenerateKey {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("signing the {what}")]
    SignCertificate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },
    #[error("invalid DNS SAN {san:?}")]
    InvalidSan {
        san: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("loading the CA private key")]
    LoadCaKey {
        #[source]
        source: rcgen::Error,
    },
    #[error("loading the CA certificate as issuer")]
    LoadCaCertificate {
        #[source]
        source: rcgen::Error,
    },
    #[error("parsing the {what} PEM: {reason}")]
    ParsePem { what: &'static str, reason: String },
    #[error("parsing a certificate: {reason}")]
    ParseCertificate { reason: String },
    #[error("loading the serving certificate and key into rustls")]
    LoadServingKey {
        #[source]
        source: rustls::Error,
    },
    #[error("building the rustls server config")]
    BuildServerConfig {
        #[source]
        source: rustls::Error,
    },
    #[error("cannot {action}: {reason}")]
    PerformAction {
        action: &'static str,
        reason: &'static str,
    },
    #[error("reading Secret {name}")]
    ReadSecret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("creating Secret {name}")]
    CreateSecret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("updating Secret {name}")]
    UpdateSecret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading webhook configuration {name} to confirm the CA bundle")]
    ReadConfiguration {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the replicas' serving records")]
    ListReplicas {
        #[source]
        source: kube::Error,
    },
    #[error("TLS Secret did not settle after {steps} create/update attempts")]
    ReconcileNotSettled { steps: usize },
}

impl crate::runtime::reconcile::Failure for TlsError {
    fn step(&self) -> &'static str {
        match self {
            TlsError::InvalidConfig { .. } => "InvalidConfig",
            TlsError::GenerateKey { .. } => "GenerateKey",
            TlsError::SignCertificate { .. } => "SignCertificate",
            TlsError::InvalidSan { .. } => "InvalidSan",
            TlsError::LoadCaKey { .. } => "LoadCaKey",
            TlsError::LoadCaCertificate { .. } => "LoadCaCertificate",
            TlsError::ParsePem { .. } => "ParsePem",
            TlsError::ParseCertificate { .. } => "ParseCertificate",
            TlsError::LoadServingKey { .. } => "LoadServingKey",
            TlsError::BuildServerConfig { .. } => "BuildServerConfig",
            TlsError::PerformAction { .. } => "PerformAction",
            TlsError::ReadSecret { .. } => "ReadSecret",
            TlsError::CreateSecret { .. } => "CreateSecret",
            TlsError::UpdateSecret { .. } => "UpdateSecret",
            TlsError::ReadConfiguration { .. } => "ReadConfiguration",
            TlsError::ListReplicas { .. } => "ListReplicas",
            TlsError::ReconcileNotSettled { .. } => "ReconcileNotSettled",
        }
    }
}
