//! The ExternalCall records as the loop reads them: one watch into a table of what a pass
//! needs of each, so ten thousand records cost a few megabytes.
use std::sync::Arc;

use chrono::{DateTime, Utc};
use kube::api::Api;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::Notify;

use crate::runtime::table::{Table, feed};
use gatehouse_api::v1alpha1::{CALL_POLICY_LABEL, CallState, ExternalCall, Owner};

/// What a pass needs of one ExternalCall.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub name: String,
    pub uid: String,
    pub key: String,
    pub policy: String,
    pub policy_uid: String,
    pub effect: usize,
    /// Where Release goes: the receiver Apply last went to.
    pub url: String,
    pub object: Owner,
    pub state: CallState,
    pub attempts: i64,
    pub next_attempt: Option<DateTime<Utc>>,
    pub failed_generation: Option<i64>,
    pub result: Option<String>,
    pub last_error: Option<String>,
}

/// The records, by name.
pub type Records = Table<Arc<Record>>;

/// Starts the watch of every ExternalCall into a table, poking `trigger` on every change.
pub fn watch(client: Client, trigger: Arc<Notify>) -> (Records, impl Future<Output = ()>) {
    let table = Records::default();
    let api: Api<ExternalCall> = Api::all(client);
    let feeding = feed(
        table.clone(),
        watcher(api, watcher::Config::default()),
        vec![trigger],
        "ExternalCall".to_string(),
        record_of,
    );
    (table, feeding)
}

/// An ExternalCall as a pass reads it.
pub fn record_of(call: ExternalCall) -> Arc<Record> {
    let status = call.status.clone().unwrap_or_default();
    let next_attempt = status
        .next_attempt
        .as_deref()
        .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
        .map(|at| at.with_timezone(&Utc));
    Arc::new(Record {
        name: call.name_any(),
        uid: call.uid().unwrap_or_default(),
        policy_uid: call
            .labels()
            .get(CALL_POLICY_LABEL)
            .cloned()
            .unwrap_or_default(),
        key: call.spec.key,
        policy: call.spec.policy,
        effect: usize::try_from(call.spec.effect).unwrap_or_default(),
        url: status.url.clone().unwrap_or(call.spec.url),
        object: call.spec.object,
        state: status.state,
        attempts: status.attempts,
        next_attempt,
        failed_generation: status.failed_generation,
        result: status.result,
        last_error: status.last_error,
    })
}
