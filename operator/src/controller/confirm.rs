//! Confirming that the API server enforces the generated admission policies the leader wrote,
//! without holding up a pass: a probe ([`wiring::probe`]) is written after them, and each pass
//! looks once whether the API server acts on it. The API server fills its caches of policies
//! and of bindings each in write order, so once it acts on the probe it runs everything written
//! before it. Until then the pass goes on (the webhook keeps the Policies it is to let go of)
//! and asks the loop to look again shortly.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::generated::apply;
use super::wiring::Wiring;
use super::wiring::probe::{
    MUTATING_PROBE_ANNOTATION, PROBE_LABEL, mutating_probe, probe, probe_message,
};
use super::{ControllerContext, WriteError};
use crate::runtime::lease::Leadership;

/// How long a probe may take to be enforced before the step fails (and the loop backs off).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// How soon a pass looks again at a probe not yet enforced.
const PROBE_INTERVAL: Duration = Duration::from_millis(200);

/// Which generated policies a probe confirms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    /// ValidatingAdmissionPolicies: the probe denies its Lease.
    Validating,
    /// MutatingAdmissionPolicies: the probe annotates its Lease.
    Mutating,
}

/// What a look at the probe found.
#[derive(Debug, PartialEq)]
pub struct Probed<T> {
    /// What the API server was seen to enforce, of what is still written.
    pub enforced: Vec<T>,
    /// When a pass should look again, while a probe is out.
    pub look_again: Option<Instant>,
}

/// A probe written and not yet seen enforced.
struct Pending<T> {
    token: String,
    written: Instant,
    /// What it confirms: written before it.
    confirms: Vec<T>,
}

/// The leader's probe of one kind, across passes.
pub struct Prober<T> {
    kind: ProbeKind,
    pending: Option<Pending<T>>,
}

impl<T: PartialEq> Prober<T> {
    pub fn new(kind: ProbeKind) -> Self {
        Prober {
            kind,
            pending: None,
        }
    }

    /// Whether a probe is out: what it is to confirm is not yet known to run.
    pub fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Looks once whether the API server acts on the pending probe; once it does (or when none
    /// is out), writes a new probe for what of `written` that one did not confirm. `written` is
    /// everything written and not yet confirmed, all of it before this call; what a probe was
    /// written for and is no longer in it (changed or gone since) is never reported enforced.
    pub async fn confirm(
        &mut self,
        ctx: &ControllerContext,
        wiring: &Wiring,
        leader: &watch::Receiver<Leadership>,
        written: Vec<T>,
    ) -> Result<Probed<T>, WriteError> {
        if written.is_empty() {
            self.pending = None;
            return Ok(Probed {
                enforced: Vec::new(),
                look_again: None,
            });
        }
        let acted_on = match &self.pending {
            Some(pending) => {
                let acted = self.look(ctx, wiring, pending).await;
                let waited = pending.written.elapsed();
                match acted {
                    Ok(true) => self.pending.take().map(|p| p.confirms).unwrap_or_default(),
                    Ok(false) if waited < PROBE_TIMEOUT => {
                        return Ok(Probed {
                            enforced: Vec::new(),
                            look_again: Some(Instant::now() + PROBE_INTERVAL),
                        });
                    }
                    Ok(false) => {
                        self.pending = None;
                        return Err(WriteError::Probe {
                            reason: format!(
                                "the API server did not act on the {} probe within {}s",
                                self.kind.word(),
                                PROBE_TIMEOUT.as_secs()
                            ),
                        });
                    }
                    Err(e) => {
                        self.pending = None;
                        return Err(e);
                    }
                }
            }
            None => Vec::new(),
        };
        let (enforced, unconfirmed): (Vec<T>, Vec<T>) =
            written.into_iter().partition(|w| acted_on.contains(w));
        let look_again = if unconfirmed.is_empty() {
            None
        } else {
            self.write(ctx, wiring, leader, unconfirmed).await?;
            Some(Instant::now() + PROBE_INTERVAL)
        };
        Ok(Probed {
            enforced,
            look_again,
        })
    }

    /// Writes the probe with a new token, to confirm `confirms`.
    async fn write(
        &mut self,
        ctx: &ControllerContext,
        wiring: &Wiring,
        leader: &watch::Receiver<Leadership>,
        confirms: Vec<T>,
    ) -> Result<(), WriteError> {
        let token = format!(
            "gatehouse-probe-{}{:x}",
            self.kind.token_prefix(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        );
        let namespace = &wiring.home_namespace;
        let refusals = match self.kind {
            ProbeKind::Validating => {
                let probe = probe(&token, namespace, wiring);
                [
                    apply(ctx, &probe.policy, leader).await?,
                    apply(ctx, &probe.binding, leader).await?,
                ]
            }
            ProbeKind::Mutating => {
                let probe = mutating_probe(&token, namespace, wiring);
                [
                    apply(ctx, &probe.policy, leader).await?,
                    apply(ctx, &probe.binding, leader).await?,
                ]
            }
        };
        for refused in refusals {
            refused.map_err(|reason| WriteError::Probe { reason })?;
        }
        self.pending = Some(Pending {
            token,
            written: Instant::now(),
            confirms,
        });
        Ok(())
    }

    /// Whether the API server acts on `pending`'s probe: one server-dry-run create of its
    /// Lease. Transient failures (5xx, 429, the connection) count as not yet.
    async fn look(
        &self,
        ctx: &ControllerContext,
        wiring: &Wiring,
        pending: &Pending<T>,
    ) -> Result<bool, WriteError> {
        let token = &pending.token;
        let lease = Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(token.clone()),
                labels: Some([(PROBE_LABEL.to_string(), token.clone())].into()),
                ..Default::default()
            },
            spec: None,
        };
        let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &wiring.home_namespace);
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match (self.kind, leases.create(&dry_run, &lease).await) {
            (ProbeKind::Validating, Err(kube::Error::Api(e)))
                if e.message.contains(&probe_message(token)) =>
            {
                Ok(true)
            }
            (ProbeKind::Mutating, Ok(created)) => {
                Ok(created.annotations().get(MUTATING_PROBE_ANNOTATION) == Some(token))
            }
            (_, Err(kube::Error::Api(e))) if e.code < 500 && e.code != 429 => {
                Err(WriteError::Probe { reason: e.message })
            }
            _ => Ok(false),
        }
    }
}

impl ProbeKind {
    fn word(self) -> &'static str {
        match self {
            ProbeKind::Validating => "validating",
            ProbeKind::Mutating => "mutating",
        }
    }

    fn token_prefix(self) -> &'static str {
        match self {
            ProbeKind::Validating => "",
            ProbeKind::Mutating => "mutating-",
        }
    }
}
