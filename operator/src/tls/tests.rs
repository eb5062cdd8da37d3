//! Transitions of the rotation state machine and properties of the generated certificates.
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY};
use x509_parser::prelude::{FromDer, X509Certificate};

use super::pki::{self, cert_ders, from_unix, parse_cert_pem, unix_secs};
use super::*;

const DNS_NAME: &str = "gatehouse.gatehouse-system.svc";
const IP_NAME: &str = "127.0.0.1";

/// Nothing confirmed by the cluster yet.
const NONE: Confirmed = Confirmed {
    next_ca_published: false,
    previous_ca_unused: false,
};
/// The new CA confirmed in every configuration.
const PUBLISHED: Confirmed = Confirmed {
    next_ca_published: true,
    previous_ca_unused: false,
};
/// Every replica confirmed serving the current CA.
const UNUSED: Confirmed = Confirmed {
    next_ca_published: false,
    previous_ca_unused: true,
};

fn sans() -> Vec<San> {
    vec![
        San::parse("gatehouse"),
        San::parse("gatehouse.gatehouse-system"),
        San::parse(DNS_NAME),
        San::parse("gatehouse.gatehouse-system.svc.cluster.local"),
        San::parse(IP_NAME),
    ]
}

/// The short lifetimes of the e2e test: CA 20s, serving 8s, grace 2s.
fn cfg() -> TlsConfig {
    let mut c = TlsConfig::new("gatehouse-system", sans());
    c.ca_validity = Duration::from_secs(20);
    c.cert_validity = Duration::from_secs(8);
    c.bundle_propagation = Duration::from_secs(2);
    c
}

/// A whole-second base time, so expected certificate times are exact.
fn t0() -> SystemTime {
    from_unix(unix_secs(SystemTime::now()))
}

fn at(base: SystemTime, secs: f64) -> SystemTime {
    if secs >= 0.0 {
        base + Duration::from_secs_f64(secs)
    } else {
        base - Duration::from_secs_f64(-secs)
    }
}

fn renew(reason: Reason) -> Action {
    Action::RenewServing { reason }
}

fn create(reason: Reason) -> Action {
    Action::Create { reason }
}

fn fresh(now: SystemTime, cfg: &TlsConfig) -> TlsMaterial {
    let m = TlsMaterial::default();
    assert_eq!(plan(&m, now, cfg, NONE), create(Reason::Missing));
    perform(&m, plan(&m, now, cfg, NONE), now, cfg).unwrap()
}

fn step(m: &TlsMaterial, now: SystemTime, cfg: &TlsConfig, expected: Action) -> TlsMaterial {
    step_given(m, now, cfg, NONE, expected)
}

fn step_given(
    m: &TlsMaterial,
    now: SystemTime,
    cfg: &TlsConfig,
    confirmed: Confirmed,
    expected: Action,
) -> TlsMaterial {
    assert_eq!(plan(m, now, cfg, confirmed), expected);
    perform(m, expected, now, cfg).unwrap()
}

fn bundle_len(m: &TlsMaterial) -> usize {
    cert_ders(&m.ca_bundle_pem()).unwrap().len()
}

fn serving_pem(m: &TlsMaterial) -> &str {
    &m.serving.as_ref().unwrap().cert_pem
}

/// Verifies the serving certificate the way a TLS client trusting `bundle_pem` would.
fn verifies(bundle_pem: &str, cert_pem: &str, name: &str, now: SystemTime) -> bool {
    let mut roots = RootCertStore::empty();
    for der in cert_ders(bundle_pem).unwrap() {
        roots.add(CertificateDer::from(der)).unwrap();
    }
    let verifier = WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let leaf = CertificateDer::from(cert_ders(cert_pem).unwrap().remove(0));
    let name = ServerName::try_from(name.to_string()).unwrap();
    let now = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap());
    verifier
        .verify_server_cert(&leaf, &[], &name, &[], now)
        .is_ok()
}

fn verifies_both_names(bundle_pem: &str, cert_pem: &str, now: SystemTime) -> bool {
    verifies(bundle_pem, cert_pem, DNS_NAME, now) && verifies(bundle_pem, cert_pem, IP_NAME, now)
}

/// Whether `m`'s own bundle trusts its serving certificate under both names.
fn serves_both_names(m: &TlsMaterial, now: SystemTime) -> bool {
    verifies_both_names(&m.ca_bundle_pem(), serving_pem(m), now)
}

/// Whether the plan for `m` at `now` is to keep it as it is.
fn keeps(m: &TlsMaterial, now: SystemTime, cfg: &TlsConfig, confirmed: Confirmed) -> bool {
    matches!(plan(m, now, cfg, confirmed), Action::Keep { .. })
}

fn issued_by_pem(cert_pem: &str, ca_pem: &str) -> bool {
    pki::issued_by(
        &parse_cert_pem(cert_pem).unwrap(),
        &parse_cert_pem(ca_pem).unwrap(),
    )
}

#[test]
fn fresh_material_is_created_and_then_kept() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    assert!(m.next_ca.is_none() && m.previous_ca_pem.is_none());
    assert_eq!(bundle_len(&m), 1);
    // Serving: not_before t0-1 (backdate), not_after t0+8, renewal at 2/3 of 9s.
    assert_eq!(
        plan(&m, at(t0, 1.0), &cfg, NONE),
        Action::Keep {
            next_check: at(t0, 5.0)
        }
    );
    assert!(serves_both_names(&m, at(t0, 0.0)));
}

#[test]
fn generated_certificates_have_the_right_properties() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let ca_der = cert_ders(&m.ca.as_ref().unwrap().cert_pem)
        .unwrap()
        .remove(0);
    let (_, ca) = X509Certificate::from_der(&ca_der).unwrap();
    let srv_der = cert_ders(serving_pem(&m)).unwrap().remove(0);
    let (_, srv) = X509Certificate::from_der(&srv_der).unwrap();
    let ts = |secs: i64| unix_secs(t0) + secs;

    // CA: self-signed, CA:TRUE pathlen 0 (critical), may sign certificates.
    let bc = ca.basic_constraints().unwrap().unwrap();
    assert!(bc.critical && bc.value.ca);
    assert_eq!(bc.value.path_len_constraint, Some(0));
    assert!(ca.key_usage().unwrap().unwrap().value.key_cert_sign());
    assert_eq!(ca.issuer().as_raw(), ca.subject().as_raw());
    ca.verify_signature(None).unwrap();
    assert_eq!(ca.validity().not_before.timestamp(), ts(-2));
    assert_eq!(ca.validity().not_after.timestamp(), ts(20));

    // Serving: issued by the CA, not a CA, for server auth, exactly the configured SANs.
    assert_eq!(srv.issuer().as_raw(), ca.subject().as_raw());
    srv.verify_signature(Some(ca.public_key())).unwrap();
    assert!(!srv.is_ca());
    assert!(srv.extended_key_usage().unwrap().unwrap().value.server_auth);
    assert_eq!(srv.validity().not_before.timestamp(), ts(-1));
    assert_eq!(srv.validity().not_after.timestamp(), ts(8));
    let names: Vec<String> = srv
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => d.to_string(),
            GeneralName::IPAddress(b) => IpAddr::from(<[u8; 4]>::try_from(*b).unwrap()).to_string(),
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect();
    let expected: Vec<String> = sans().iter().map(ToString::to_string).collect();
    assert_eq!(names, expected);

    // Both keys are ECDSA P-256.
    for cert in [&ca, &srv] {
        let alg = &cert.public_key().algorithm;
        assert_eq!(alg.algorithm, OID_KEY_TYPE_EC_PUBLIC_KEY);
        let curve = alg.parameters.as_ref().unwrap().as_oid().unwrap();
        assert_eq!(curve, OID_EC_P256);
    }
    for key in [
        &m.ca.as_ref().unwrap().key_pem,
        &m.serving.as_ref().unwrap().key_pem,
    ] {
        let key = rcgen::KeyPair::from_pem(key).unwrap();
        assert_eq!(key.algorithm(), &rcgen::PKCS_ECDSA_P256_SHA256);
    }
}

#[test]
fn serving_at_70_percent_is_renewed_under_the_same_ca() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    // 70% of the 9s lifetime starting at t0-1.
    let now = at(t0, -1.0 + 0.7 * 9.0);
    let renewed = step(&m, now, &cfg, renew(Reason::NearExpiry));
    assert_eq!(renewed.ca, m.ca);
    assert_ne!(renewed.serving, m.serving);
    // No bundle change is needed for a renewal under the same CA.
    assert_eq!(renewed.ca_bundle_pem(), m.ca_bundle_pem());
    assert!(serves_both_names(&renewed, now));
    assert!(keeps(&renewed, now, &cfg, NONE));
}

#[test]
fn serving_is_capped_at_the_ca_expiry() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let late = at(t0, 15.0);
    let renewed = perform(&m, renew(Reason::NearExpiry), late, &cfg).unwrap();
    let info = parse_cert_pem(serving_pem(&renewed)).unwrap();
    assert_eq!(info.not_after, at(t0, 20.0));
}

/// Drives a full CA rotation and checks every phase: neither the switch nor the drop happens
/// on a timer, however long it has been, until the cluster confirms it.
#[test]
fn ca_rotation_waits_for_each_confirmation() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    // Renew the serving certificate first (the first one has expired by t0+12), so that at
    // the CA's 70% only the CA is due.
    let m = step(&m, at(t0, 12.0), &cfg, renew(Reason::Expired));
    let old_ca = m.ca.clone().unwrap();
    let old_serving = m.serving.clone().unwrap();

    // CA lifetime 22s from t0-2: 70% is t0+13.4. Phase 1: bundle = old + new.
    let started = at(t0, -2.0 + 0.7 * 22.0);
    let m = step(
        &m,
        started,
        &cfg,
        Action::StartCaRotation {
            reason: Reason::NearExpiry,
        },
    );
    assert_eq!(m.ca.as_ref(), Some(&old_ca), "the old CA keeps signing");
    assert_eq!(
        m.serving.as_ref(),
        Some(&old_serving),
        "the serving cert is untouched"
    );
    let next_ca = m.next_ca.clone().unwrap();
    assert_eq!(bundle_len(&m), 2);
    assert!(m.ca_bundle_pem().contains(old_ca.cert_pem.trim()));
    assert!(m.ca_bundle_pem().contains(next_ca.cert_pem.trim()));
    assert!(serves_both_names(&m, started));

    // Unconfirmed, the switch never happens: long past any grace the old CA keeps signing,
    // and an expiring serving certificate is renewed by it.
    assert!(keeps(&m, at(t0, 15.9), &cfg, NONE));
    assert!(keeps(&m, at(t0, 16.5), &cfg, UNUSED));
    let renewed = step(&m, at(t0, 17.0), &cfg, renew(Reason::NearExpiry));
    assert!(issued_by_pem(serving_pem(&renewed), &old_ca.cert_pem));
    assert_eq!(renewed.next_ca.as_ref(), Some(&next_ca));

    // Phase 2, once the bundle is confirmed: the new CA signs, the old one stays in the bundle.
    let switched = at(t0, 17.0);
    let m = step_given(
        &renewed,
        switched,
        &cfg,
        PUBLISHED,
        Action::FinishCaRotation,
    );
    assert_eq!(m.ca.as_ref(), Some(&next_ca));
    assert!(m.next_ca.is_none());
    assert_eq!(m.previous_ca_pem.as_deref(), Some(old_ca.cert_pem.as_str()));
    assert!(issued_by_pem(serving_pem(&m), &next_ca.cert_pem));
    assert_eq!(bundle_len(&m), 2);
    assert!(serves_both_names(&m, switched));
    assert!(verifies_both_names(
        &m.ca_bundle_pem(),
        &old_serving.cert_pem,
        switched
    ));

    // The old CA stays until every replica is confirmed serving the new one.
    assert!(keeps(&m, at(t0, 19.0), &cfg, NONE));
    assert!(keeps(&m, at(t0, 19.0), &cfg, PUBLISHED));
    let dropped_at = at(t0, 19.0);
    let m = step_given(&m, dropped_at, &cfg, UNUSED, Action::DropOldCa);
    assert!(m.previous_ca_pem.is_none() && m.previous_retired_at.is_none());
    assert_eq!(bundle_len(&m), 1);
    assert!(serves_both_names(&m, dropped_at));
    assert!(!verifies(
        &m.ca_bundle_pem(),
        &old_serving.cert_pem,
        DNS_NAME,
        dropped_at
    ));
    assert!(keeps(&m, dropped_at, &cfg, NONE));
}

/// A stuck rotation keeps the current CA and certificate in use as long as they are valid;
/// only an expired CA is replaced (nothing else can be served then).
#[test]
fn an_unconfirmed_rotation_waits_until_the_old_ca_expires() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let m = step(&m, at(t0, 14.0), &cfg, renew(Reason::Expired));
    let m = step(
        &m,
        at(t0, 14.0),
        &cfg,
        Action::StartCaRotation {
            reason: Reason::NearExpiry,
        },
    );
    for s in [15.0, 16.0, 17.0, 18.0, 19.0, 19.9] {
        let action = plan(&m, at(t0, s), &cfg, NONE);
        assert!(
            !matches!(action, Action::FinishCaRotation | Action::Create { .. }),
            "t0+{s}: {action:?}"
        );
    }
    assert_eq!(plan(&m, at(t0, 20.0), &cfg, NONE), create(Reason::Expired));
}

#[test]
fn no_new_rotation_while_the_previous_ca_is_still_in_the_bundle() {
    let (cfg, t0) = (cfg(), t0());
    let mut m = fresh(t0, &cfg);
    // A previous CA retired just now, while the current CA is already past its 2/3.
    m.previous_ca_pem = Some(fresh(t0, &cfg).ca.unwrap().cert_pem);
    m.previous_retired_at = Some(at(t0, 14.0));
    m = perform(&m, renew(Reason::NearExpiry), at(t0, 14.0), &cfg).unwrap();
    assert!(keeps(&m, at(t0, 14.5), &cfg, NONE));
    let m = step_given(&m, at(t0, 16.0), &cfg, UNUSED, Action::DropOldCa);
    assert_eq!(
        plan(&m, at(t0, 16.0), &cfg, NONE),
        Action::StartCaRotation {
            reason: Reason::NearExpiry
        }
    );
}

#[test]
fn changed_sans_reissue_the_serving_certificate() {
    let (mut cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    cfg.sans.push(San::parse("webhook.example.com"));
    let m2 = step(&m, t0, &cfg, renew(Reason::SansChanged));
    assert_eq!(m2.ca, m.ca);
    assert!(verifies(
        &m2.ca_bundle_pem(),
        serving_pem(&m2),
        "webhook.example.com",
        t0
    ));
    // Order and case do not matter.
    cfg.sans.reverse();
    cfg.sans.push(San::Dns("GATEHOUSE".into()));
    assert!(keeps(&m2, t0, &cfg, NONE));
}

#[test]
fn broken_serving_material_is_reissued() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let other = fresh(t0, &cfg);

    let mut bad = m.clone();
    bad.serving = None;
    assert_eq!(plan(&bad, t0, &cfg, NONE), renew(Reason::Missing));
    bad.serving = Some(CertKeyPem {
        cert_pem: "garbage".into(),
        key_pem: "garbage".into(),
    });
    assert_eq!(plan(&bad, t0, &cfg, NONE), renew(Reason::Unparseable));
    bad.serving = Some(CertKeyPem {
        cert_pem: serving_pem(&m).into(),
        key_pem: other.serving.as_ref().unwrap().key_pem.clone(),
    });
    assert_eq!(plan(&bad, t0, &cfg, NONE), renew(Reason::KeyMismatch));
    bad.serving = other.serving.clone();
    assert_eq!(plan(&bad, t0, &cfg, NONE), renew(Reason::NotIssuedByCa));
    assert_eq!(plan(&m, at(t0, 8.0), &cfg, NONE), renew(Reason::Expired));
}

#[test]
fn broken_or_expired_ca_is_replaced() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let other = fresh(t0, &cfg);

    let mut bad = m.clone();
    bad.ca.as_mut().unwrap().key_pem = other.ca.as_ref().unwrap().key_pem.clone();
    assert_eq!(plan(&bad, t0, &cfg, NONE), create(Reason::KeyMismatch));
    bad.ca = m.serving.clone();
    assert_eq!(plan(&bad, t0, &cfg, NONE), create(Reason::NotACa));
    bad.ca.as_mut().unwrap().cert_pem = "-----BEGIN CERTIFICATE-----\nAAAA\n".into();
    assert_eq!(plan(&bad, t0, &cfg, NONE), create(Reason::Unparseable));
    assert_eq!(plan(&m, at(t0, 20.0), &cfg, NONE), create(Reason::Expired));
    let replaced = perform(&m, create(Reason::Expired), at(t0, 20.0), &cfg).unwrap();
    assert_ne!(replaced.ca, m.ca);
    assert!(keeps(&replaced, at(t0, 20.0), &cfg, NONE));
}

#[test]
fn shorter_configured_validity_rotates_gracefully() {
    let t0 = t0();
    let long = TlsConfig::new("gatehouse-system", sans());
    let m = fresh(t0, &long);
    assert!(keeps(&m, t0, &long, NONE));
    let short = cfg();
    let m = step(&m, t0, &short, renew(Reason::ValidityChanged));
    // The long-lived CA is rotated the graceful way, never replaced outright.
    let m = step(
        &m,
        t0,
        &short,
        Action::StartCaRotation {
            reason: Reason::ValidityChanged,
        },
    );
    assert_eq!(bundle_len(&m), 2);
}

#[test]
fn rotation_timestamps_decide_nothing() {
    // Written by one replica's wall clock, judged by none: missing or absurd ones change no
    // decision, so clock skew between replicas cannot shorten an overlap.
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let mut m1 = m.clone();
    m1.next_ca = fresh(t0, &cfg).ca;
    assert!(keeps(&m1, t0, &cfg, NONE));
    m1.rotation_started_at = Some(at(t0, -3600.0));
    assert!(keeps(&m1, t0, &cfg, NONE));
    assert_eq!(plan(&m1, t0, &cfg, PUBLISHED), Action::FinishCaRotation);
    let mut m2 = m.clone();
    m2.previous_ca_pem = fresh(t0, &cfg).ca.map(|c| c.cert_pem);
    assert!(keeps(&m2, t0, &cfg, NONE));
    m2.previous_retired_at = Some(at(t0, -3600.0));
    assert!(keeps(&m2, t0, &cfg, NONE));
    assert_eq!(plan(&m2, t0, &cfg, UNUSED), Action::DropOldCa);
    // A corrupt previous CA protects nobody.
    m2.previous_ca_pem = Some("garbage".into());
    assert_eq!(plan(&m2, t0, &cfg, NONE), Action::DropOldCa);
}

#[test]
fn secret_data_round_trips_and_a_restart_adopts_it() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let m = perform(
        &m,
        Action::StartCaRotation {
            reason: Reason::NearExpiry,
        },
        at(t0, 13.5),
        &cfg,
    )
    .unwrap();
    let data = m.to_secret_data();
    for key in [
        "ca.crt",
        "ca.key",
        "tls.crt",
        "tls.key",
        "ca-next.crt",
        "ca-bundle.crt",
    ] {
        assert!(data.contains_key(key), "{key} missing");
    }
    let read = TlsMaterial::from_secret_data(&data);
    assert_eq!(read, m);
    // What a restarted replica sees: the same CA, nothing to generate.
    let restarted = TlsMaterial::from_secret_data(&read.to_secret_data());
    assert_eq!(restarted.ca, m.ca);
    assert_eq!(
        plan(&restarted, at(t0, 13.6), &cfg, NONE),
        plan(&m, at(t0, 13.6), &cfg, NONE)
    );

    let mut corrupt = data.clone();
    corrupt.insert("ca.key".into(), k8s_openapi::ByteString(vec![0xff, 0xfe]));
    assert!(TlsMaterial::from_secret_data(&corrupt).ca.is_none());
    assert_eq!(
        TlsMaterial::from_secret_data(&BTreeMap::new()),
        TlsMaterial::default()
    );
}

#[test]
fn state_reports_bundle_and_expiries() {
    let (cfg, t0) = (cfg(), t0());
    let m = fresh(t0, &cfg);
    let state = m.state().unwrap();
    assert_eq!(state.ca_bundle_pem, m.ca_bundle_pem());
    assert_eq!(state.ca_not_after, unix_secs(t0) + 20);
    assert_eq!(state.serving_not_after, unix_secs(t0) + 8);
    assert!(TlsMaterial::default().state().is_none());
}

/// Simulates a minute of continuous operation with rotations every ~13s and checks the
/// property the e2e test relies on: with replicas and API servers lagging by up to half a
/// grace period, whatever certificate any replica presents verifies against whatever bundle
/// any API server holds. Confirmations are modelled as the manager makes them: the bundle is
/// confirmed once the lagging API server's copy holds the next CA, replicas once the lagging
/// replica serves a certificate of the current CA, each then held for a grace.
#[test]
fn simulated_rotations_never_present_an_untrusted_certificate() {
    let (cfg, t0) = (cfg(), t0());
    let tick = 0.25;
    let lag_ticks = 4; // 1s = half the 2s grace
    let grace_ticks = 8; // 2s
    let mut history: Vec<TlsMaterial> = Vec::new();
    let mut m = TlsMaterial::default();
    let mut rotations = 0;
    let (mut published_since, mut unused_since): (Option<usize>, Option<usize>) = (None, None);
    for i in 0..(70.0 / tick) as usize {
        let now = at(t0, i as f64 * tick);
        let lagging = history.get(i.saturating_sub(lag_ticks)).cloned();
        let ca_pem = |c: &Option<CertKeyPem>| c.as_ref().map(|c| c.cert_pem.trim().to_string());
        let published = lagging
            .as_ref()
            .zip(ca_pem(&m.next_ca))
            .is_some_and(|(old, next)| old.ca_bundle_pem().contains(&next));
        published_since = if published {
            published_since.or(Some(i))
        } else {
            None
        };
        let unused = m.previous_ca_pem.is_some()
            && lagging
                .as_ref()
                .zip(ca_pem(&m.ca))
                .is_some_and(|(old, ca)| {
                    old.serving
                        .as_ref()
                        .is_some_and(|s| issued_by_pem(&s.cert_pem, &ca))
                });
        unused_since = if unused {
            unused_since.or(Some(i))
        } else {
            None
        };
        let confirmed = Confirmed {
            next_ca_published: published_since.is_some_and(|s| i - s >= grace_ticks),
            previous_ca_unused: unused_since.is_some_and(|s| i - s >= grace_ticks),
        };
        for _ in 0..5 {
            match plan(&m, now, &cfg, confirmed) {
                Action::Keep { next_check } => {
                    assert!(next_check > now);
                    break;
                }
                action => {
                    if action == Action::FinishCaRotation {
                        rotations += 1;
                    }
                    m = perform(&m, action, now, &cfg).unwrap();
                }
            }
        }
        assert!(bundle_len(&m) <= 2);
        history.push(m.clone());
        for serve_lag in [0, lag_ticks] {
            for bundle_lag in [0, lag_ticks] {
                let served = &history[i.saturating_sub(serve_lag)];
                let bundle = &history[i.saturating_sub(bundle_lag)];
                assert!(
                    verifies_both_names(&bundle.ca_bundle_pem(), serving_pem(served), now),
                    "t={}s serve_lag={serve_lag} bundle_lag={bundle_lag}",
                    i as f64 * tick
                );
            }
        }
    }
    assert!(rotations >= 3, "only {rotations} CA rotations");
}

#[test]
fn a_missing_or_corrupted_secret_is_restored_from_what_is_served() {
    let cfg = cfg();
    let now = t0();
    let served = fresh(now, &cfg);
    // No Secret and nothing served: a new CA.
    match plan_secret(None, None, now, &cfg, NONE).unwrap() {
        SecretPlan::Create { material, restored } => {
            assert!(!restored);
            assert!(keeps(&material, now, &cfg, NONE));
        }
        other => panic!("{other:?}"),
    }
    // No Secret, but this replica serves a CA the cluster trusts: that one, not a new one.
    assert_eq!(
        plan_secret(None, Some(&served), now, &cfg, NONE).unwrap(),
        SecretPlan::Create {
            material: served.clone(),
            restored: true
        }
    );
    // Corrupted by hand: the served material goes back.
    let corrupted = TlsMaterial::default();
    match plan_secret(Some(&corrupted), Some(&served), now, &cfg, NONE).unwrap() {
        SecretPlan::Update {
            material,
            restored,
            action,
        } => {
            assert!(restored, "{action}");
            assert_eq!(material, served);
        }
        other => panic!("{other:?}"),
    }
    // As it should be: kept, and nothing is written.
    assert!(matches!(
        plan_secret(Some(&served), Some(&served), now, &cfg, NONE).unwrap(),
        SecretPlan::Keep { .. }
    ));
    // Due for renewal: the rotation plan's action, not a restore.
    let later = at(now, 0.75 * cfg.cert_validity.as_secs_f64());
    match plan_secret(Some(&served), Some(&served), later, &cfg, NONE).unwrap() {
        SecretPlan::Update {
            restored, action, ..
        } => {
            assert!(!restored);
            assert!(matches!(action, Action::RenewServing { .. }), "{action}");
        }
        other => panic!("{other:?}"),
    }
}
