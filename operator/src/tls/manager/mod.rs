//! Keeps the Secret, the served certificate and the published bundle in step, on every
//! replica. All coordination goes through the Secret: creation is first-writer-wins, updates
//! carry the resourceVersion they were planned from, and a loser re-reads and re-plans, so
//! concurrent replicas converge on one CA without a leader.
//!
//! The two rotation steps that could lock the cluster out wait for facts read back from the
//! API server ([`Confirmed`]): the switch to a new CA waits until every live webhook
//! configuration's `caBundle` holds it, the removal of the old CA until every live replica's
//! record says it serves a certificate of the new one. Each fact must then hold for a
//! propagation grace on this replica's monotonic clock. While a step waits, the current
//! certificate keeps being served (and renewed), `gatehouse_tls_rotation_waiting` says so and
//! an Event on the Secret says why.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::TlsError;
use super::config::TlsConfig;
use super::pki::{cert_ders, parse_cert_der, parse_cert_pem};
use super::replicas::ReplicaRecords;
use super::resolver::CertResolver;
use super::rotation::{
    self, Action, Confirmed, KEY_CA_BUNDLE, KEY_CA_CERT, KEY_CA_KEY, KEY_NEXT_CA_CERT,
    KEY_NEXT_CA_KEY, KEY_PREVIOUS_CA_CERT, KEY_PREVIOUS_RETIRED_AT, KEY_ROTATION_STARTED_AT,
    KEY_TLS_CERT, KEY_TLS_KEY, SecretPlan, TlsMaterial, TlsState,
};
use crate::runtime::admin::Readiness;
use crate::runtime::error_chain::chain;
use crate::runtime::reconcile::ReconcileMetrics;

mod metrics;
mod passes;
mod secret;

pub use metrics::{CertLabels, RotationLabels, TlsMetrics};

/// Keys owned by the manager; anything else a user adds to the Secret is left alone.
const MANAGED_KEYS: [&str; 10] = [
    KEY_CA_CERT,
    KEY_CA_KEY,
    KEY_TLS_CERT,
    KEY_TLS_KEY,
    KEY_NEXT_CA_CERT,
    KEY_NEXT_CA_KEY,
    KEY_PREVIOUS_CA_CERT,
    KEY_CA_BUNDLE,
    KEY_ROTATION_STARTED_AT,
    KEY_PREVIOUS_RETIRED_AT,
];

/// Bound on create/update round trips in one reconcile (conflicts plus consecutive actions,
/// e.g. renew serving then start a CA rotation); beyond it the error backoff takes over.
const MAX_RECONCILE_STEPS: usize = 12;
/// Re-reads the Secret at least this often even when nothing is due, which bounds the damage
/// of a wall-clock jump and of a missed watch event.
const MAX_RECHECK: Duration = Duration::from_secs(300);
/// Wake-ups are slightly late rather than early: certificate times are whole seconds and a
/// wake-up just before a deadline would find nothing to do and sleep again.
const WAKE_MARGIN: Duration = Duration::from_millis(20);

/// How often a waiting rotation step looks again.
const CONFIRM_POLL: Duration = Duration::from_secs(1);

/// What a replica needs to take part in rotations beside the Secret itself.
pub struct Coordination {
    /// This replica's identity (its record's holder).
    pub identity: String,
    /// A replica record not seen renewed for this long is dead.
    pub replica_ttl: Duration,
    /// Name of the Mutating- and ValidatingWebhookConfiguration whose `caBundle` must hold a new
    /// CA before it signs anything.
    pub configuration_name: String,
    pub metrics: TlsMetrics,
    pub recorder: Recorder,
    /// Whose `certificate_loaded` bit this manager keeps.
    pub readiness: Arc<Readiness>,
    /// The reconcile loops' metrics, shared with every loop.
    pub loops: Arc<ReconcileMetrics>,
}

/// A rotation step that waits for the cluster, and since when (this replica's clock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Switching to the next CA: waits for the bundle in every configuration.
    Switch,
    /// Dropping the previous CA: waits for every replica to serve the current one.
    Drop,
}

impl Step {
    fn label(self) -> &'static str {
        match self {
            Step::Switch => "switch",
            Step::Drop => "drop",
        }
    }
}

/// A fact about one CA (by DER) and since when it has held.
type Since = Option<(Vec<u8>, Instant)>;

/// Maintains the TLS Secret and the served certificate on one replica.
pub struct TlsManager {
    config: TlsConfig,
    api: Api<Secret>,
    mutating: Api<MutatingWebhookConfiguration>,
    validating: Api<ValidatingWebhookConfiguration>,
    resolver: Arc<CertResolver>,
    state: watch::Sender<Option<TlsState>>,
    /// The CA bundle the configurations must carry: the published state's, changing only when
    /// the bundle does.
    bundle: watch::Sender<Option<String>>,
    coordination: Coordination,
    records: ReplicaRecords,
    /// The CA (public key, base64url) of the certificate this replica serves.
    served_ca: Option<String>,
    /// The last material this replica served and planned as usable: a deleted or corrupted
    /// Secret is restored from it instead of minting a CA nobody trusts yet.
    last_good: Option<TlsMaterial>,
    /// Since when every live configuration's bundle holds the next CA.
    published: Since,
    /// Since when every live replica serves a certificate of the current CA.
    unused: Since,
    /// Steps waiting for the cluster, with when they started waiting and whether the Event was
    /// recorded.
    waiting: Vec<(Step, Instant, bool)>,
    /// resourceVersions of the Secret this replica has served from, oldest first.
    versions: std::collections::VecDeque<String>,
}

impl TlsManager {
    /// A manager for `config`; nothing happens until [`TlsManager::run`].
    pub fn new(
        config: TlsConfig,
        client: kube::Client,
        resolver: Arc<CertResolver>,
        coordination: Coordination,
    ) -> TlsManager {
        let api = Api::namespaced(client.clone(), &config.namespace);
        let records = ReplicaRecords::new(
            Api::namespaced(client.clone(), &config.namespace),
            coordination.identity.clone(),
            coordination.replica_ttl,
        );
        let (state, _) = watch::channel(None);
        let (bundle, _) = watch::channel(None);
        TlsManager {
            config,
            api,
            mutating: Api::all(client.clone()),
            validating: Api::all(client),
            resolver,
            state,
            bundle,
            coordination,
            records,
            served_ca: None,
            last_good: None,
            published: None,
            unused: None,
            waiting: Vec::new(),
            versions: std::collections::VecDeque::new(),
        }
    }

    /// The published state: `None` until a certificate is served, then updated whenever the
    /// bundle or the expiries change.
    pub fn subscribe(&self) -> watch::Receiver<Option<TlsState>> {
        self.state.subscribe()
    }

    /// The CA bundle: `None` until a certificate is served, then changed only when the bundle
    /// does.
    pub fn ca_bundle(&self) -> watch::Receiver<Option<String>> {
        self.bundle.subscribe()
    }

    /// When the material next needs a reconcile according to the plan.
    fn due(&self, material: &TlsMaterial) -> Instant {
        match rotation::plan(material, SystemTime::now(), &self.config, self.confirmed()) {
            Action::Keep { next_check } => instant_at(next_check),
            _ => Instant::now(),
        }
    }

    /// Serves the material's certificate and publishes its state. The state is only
    /// published once this replica actually presents the certificate, so the bundle a
    /// subscriber sees always trusts what is served here.
    fn observe(&mut self, material: &TlsMaterial) {
        let Some(serving) = &material.serving else {
            return;
        };
        if self.resolver.current_cert_pem().as_deref() != Some(serving.cert_pem.as_str()) {
            if let Err(error) = self.resolver.set_pem(&serving.cert_pem, &serving.key_pem) {
                // The plan will re-issue it; until then the previous certificate is served.
                warn!(error = %chain(&error), "cannot load the serving certificate from the TLS Secret");
                return;
            }
            info!(
                not_after = ?material.state().map(|s| s.serving_not_after),
                "serving certificate loaded"
            );
        }
        // The Secret's invariant: `ca` signed `serving`.
        self.served_ca = material.ca.as_ref().and_then(|ca| ca_id(&ca.cert_pem));
        let usable = !matches!(
            rotation::plan(
                material,
                SystemTime::now(),
                &self.config,
                Confirmed::default()
            ),
            Action::Create { .. }
        );
        if usable {
            self.last_good = Some(material.clone());
        }
        if let Some(state) = material.state() {
            self.publish_gauges(&state);
            self.bundle.send_if_modified(|bundle| {
                let changed = bundle.as_deref() != Some(state.ca_bundle_pem.as_str());
                if changed {
                    *bundle = Some(state.ca_bundle_pem.clone());
                }
                changed
            });
            self.state.send_if_modified(|current| {
                if current.as_ref() == Some(&state) {
                    return false;
                }
                if current.as_ref().map(|c| &c.ca_bundle_pem) != Some(&state.ca_bundle_pem) {
                    info!(
                        cas = state.ca_bundle_pem.matches("BEGIN CERTIFICATE").count(),
                        "CA bundle changed"
                    );
                }
                *current = Some(state);
                true
            });
        }
    }

    /// The expiry gauges and the readiness bit of what is served now.
    fn publish_gauges(&self, state: &TlsState) {
        let metrics = &self.coordination.metrics;
        let not_after = |cert: &str| {
            metrics.cert_not_after.get_or_create(&CertLabels {
                cert: cert.to_string(),
            })
        };
        not_after("ca").set(state.ca_not_after);
        not_after("serving").set(state.serving_not_after);
        self.coordination
            .readiness
            .certificate_loaded
            .store(self.resolver.is_loaded(), Ordering::Release);
    }

    /// Reads the Secret and applies due actions until the plan says keep. Returns the
    /// material now stored, when to look again and the Secret's resourceVersion.
    async fn reconcile(&mut self) -> Result<(TlsMaterial, SystemTime, Option<String>), TlsError> {
        let name = self.config.secret_name.clone();
        let name = name.as_str();
        // `Some(..)`: the Secret as last written by us, no need to read it back.
        let mut known: Option<Option<Secret>> = None;
        for _ in 0..MAX_RECONCILE_STEPS {
            let current = match known.take() {
                Some(current) => current,
                None => self
                    .api
                    .get_opt(name)
                    .await
                    .map_err(|source| TlsError::ReadSecret {
                        name: name.to_string(),
                        source,
                    })?,
            };
            let now = SystemTime::now();
            let material = current.as_ref().map(material_of);
            let confirmed = match &material {
                Some(material) => self.confirm(material).await?,
                None => Confirmed::default(),
            };
            let planned = rotation::plan_secret(
                material.as_ref(),
                self.last_good.as_ref(),
                now,
                &self.config,
                confirmed,
            )?;
            known = match (planned, current, material) {
                (SecretPlan::Keep { next_check }, Some(secret), Some(material)) => {
                    return Ok((material, next_check, secret.metadata.resource_version));
                }
                (
                    SecretPlan::Update {
                        material,
                        action,
                        restored,
                    },
                    Some(secret),
                    _,
                ) => {
                    self.replace_secret(secret, &material, action, restored)
                        .await?
                }
                (SecretPlan::Create { material, restored }, _, _) => {
                    self.create_secret(&material, restored).await?
                }
                // The plan was made for the Secret as read: this pairing does not occur.
                _ => None,
            };
        }
        Err(TlsError::ReconcileNotSettled {
            steps: MAX_RECONCILE_STEPS,
        })
    }

    /// The gates of the rotation steps as they stand now.
    fn confirmed(&self) -> Confirmed {
        let grace = self.config.effective_bundle_propagation();
        let held = |since: &Since| since.as_ref().is_some_and(|(_, at)| at.elapsed() >= grace);
        Confirmed {
            next_ca_published: held(&self.published),
            previous_ca_unused: held(&self.unused),
        }
    }

    /// Reads back what the rotation in `material` waits for and ages it; returns the gates.
    async fn confirm(&mut self, material: &TlsMaterial) -> Result<Confirmed, TlsError> {
        let next = material.next_ca.as_ref().and_then(|c| der_of(&c.cert_pem));
        self.published = match next {
            Some(der) if self.bundle_holds(&der).await? => keep_since(self.published.take(), der),
            _ => None,
        };
        let current = material.ca.as_ref().and_then(|c| der_of(&c.cert_pem));
        self.unused = match current {
            Some(der)
                if material.previous_ca_pem.is_some() && self.replicas_serve(&der).await? =>
            {
                keep_since(self.unused.take(), der)
            }
            _ => None,
        };
        Ok(self.confirmed())
    }

    /// Whether every entry of every live configuration trusts the CA with this DER. An absent
    /// configuration calls nobody, so it holds vacuously.
    async fn bundle_holds(&self, der: &[u8]) -> Result<bool, TlsError> {
        let name = self.coordination.configuration_name.as_str();
        let read = |source| TlsError::ReadConfiguration {
            name: name.to_string(),
            source,
        };
        let mutating = self.mutating.get_opt(name).await.map_err(read)?;
        let validating = self.validating.get_opt(name).await.map_err(read)?;
        let configs = mutating
            .iter()
            .flat_map(|c| c.webhooks.iter().flatten().map(|w| &w.client_config))
            .chain(
                validating
                    .iter()
                    .flat_map(|c| c.webhooks.iter().flatten().map(|w| &w.client_config)),
            )
            .collect::<Vec<&WebhookClientConfig>>();
        Ok(configs.iter().all(|cc| {
            cc.ca_bundle
                .as_ref()
                .and_then(|b| std::str::from_utf8(&b.0).ok())
                .and_then(|pem| cert_ders(pem).ok())
                .is_some_and(|ders| ders.iter().any(|d| d.as_slice() == der))
        }))
    }

    /// Whether this replica and every live replica record serve a certificate of the CA with
    /// this DER.
    async fn replicas_serve(&mut self, der: &[u8]) -> Result<bool, TlsError> {
        let Some(id) = ca_id_of_der(der) else {
            return Ok(false);
        };
        if self.served_ca.as_deref() != Some(id.as_str()) {
            return Ok(false);
        }
        let live = self
            .records
            .live()
            .await
            .map_err(|source| TlsError::ListReplicas { source })?;
        Ok(live
            .iter()
            .all(|r| r.serving_ca.as_deref() == Some(id.as_str())))
    }

    /// Updates the waiting metric and, once per wait, the Event; true while a step waits.
    async fn note_waiting(&mut self, material: &TlsMaterial) -> bool {
        let mut now_waiting = Vec::new();
        if material.next_ca.is_some() {
            now_waiting.push(Step::Switch);
        }
        if material.previous_ca_pem.is_some() {
            now_waiting.push(Step::Drop);
        }
        self.waiting
            .retain(|(step, _, _)| now_waiting.contains(step));
        for step in &now_waiting {
            if !self.waiting.iter().any(|(s, _, _)| s == step) {
                self.waiting.push((*step, Instant::now(), false));
            }
        }
        let patience = self.config.effective_bundle_propagation() * 2 + CONFIRM_POLL;
        let mut to_report = Vec::new();
        for (step, since, reported) in &mut self.waiting {
            let stalled = since.elapsed() > patience;
            self.coordination
                .metrics
                .rotation_waiting
                .get_or_create(&RotationLabels {
                    step: step.label().into(),
                })
                .set(i64::from(stalled));
            if stalled && !*reported {
                *reported = true;
                to_report.push(*step);
            }
        }
        for step in [Step::Switch, Step::Drop] {
            if !now_waiting.contains(&step) {
                self.coordination
                    .metrics
                    .rotation_waiting
                    .get_or_create(&RotationLabels {
                        step: step.label().into(),
                    })
                    .set(0);
            }
        }
        for step in to_report {
            let note = match step {
                Step::Switch => format!(
                    "CA rotation waits: not every webhook configuration {:?} holds the new CA in its caBundle yet (is a Gatehouse replica leading and able to write it?); the current certificate stays in use",
                    self.coordination.configuration_name
                ),
                Step::Drop => "CA rotation waits: not every live replica serves a certificate of the new CA yet; the previous CA stays in the bundle".to_string(),
            };
            warn!(step = step.label(), "{note}");
            let event = Event {
                type_: EventType::Warning,
                reason: "RotationWaiting".into(),
                note: Some(note),
                action: "Rotate".into(),
                secondary: None,
            };
            if let Err(error) = self
                .coordination
                .recorder
                .publish(&event, &self.secret_ref())
                .await
            {
                warn!(%error, "recording the rotation event failed");
            }
        }
        !now_waiting.is_empty()
    }
}

/// Keeps the start of a fact that still holds for the same CA, or starts it now.
fn keep_since(previous: Since, der: Vec<u8>) -> Since {
    match previous {
        Some((d, at)) if d == der => Some((d, at)),
        _ => Some((der, Instant::now())),
    }
}

fn der_of(pem: &str) -> Option<Vec<u8>> {
    parse_cert_pem(pem).ok().map(|info| info.der)
}

/// A CA's identity in replica records: its public key, base64url.
fn ca_id(pem: &str) -> Option<String> {
    ca_id_of_der(&der_of(pem)?)
}

fn ca_id_of_der(der: &[u8]) -> Option<String> {
    use base64::Engine as _;
    let info = parse_cert_der(der.to_vec()).ok()?;
    Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(info.public_key))
}

fn material_of(secret: &Secret) -> TlsMaterial {
    secret
        .data
        .as_ref()
        .map(TlsMaterial::from_secret_data)
        .unwrap_or_default()
}

/// The monotonic instant corresponding to a wall-clock time, within [now, now + MAX_RECHECK].
fn instant_at(t: SystemTime) -> Instant {
    let wait = t
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
        .min(MAX_RECHECK);
    Instant::now() + wait + WAKE_MARGIN
}
