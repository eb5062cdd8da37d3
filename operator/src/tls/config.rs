//! What the TLS manager is asked to maintain: names, lifetimes and rotation timings.
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::TlsError;

/// Name of the Secret holding the CA and the serving certificate.
pub const DEFAULT_SECRET_NAME: &str = "gatehouse-tls";
/// CA lifetime unless configured otherwise.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Serving-certificate lifetime unless configured otherwise.
pub const DEFAULT_CERT_VALIDITY: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a CA bundle change is given to reach every API server (watch, controller,
/// webhook-configuration informer) before anything relies on it.
pub const DEFAULT_BUNDLE_PROPAGATION: Duration = Duration::from_secs(10);

/// Upper bound of the `not_before` backdate that absorbs clock skew between us and the API
/// server (which rejects certificates that are not yet valid).
const MAX_BACKDATE: Duration = Duration::from_secs(60);

/// A subject alternative name of the serving certificate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum San {
    /// A DNS name, e.g. `gatehouse.gatehouse-system.svc`.
    Dns(String),
    /// An IP address, e.g. `127.0.0.1` (URL mode with an IP host).
    Ip(IpAddr),
}

impl San {
    /// An IP SAN if `s` parses as an IP address (brackets around IPv6 allowed), a DNS SAN
    /// otherwise. DNS names compare case-insensitively, so they are lowercased.
    pub fn parse(s: &str) -> San {
        let bare = s.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<IpAddr>() {
            Ok(ip) => San::Ip(ip),
            Err(_) => San::Dns(s.to_ascii_lowercase()),
        }
    }

    /// The same name in canonical form, so that SAN sets compare as the TLS client would.
    pub(crate) fn normalized(&self) -> San {
        match self {
            San::Dns(d) => San::Dns(d.trim_end_matches('.').to_ascii_lowercase()),
            San::Ip(ip) => San::Ip(ip.to_canonical()),
        }
    }
}

impl fmt::Display for San {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            San::Dns(d) => f.write_str(d),
            San::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Everything the TLS manager maintains, and the timings of its rotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// Namespace of the operator; the Secret lives there.
    pub namespace: String,
    /// Name of the Secret (default [`DEFAULT_SECRET_NAME`]).
    pub secret_name: String,
    /// SANs of the serving certificate; a change re-issues it.
    pub sans: Vec<San>,
    /// Lifetime of a newly generated CA.
    pub ca_validity: Duration,
    /// Lifetime of a newly issued serving certificate (capped by its CA's expiry).
    pub cert_validity: Duration,
    /// Grace period of each CA-rotation phase; see [`TlsConfig::effective_bundle_propagation`].
    pub bundle_propagation: Duration,
}

impl TlsConfig {
    /// A configuration with the default Secret name, lifetimes and propagation grace.
    pub fn new(namespace: impl Into<String>, sans: Vec<San>) -> TlsConfig {
        TlsConfig {
            namespace: namespace.into(),
            secret_name: DEFAULT_SECRET_NAME.to_string(),
            sans,
            ca_validity: DEFAULT_CA_VALIDITY,
            cert_validity: DEFAULT_CERT_VALIDITY,
            bundle_propagation: DEFAULT_BUNDLE_PROPAGATION,
        }
    }

    /// Rejects configurations no certificate can be issued for, so that `run` only ever
    /// meets transient failures.
    pub fn validate(&self) -> Result<(), TlsError> {
        let invalid = |reason: String| Err(TlsError::InvalidConfig { reason });
        if self.sans.is_empty() {
            return invalid("the serving certificate needs at least one SAN".into());
        }
        for san in &self.sans {
            if let San::Dns(name) = san
                && (name.is_empty() || !name.is_ascii() || name.contains(char::is_whitespace))
            {
                return invalid(format!("{name:?} is not a valid DNS SAN"));
            }
        }
        // X.509 validity has one-second resolution and rotation happens at 2/3 of the
        // lifetime: below a few seconds the plan could not make progress.
        if self.ca_validity < Duration::from_secs(3) || self.cert_validity < Duration::from_secs(3)
        {
            return invalid(format!(
                "validities must be at least 3s (CA {:?}, serving {:?})",
                self.ca_validity, self.cert_validity
            ));
        }
        if self.namespace.is_empty() || self.secret_name.is_empty() {
            return invalid("namespace and secret name must not be empty".into());
        }
        Ok(())
    }

    /// The grace period actually used for each CA-rotation phase.
    ///
    /// A CA rotation starts with a third of the old CA's lifetime left and takes two grace
    /// periods (bundle propagation, then old serving certificate draining); capping the grace
    /// at an eighth of the CA lifetime leaves the old CA valid well past the switch. The cap at
    /// half the serving lifetime keeps a rotation within one serving-certificate lifetime,
    /// so short test lifetimes still rotate promptly.
    pub fn effective_bundle_propagation(&self) -> Duration {
        self.bundle_propagation
            .min(self.ca_validity / 8)
            .min(self.cert_validity / 2)
    }
}

/// How far `not_before` is moved into the past for a certificate of the given lifetime.
///
/// A minute absorbs ordinary clock skew; short (test) lifetimes get a tenth of the lifetime
/// instead so the certificate is not mostly spent before it is issued, but at least one
/// second because X.509 times are truncated to whole seconds anyway.
pub(crate) fn backdate(validity: Duration) -> Duration {
    (validity / 10)
        .min(MAX_BACKDATE)
        .max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn san_parse_distinguishes_ip_and_dns() {
        assert_eq!(San::parse("10.0.0.1"), San::Ip("10.0.0.1".parse().unwrap()));
        assert_eq!(San::parse("[::1]"), San::Ip("::1".parse().unwrap()));
        assert_eq!(San::parse("Svc.NS.svc"), San::Dns("svc.ns.svc".into()));
    }

    #[test]
    fn propagation_is_clamped_to_lifetimes() {
        let mut c = TlsConfig::new("ns", vec![San::parse("svc")]);
        assert_eq!(c.effective_bundle_propagation(), DEFAULT_BUNDLE_PROPAGATION);
        c.ca_validity = Duration::from_secs(20);
        c.cert_validity = Duration::from_secs(8);
        c.bundle_propagation = Duration::from_secs(5);
        assert_eq!(
            c.effective_bundle_propagation(),
            Duration::from_millis(2500)
        );
        c.cert_validity = Duration::from_secs(4);
        assert_eq!(c.effective_bundle_propagation(), Duration::from_secs(2));
    }

    #[test]
    fn backdate_is_bounded() {
        assert_eq!(backdate(DEFAULT_CA_VALIDITY), Duration::from_secs(60));
        assert_eq!(backdate(Duration::from_secs(20)), Duration::from_secs(2));
        assert_eq!(backdate(Duration::from_secs(8)), Duration::from_secs(1));
    }

    #[test]
    fn validate_rejects_unusable_configs() {
        let ok = TlsConfig::new("ns", vec![San::parse("svc")]);
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.sans.clear();
        assert!(c.validate().is_err());
        let mut c = ok.clone();
        c.sans = vec![San::Dns("bad name".into())];
        assert!(c.validate().is_err());
        let mut c = ok;
        c.cert_validity = Duration::from_secs(1);
        assert!(c.validate().is_err());
    }
}
