//! The rotation state machine: [`plan`] looks at the stored material and the clock and says
//! what to do next; [`perform`] does it, producing the material to store. Both are pure (apart
//! from key generation), so every transition is unit-tested without an API server.
//!
//! The Secret holds up to three CAs:
//! * `ca.crt`/`ca.key`: the CA that signed `tls.crt`/`tls.key` (always; the invariant that lets
//!   the serving certificate be renewed at any time, even mid-rotation);
//! * `ca-next.crt`/`ca-next.key`: a new CA that is already in the bundle but signs nothing yet;
//! * `ca-previous.crt`: the retired CA, kept in the bundle while replicas may still present
//!   a serving certificate it signed.
//!
//! A CA rotation therefore goes: `StartCaRotation` (bundle = old + new, serving still by the
//! old CA) → `FinishCaRotation` (new CA signs a new serving certificate; old CA becomes previous,
//! bundle unchanged) → `DropOldCa`. Neither of the last two steps is taken on a timer: each
//! waits for a fact read back from the cluster ([`Confirmed`]), so a leader that cannot write
//! the configurations, or no leader at all, stalls the rotation instead of locking the cluster
//! out. At every instant the bundle the API server holds trusts whatever certificate a replica
//! may still present.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;

use super::TlsError;
use super::config::{San, TlsConfig, backdate};
use super::pki::{
    self, CertInfo, CertKeyPem, from_unix, issued_by, key_matches, parse_cert_pem, unix_secs,
};

/// Secret data keys.
pub const KEY_CA_CERT: &str = "ca.crt";
pub const KEY_CA_KEY: &str = "ca.key";
pub const KEY_TLS_CERT: &str = "tls.crt";
pub const KEY_TLS_KEY: &str = "tls.key";
pub const KEY_NEXT_CA_CERT: &str = "ca-next.crt";
pub const KEY_NEXT_CA_KEY: &str = "ca-next.key";
pub const KEY_PREVIOUS_CA_CERT: &str = "ca-previous.crt";
/// Derived (the `caBundle` to publish), written for humans and tools; never read back.
pub const KEY_CA_BUNDLE: &str = "ca-bundle.crt";
/// Unix seconds at which `ca-next.crt` was first stored (for humans; no decision reads it).
pub const KEY_ROTATION_STARTED_AT: &str = "ca-rotation-started-at";
/// Unix seconds at which the serving certificate stopped being signed by `ca-previous.crt`
/// (for humans; no decision reads it).
pub const KEY_PREVIOUS_RETIRED_AT: &str = "ca-previous-retired-at";

/// Tolerance when comparing a certificate's lifetime with the configured one, so that
/// whole-second truncation never looks like a configuration change.
const VALIDITY_SLACK: Duration = Duration::from_secs(2);

/// Everything stored in the Secret, as PEM text and timestamps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsMaterial {
    /// The CA that signed `serving`.
    pub ca: Option<CertKeyPem>,
    /// Phase 1 of a CA rotation: published in the bundle, not yet signing.
    pub next_ca: Option<CertKeyPem>,
    /// Phase 2 of a CA rotation: retired CA, still in the bundle.
    pub previous_ca_pem: Option<String>,
    /// The serving certificate and key.
    pub serving: Option<CertKeyPem>,
    /// When `next_ca` was stored.
    pub rotation_started_at: Option<SystemTime>,
    /// When `previous_ca_pem` stopped signing the stored serving certificate.
    pub previous_retired_at: Option<SystemTime>,
}

/// What the server presents and what clients must trust, for the controller and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsState {
    /// PEM bundle for `caBundle` of the webhook configurations.
    pub ca_bundle_pem: String,
    /// Expiry of the serving certificate in the Secret, Unix seconds.
    pub serving_not_after: i64,
    /// Expiry of the CA that signed it, Unix seconds.
    pub ca_not_after: i64,
}

/// Why a certificate is (re)generated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Missing,
    Unparseable,
    NotACa,
    KeyMismatch,
    Expired,
    NearExpiry,
    NotIssuedByCa,
    SansChanged,
    ValidityChanged,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Reason::Missing => "missing",
            Reason::Unparseable => "unparseable",
            Reason::NotACa => "not a CA certificate",
            Reason::KeyMismatch => "private key does not match certificate",
            Reason::Expired => "expired",
            Reason::NearExpiry => "less than a third of its lifetime left",
            Reason::NotIssuedByCa => "not signed by the current CA",
            Reason::SansChanged => "SANs differ from the configured ones",
            Reason::ValidityChanged => "lifetime exceeds the configured validity",
        })
    }
}

/// The next step towards the desired material.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing to do before `next_check`.
    Keep { next_check: SystemTime },
    /// No usable CA: generate a CA and a serving certificate from scratch.
    Create { reason: Reason },
    /// Issue a new serving certificate from the current CA (no bundle change).
    RenewServing { reason: Reason },
    /// Generate the next CA and add it to the bundle; the serving certificate is untouched.
    StartCaRotation { reason: Reason },
    /// The next CA is confirmed in every live configuration: it becomes the current CA and signs
    /// a new serving certificate; the old CA stays in the bundle as previous.
    FinishCaRotation,
    /// No replica presents a certificate by the previous CA any more: remove it from the bundle.
    DropOldCa,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Keep { .. } => f.write_str("keep"),
            Action::Create { reason } => write!(f, "create CA and serving certificate ({reason})"),
            Action::RenewServing { reason } => write!(f, "renew serving certificate ({reason})"),
            Action::StartCaRotation { reason } => write!(f, "start CA rotation ({reason})"),
            Action::FinishCaRotation => f.write_str("switch serving certificate to the new CA"),
            Action::DropOldCa => f.write_str("drop the previous CA from the bundle"),
        }
    }
}

/// What the cluster has confirmed about the rotation in progress: facts read back from the API
/// server and aged on this replica's monotonic clock, never timestamps another replica wrote
/// with its own wall clock (which skew could make lie).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// Every live webhook configuration's `caBundle` has held the next CA for a propagation
    /// grace: the API server trusts it.
    pub next_ca_published: bool,
    /// Every live replica has served a certificate of the current CA for a grace: nobody
    /// presents one of the previous CA any more.
    pub previous_ca_unused: bool,
}

/// Decides the next step for `m` at `now`, given what the cluster `confirmed`. See the module
/// documentation for the phases.
pub fn plan(m: &TlsMaterial, now: SystemTime, cfg: &TlsConfig, confirmed: Confirmed) -> Action {
    // Without a usable CA nothing else can be kept. An existing valid CA is never replaced
    // here, so a restarted or additional replica adopts it.
    let ca = match inspect_ca(m.ca.as_ref(), now) {
        Ok(ca) => ca,
        Err(reason) => return Action::Create { reason },
    };

    if let Some(prev) = &m.previous_ca_pem {
        match parse_cert_pem(prev) {
            Ok(info) if now < info.not_after && !confirmed.previous_ca_unused => {}
            // Unused, or a corrupt or expired CA that protects nobody.
            _ => return Action::DropOldCa,
        }
    }

    // Checked before the serving certificate: switching issues a new one anyway. One rotation
    // at a time: the previous CA leaves the bundle before the next one is switched to.
    let next = inspect_ca(m.next_ca.as_ref(), now);
    if next.is_ok() && m.previous_ca_pem.is_none() && confirmed.next_ca_published {
        return Action::FinishCaRotation;
    }

    let serving = match inspect_serving(m.serving.as_ref(), &ca, now, cfg) {
        Ok(s) => s,
        Err(reason) => return Action::RenewServing { reason },
    };
    let mut next_check = serving.renew_at();

    match (m.next_ca.as_ref(), next) {
        (Some(_), Err(reason)) => return Action::StartCaRotation { reason },
        // Waiting for the bundle to be confirmed; the caller polls while it waits.
        (Some(_), Ok(_)) => {}
        (None, _) => {
            // The bundle never holds more than two CAs.
            if m.previous_ca_pem.is_none() {
                if now >= ca.renew_at() {
                    return Action::StartCaRotation {
                        reason: Reason::NearExpiry,
                    };
                }
                if ca.lifetime() > max_lifetime(cfg.ca_validity) {
                    return Action::StartCaRotation {
                        reason: Reason::ValidityChanged,
                    };
                }
                next_check = next_check.min(ca.renew_at());
            }
        }
    }
    Action::Keep { next_check }
}

/// What the manager writes for its Secret, as it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum SecretPlan {
    /// Nothing until `next_check`.
    Keep { next_check: SystemTime },
    /// The Secret is missing: create it holding `material`.
    Create {
        material: TlsMaterial,
        /// `material` is what this replica serves (the cluster trusts it), not a new CA.
        restored: bool,
    },
    /// Replace the Secret's material with `material`, made by `action`.
    Update {
        material: TlsMaterial,
        action: Action,
        /// `material` is what this replica serves, put back over a Secret corrupted by hand.
        restored: bool,
    },
}

/// Decides what to write for the Secret's material as it stands (`None`: no Secret), given the
/// material this replica last served and planned as usable (`last_good`): a missing or
/// corrupted Secret is restored from it rather than replaced by a CA nobody trusts yet; otherwise
/// the rotation [`plan`] decides and [`perform`] makes the material.
pub fn plan_secret(
    current: Option<&TlsMaterial>,
    last_good: Option<&TlsMaterial>,
    now: SystemTime,
    cfg: &TlsConfig,
    confirmed: Confirmed,
) -> Result<SecretPlan, TlsError> {
    let Some(material) = current else {
        return Ok(match last_good {
            Some(good) => SecretPlan::Create {
                material: good.clone(),
                restored: true,
            },
            None => SecretPlan::Create {
                material: perform(
                    &TlsMaterial::default(),
                    Action::Create {
                        reason: Reason::Missing,
                    },
                    now,
                    cfg,
                )?,
                restored: false,
            },
        });
    };
    let action = plan(material, now, cfg, confirmed);
    Ok(match (action, last_good) {
        (Action::Keep { next_check }, _) => SecretPlan::Keep { next_check },
        (Action::Create { .. }, Some(good)) if good != material => SecretPlan::Update {
            material: good.clone(),
            action,
            restored: true,
        },
        _ => SecretPlan::Update {
            material: perform(material, action, now, cfg)?,
            action,
            restored: false,
        },
    })
}

/// Performs `action` on `m` at `now`, returning the material to store.
pub fn perform(
    m: &TlsMaterial,
    action: Action,
    now: SystemTime,
    cfg: &TlsConfig,
) -> Result<TlsMaterial, TlsError> {
    // Stored timestamps have one-second resolution. Rounding up never shortens a grace
    // period, and doing it here keeps the in-memory result identical to a re-read Secret.
    let now_stored = ceil_to_second(now);
    let mut out = m.clone();
    match action {
        Action::Keep { .. } => {}
        Action::Create { .. } => {
            let ca = pki::generate_ca(now, cfg.ca_validity)?;
            let serving = pki::issue_serving(&ca, &cfg.sans, now, cfg.cert_validity)?;
            out = TlsMaterial {
                ca: Some(ca),
                serving: Some(serving),
                ..TlsMaterial::default()
            };
        }
        Action::RenewServing { .. } => {
            let ca = m.ca.as_ref().ok_or(TlsError::PerformAction {
                action: "renew serving certificate",
                reason: "no CA",
            })?;
            out.serving = Some(pki::issue_serving(ca, &cfg.sans, now, cfg.cert_validity)?);
        }
        Action::StartCaRotation { .. } => {
            out.next_ca = Some(pki::generate_ca(now, cfg.ca_validity)?);
            out.rotation_started_at = Some(now_stored);
        }
        Action::FinishCaRotation => {
            let next = m.next_ca.as_ref().ok_or(TlsError::PerformAction {
                action: "finish CA rotation",
                reason: "no next CA",
            })?;
            out.serving = Some(pki::issue_serving(next, &cfg.sans, now, cfg.cert_validity)?);
            out.previous_ca_pem = m.ca.as_ref().map(|ca| ca.cert_pem.clone());
            out.ca = Some(next.clone());
            out.next_ca = None;
            out.rotation_started_at = None;
            out.previous_retired_at = Some(now_stored);
        }
        Action::DropOldCa => {
            out.previous_ca_pem = None;
            out.previous_retired_at = None;
        }
    }
    Ok(out)
}

impl TlsMaterial {
    /// Reads the material from Secret data; missing or non-UTF-8 entries read as absent, for
    /// [`plan`] to repair.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> TlsMaterial {
        let text = |k: &str| {
            data.get(k)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .filter(|s| !s.trim().is_empty())
        };
        let pair = |c: &str, k: &str| {
            Some(CertKeyPem {
                cert_pem: text(c)?,
                key_pem: text(k)?,
            })
        };
        let stamp = |k: &str| {
            text(k)
                .and_then(|s| s.trim().parse::<i64>().ok())
                .map(from_unix)
        };
        TlsMaterial {
            ca: pair(KEY_CA_CERT, KEY_CA_KEY),
            next_ca: pair(KEY_NEXT_CA_CERT, KEY_NEXT_CA_KEY),
            previous_ca_pem: text(KEY_PREVIOUS_CA_CERT),
            serving: pair(KEY_TLS_CERT, KEY_TLS_KEY),
            rotation_started_at: stamp(KEY_ROTATION_STARTED_AT),
            previous_retired_at: stamp(KEY_PREVIOUS_RETIRED_AT),
        }
    }

    /// The Secret data for this material (all managed keys; absent parts are left out).
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        let mut data = BTreeMap::new();
        let mut put = |k: &str, v: &str| {
            data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
        };
        if let Some(ca) = &self.ca {
            put(KEY_CA_CERT, &ca.cert_pem);
            put(KEY_CA_KEY, &ca.key_pem);
        }
        if let Some(s) = &self.serving {
            put(KEY_TLS_CERT, &s.cert_pem);
            put(KEY_TLS_KEY, &s.key_pem);
        }
        if let Some(n) = &self.next_ca {
            put(KEY_NEXT_CA_CERT, &n.cert_pem);
            put(KEY_NEXT_CA_KEY, &n.key_pem);
        }
        if let Some(p) = &self.previous_ca_pem {
            put(KEY_PREVIOUS_CA_CERT, p);
        }
        if let Some(t) = self.rotation_started_at {
            put(KEY_ROTATION_STARTED_AT, &unix_secs(t).to_string());
        }
        if let Some(t) = self.previous_retired_at {
            put(KEY_PREVIOUS_RETIRED_AT, &unix_secs(t).to_string());
        }
        put(KEY_CA_BUNDLE, &self.ca_bundle_pem());
        data
    }

    /// Every stored CA that parses (previous, current, next), as one PEM bundle.
    pub fn ca_bundle_pem(&self) -> String {
        let candidates = [
            self.previous_ca_pem.as_deref(),
            self.ca.as_ref().map(|c| c.cert_pem.as_str()),
            self.next_ca.as_ref().map(|c| c.cert_pem.as_str()),
        ];
        let mut seen = BTreeSet::new();
        let mut bundle = String::new();
        for pem in candidates.into_iter().flatten() {
            // A corrupt entry must not poison caBundle: the API server would reject all of it.
            let Ok(info) = parse_cert_pem(pem) else {
                continue;
            };
            if seen.insert(info.der) {
                bundle.push_str(pem.trim_end());
                bundle.push('\n');
            }
        }
        bundle
    }

    /// The state to publish, if the material has a parseable CA and serving certificate.
    pub fn state(&self) -> Option<TlsState> {
        let ca = parse_cert_pem(&self.ca.as_ref()?.cert_pem).ok()?;
        let serving = parse_cert_pem(&self.serving.as_ref()?.cert_pem).ok()?;
        Some(TlsState {
            ca_bundle_pem: self.ca_bundle_pem(),
            serving_not_after: unix_secs(serving.not_after),
            ca_not_after: unix_secs(ca.not_after),
        })
    }
}

fn ceil_to_second(t: SystemTime) -> SystemTime {
    let floor = from_unix(unix_secs(t));
    if floor < t {
        floor + Duration::from_secs(1)
    } else {
        floor
    }
}

fn max_lifetime(validity: Duration) -> Duration {
    validity + backdate(validity) + VALIDITY_SLACK
}

fn inspect_ca(ca: Option<&CertKeyPem>, now: SystemTime) -> Result<CertInfo, Reason> {
    let ca = ca.ok_or(Reason::Missing)?;
    let info = parse_cert_pem(&ca.cert_pem).map_err(|_| Reason::Unparseable)?;
    if !info.is_ca {
        return Err(Reason::NotACa);
    }
    if !key_matches(&info, &ca.key_pem) {
        return Err(Reason::KeyMismatch);
    }
    // not_before is not checked: a CA from a replica whose clock runs ahead is still ours.
    if now >= info.not_after {
        return Err(Reason::Expired);
    }
    Ok(info)
}

fn inspect_serving(
    serving: Option<&CertKeyPem>,
    ca: &CertInfo,
    now: SystemTime,
    cfg: &TlsConfig,
) -> Result<CertInfo, Reason> {
    let serving = serving.ok_or(Reason::Missing)?;
    let info = parse_cert_pem(&serving.cert_pem).map_err(|_| Reason::Unparseable)?;
    if !key_matches(&info, &serving.key_pem) {
        return Err(Reason::KeyMismatch);
    }
    if !issued_by(&info, ca) {
        return Err(Reason::NotIssuedByCa);
    }
    if now >= info.not_after {
        return Err(Reason::Expired);
    }
    let wanted: BTreeSet<San> = cfg.sans.iter().map(San::normalized).collect();
    if info.sans != wanted {
        return Err(Reason::SansChanged);
    }
    if info.lifetime() > max_lifetime(cfg.cert_validity) {
        return Err(Reason::ValidityChanged);
    }
    if now >= info.renew_at() {
        return Err(Reason::NearExpiry);
    }
    Ok(info)
}
