//! What the reconcile loops (the Policy controller and the effects loop) share: one loop
//! ([`run_loop`]) with coalescing of bursts and kube's backoff for failing passes, reflectors
//! that poke its trigger, one field manager, and writes fenced by the leader's term
//! ([`crate::runtime::lease`]).
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::DefaultBackoff;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::runtime::telemetry::{HistogramFamily, latency_histogram};

/// Labels of a reconcile loop.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub controller: String,
}

/// Labels of a failed pass: the loop and the error, as [`Failure::step`] names it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub controller: String,
    pub error: String,
}

/// An error a loop's pass fails with, as its failure metric names it: the variant of the loop's
/// error enum, which is named after the failing step.
pub trait Failure: std::error::Error + 'static {
    /// The variant's name, e.g. `ApplyConfiguration`.
    fn step(&self) -> &'static str;
}

/// The passes of the reconcile loops (`gatehouse_reconcile_*`), by loop.
pub struct ReconcileMetrics {
    pub runs: Family<ReconcileLabels, Counter>,
    pub failures: Family<FailureLabels, Counter>,
    pub duration: HistogramFamily<ReconcileLabels>,
}

impl ReconcileMetrics {
    /// Registers the loops' families in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = ReconcileMetrics {
            runs: Family::default(),
            failures: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
        };
        let reconcile = registry.sub_registry_with_prefix("reconcile");
        reconcile.register("runs", "Reconcile runs", metrics.runs.clone());
        reconcile.register(
            "failures",
            "Failed reconcile runs, by the step that failed",
            metrics.failures.clone(),
        );
        reconcile.register(
            "duration_seconds",
            "Duration of reconcile runs",
            metrics.duration.clone(),
        );
        metrics
    }
}

/// The one field manager of every write Gatehouse makes.
pub const FIELD_MANAGER: &str = "gatehouse";

/// How a loop collects a burst of changes into one pass: until it has been quiet for `quiet`,
/// but never longer than `max`, so a steady trickle still gets handled.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub quiet: Duration,
    pub max: Duration,
}

/// A write skipped or cut off because this replica's term as leader ended.
#[derive(Debug, thiserror::Error)]
#[error("not leading any more: {what} not written")]
pub struct NotLeading {
    pub what: String,
}

/// How a reconcile loop is paced.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    /// How a burst of triggers is collected into one pass.
    pub window: Window,
    /// How often a pass runs with nothing triggering it: the level-triggered safety net in case
    /// a watch event was missed.
    pub resync: Duration,
}

/// When a pass wants the next one, besides what triggers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// After the resync interval.
    Resync,
    /// No later than this: a timer of the loop's own, or at once for work left over.
    By(Instant),
}

/// What a pass is told of this replica's part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    Following,
    /// Leading, in the term the last pass saw.
    Continuing,
    /// Leading in a term the last pass did not see: what an earlier term remembered may be stale.
    Began,
}

impl Term {
    pub fn is_leading(self) -> bool {
        self != Term::Following
    }
}

/// The one reconcile loop of a controller. A pass runs when a watched object changed (`trigger`;
/// a burst is collected into one pass, [`Pacing::window`]), when this replica starts or stops
/// leading (or its term lapsed and was taken again), when the pass asked for one ([`Next`]), or
/// every [`Pacing::resync`]. After a failing pass the next one waits for kube's default backoff
/// (0.8 s doubling to 30 s, with jitter, reset by a pass that succeeds) unless something changes
/// first, as kube's `Controller` requeues a failed object but reconciles a changed one at once.
/// Renewals of the leader's term wake nothing. `pass` is told this replica's [`Term`]; the loop
/// ends when the leader's channel closes.
pub async fn run_loop<E: Failure>(
    controller: &'static str,
    metrics: &ReconcileMetrics,
    trigger: &Notify,
    leader: &mut watch::Receiver<Leadership>,
    pacing: Pacing,
    mut pass: impl AsyncFnMut(Term) -> Result<Next, E>,
) {
    let labels = ReconcileLabels {
        controller: controller.into(),
    };
    let mut backoff = DefaultBackoff::default();
    let mut seen = Seen {
        term: Leadership::default(),
        leading: false,
    };
    loop {
        let term = *leader.borrow_and_update();
        let leading = term.is_leading();
        // The term the last pass saw (renewed since, as `wait` saw) still lasts: the same one.
        let continuing = seen.leading && seen.term.is_leading();
        seen = Seen { term, leading };
        let started = Instant::now();
        let result = pass(match (leading, continuing) {
            (false, _) => Term::Following,
            (true, true) => Term::Continuing,
            (true, false) => Term::Began,
        })
        .await;
        metrics.runs.get_or_create(&labels).inc();
        metrics
            .duration
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
        let wake = match result {
            Ok(next) => {
                backoff.reset();
                match next {
                    Next::Resync => Instant::now() + pacing.resync,
                    Next::By(at) => at,
                }
            }
            Err(e) => {
                metrics
                    .failures
                    .get_or_create(&FailureLabels {
                        controller: controller.into(),
                        error: e.step().into(),
                    })
                    .inc();
                let delay = backoff.next().unwrap_or(pacing.resync);
                warn!(controller, error = %chain(&e), retry_in = ?delay, "pass failed; backing off");
                Instant::now() + delay
            }
        };
        let next = wait(trigger, leader, &mut seen, wake, pacing.window).await;
        if next == Wake::Closed {
            return;
        }
    }
}

/// Why [`wait`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wake {
    Pass,
    /// The leader's channel closed: the process is stopping.
    Closed,
}

/// The leader's term as the last pass was told of it.
#[derive(Clone, Copy, Debug)]
struct Seen {
    term: Leadership,
    /// Whether it led then (a term's `is_leading` changes with the clock).
    leading: bool,
}

/// Waits for a reason to run a pass: a trigger (then collects the burst), a change of whether
/// this replica leads from what the last pass was told (`seen`), or `deadline`. A renewal while
/// the term lasts changes nothing; a step-down (published only once the term ran out) does, and
/// so does a term that lapsed and was taken again: the pass must learn that whatever an earlier
/// term remembered may be stale.
async fn wait(
    trigger: &Notify,
    leader: &mut watch::Receiver<Leadership>,
    seen: &mut Seen,
    deadline: Instant,
    window: Window,
) -> Wake {
    loop {
        tokio::select! {
            () = trigger.notified() => {
                coalesce(trigger, window).await;
                return Wake::Pass;
            }
            changed = leader.changed() => {
                if changed.is_err() {
                    return Wake::Closed;
                }
                let now = *leader.borrow_and_update();
                let lapsed = seen.leading && !seen.term.is_leading();
                if now.is_leading() != seen.leading || lapsed {
                    return Wake::Pass;
                }
                seen.term = now;
            }
            () = tokio::time::sleep_until(deadline) => return Wake::Pass,
        }
    }
}

/// Waits until no trigger arrived for `window.quiet`, or `window.max` passed.
async fn coalesce(trigger: &Notify, window: Window) {
    let deadline = tokio::time::Instant::now() + window.max;
    loop {
        let quiet = tokio::time::sleep(window.quiet);
        tokio::select! {
            () = trigger.notified() => {
                if tokio::time::Instant::now() >= deadline {
                    return;
                }
            }
            () = quiet => return,
            () = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// A reflector of `K` (optionally narrowed by `config`'s selectors) that pokes `trigger` on every
/// change. Returns the store and the future driving the watch.
pub fn reflect<K>(
    client: Client,
    config: watcher::Config,
    trigger: Arc<Notify>,
) -> (Store<K>, impl Future<Output = ()> + Send + use<K>)
where
    K: Watched,
{
    reflect_in(Api::all(client), config, trigger)
}

/// [`reflect`] of the objects `api` reaches (one namespace's, say).
pub fn reflect_in<K>(
    api: Api<K>,
    config: watcher::Config,
    trigger: Arc<Notify>,
) -> (Store<K>, impl Future<Output = ()> + Send + use<K>)
where
    K: Watched,
{
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, events::<K>(api, config));
    (store, drive(stream, trigger, |_| {}))
}

/// The watch events of `K`, handed to the returned channel, poking `trigger` on each: for a loop
/// that keeps its own compact index instead of a store of whole objects.
pub fn watch_events<K>(
    client: Client,
    config: watcher::Config,
    trigger: Arc<Notify>,
) -> (
    mpsc::UnboundedReceiver<watcher::Event<K>>,
    impl Future<Output = ()> + Send + use<K>,
)
where
    K: Watched,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let send = move |event: &watcher::Event<K>| {
        // The loop owning the receiver stopped: nothing is left to tell.
        let _ = tx.send(event.clone());
    };
    (
        rx,
        drive(events::<K>(Api::all(client), config), trigger, send),
    )
}

/// What a watched kind must be.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static
{
}

impl<K> Watched for K where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// The watch of `K` without managedFields: no loop reads them, and they are most of a small
/// object's size.
fn events<K: Watched>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send {
    watcher(api, config)
        .filter(|event| {
            let relist = is_relist(event);
            if relist {
                debug!(kind = %K::kind(&()), "resource version too old; relisting");
            }
            std::future::ready(!relist)
        })
        .modify(|o| o.managed_fields_mut().clear())
}

/// The API server's "too old resource version" (410 Gone): the watcher has started over with a
/// fresh list already, so this is no failure to back off from.
fn is_relist<K>(event: &Result<watcher::Event<K>, watcher::Error>) -> bool {
    matches!(event, Err(watcher::Error::WatchError(status)) if status.code == 410)
}

/// Drives `stream` with backoff, handing each event to `each` and poking `trigger`.
async fn drive<K: Watched>(
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    trigger: Arc<Notify>,
    each: impl Fn(&watcher::Event<K>) + Send,
) {
    let kind = K::kind(&()).to_string();
    let mut stream = std::pin::pin!(stream.default_backoff());
    loop {
        match stream.try_next().await {
            Ok(Some(event)) => {
                each(&event);
                trigger.notify_one();
            }
            Ok(None) => return,
            Err(e) => warn!(%kind, error = %e, "watch failed; backing off"),
        }
    }
}

/// Runs `write` only while this replica leads, and no longer than its term lasts. Together
/// with the resourceVersion precondition on every write, a replica that stopped leading can
/// neither start a write nor have one land after its successor wrote.
pub async fn fenced<T>(
    leader: &watch::Receiver<Leadership>,
    what: impl Fn() -> String,
    write: impl Future<Output = Result<T, kube::Error>>,
) -> Result<Result<T, kube::Error>, NotLeading> {
    let term = *leader.borrow();
    if !term.is_leading() {
        return Err(NotLeading { what: what() });
    }
    tokio::time::timeout(term.remaining(), write)
        .await
        .map_err(|_| NotLeading { what: what() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::core::Status;

    /// A pass's failure in these tests.
    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;

    impl Failure for Refused {
        fn step(&self) -> &'static str {
            "Refused"
        }
    }

    #[test]
    fn a_too_old_resource_version_is_a_relist_and_other_errors_are_not() {
        let status = |code| {
            let mut s = Status::failure("too old resource version", "Expired");
            s.code = code;
            Box::new(s)
        };
        let gone: Result<watcher::Event<ConfigMap>, _> =
            Err(watcher::Error::WatchError(status(410)));
        assert!(is_relist(&gone));
        let forbidden: Result<watcher::Event<ConfigMap>, _> =
            Err(watcher::Error::WatchError(status(403)));
        assert!(!is_relist(&forbidden));
        assert!(!is_relist::<ConfigMap>(&Ok(watcher::Event::InitDone)));
    }

    fn term(leading: bool) -> Leadership {
        Leadership {
            until: leading.then(|| Instant::now() + Duration::from_secs(24 * 3600)),
        }
    }

    const WINDOW: Window = Window {
        quiet: Duration::from_millis(1),
        max: Duration::from_millis(5),
    };

    #[tokio::test(start_paused = true)]
    async fn a_renewal_wakes_nothing_and_a_change_of_leader_does() {
        let trigger = Notify::new();
        let far = Instant::now() + Duration::from_secs(3600);
        let seen = |term: Leadership| Seen {
            term,
            leading: term.is_leading(),
        };
        // A term that ran out after the pass saw it leading: taken again, it is a new term; let
        // go, the step-down is published only now. Both wake the loop.
        let lapsed = Seen {
            term: Leadership {
                until: Some(Instant::now()),
            },
            leading: true,
        };
        for next in [term(true), term(false)] {
            let (tx, mut rx) = watch::channel(lapsed.term);
            let mut lapsed = lapsed;
            let waiting = wait(&trigger, &mut rx, &mut lapsed, far, WINDOW);
            tx.send_replace(next);
            assert_eq!(waiting.await, Wake::Pass, "{next:?}");
        }

        let (tx, mut rx) = watch::channel(term(true));
        {
            let mut leading = seen(term(true));
            let waiting = wait(&trigger, &mut rx, &mut leading, far, WINDOW);
            tokio::pin!(waiting);
            // A renewal: still leading.
            tx.send_replace(term(true));
            assert!(
                tokio::time::timeout(Duration::from_secs(60), &mut waiting)
                    .await
                    .is_err(),
                "a renewal woke the loop"
            );
            tx.send_replace(term(false));
            assert_eq!(waiting.await, Wake::Pass);
        }
        // A follower told again that it follows: nothing.
        {
            let mut following = seen(term(false));
            let waiting = wait(&trigger, &mut rx, &mut following, far, WINDOW);
            tokio::pin!(waiting);
            tx.send_replace(term(false));
            assert!(
                tokio::time::timeout(Duration::from_secs(60), &mut waiting)
                    .await
                    .is_err(),
                "a follower woke for nothing"
            );
        }
        drop(tx);
        assert_eq!(
            wait(&trigger, &mut rx, &mut seen(term(false)), far, WINDOW).await,
            Wake::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_pass_backs_off_and_a_pass_asked_for_runs_at_once() {
        let (tx, mut rx) = watch::channel(term(true));
        let trigger = Notify::new();
        let mut registry = crate::runtime::telemetry::registry();
        let metrics = ReconcileMetrics::register(&mut registry);
        let pacing = Pacing {
            window: WINDOW,
            resync: Duration::from_secs(3600),
        };
        let mut runs: Vec<Instant> = Vec::new();
        let run = run_loop("test", &metrics, &trigger, &mut rx, pacing, async |_| {
            runs.push(Instant::now());
            match runs.len() {
                // Four failures, then a success that asks for one more pass at once.
                1..=4 => Err(Refused),
                5 => Ok(Next::By(Instant::now())),
                _ => Ok(Next::Resync),
            }
        });
        let _ = tokio::time::timeout(Duration::from_secs(7200), run).await;
        drop(tx);
        let gaps: Vec<Duration> = runs.windows(2).map(|w| w[1] - w[0]).collect();
        // Jitter spreads each delay; the doubling shows in the bounds.
        assert!(gaps.len() >= 6, "{gaps:?}");
        assert!(gaps[0] >= Duration::from_millis(400), "{gaps:?}");
        assert!(gaps[3] > gaps[0] * 2, "no backoff: {gaps:?}");
        assert!(
            gaps[4] < Duration::from_millis(10),
            "the asked-for pass waited: {gaps:?}"
        );
        assert!(gaps[5] >= Duration::from_secs(3600), "{gaps:?}");
        let text = crate::runtime::telemetry::encode(&registry).expect("metrics encode");
        assert!(
            text.contains(
                r#"gatehouse_reconcile_failures_total{controller="test",error="Refused"} 4"#
            ),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_is_told_when_a_term_began() {
        let (tx, mut rx) = watch::channel(term(true));
        let trigger = std::sync::Arc::new(Notify::new());
        let metrics = ReconcileMetrics::register(&mut crate::runtime::telemetry::registry());
        let pacing = Pacing {
            window: WINDOW,
            resync: Duration::from_secs(3600),
        };
        let mut told: Vec<Term> = Vec::new();
        let poke = trigger.clone();
        let steps = async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            poke.notify_one();
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(term(true)); // a renewal: no pass
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(term(false));
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send_replace(term(true));
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let run = run_loop("test", &metrics, &trigger, &mut rx, pacing, async |t| {
            told.push(t);
            Ok::<_, Refused>(Next::Resync)
        });
        tokio::select! {
            () = run => {}
            () = steps => {}
        }
        assert_eq!(
            told,
            [Term::Began, Term::Continuing, Term::Following, Term::Began]
        );
    }
}
