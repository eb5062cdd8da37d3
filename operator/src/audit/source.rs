//! What the audit reads from the API server: which kinds the Policies name (discovery), whether
//! Gatehouse may list them (a SelfSubjectAccessReview), and their objects, page by page at a
//! bounded rate: no watch cache of everything, memory bounded by the page size.
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::discovery::{Scope, oneshot};
use kube::{Client, core::GroupVersion};
use serde_json::Value;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::AuditError;
use super::judge::AuditedKind;
use crate::runtime::error_chain::chain;

/// Paces the audit's calls (LISTs and writes): at most `qps` per second.
pub struct Pace {
    interval: Interval,
}

impl Pace {
    pub fn new(qps: f64) -> Self {
        // Between 1 ms and 100 s, whatever the flag says (0, inf, NaN).
        let seconds = 1.0 / qps;
        let seconds = if seconds.is_nan() {
            1.0
        } else {
            seconds.clamp(0.001, 100.0)
        };
        let period = Duration::from_secs_f64(seconds);
        let mut interval = tokio::time::interval_at(Instant::now(), period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Pace { interval }
    }

    pub async fn wait(&mut self) {
        self.interval.tick().await;
    }
}

/// Why a (group, version, resource) is no kind the audit can list.
#[derive(Debug)]
pub enum KindUnknown {
    /// No API serves it: why.
    NotServed(String),
    /// Discovery failed (an aggregated API unavailable, the API server away): why.
    Unavailable(String),
}

/// The kind `resource` names in `group`/`version`, or why none.
pub async fn resolve_kind(
    client: &Client,
    group: &str,
    version: &str,
    resource: &str,
) -> Result<AuditedKind, KindUnknown> {
    let gv = GroupVersion::gv(group, version);
    let served = match oneshot::pinned_group(client, &gv).await {
        Ok(served) => served,
        Err(kube::Error::Api(e)) if e.code == 404 => {
            return Err(KindUnknown::NotServed(format!(
                "the API server serves no {}",
                gv.api_version()
            )));
        }
        Err(e) => {
            return Err(KindUnknown::Unavailable(format!(
                "discovering {}: {}",
                gv.api_version(),
                chain(&e)
            )));
        }
    };
    served
        .versioned_resources(version)
        .into_iter()
        .find(|(ar, _)| ar.plural == resource)
        .map(|(ar, caps)| AuditedKind {
            group: group.to_string(),
            version: version.to_string(),
            resource: resource.to_string(),
            kind: ar.kind,
            namespaced: caps.scope == Scope::Namespaced,
        })
        .ok_or_else(|| {
            KindUnknown::NotServed(format!(
                "the API server serves no resource {resource:?} in {}",
                gv.api_version()
            ))
        })
}

/// Whether Gatehouse may list `kind` in every namespace; `Err` with the reason when not.
pub async fn may_list(client: &Client, kind: &AuditedKind) -> Result<(), AuditError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("list".into()),
                group: Some(kind.group.clone()),
                version: Some(kind.version.clone()),
                resource: Some(kind.resource.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answer = api
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| AuditError::AccessReview {
            resource: kind.resource.clone(),
            source,
        })?;
    let status = answer.status.unwrap_or_default();
    if status.allowed {
        Ok(())
    } else {
        Err(AuditError::NotAllowed {
            resource: if kind.group.is_empty() {
                kind.resource.clone()
            } else {
                format!("{}.{}", kind.resource, kind.group)
            },
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// The pages of one LIST of a kind, fetched one at a time, each when the pace allows: the
/// audit holds one page at a time, and judges it between fetches.
pub struct Pages {
    api: Api<DynamicObject>,
    kind: AuditedKind,
    page_size: u32,
    /// The continue token of the next page; `None` before the first and after the last.
    token: Option<String>,
    finished: bool,
}

impl Pages {
    pub fn new(client: &Client, kind: &AuditedKind, page_size: u32) -> Self {
        let resource = ApiResource {
            group: kind.group.clone(),
            version: kind.version.clone(),
            api_version: kind.api_version(),
            kind: kind.kind.clone(),
            plural: kind.resource.clone(),
        };
        Pages {
            api: Api::all_with(client.clone(), &resource),
            kind: kind.clone(),
            page_size,
            token: None,
            finished: false,
        }
    }

    /// The next page's objects, with apiVersion and kind as admission sees them (a LIST's
    /// items lack both); `None` after the last page.
    pub async fn next(&mut self, pace: &mut Pace) -> Result<Option<Vec<Value>>, AuditError> {
        if self.finished {
            return Ok(None);
        }
        pace.wait().await;
        let mut params = ListParams::default().limit(self.page_size);
        if let Some(t) = &self.token {
            params = params.continue_token(t);
        }
        let page = self
            .api
            .list(&params)
            .await
            .map_err(|source| AuditError::List {
                resource: self.kind.resource.clone(),
                source,
            })?;
        self.token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        self.finished = self.token.is_none();
        let objects = page
            .items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .map(|mut o| {
                o["apiVersion"] = Value::String(self.kind.api_version());
                o["kind"] = Value::String(self.kind.kind.clone());
                o
            })
            .collect();
        Ok(Some(objects))
    }
}
