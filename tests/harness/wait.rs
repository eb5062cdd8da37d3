//! Polling helpers.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use kube::runtime::wait::Condition;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// Interval between two polls of [`await_condition`].
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls `check` every ~200ms until it returns `Ok(Some(value))` and returns that value.
///
/// `Ok(None)` and errors mean "not yet"; after `timeout` the error names `what` and carries the
/// last error seen. A single call of `check` is also cut off at the deadline.
pub async fn await_condition<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error: Option<anyhow::Error> = None;
    let mut polls = 0u32;
    loop {
        polls += 1;
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining.max(POLL_INTERVAL), check()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => {}
            Ok(Err(err)) => last_error = Some(err),
            Err(_) => last_error = Some(anyhow!("check still running at the deadline")),
        }
        if Instant::now() >= deadline {
            let err = anyhow!("timed out after {timeout:?} ({polls} polls) waiting for {what}");
            return Err(match last_error {
                Some(last) => err.context(format!("last error: {last:#}")),
                None => err,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits (watching) until the named object satisfies `condition`, via
/// [`kube::runtime::wait::await_condition`], and returns the object.
pub async fn await_resource<K, C>(
    api: Api<K>,
    name: &str,
    condition: C,
    timeout: Duration,
) -> anyhow::Result<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
    C: Condition<K>,
{
    let kind = K::kind(&Default::default()).into_owned();
    let waited = tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api, name, condition),
    )
    .await
    .map_err(|_| anyhow!("timed out after {timeout:?} waiting for {kind} {name}"))?
    .with_context(|| format!("watching {kind} {name}"))?;
    waited.ok_or_else(|| anyhow!("{kind} {name} was deleted while waiting for it"))
}
