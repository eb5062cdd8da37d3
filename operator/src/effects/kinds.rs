//! What discovery and the API server's authorizer say of the kinds a Policy's object effects
//! name, remembered for a while: each pass asks about every Policy, and a grant or a new CRD
//! must still be seen within a resync.
use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::discovery::{Scope, pinned_kind};
use tokio::time::Instant;

use crate::audit::judge::AuditedKind;
use crate::audit::source::{KindUnknown, resolve_kind};
use crate::runtime::error_chain::chain;

/// How long an answer is trusted.
const REMEMBERED: Duration = Duration::from_secs(20);

/// A companion's kind as discovery serves it.
#[derive(Clone, Debug)]
pub struct CompanionKind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// One access question: may Gatehouse `verb` this resource (in `namespace`, or everywhere)?
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Access {
    verb: &'static str,
    group: String,
    resource: String,
    namespace: Option<String>,
}

/// An answer and when it was given.
type Remembered<T> = (Instant, Result<T, String>);

/// A rule's (group, version, resource).
type Gvr = (String, String, String);

/// The remembered answers.
pub struct Kinds {
    client: Client,
    companions: HashMap<(String, String), Remembered<CompanionKind>>,
    triggers: HashMap<Gvr, Remembered<AuditedKind>>,
    access: HashMap<Access, Remembered<()>>,
}

fn fresh<T: Clone>(entry: Option<&(Instant, T)>) -> Option<T> {
    entry
        .filter(|(at, _)| at.elapsed() < REMEMBERED)
        .map(|(_, answer)| answer.clone())
}

/// What to grant, as a user reads it: `create networkpolicies.networking.k8s.io`.
fn resource_name(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

impl Kinds {
    pub fn new(client: Client) -> Self {
        Kinds {
            client,
            companions: HashMap::new(),
            triggers: HashMap::new(),
            access: HashMap::new(),
        }
    }

    /// The kind of a template, `Err` with the reason when none is served.
    pub async fn companion(
        &mut self,
        api_version: &str,
        kind: &str,
    ) -> Result<CompanionKind, String> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(answer) = fresh(self.companions.get(&key)) {
            return answer;
        }
        let (group, version) = match api_version.split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", api_version),
        };
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let answer = match pinned_kind(&self.client, &gvk).await {
            Ok((resource, caps)) => Ok(CompanionKind {
                resource,
                namespaced: caps.scope == Scope::Namespaced,
            }),
            Err(kube::Error::Api(e)) if e.code == 404 => {
                Err(format!("the API server serves no {kind} in {api_version}"))
            }
            Err(e) => Err(format!(
                "discovering {kind} in {api_version}: {}",
                chain(&e)
            )),
        };
        self.companions
            .insert(key, (Instant::now(), answer.clone()));
        answer
    }

    /// The kind a rule's (group, version, resource) names.
    pub async fn trigger(
        &mut self,
        group: &str,
        version: &str,
        resource: &str,
    ) -> Result<AuditedKind, String> {
        let key = (group.to_string(), version.to_string(), resource.to_string());
        if let Some(answer) = fresh(self.triggers.get(&key)) {
            return answer;
        }
        let answer = resolve_kind(&self.client, group, version, resource)
            .await
            .map_err(|e| match e {
                KindUnknown::NotServed(why) | KindUnknown::Unavailable(why) => why,
            });
        self.triggers.insert(key, (Instant::now(), answer.clone()));
        answer
    }

    /// `Ok` when Gatehouse may do each of `verbs` on `resource` of `group` (in `namespace`, or
    /// in every namespace); otherwise the first verb it may not, as a sentence naming the verb,
    /// the resource and where to grant it.
    pub async fn may(
        &mut self,
        verbs: &[&'static str],
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> Result<(), String> {
        for verb in verbs {
            let question = Access {
                verb,
                group: group.to_string(),
                resource: resource.to_string(),
                namespace: namespace.map(str::to_string),
            };
            let answer = match fresh(self.access.get(&question)) {
                Some(answer) => answer,
                None => {
                    let answer = self.ask(&question).await;
                    self.access
                        .insert(question, (Instant::now(), answer.clone()));
                    answer
                }
            };
            answer?;
        }
        Ok(())
    }

    async fn ask(&self, question: &Access) -> Result<(), String> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(question.verb.to_string()),
                    group: Some(question.group.clone()),
                    resource: Some(question.resource.clone()),
                    namespace: question.namespace.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let what = resource_name(&question.group, &question.resource);
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                format!(
                    "asking whether Gatehouse may {} {what}: {}",
                    question.verb,
                    chain(&e)
                )
            })?;
        if answer.status.is_some_and(|s| s.allowed) {
            return Ok(());
        }
        let place = match &question.namespace {
            Some(ns) => format!(" in namespace {ns}"),
            None => String::new(),
        };
        Err(format!(
            "Gatehouse may not {} {what}{place}: grant it with a ClusterRole labelled \
             gatehouse.dev/aggregate-to-effects: \"true\" (aggregated into gatehouse-effects)",
            question.verb
        ))
    }
}
