//! What a pass writes: every Policy's reports (server-side apply, replaced whole) in the report
//! API `--report-api` chooses, the deletion of reports no Policy has any more (in the other API
//! too, so a switch leaves none behind), and each Policy's `Audited` condition and last pass time,
//! at the pace of the LISTs (a server-side apply of a report is costly for the API server: the
//! larger the report, the more; see `--audit-max-results`).
use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;
use tracing::warn;

use super::audited::AuditedPolicy;
use super::report::{POLICY_UID_LABEL, ReportLocation, Tallies, report_name, report_object};
use super::report_api::{chosen, served};
use super::source::Pace;
use super::{AUDITED, AuditContext, AuditError};
use crate::controller::wiring::MANAGED_BY_LABEL;
use crate::runtime::error_chain::chain;
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::{FIELD_MANAGER, fenced};
use gatehouse_api::reports::{ReportApi, ReportKind};
use gatehouse_api::v1alpha1::Policy;

fn report_resource(api: ReportApi, kind: ReportKind) -> ApiResource {
    ApiResource {
        group: api.group().into(),
        version: api.version().into(),
        api_version: api.api_version(),
        kind: api.kind(kind).into(),
        plural: api.plural(kind).into(),
    }
}

fn reports_api(ctx: &AuditContext, api: ReportApi, scope: &ReportLocation) -> Api<DynamicObject> {
    match scope {
        ReportLocation::Namespace(ns) => Api::namespaced_with(
            ctx.client.clone(),
            ns,
            &report_resource(api, ReportKind::Namespaced),
        ),
        ReportLocation::Cluster => Api::all_with(
            ctx.client.clone(),
            &report_resource(api, ReportKind::Cluster),
        ),
    }
}

/// Writes every Policy's reports and deletes the Gatehouse reports not written; the number
/// written. A Policy whose report could not be written gets the reason among its problems.
pub async fn write_reports(
    ctx: &AuditContext,
    audited: &mut [AuditedPolicy],
    tallies: &Tallies,
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) -> Result<usize, AuditError> {
    let served = served(&ctx.client).await.map_err(AuditError::Discovery)?;
    let api = chosen(ctx.config.report_api, served);
    if !served.serves(api) {
        warn!(
            api = %api.api_version(),
            "the API server does not serve the reports' API: install its CRDs (config/reports, config/openreports)"
        );
    }
    let written = apply_reports(ctx, api, audited, tallies, leader, pace).await?;
    delete_unwritten(ctx, api, audited, &written, leader, pace).await?;
    // The other API holds reports of an earlier choice: they go as they would in the chosen
    // one (a Policy whose write or LIST failed this pass keeps them), and only once the chosen
    // API is served, so that a pass that could write nothing removes nothing.
    let others = ReportApi::ALL.into_iter().filter(|a| *a != api);
    for other in others.filter(|o| served.serves(api) && served.serves(*o)) {
        delete_unwritten(ctx, other, audited, &BTreeSet::new(), leader, pace).await?;
    }
    Ok(written.len())
}

/// Applies every Policy's reports; the ones written, by scope and name.
async fn apply_reports(
    ctx: &AuditContext,
    api: ReportApi,
    audited: &mut [AuditedPolicy],
    tallies: &Tallies,
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) -> Result<BTreeSet<(ReportLocation, String)>, AuditError> {
    let mut written: BTreeSet<(ReportLocation, String)> = BTreeSet::new();
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for entry in audited.iter_mut() {
        let name = entry.name().to_string();
        let uid = entry.policy.metadata.uid.clone().unwrap_or_default();
        for (scope, tally) in tallies.get(&name).into_iter().flatten() {
            let report = report_object(api, &name, &uid, scope, tally);
            let report_name = report_name(&name);
            pace.wait().await;
            let applied = fenced(
                leader,
                || format!("report {report_name}"),
                reports_api(ctx, api, scope).patch(&report_name, &params, &Patch::Apply(&report)),
            )
            .await
            .map_err(|_| AuditError::NotLeading)?;
            match applied {
                Ok(_) => {
                    written.insert((scope.clone(), report_name));
                }
                Err(source) => {
                    let e = AuditError::WriteReport {
                        name: report_name,
                        source,
                    };
                    entry.transient_problem(&chain(&e).to_string());
                }
            }
        }
    }
    Ok(written)
}

/// Deletes the Gatehouse reports not `written`: of Policies gone, of scopes left without
/// matched objects, of Policies that no longer validate or cannot be audited as written; not of
/// a Policy this pass could not fully list or write (its last reports stand until a pass
/// succeeds).
async fn delete_unwritten(
    ctx: &AuditContext,
    api: ReportApi,
    audited: &[AuditedPolicy],
    written: &BTreeSet<(ReportLocation, String)>,
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) -> Result<(), AuditError> {
    let kept: BTreeSet<String> = audited
        .iter()
        .filter(|a| a.keeps_reports)
        .filter_map(|a| a.policy.metadata.uid.clone())
        .collect();
    let selector = format!(
        "{}={},{POLICY_UID_LABEL}",
        MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1
    );
    for kind in [ReportKind::Namespaced, ReportKind::Cluster] {
        let all: Api<DynamicObject> =
            Api::all_with(ctx.client.clone(), &report_resource(api, kind));
        let existing = match all
            .list_metadata(&ListParams::default().labels(&selector))
            .await
        {
            Ok(list) => list.items,
            // The report CRDs may not be installed: nothing to delete.
            Err(e) => {
                warn!(error = %chain(&e), kind = api.kind(kind), "listing reports");
                continue;
            }
        };
        for report in existing {
            let name = report.metadata.name.clone().unwrap_or_default();
            let scope = match (kind, report.metadata.namespace.clone()) {
                (ReportKind::Namespaced, Some(ns)) => ReportLocation::Namespace(ns),
                _ => ReportLocation::Cluster,
            };
            let owner = report
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(POLICY_UID_LABEL))
                .cloned()
                .unwrap_or_default();
            if written.contains(&(scope.clone(), name.clone())) || kept.contains(&owner) {
                continue;
            }
            pace.wait().await;
            let deleted = fenced(
                leader,
                || format!("report {name}"),
                reports_api(ctx, api, &scope).delete(&name, &DeleteParams::default()),
            )
            .await
            .map_err(|_| AuditError::NotLeading)?;
            match deleted {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(source) => {
                    let e = AuditError::DeleteReport { name, source };
                    warn!(error = %chain(&e), "deleting a stale report");
                }
            }
        }
    }
    Ok(())
}

/// Sets each Policy's `Audited` condition and `status.lastAuditTime`. A Policy changed since
/// the pass listed it is left for the pass its change brings forward.
pub async fn write_statuses(
    ctx: &AuditContext,
    audited: &[AuditedPolicy],
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for entry in audited {
        let condition = audited_condition(entry, now.clone());
        let patch_for = |current: &Policy| {
            let mut conditions = conditions_of(current);
            let previous = conditions.iter().position(|c| c.type_ == AUDITED);
            let condition = match previous.map(|i| conditions.remove(i)) {
                Some(old) if old.status == condition.status => Condition {
                    last_transition_time: old.last_transition_time,
                    ..condition.clone()
                },
                _ => condition.clone(),
            };
            conditions.push(condition);
            json!({"status": {"conditions": conditions, "lastAuditTime": now}})
        };
        if patch_status(ctx, &entry.policy, patch_for, leader, pace)
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Removes the `Audited` condition and `status.lastAuditTime` from Policies no pass judges any
/// more (no validate rules, or invalid).
pub async fn clear_statuses(
    ctx: &AuditContext,
    unaudited: &[Policy],
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) {
    for policy in unaudited {
        let patch_for = |current: &Policy| {
            let mut conditions = conditions_of(current);
            conditions.retain(|c| c.type_ != AUDITED);
            json!({"status": {"conditions": conditions, "lastAuditTime": null}})
        };
        if patch_status(ctx, policy, patch_for, leader, pace)
            .await
            .is_err()
        {
            return;
        }
    }
}

fn conditions_of(p: &Policy) -> Vec<Condition> {
    p.status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}

/// How often a status write is tried against a Policy whose status changed under it.
const STATUS_ATTEMPTS: usize = 3;

/// Merge-patches the status `patch_for` makes of `policy`, under its resourceVersion (conditions
/// are one list: a write must not drop the controller's). On a conflict (the controller wrote
/// since) the Policy is read again and `patch_for` asked again, unless its generation changed
/// since the pass judged it: the pass that change brings forward writes instead. `Err` when
/// leadership ended.
async fn patch_status(
    ctx: &AuditContext,
    policy: &Policy,
    patch_for: impl Fn(&Policy) -> serde_json::Value,
    leader: &watch::Receiver<Leadership>,
    pace: &mut Pace,
) -> Result<(), AuditError> {
    let api: Api<Policy> = Api::all(ctx.client.clone());
    let name = policy.metadata.name.clone().unwrap_or_default();
    let mut current = policy.clone();
    for _ in 0..STATUS_ATTEMPTS {
        if current.metadata.generation != policy.metadata.generation {
            return Ok(());
        }
        let mut patch = patch_for(&current);
        patch["metadata"] = json!({"resourceVersion": current.metadata.resource_version});
        pace.wait().await;
        let written = fenced(
            leader,
            || format!("status of Policy {name}"),
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map_err(|_| AuditError::NotLeading)?;
        match written {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                pace.wait().await;
                match api.get_opt(&name).await {
                    Ok(Some(fresh)) => current = fresh,
                    Ok(None) => return Ok(()),
                    Err(e) => {
                        warn!(policy = %name, error = %chain(&e), "reading a Policy to write its audit status");
                        return Ok(());
                    }
                }
            }
            Err(e) => {
                warn!(policy = %name, error = %chain(&e), "writing the audit status");
                return Ok(());
            }
        }
    }
    warn!(policy = %name, "the audit status was not written: the Policy kept changing");
    Ok(())
}

/// The `Audited` condition a pass gives `entry`.
fn audited_condition(entry: &AuditedPolicy, now: Time) -> Condition {
    let (status, reason, message) = if entry.problems.is_empty() {
        (
            "True",
            "Audited",
            format!(
                "the last audit pass judged {} stored objects it matches",
                entry.matched
            ),
        )
    } else {
        (
            "False",
            "NotAudited",
            format!(
                "the last audit pass judged {} stored objects it matches, but not all: {}",
                entry.matched,
                entry.problems.join("; ")
            ),
        )
    };
    Condition {
        type_: AUDITED.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: entry.policy.metadata.generation,
        last_transition_time: now,
    }
}
