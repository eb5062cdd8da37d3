//! What the reconcile loops (the Policy controller and the effects loop) share: reflectors
//! that poke a trigger, coalescing of bursts, one field manager, and writes fenced by the
//! leader's term ([`crate::lease`]).
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{Notify, mpsc, watch};
use tracing::warn;

use crate::lease::Leadership;

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

/// Waits until no trigger arrived for `window.quiet`, or `window.max` passed.
pub async fn coalesce(trigger: &Notify, window: Window) {
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
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(writer, events::<K>(client, config));
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
    (rx, drive(events::<K>(client, config), trigger, send))
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
    client: Client,
    config: watcher::Config,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send {
    watcher(Api::<K>::all(client), config).modify(|o| o.managed_fields_mut().clear())
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
