//! Certificate generation (rcgen) and inspection (x509-parser): the only place that touches
//! X.509 details, so the rotation logic can reason in terms of times and names.
use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType,
};
use time::OffsetDateTime;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::TlsError;
use super::config::{San, backdate};

/// A PEM certificate and its PEM (PKCS#8) private key, as stored in the Secret.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKeyPem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl fmt::Debug for CertKeyPem {
    // The key must never end up in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertKeyPem")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// The facts about a certificate that rotation decisions depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertInfo {
    pub der: Vec<u8>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    pub sans: BTreeSet<San>,
    pub is_ca: bool,
    /// The subjectPublicKey bits, to match against a private key.
    pub public_key: Vec<u8>,
}

impl CertInfo {
    pub fn lifetime(&self) -> Duration {
        self.not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO)
    }

    /// When less than a third of the lifetime remains.
    pub fn renew_at(&self) -> SystemTime {
        self.not_before + self.lifetime() * 2 / 3
    }
}

/// Parses the first certificate of a PEM text.
pub(crate) fn parse_cert_pem(pem: &str) -> Result<CertInfo, TlsError> {
    let der = first_cert_der(pem)?;
    parse_cert_der(der)
}

/// Every certificate of a PEM text, in order; fails on the first malformed block.
pub(crate) fn cert_ders(pem: &str) -> Result<Vec<Vec<u8>>, TlsError> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes()) {
        let block = block.map_err(|e| TlsError::ParsePem {
            what: "certificate",
            reason: e.to_string(),
        })?;
        if block.label == "CERTIFICATE" {
            out.push(block.contents);
        }
    }
    Ok(out)
}

fn first_cert_der(pem: &str) -> Result<Vec<u8>, TlsError> {
    cert_ders(pem)?
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::ParsePem {
            what: "certificate",
            reason: "no CERTIFICATE block".into(),
        })
}

pub(crate) fn parse_cert_der(der: Vec<u8>) -> Result<CertInfo, TlsError> {
    let parse_err = |reason: String| TlsError::ParseCertificate { reason };
    let (not_before, not_after, sans, is_ca, public_key) = {
        let (_, x509) = X509Certificate::from_der(&der).map_err(|e| parse_err(e.to_string()))?;
        let mut sans = BTreeSet::new();
        if let Some(ext) = x509
            .subject_alternative_name()
            .map_err(|e| parse_err(e.to_string()))?
        {
            for name in &ext.value.general_names {
                match name {
                    GeneralName::DNSName(d) => {
                        sans.insert(San::Dns((*d).to_string()).normalized());
                    }
                    GeneralName::IPAddress(bytes) => {
                        if let Some(ip) = ip_from_bytes(bytes) {
                            sans.insert(San::Ip(ip).normalized());
                        }
                    }
                    // Other name kinds are never issued here; a certificate carrying them
                    // simply will not match the configured set and gets re-issued.
                    other => {
                        sans.insert(San::Dns(format!("<unsupported {other}>")));
                    }
                }
            }
        }
        (
            from_unix(x509.validity().not_before.timestamp()),
            from_unix(x509.validity().not_after.timestamp()),
            sans,
            x509.is_ca(),
            x509.public_key().subject_public_key.data.to_vec(),
        )
    };
    Ok(CertInfo {
        der,
        not_before,
        not_after,
        sans,
        is_ca,
        public_key,
    })
}

fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| IpAddr::V4(Ipv4Addr::from(b))),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        _ => None,
    }
}

/// Whether the private key in `key_pem` belongs to the certificate.
pub(crate) fn key_matches(cert: &CertInfo, key_pem: &str) -> bool {
    KeyPair::from_pem(key_pem).is_ok_and(|key| key.der_bytes() == cert.public_key.as_slice())
}

/// Whether `cert` carries a valid signature by the key of `issuer`.
pub(crate) fn issued_by(cert: &CertInfo, issuer: &CertInfo) -> bool {
    let Ok((_, cert)) = X509Certificate::from_der(&cert.der) else {
        return false;
    };
    let Ok((_, issuer)) = X509Certificate::from_der(&issuer.der) else {
        return false;
    };
    cert.issuer().as_raw() == issuer.subject().as_raw()
        && cert.verify_signature(Some(issuer.public_key())).is_ok()
}

/// A new self-signed ECDSA P-256 CA valid from (about) `now` for `validity`.
pub(crate) fn generate_ca(now: SystemTime, validity: Duration) -> Result<CertKeyPem, TlsError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| TlsError::GenerateKey { what: "CA", source })?;
    let now_secs = unix_secs(now);
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    // A per-generation name (like kube's "kube-ca@<unix>") keeps the old and new CA of a
    // rotation distinguishable for chain building and for humans reading the bundle.
    dn.push(DnType::CommonName, format!("gatehouse-ca@{now_secs}"));
    dn.push(DnType::OrganizationName, "gatehouse");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = to_offset(now_secs - backdate(validity).as_secs() as i64)?;
    params.not_after = to_offset(now_secs + validity.as_secs() as i64)?;
    let cert = params
        .self_signed(&key)
        .map_err(|source| TlsError::SignCertificate { what: "CA", source })?;
    Ok(CertKeyPem {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A new ECDSA P-256 serving certificate for `sans`, signed by `ca`, valid from (about) `now`
/// for `validity` but never past the CA's own expiry (a chain is only as valid as its CA).
pub(crate) fn issue_serving(
    ca: &CertKeyPem,
    sans: &[San],
    now: SystemTime,
    validity: Duration,
) -> Result<CertKeyPem, TlsError> {
    let ca_info = parse_cert_pem(&ca.cert_pem)?;
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(|source| TlsError::LoadCaKey { source })?;
    let issuer = Issuer::from_ca_cert_der(&ca_info.der.as_slice().into(), ca_key)
        .map_err(|source| TlsError::LoadCaCertificate { source })?;
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|source| {
        TlsError::GenerateKey {
            what: "serving certificate",
            source,
        }
    })?;

    let now_secs = unix_secs(now);
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(first) = sans.first() {
        dn.push(DnType::CommonName, first.to_string());
    }
    params.distinguished_name = dn;
    params.subject_alt_names = sans
        .iter()
        .map(|san| match san {
            San::Dns(name) => name
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|source| TlsError::InvalidSan {
                    san: name.clone(),
                    source,
                }),
            San::Ip(ip) => Ok(SanType::IpAddress(*ip)),
        })
        .collect::<Result<_, _>>()?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = to_offset(now_secs - backdate(validity).as_secs() as i64)?;
    let not_after = (now_secs + validity.as_secs() as i64).min(unix_secs(ca_info.not_after));
    params.not_after = to_offset(not_after)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|source| TlsError::SignCertificate {
            what: "serving certificate",
            source,
        })?;
    Ok(CertKeyPem {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whole seconds since the epoch (X.509 times have one-second resolution).
pub(crate) fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

pub(crate) fn from_unix(secs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(secs as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs())
    }
}

fn to_offset(secs: i64) -> Result<OffsetDateTime, TlsError> {
    OffsetDateTime::from_unix_timestamp(secs).map_err(|e| TlsError::InvalidConfig {
        reason: format!("certificate time {secs} out of range: {e}"),
    })
}
