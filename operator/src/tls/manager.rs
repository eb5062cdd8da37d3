//! Keeps the Secret, the served certificate and the published bundle in step, on every
//! replica. All coordination goes through the Secret: creation is first-writer-wins, updates
//! carry the resourceVersion they were planned from, and a loser re-reads and re-plans, so
//! concurrent replicas converge on one CA without a leader.
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::TlsError;
use super::config::TlsConfig;
use super::resolver::CertResolver;
use super::rotation::{
    self, Action, KEY_CA_BUNDLE, KEY_CA_CERT, KEY_CA_KEY, KEY_NEXT_CA_CERT, KEY_NEXT_CA_KEY,
    KEY_PREVIOUS_CA_CERT, KEY_PREVIOUS_RETIRED_AT, KEY_ROTATION_STARTED_AT, KEY_TLS_CERT,
    KEY_TLS_KEY, Reason, TlsMaterial, TlsState,
};

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
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(500);
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Re-reads the Secret at least this often even when nothing is due, which bounds the damage
/// of a wall-clock jump and of a missed watch event.
const MAX_RECHECK: Duration = Duration::from_secs(300);
/// Wake-ups are slightly late rather than early: certificate times are whole seconds and a
/// wake-up just before a deadline would find nothing to do and sleep again.
const WAKE_MARGIN: Duration = Duration::from_millis(20);

/// The Secret as `watch_object` reports it: `None` while it does not exist.
type SecretWatch =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Option<Secret>, watcher::Error>> + Send>>;

/// Maintains the TLS Secret and the served certificate on one replica.
pub struct TlsManager {
    config: TlsConfig,
    api: Api<Secret>,
    resolver: Arc<CertResolver>,
    state: watch::Sender<Option<TlsState>>,
}

impl TlsManager {
    /// A manager for `config`; nothing happens until [`TlsManager::run`].
    pub fn new(config: TlsConfig, client: kube::Client, resolver: Arc<CertResolver>) -> TlsManager {
        let api = Api::namespaced(client, &config.namespace);
        let (state, _) = watch::channel(None);
        TlsManager {
            config,
            api,
            resolver,
            state,
        }
    }

    /// The published state: `None` until a certificate is served, then updated whenever the
    /// bundle or the expiries change.
    pub fn subscribe(&self) -> watch::Receiver<Option<TlsState>> {
        self.state.subscribe()
    }

    /// Ensures the Secret, serves its certificate and rotates, until `shutdown` resolves.
    /// API errors are logged and retried with backoff; the only error returned is a
    /// configuration no certificate can be issued for ([`TlsConfig::validate`]), at once.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), TlsError> {
        self.config.validate()?;
        let mut shutdown = std::pin::pin!(shutdown);
        let mut secrets = self.watch_secret();
        let mut next_reconcile = Instant::now();
        let mut retry_not_before = Instant::now();
        let mut backoff = ERROR_BACKOFF_MIN;
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                event = secrets.next() => match event {
                    Some(Ok(Some(secret))) => {
                        let material = material_of(&secret);
                        self.observe(&material);
                        // Another replica may have acted already (then our timer moves later)
                        // or the new content may need action (then it moves earlier).
                        let due = self.due(&material);
                        next_reconcile = due.max(retry_not_before);
                    }
                    Some(Ok(None)) => {
                        info!(secret = %self.config.secret_name, "TLS Secret absent; creating it");
                        next_reconcile = retry_not_before;
                    }
                    Some(Err(error)) => {
                        // StreamBackoff already delays the next attempt of the watcher.
                        warn!(%error, "watching the TLS Secret failed; retrying");
                    }
                    None => {
                        warn!("TLS Secret watch ended; restarting it");
                        secrets = self.watch_secret();
                    }
                },
                () = tokio::time::sleep_until(next_reconcile) => {
                    let result = tokio::select! {
                        biased;
                        () = &mut shutdown => return Ok(()),
                        result = self.reconcile() => result,
                    };
                    match result {
                        Ok((material, next_check)) => {
                            self.observe(&material);
                            backoff = ERROR_BACKOFF_MIN;
                            retry_not_before = Instant::now();
                            next_reconcile = instant_at(next_check);
                        }
                        Err(error) => {
                            warn!(%error, retry_in = ?backoff, "TLS Secret reconcile failed");
                            retry_not_before = Instant::now() + backoff;
                            next_reconcile = retry_not_before;
                            backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                        }
                    }
                }
            }
        }
    }

    fn watch_secret(&self) -> SecretWatch {
        Box::pin(
            watcher::watch_object(self.api.clone(), &self.config.secret_name).default_backoff(),
        )
    }

    /// When the material next needs a reconcile according to the plan.
    fn due(&self, material: &TlsMaterial) -> Instant {
        match rotation::plan(material, SystemTime::now(), &self.config) {
            Action::Keep { next_check } => instant_at(next_check),
            _ => Instant::now(),
        }
    }

    /// Serves the material's certificate and publishes its state. The state is only
    /// published once this replica actually presents the certificate, so the bundle a
    /// subscriber sees always trusts what is served here.
    fn observe(&self, material: &TlsMaterial) {
        let Some(serving) = &material.serving else {
            return;
        };
        if self.resolver.current_cert_pem().as_deref() != Some(serving.cert_pem.as_str()) {
            if let Err(error) = self.resolver.set_pem(&serving.cert_pem, &serving.key_pem) {
                // The plan will re-issue it; until then the previous certificate is served.
                warn!(%error, "cannot load the serving certificate from the TLS Secret");
                return;
            }
            info!(
                not_after = ?material.state().map(|s| s.serving_not_after),
                "serving certificate loaded"
            );
        }
        if let Some(state) = material.state() {
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

    /// Reads the Secret and applies due actions until the plan says keep. Returns the
    /// material now stored and when to look again.
    async fn reconcile(&self) -> Result<(TlsMaterial, SystemTime), TlsError> {
        let name = self.config.secret_name.as_str();
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
            let Some(mut secret) = current else {
                let material = rotation::apply(
                    &TlsMaterial::default(),
                    Action::Create {
                        reason: Reason::Missing,
                    },
                    now,
                    &self.config,
                )?;
                match self
                    .api
                    .create(&PostParams::default(), &self.new_secret(&material))
                    .await
                {
                    Ok(created) => {
                        info!(secret = name, "created TLS Secret with a new CA");
                        known = Some(Some(created));
                    }
                    Err(kube::Error::Api(status)) if status.is_already_exists() => {
                        // Another replica won the race: adopt its CA.
                        info!(
                            secret = name,
                            "TLS Secret created concurrently; adopting it"
                        );
                    }
                    Err(source) => {
                        return Err(TlsError::CreateSecret {
                            name: name.to_string(),
                            source,
                        });
                    }
                }
                continue;
            };

            let material = material_of(&secret);
            let action = rotation::plan(&material, now, &self.config);
            if let Action::Keep { next_check } = action {
                return Ok((material, next_check));
            }
            let updated = rotation::apply(&material, action, now, &self.config)?;
            let data = secret.data.get_or_insert_with(BTreeMap::new);
            for key in MANAGED_KEYS {
                data.remove(key);
            }
            data.extend(updated.to_secret_data());
            // `replace` sends the resourceVersion we read: a concurrent writer makes it fail
            // with 409 instead of being overwritten.
            match self
                .api
                .replace(name, &PostParams::default(), &secret)
                .await
            {
                Ok(replaced) => {
                    info!(secret = name, %action, "TLS Secret updated");
                    known = Some(Some(replaced));
                }
                Err(kube::Error::Api(status)) if status.is_conflict() => {
                    debug!(secret = name, %action, "TLS Secret changed concurrently; re-planning");
                }
                Err(kube::Error::Api(status)) if status.is_not_found() => {
                    debug!(
                        secret = name,
                        "TLS Secret deleted concurrently; re-creating"
                    );
                    known = Some(None);
                }
                Err(source) => {
                    return Err(TlsError::UpdateSecret {
                        name: name.to_string(),
                        source,
                    });
                }
            }
        }
        Err(TlsError::ReconcileNotSettled {
            steps: MAX_RECONCILE_STEPS,
        })
    }

    fn new_secret(&self, material: &TlsMaterial) -> Secret {
        let labels = BTreeMap::from([
            (
                "app.kubernetes.io/name".to_string(),
                "gatehouse".to_string(),
            ),
            (
                "app.kubernetes.io/component".to_string(),
                "webhook-tls".to_string(),
            ),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "gatehouse".to_string(),
            ),
        ]);
        Secret {
            metadata: ObjectMeta {
                name: Some(self.config.secret_name.clone()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_string()),
            data: Some(material.to_secret_data()),
            ..Secret::default()
        }
    }
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
