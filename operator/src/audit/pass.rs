//! One audit pass: which kinds the validating Policies name, their objects page by page, each
//! judged by every Policy naming its kind, and the reports and statuses written at the end.
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

use kube::api::{Api, ListParams};
use tokio::sync::watch;

use super::judge::{AuditedKind, Judgement, audit_copy, judge};
use super::report::{Scope, Tallies, Tally};
use super::source::{Pace, for_each_page, may_list, namespace_labels, resolve_kind};
use super::writes::{write_reports, write_statuses};
use super::{AuditContext, AuditError, AuditLabels};
use crate::api::reports::Timestamp;
use crate::api::v1alpha1::Policy;
use crate::engine::matcher::Namespace;
use crate::engine::policy::CompiledPolicy;
use crate::error_chain::chain;
use crate::lease::Leadership;

/// One validating Policy in a pass.
pub struct AuditedPolicy {
    pub policy: Policy,
    pub compiled: CompiledPolicy,
    /// The kinds it names that are listed.
    pub kinds: Vec<AuditedKind>,
    /// Why some of what it names is not audited.
    pub problems: Vec<String>,
    /// Objects it matched.
    pub matched: u64,
}

impl AuditedPolicy {
    pub fn name(&self) -> &str {
        self.compiled.name()
    }
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
    let mut audited: Vec<AuditedPolicy> = listed
        .items
        .into_iter()
        .filter(|p| !p.spec.validate.is_empty())
        // An invalid Policy is Ready=False already and judges nothing.
        .filter_map(|p| {
            audit_copy(&p).ok().map(|compiled| AuditedPolicy {
                policy: p,
                compiled,
                kinds: Vec::new(),
                problems: Vec::new(),
                matched: 0,
            })
        })
        .collect();
    // Each kind named, resolved and access-checked once.
    let mut resolved: BTreeMap<(String, String, String), Result<AuditedKind, String>> =
        BTreeMap::new();
    for entry in &mut audited {
        let rules = entry.compiled.spec().match_.rules.clone();
        for (i, rule) in rules.iter().enumerate() {
            for group in &rule.api_groups {
                for version in &rule.api_versions {
                    for resource in &rule.resources {
                        if [group, version, resource].iter().any(|v| v.contains('*')) {
                            entry.problems.push(format!(
                                "spec.match.rules[{i}]: a wildcard is not audited (the audit \
                                 lists only the kinds a Policy names)"
                            ));
                            continue;
                        }
                        let key = (group.clone(), version.clone(), resource.clone());
                        if !resolved.contains_key(&key) {
                            let kind =
                                match resolve_kind(&ctx.client, group, version, resource).await {
                                    Ok(kind) => match may_list(&ctx.client, &kind).await {
                                        Ok(()) => Ok(kind),
                                        Err(e) => Err(chain(&e).to_string()),
                                    },
                                    Err(reason) => Err(reason),
                                };
                            resolved.insert(key.clone(), kind);
                        }
                        match &resolved[&key] {
                            Ok(kind) if !entry.kinds.contains(kind) => {
                                entry.kinds.push(kind.clone())
                            }
                            Ok(_) => {}
                            Err(reason) if !entry.problems.contains(reason) => {
                                entry.problems.push(reason.clone())
                            }
                            Err(_) => {}
                        }
                    }
                }
            }
        }
    }
    let mut pace = Pace::new(config.qps);
    let namespaces = namespace_labels(&ctx.client, config.page_size, &mut pace).await?;
    let no_labels = BTreeMap::new();
    let kinds: BTreeSet<AuditedKind> = audited
        .iter()
        .flat_map(|a| a.kinds.iter().cloned())
        .collect();
    let mut tallies: Tallies = BTreeMap::new();
    let mut objects = 0u64;
    for kind in &kinds {
        let members: Vec<usize> = (0..audited.len())
            .filter(|&i| audited[i].kinds.contains(kind))
            .collect();
        let listed = for_each_page(&ctx.client, kind, config.page_size, &mut pace, |page| {
            for object in page {
                objects += 1;
                let scope = match object["metadata"]["namespace"].as_str() {
                    Some(ns) if kind.namespaced => {
                        if config.excluded_namespaces.iter().any(|e| e == ns) {
                            continue;
                        }
                        Scope::Namespace(ns.to_string())
                    }
                    _ => Scope::Cluster,
                };
                let labels = match &scope {
                    Scope::Namespace(ns) => match namespaces.get(ns) {
                        Some(labels) => Namespace::Labels(labels),
                        // Its Namespace came after the pass listed them: next pass.
                        None => continue,
                    },
                    Scope::Cluster => Namespace::Labels(&no_labels),
                };
                for &i in &members {
                    let entry = &mut audited[i];
                    let Judgement::Judged { failing, held } =
                        judge(&entry.compiled, kind, &object, labels, &now)
                    else {
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
                    tallies
                        .entry(entry.name().to_string())
                        .or_default()
                        .entry(scope.clone())
                        .or_default()
                        .add(failing, held, config.max_results);
                }
            }
        })
        .await;
        if let Err(e) = listed {
            for &i in &members {
                audited[i].problems.push(chain(&e).to_string());
            }
        }
    }
    if !leader.borrow().is_leading() {
        return Err(AuditError::NotLeading);
    }
    let reports = write_reports(ctx, &mut audited, &tallies, leader, &mut pace).await?;
    write_statuses(ctx, &audited, leader, &mut pace).await;
    Ok(format!(
        "{} Policies, {} kinds, {objects} objects listed, {reports} reports",
        audited.len(),
        kinds.len()
    ))
}
