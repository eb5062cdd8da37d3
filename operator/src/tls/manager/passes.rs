//! The manager's passes on the one reconcile loop: what wakes one, and what one does.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{CONFIRM_POLL, MAX_RECHECK, TlsManager, instant_at, material_of};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{Next, Pacing, Window, reflect_in, run_loop};
use crate::tls::TlsError;

/// Changes of the Secret come one at a time (each replica's writes are fenced by its
/// resourceVersion): a pass need not wait long for more.
const SECRET_CHANGES: Window = Window {
    quiet: Duration::from_millis(50),
    max: Duration::from_millis(500),
};

/// When the manager's passes act next, and what they last saw of the Secret.
struct Timers {
    next_reconcile: Instant,
    /// When this replica's serving record is written next.
    next_record: Instant,
    seen: Seen,
}

/// What a pass last saw of the Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Nothing,
    Absent,
    /// This resourceVersion.
    Version(String),
}

impl TlsManager {
    /// Ensures the Secret, serves its certificate and rotates, until `shutdown` resolves, on
    /// the one reconcile loop (`controller="tls"`): a pass runs when the Secret changes, when
    /// its timers say, and after a failure with the loop's backoff. The only error returned is
    /// a configuration no certificate can be issued for ([`TlsConfig::validate`]), at once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), TlsError> {
        self.config.validate()?;
        let trigger = Arc::new(Notify::new());
        let by_name = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.config.secret_name));
        let (secrets, secret_watch) =
            reflect_in::<Secret>(self.api.clone(), by_name, trigger.clone());
        // Every replica keeps its own certificate: the loop runs whoever leads.
        let (_everyone, mut term) = watch::channel(Leadership::default());
        let loops = self.coordination.loops.clone();
        let now = Instant::now();
        let mut timers = Timers {
            next_reconcile: now,
            next_record: now,
            seen: Seen::Nothing,
        };
        let pacing = Pacing {
            window: SECRET_CHANGES,
            resync: MAX_RECHECK,
        };
        let passes = run_loop("tls", &loops, &trigger, &mut term, pacing, async |_| {
            self.pass(&secrets, &mut timers).await
        });
        tokio::select! {
            () = passes => {}
            () = secret_watch => {}
            () = shutdown => {}
        }
        Ok(())
    }

    /// One pass: serves a new version of the Secret, writes this replica's serving record when
    /// due, reconciles the Secret when the plan says; when to look again.
    async fn pass(
        &mut self,
        secrets: &Store<Secret>,
        timers: &mut Timers,
    ) -> Result<Next, TlsError> {
        let served_before = self.served_ca.clone();
        self.see(secrets.state().first().map(|s| s.as_ref()), timers);
        if self.served_ca.is_some() && Instant::now() >= timers.next_record {
            let served = self.served_ca.clone().unwrap_or_default();
            timers.next_record = Instant::now() + self.records.renew_every();
            if let Err(error) = self.records.publish(&served).await {
                warn!(%error, "writing this replica's serving record failed");
                timers.next_record = Instant::now() + CONFIRM_POLL;
            }
        }
        if Instant::now() >= timers.next_reconcile {
            let (material, next_check, version) = self.reconcile().await?;
            self.remember_version(version);
            self.observe(&material);
            timers.next_reconcile = instant_at(next_check);
            if self.note_waiting(&material).await {
                timers.next_reconcile = timers.next_reconcile.min(Instant::now() + CONFIRM_POLL);
            }
        }
        // What this replica serves changed: say so at once, a waiting drop depends on it.
        if self.served_ca != served_before {
            timers.next_record = Instant::now();
        }
        let next = match self.served_ca {
            Some(_) => timers.next_reconcile.min(timers.next_record),
            None => timers.next_reconcile,
        };
        Ok(Next::By(next))
    }

    /// Serves what the watch brings of the Secret (`current`) when it is a version not seen
    /// yet, and moves the next reconcile to when the plan says.
    fn see(&mut self, current: Option<&Secret>, timers: &mut Timers) {
        let seen = match current {
            Some(secret) => {
                Seen::Version(secret.metadata.resource_version.clone().unwrap_or_default())
            }
            None => Seen::Absent,
        };
        if seen == timers.seen {
            return;
        }
        let before = std::mem::replace(&mut timers.seen, seen);
        let Some(secret) = current else {
            if matches!(before, Seen::Version(_)) {
                info!(secret = %self.config.secret_name, "TLS Secret deleted; creating it again");
            }
            timers.next_reconcile = Instant::now();
            return;
        };
        // Our own writes are observed as they return; the watch brings them (and versions in
        // between) later, and must not roll the served certificate back.
        if self.is_stale(secret) {
            return;
        }
        let material = material_of(secret);
        self.observe(&material);
        // Another replica may have acted already (then our timer moves later) or the new
        // content may need action (then it moves earlier).
        timers.next_reconcile = self.due(&material);
    }
}
