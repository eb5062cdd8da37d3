//! One audit pass: which kinds the validating Policies name, their objects page by page, each
//! judged by every Policy naming its kind, and the reports and statuses written at the end.
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use kube::api::{Api, ListParams};
use serde_json::Value;
use tokio::sync::watch;

use super::audited::{AuditedPolicy, push_once};
use super::judge::{AuditedKind, Judgement, audited_resources, judge_excepting};
use super::report::{ReportLocation, Tallies, Tally};
use super::source::{KindUnknown, Pace, Pages, may_list, resolve_kind};
use super::writes::{clear_statuses, write_reports, write_statuses};
use super::{AUDITED, AuditContext, AuditError, AuditLabels};
use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use crate::webhook::NO_SUCH_NAMESPACE;
use gatehouse_api::reports::Timestamp;
use gatehouse_api::v1alpha1::{Policy, PolicyException};
use gatehouse_engine::exception::{CompiledExemption, exemptions_of};
use gatehouse_engine::matcher::Namespace;

/// Whether `p` carries what a pass wrote (the `Audited` condition or the last pass's time).
fn carries_audit_status(p: &Policy) -> bool {
    p.status.as_ref().is_some_and(|s| {
        s.last_audit_time.is_some() || s.conditions.iter().any(|c| c.type_ == AUDITED)
    })
}

/// What a pass has gathered so far.
struct PassState {
    audited: Vec<AuditedPolicy>,
    tallies: Tallies,
    /// Namespace labels read this pass, by name (the reflector's, or a read's when it has not
    /// seen the Namespace yet); `Err` says why unknown.
    namespace_labels: BTreeMap<String, Result<BTreeMap<String, String>, String>>,
    objects: u64,
}

/// The time of a pass, as reports carry it.
fn timestamp() -> Timestamp {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// The kinds each Policy names, resolved by discovery and access-checked once per pass. As the
/// API server does, a rule matches the cross product of its groups, versions and resources, so a
/// combination no API serves is no problem; a resource no combination of its rule serves is. A
/// resource served in several versions is listed in the first the rule names (admission matches
/// a request once, whatever the version).
async fn resolve_kinds(ctx: &AuditContext, audited: &mut [AuditedPolicy]) {
    let mut resolved: BTreeMap<(String, String, String), Resolved> = BTreeMap::new();
    for entry in audited.iter_mut() {
        if entry.copy.is_none() {
            continue;
        }
        let rules = entry.policy.spec.match_.rules.clone();
        for (i, rule) in rules.iter().enumerate() {
            let Some(resources) = audited_resources(rule) else {
                continue;
            };
            for resource in &resources {
                let mut unserved = Vec::new();
                for group in &rule.api_groups {
                    for version in &rule.api_versions {
                        if [group, version, resource].iter().any(|v| v.contains('*')) {
                            push_once(
                                &mut entry.problems,
                                &format!(
                                    "spec.match.rules[{i}]: a wildcard is not audited (the \
                                     audit lists only the kinds a Policy names)"
                                ),
                            );
                            continue;
                        }
                        let key = (group.clone(), version.clone(), resource.clone());
                        if !resolved.contains_key(&key) {
                            let answer = match resolve_kind(&ctx.client, group, version, resource)
                                .await
                            {
                                Ok(kind) => match may_list(&ctx.client, &kind).await {
                                    Ok(()) => Resolved::Listed(kind),
                                    Err(e) => Resolved::Unlisted(chain(&e).to_string()),
                                },
                                Err(KindUnknown::NotServed(reason)) => Resolved::NotServed(reason),
                                Err(KindUnknown::Unavailable(reason)) => Resolved::Unlisted(reason),
                            };
                            resolved.insert(key.clone(), answer);
                        }
                        match resolved.get(&key) {
                            Some(Resolved::Listed(kind)) => {
                                let listed_already = entry
                                    .kinds
                                    .iter()
                                    .any(|k| k.group == kind.group && k.resource == kind.resource);
                                if !listed_already {
                                    entry.kinds.push(kind.clone());
                                }
                            }
                            Some(Resolved::Unlisted(reason)) => entry.transient_problem(reason),
                            Some(Resolved::NotServed(reason)) => unserved.push(reason.clone()),
                            None => {}
                        }
                    }
                }
                let combinations = rule.api_groups.len() * rule.api_versions.len();
                if combinations > 0 && unserved.len() == combinations {
                    push_once(
                        &mut entry.problems,
                        &format!("spec.match.rules[{i}]: {}", unserved[0]),
                    );
                }
            }
        }
    }
}

/// What discovery and the access review made of one (group, version, resource).
enum Resolved {
    Listed(AuditedKind),
    /// Not listed this pass (Gatehouse may not, or discovery failed): why.
    Unlisted(String),
    /// No API serves it: why.
    NotServed(String),
}

/// Gives each audited Policy what the honoured PolicyExceptions exempt from it (read anew each
/// pass, like the Policies: a restart loses nothing).
async fn exempt(ctx: &AuditContext, audited: &mut [AuditedPolicy]) -> Result<(), AuditError> {
    let listed = Api::<PolicyException>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(AuditError::ListExceptions)?;
    let honoured: Vec<&PolicyException> = listed
        .items
        .iter()
        .filter(|e| {
            let namespace = e.metadata.namespace.as_deref().unwrap_or_default();
            ctx.config
                .exception_namespaces
                .iter()
                .any(|n| n == namespace)
        })
        .collect();
    for entry in audited {
        entry.exemptions = exemptions_of(entry.name(), &honoured)
            .into_iter()
            .filter_map(CompiledExemption::new)
            .collect();
    }
    Ok(())
}

/// Runs one pass; a one-line summary of it.
pub async fn run_pass(
    ctx: &AuditContext,
    leader: &watch::Receiver<Leadership>,
) -> Result<String, AuditError> {
    let now = timestamp();
    let config = &ctx.config;
    let listed = Api::<Policy>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(AuditError::ListPolicies)?;
    // Policies no pass judges any more (no validate rules, or invalid) lose what earlier
    // passes wrote on them.
    let (mut audited, mut unaudited) = (Vec::new(), Vec::new());
    for p in listed.items {
        match AuditedPolicy::of(p.clone()) {
            Some(entry) => audited.push(entry),
            None if carries_audit_status(&p) => unaudited.push(p),
            None => {}
        }
    }
    let mut state = PassState {
        audited,
        tallies: BTreeMap::new(),
        namespace_labels: BTreeMap::new(),
        objects: 0,
    };
    exempt(ctx, &mut state.audited).await?;
    resolve_kinds(ctx, &mut state.audited).await;
    let mut pace = Pace::new(config.qps);
    let kinds: BTreeSet<AuditedKind> = state
        .audited
        .iter()
        .flat_map(|a| a.kinds.iter().cloned())
        .collect();
    for kind in &kinds {
        let members: Vec<usize> = (0..state.audited.len())
            .filter(|&i| state.audited[i].kinds.contains(kind))
            .collect();
        let mut pages = Pages::new(&ctx.client, kind, config.page_size);
        let listed = loop {
            if !leader.borrow().is_leading() {
                return Err(AuditError::NotLeading);
            }
            match pages.next(&mut pace).await {
                Ok(Some(page)) => {
                    for object in page {
                        state.judge_object(ctx, kind, &members, &object, &now).await;
                        // An object at a time: shutdown, awaited beside the pass, is noticed
                        // within an object, not a page.
                        tokio::task::yield_now().await;
                    }
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = listed {
            for &i in &members {
                state.audited[i].transient_problem(&chain(&e).to_string());
            }
        }
    }
    if !leader.borrow().is_leading() {
        return Err(AuditError::NotLeading);
    }
    let PassState {
        mut audited,
        tallies,
        objects,
        ..
    } = state;
    let reports = write_reports(ctx, &mut audited, &tallies, leader, &mut pace).await?;
    write_statuses(ctx, &audited, leader, &mut pace).await;
    clear_statuses(ctx, &unaudited, leader, &mut pace).await;
    Ok(format!(
        "{} Policies, {} kinds, {objects} objects listed, {reports} reports",
        audited.len(),
        kinds.len()
    ))
}

impl PassState {
    /// Judges `object` (of `kind`) by the Policies `members` (indexes into `audited`).
    async fn judge_object(
        &mut self,
        ctx: &AuditContext,
        kind: &AuditedKind,
        members: &[usize],
        object: &Value,
        now: &Timestamp,
    ) {
        self.objects += 1;
        let excluded = |ns: &str| ctx.config.excluded_namespaces.iter().any(|e| e == ns);
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let scope = match object["metadata"]["namespace"].as_str() {
            Some(ns) if kind.namespaced => ReportLocation::Namespace(ns.to_string()),
            _ => ReportLocation::Cluster,
        };
        // What admission never touches is not audited: objects in the excluded namespaces,
        // and those Namespaces themselves.
        let untouched = match &scope {
            ReportLocation::Namespace(ns) => excluded(ns),
            ReportLocation::Cluster => kind.is_namespace() && excluded(name),
        };
        if untouched {
            return;
        }
        let no_labels = BTreeMap::new();
        if let ReportLocation::Namespace(ns) = &scope
            && !self.namespace_labels.contains_key(ns)
        {
            let labels = ctx.namespaces.labels(ns).await;
            self.namespace_labels.insert(ns.clone(), labels);
        }
        let labels = match &scope {
            ReportLocation::Namespace(ns) => match self.namespace_labels.get(ns) {
                Some(Ok(labels)) => Namespace::Labels(labels),
                // Its Namespace is gone: it is being deleted with it.
                Some(Err(reason)) if reason == NO_SUCH_NAMESPACE => return,
                // Unreadable: the Policies keep their last reports.
                Some(Err(reason)) => {
                    let problem = format!("the labels of namespace {ns:?} are unknown: {reason}");
                    for &i in members {
                        self.audited[i].transient_problem(&problem);
                    }
                    return;
                }
                None => return,
            },
            ReportLocation::Cluster => Namespace::Labels(&no_labels),
        };
        for &i in members {
            let entry = &mut self.audited[i];
            let Some(copy) = &entry.copy else { continue };
            let judged = judge_excepting(copy, &entry.exemptions, kind, object, labels, now);
            let Judgement::Judged { failing, held } = judged else {
                continue;
            };
            entry.matched += 1;
            ctx.metrics
                .objects
                .get_or_create(&AuditLabels {
                    policy: entry.name().to_string(),
                    result: Tally::worst(&failing),
                })
                .inc();
            self.tallies
                .entry(entry.name().to_string())
                .or_default()
                .entry(scope.clone())
                .or_default()
                .add(failing, held, ctx.config.max_results);
        }
    }
}
