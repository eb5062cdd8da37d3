//! Leader election over a `coordination.k8s.io/v1` Lease, so that with several replicas exactly
//! one writes the webhook configurations and Policy statuses, while every replica serves.
//!
//! Two rules keep two replicas from ever leading at once, whatever the network or the wall
//! clocks do (the same rules client-go's leader election follows):
//! * A follower judges the holder by when *it* last saw the record change, on its own monotonic
//!   clock, never by the `renewTime` the holder wrote with its wall clock: a follower whose
//!   clock runs ahead cannot take a healthy leader's Lease.
//! * A leader leads only until `renew deadline` after the *start* of its last successful
//!   renewal. The deadline is shorter than the lease duration, and a follower's expiry clock
//!   starts no earlier than that renewal landed, so the leader has stopped before anyone may
//!   take over. Every request is bounded well below the deadline, and [`Leadership`] carries
//!   the deadline itself, so a writer that checks it just before writing is safe even while the
//!   election task is stuck on a hung connection.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

/// Name of the Lease in the operator's namespace.
pub const LEASE_NAME: &str = "gatehouse-controller";

/// Timings of the election.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub namespace: String,
    pub identity: String,
    /// A holder whose record nobody saw change for this long has lost the Lease.
    pub duration: Duration,
    /// A leader that could not renew for this long (from the start of its last successful
    /// renewal) stops leading. Shorter than `duration`.
    pub renew_deadline: Duration,
    /// How often the holder renews (and followers look); also the bound on one round's requests.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// The timings client-go uses in proportion (15s / 10s / 2s): renew deadline two thirds of
    /// the duration, a retry every sixth of it (at least 200 ms).
    pub fn new(namespace: String, identity: String, duration: Duration) -> Self {
        Self {
            namespace,
            identity,
            duration,
            renew_deadline: duration * 2 / 3,
            retry_period: (duration / 6).max(Duration::from_millis(200)),
        }
    }
}

/// Whether this replica leads, and until when at the latest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leadership {
    /// The renew deadline of the current term; `None` when following.
    pub until: Option<Instant>,
}

impl Leadership {
    /// True while the term lasts. Check it immediately before every write.
    pub fn is_leading(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() < until)
    }

    /// How long the term has left (zero when following); bounds a write's duration.
    pub fn remaining(&self) -> Duration {
        self.until
            .map(|until| until.saturating_duration_since(Instant::now()))
            .unwrap_or_default()
    }
}

/// What to do with the Lease as it stands.
#[derive(Debug, PartialEq, Eq)]
pub enum LeaseAction {
    /// Nobody holds it (or the holder expired): take it.
    Acquire,
    /// We hold it: renew.
    Renew,
    /// Someone else holds it and is alive.
    Follow { holder: String },
}

/// The Lease record as this replica last saw it, and when (on this replica's monotonic clock)
/// it last saw it change.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub record: Option<LeaseSpec>,
    pub at: Instant,
}

/// Pure: what this replica knows after reading `current` at `now`. The observation time only
/// moves when the record changed, so a holder that stopped renewing ages on our clock.
pub fn observe(previous: Option<Observed>, current: Option<&LeaseSpec>, now: Instant) -> Observed {
    match previous {
        Some(p) if p.record.as_ref() == current => p,
        _ => Observed {
            record: current.cloned(),
            at: now,
        },
    }
}

/// Pure: the decision for the record in `observed` at `now`.
pub fn next_action(observed: &Observed, identity: &str, now: Instant) -> LeaseAction {
    let Some(spec) = observed.record.as_ref() else {
        return LeaseAction::Acquire;
    };
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() {
        return LeaseAction::Acquire;
    }
    if holder == identity {
        return LeaseAction::Renew;
    }
    let seconds = spec.lease_duration_seconds.unwrap_or(15).max(1);
    let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(15));
    if observed.at + duration > now {
        LeaseAction::Follow {
            holder: holder.to_string(),
        }
    } else {
        LeaseAction::Acquire
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
        lease_duration_seconds: Some(i32::try_from(config.duration.as_secs().max(1)).unwrap_or(15)),
        acquire_time: if ours {
            previous.and_then(|p| p.acquire_time.clone())
        } else {
            Some(MicroTime(now))
        },
        // For humans and other tools only: no replica judges expiry by another's wall clock.
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if ours || previous.is_none() {
            transitions
        } else {
            transitions + 1
        }),
        ..LeaseSpec::default()
    }
}

/// Registers the leadership gauge (`gatehouse_reconcile_leader`) in `registry`.
pub fn leader_gauge(registry: &mut prometheus_client::registry::Registry) -> Gauge {
    let gauge = Gauge::default();
    registry.sub_registry_with_prefix("reconcile").register(
        "leader",
        "1 while this replica leads (writes configurations and statuses), else 0",
        gauge.clone(),
    );
    gauge
}

/// Runs the election until `shutdown`, publishing leadership on `leader`. On shutdown a holder
/// releases the Lease so a successor need not wait for it to expire.
/// `gauge` mirrors leadership for `/metrics` (1 leading, 0 following).
pub async fn run(
    client: Client,
    config: LeaseConfig,
    leader: watch::Sender<Leadership>,
    gauge: Gauge,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let publish = |term: Leadership| {
        gauge.set(i64::from(term.until.is_some()));
        leader.send_replace(term);
    };
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let mut observed: Option<Observed> = None;
    tokio::pin!(shutdown);
    loop {
        let started = Instant::now();
        let round = tokio::time::timeout(
            config.retry_period,
            step(&api, &config, &mut observed, started),
        )
        .await;
        let current = *leader.borrow();
        match round {
            Ok(Ok(true)) => {
                if !current.is_leading() {
                    info!(identity = %config.identity, "became leader");
                }
                publish(Leadership {
                    until: Some(started + config.renew_deadline),
                });
            }
            Ok(Ok(false)) => {
                if current.until.is_some() {
                    info!(identity = %config.identity, "lost leadership");
                }
                publish(Leadership::default());
            }
            Ok(Err(e)) => warn!(error = %e, "lease election round failed"),
            Err(_) => warn!(
                timeout = ?config.retry_period,
                "lease election round timed out"
            ),
        }
        step_down_if_expired(&leader, &publish);
        let next = Instant::now() + config.retry_period.saturating_sub(started.elapsed());
        // Wake at the deadline too, so followers of the watch learn of the step-down on time
        // (writers do not depend on it: they check the deadline themselves).
        let deadline = leader.borrow().until.filter(|until| *until < next);
        tokio::select! {
            () = tokio::time::sleep_until(deadline.unwrap_or(next)) => {}
            () = &mut shutdown => break,
        }
        step_down_if_expired(&leader, &publish);
    }
    if leader.borrow().until.is_some() {
        publish(Leadership::default());
        let release = tokio::time::timeout(config.retry_period, release(&api, &config));
        if !matches!(release.await, Ok(Ok(()))) {
            warn!("releasing the lease failed; a successor waits for it to expire");
        }
    }
}

fn step_down_if_expired(leader: &watch::Sender<Leadership>, publish: &impl Fn(Leadership)) {
    let current = *leader.borrow();
    if current.until.is_some() && !current.is_leading() {
        warn!("stepping down: lease not renewed within the renew deadline");
        publish(Leadership::default());
    }
}

/// One round; `Ok(true)` when we hold the Lease afterwards.
async fn step(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<Observed>,
    now: Instant,
) -> Result<bool, kube::Error> {
    let current = api.get_opt(LEASE_NAME).await?;
    let seen = observe(
        observed.take(),
        current.as_ref().and_then(|l| l.spec.as_ref()),
        now,
    );
    let decision = next_action(&seen, &config.identity, now);
    *observed = Some(seen);
    if let LeaseAction::Follow { .. } = decision {
        return Ok(false);
    }
    let spec = spec_for(
        &config.identity,
        config,
        current.as_ref().and_then(|l| l.spec.as_ref()),
        Timestamp::now(),
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

    fn record(holder: Option<&str>, renewed_wall_secs: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(duration),
            renew_time: Some(MicroTime(
                Timestamp::from_second(renewed_wall_secs).unwrap(),
            )),
            ..LeaseSpec::default()
        }
    }

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig::new("ns".into(), identity.into(), Duration::from_secs(15))
    }

    #[test]
    fn timings_keep_the_deadline_inside_the_duration() {
        let c = config("a");
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_millis(2500));
        let short = LeaseConfig::new("ns".into(), "a".into(), Duration::from_secs(1));
        assert!(short.retry_period < short.renew_deadline);
        assert!(short.renew_deadline < short.duration);
    }

    #[test]
    fn absent_or_released_leases_are_taken() {
        let now = Instant::now();
        assert_eq!(
            next_action(&observe(None, None, now), "a", now),
            LeaseAction::Acquire
        );
        let released = record(None, 90, 15);
        assert_eq!(
            next_action(&observe(None, Some(&released), now), "a", now),
            LeaseAction::Acquire
        );
    }

    #[test]
    fn a_holder_is_judged_by_when_we_saw_its_record_change() {
        let t0 = Instant::now();
        let held = record(Some("b"), 90, 15);
        let seen = observe(None, Some(&held), t0);
        assert_eq!(
            next_action(&seen, "a", t0 + Duration::from_secs(14)),
            LeaseAction::Follow { holder: "b".into() }
        );
        // Unchanged record: it keeps ageing from the first sight.
        let seen = observe(Some(seen), Some(&held), t0 + Duration::from_secs(14));
        assert_eq!(seen.at, t0);
        assert_eq!(
            next_action(&seen, "a", t0 + Duration::from_secs(15)),
            LeaseAction::Acquire
        );
        // A renewal (any change of the record) restarts the clock.
        let renewed = record(Some("b"), 91, 15);
        let seen = observe(Some(seen), Some(&renewed), t0 + Duration::from_secs(15));
        assert_eq!(
            next_action(&seen, "a", t0 + Duration::from_secs(29)),
            LeaseAction::Follow { holder: "b".into() }
        );
        assert_eq!(next_action(&seen, "b", t0), LeaseAction::Renew);
    }

    #[test]
    fn takeover_counts_a_transition_and_renewal_keeps_acquire_time() {
        let config = config("a");
        let at = |s| Timestamp::from_second(s).unwrap();
        let old = record(Some("b"), 50, 15);
        let taken = spec_for("a", &config, Some(&old), at(100));
        assert_eq!(taken.lease_transitions, Some(1));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(100))));
        let renewed = spec_for("a", &config, Some(&taken), at(105));
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(100))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(105))));
    }

    #[test]
    fn leadership_ends_at_its_deadline() {
        let now = Instant::now();
        assert!(!Leadership::default().is_leading());
        assert!(
            Leadership {
                until: Some(now + Duration::from_secs(5))
            }
            .is_leading()
        );
        let past = Leadership {
            until: Some(now - Duration::from_millis(1)),
        };
        assert!(!past.is_leading());
        assert_eq!(past.remaining(), Duration::ZERO);
    }

    /// Two replicas whose wall clocks disagree by far more than the lease duration, with the
    /// leader renewing on schedule through a network that delays each write by a second, and
    /// then a leader that goes silent: the follower never takes over while the leader's term
    /// lasts, and does take over once the leader is gone. Time is simulated in 100 ms ticks of
    /// one monotonic clock; the wall clocks only go into renewTime.
    #[test]
    fn skewed_clocks_never_make_two_leaders() {
        let cfg = config("a");
        for skew_secs in [-3600_i64, -20, -9, 0, 9, 20, 3600] {
            let t0 = Instant::now();
            let tick = Duration::from_millis(100);
            let wall = |i: u32, skew: i64| {
                Timestamp::from_second(1_000_000 + i64::from(i / 10) + skew).unwrap()
            };
            // A holds the Lease when the simulation starts.
            let mut stored = Some(spec_for("a", &cfg, None, wall(0, 0)));
            let mut in_flight: Option<(u32, LeaseSpec)> = None;
            let mut a_until = Some(t0 + cfg.renew_deadline);
            let mut b_until: Option<Instant> = None;
            let (mut a_seen, mut b_seen): (Option<Observed>, Option<Observed>) = (None, None);
            let mut b_took_over_at = None;
            let silent_from = 600; // the leader stops renewing after 60 s
            for i in 0..1500_u32 {
                let now = t0 + tick * i;
                if let Some((lands, spec)) = in_flight.take() {
                    if i >= lands {
                        stored = Some(spec);
                    } else {
                        in_flight = Some((lands, spec));
                    }
                }
                // A renews every 2.5 s while alive; its term counts from the start of the
                // round, its write lands a second later.
                if i < silent_from && i % 25 == 0 {
                    let seen = observe(a_seen.take(), stored.as_ref(), now);
                    if matches!(
                        next_action(&seen, "a", now),
                        LeaseAction::Acquire | LeaseAction::Renew
                    ) {
                        in_flight =
                            Some((i + 10, spec_for("a", &cfg, stored.as_ref(), wall(i, 0))));
                        a_until = Some(now + cfg.renew_deadline);
                    }
                    a_seen = Some(seen);
                }
                // B, with its wall clock skewed, looks every 2.5 s, half a second after A
                // starts (so it often reads the record before A's write has landed).
                if i % 25 == 5 {
                    let seen = observe(b_seen.take(), stored.as_ref(), now);
                    if matches!(
                        next_action(&seen, "b", now),
                        LeaseAction::Acquire | LeaseAction::Renew
                    ) {
                        stored = Some(spec_for("b", &cfg, stored.as_ref(), wall(i, skew_secs)));
                        b_until = Some(now + cfg.renew_deadline);
                        b_took_over_at.get_or_insert(i);
                    }
                    b_seen = Some(seen);
                }
                let a_leads = a_until.is_some_and(|u| now < u);
                let b_leads = b_until.is_some_and(|u| now < u);
                assert!(
                    !(a_leads && b_leads),
                    "skew {skew_secs}s: two leaders at tick {i}"
                );
            }
            let took_over = b_took_over_at.expect("the follower never took over");
            assert!(
                took_over >= silent_from,
                "skew {skew_secs}s: took over a live leader at tick {took_over}"
            );
        }
    }
}
