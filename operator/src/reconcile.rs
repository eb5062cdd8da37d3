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
use tokio::sync::{Notify, watch};
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
) -> (
    Store<K>,
    impl std::future::Future<Output = ()> + Send + use<K>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = Api::all(client);
    let (store, writer) = reflector::store();
    // No loop reads managedFields, and they are most of a small object's size: 10,000 cached
    // IPAllocations held 90 MiB with them (tests/bench/ipam-load).
    let events = watcher(api, config).modify(|o| o.managed_fields_mut().clear());
    let stream = reflector::reflector(writer, events).default_backoff();
    let kind = K::kind(&()).to_string();
    let fut = async move {
        let mut stream = std::pin::pin!(stream);
        loop {
            match stream.try_next().await {
                Ok(Some(_event)) => trigger.notify_one(),
                Ok(None) => return,
                Err(e) => warn!(%kind, error = %e, "watch failed; backing off"),
            }
        }
    };
    (store, fut)
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
