//! Leader election over a `coordination.k8s.io/v1` Lease, so that with several replicas exactly
//! one writes the webhook configurations and Policy statuses, while every replica serves.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{info, warn};

/// Name of the Lease in the operator's namespace.
pub const LEASE_NAME: &str = "gatehouse-controller";

/// Timings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub identity: String,
    /// A holder that has not renewed for this long has lost the Lease.
    pub duration: Duration,
    /// How often the holder renews (and followers look).
    pub renew_every: Duration,
}

/// What to do with the Lease as it stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it (or the holder expired): take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and is alive.
    Follow { holder: String },
}

/// Pure: the decision for `lease` (None = absent) at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return Decision::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return Decision::Acquire;
    }
    if holder == identity {
        return Decision::Renew;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    match renewed {
        Some(at) if at + duration > now => Decision::Follow {
            holder: holder.to_string(),
        },
        _ => Decision::Acquire,
    }
}

fn spec_for(
    identity: &str,
    config: &LeaseConfig,
    previous: Option<&LeaseSpec>,
    now: Timestamp,
) -> LeaseSpec {
    let ours = previous.and_then(|p| p.holder_identity.as_deref()) == Some(identity);
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(i32::try_from(config.duration.as_secs()).unwrap_or(15)),
        acquire_time: if ours {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || previous.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

/// Runs the election until `shutdown`, publishing leadership on `leader`. On shutdown a holder
/// releases the Lease so a successor need not wait for it to expire.
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: watch::Sender<bool>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut last_renewed: Option<tokio::time::Instant> = None;
    tokio::pin!(shutdown);
    loop {
        match step(&api, &config).await {
            Ok(true) => {
                last_renewed = Some(tokio::time::Instant::now());
                if !*leader.borrow() {
                    info!(identity = %config.identity, "became leader");
                }
                leader.send_replace(true);
            }
            Ok(false) => {
                if *leader.borrow() {
                    info!(identity = %config.identity, "lost leadership");
                }
                last_renewed = None;
                leader.send_replace(false);
            }
            Err(e) => {
                warn!(error = %e, "lease election step failed");
                // Without a successful renew within the duration, someone else may hold it.
                if last_renewed.is_none_or(|t| t.elapsed() >= config.duration) && *leader.borrow() {
                    warn!("stepping down: lease not renewed in time");
                    leader.send_replace(false);
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(config.renew_every) => {}
            () = &mut shutdown => break,
        }
    }
    if *leader.borrow() {
        leader.send_replace(false);
        if let Err(e) = release(&api, &config).await {
            warn!(error = %e, "releasing the lease failed; a successor waits for it to expire");
        }
    }
}

/// One round; `Ok(true)` when we hold the Lease afterwards.
async fn step(api: &Api<Lease>, config: &LeaseConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let current = api.get_opt(LEASE_NAME).await?;
    match decide(current.as_ref(), &config.identity, now) {
        Decision::Follow { .. } => Ok(false),
        Decision::Acquire | Decision::Renew => {
            let spec = spec_for(
                &config.identity,
                config,
                current.as_ref().and_then(|l| l.spec.as_ref()),
                now,
            );
            let result = match current {
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(LEASE_NAME.to_string()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(spec),
                    };
                    api.create(&PostParams::default(), &lease).await
                }
                Some(mut lease) => {
                    // resourceVersion stays set: a concurrent writer makes this a 409.
                    lease.spec = Some(spec);
                    api.replace(LEASE_NAME, &PostParams::default(), &lease)
                        .await
                }
            };
            match result {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

async fn release(api: &Api<Lease>, config: &LeaseConfig) -> Result<(), kube::Error> {
    let Some(mut lease) = api.get_opt(LEASE_NAME).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    api.replace(LEASE_NAME, &PostParams::default(), &lease)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, renewed: i64, duration: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn absent_or_released_leases_are_taken() {
        assert_eq!(decide(None, "a", at(100)), Decision::Acquire);
        assert_eq!(
            decide(Some(&lease(None, 90, 15)), "a", at(100)),
            Decision::Acquire
        );
    }

    #[test]
    fn a_live_holder_is_followed_and_an_expired_one_replaced() {
        let held = lease(Some("b"), 90, 15);
        assert_eq!(
            decide(Some(&held), "a", at(100)),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(decide(Some(&held), "a", at(106)), Decision::Acquire);
        assert_eq!(decide(Some(&held), "b", at(100)), Decision::Renew);
    }

    #[test]
    fn takeover_counts_a_transition_and_renewal_keeps_acquire_time() {
        let config = LeaseConfig {
            namespace: "ns".into(),
            identity: "a".into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        };
        let old = lease(Some("b"), 50, 15).spec.unwrap();
        let taken = spec_for("a", &config, Some(&old), at(100));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(100))));
        let renewed = spec_for("a", &config, Some(&taken), at(105));
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(100))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(105))));
    }
}
