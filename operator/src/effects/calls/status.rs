//! The status step: `status.calls` and the `CallsApplied` condition of every live Policy with
//! call effects, written when they changed, under the Policy's resourceVersion.
use crate::policies::PolicyObject;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use super::plan::Plan;
use super::{CallsContext, CallsError};
use crate::effects::condition::{Said, first_five, replaced};
use crate::runtime::lease::Leadership;
use crate::runtime::reconcile::fenced;
use gatehouse_api::v1alpha1::{CALLS_CONDITION, CallCounts, Policy};

/// Writes the calls status of each Policy `plan` counted, where it changed.
pub async fn write_all(
    ctx: &CallsContext,
    policies: &[Arc<Policy>],
    plan: &Plan,
    leader: &watch::Receiver<Leadership>,
) -> Result<(), CallsError> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    for policy in policies {
        let Some(counts) = plan.counts.get(&policy.name_any()) else {
            continue;
        };
        let refused = plan
            .refused
            .get(&policy.name_any())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let Some(conditions) = calls_conditions(policy, *counts, refused, now.clone()) else {
            continue;
        };
        let name = policy.name_any();
        let patch = json!({
            "metadata": {"resourceVersion": policy.resource_version()},
            "status": {"conditions": conditions, "calls": counts},
        });
        let object = PolicyObject::of(&ctx.client, policy);
        let written = fenced(
            leader,
            || format!("calls status of {}", object.source()),
            object.patch_status(&patch),
        )
        .await?;
        match written {
            Ok(_) => {}
            // Changed or gone meanwhile: the next pass sees it as it is now.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                return Err(CallsError::WriteStatus {
                    policy: name,
                    why: e.to_string(),
                });
            }
        }
    }
    Ok(())
}

/// The Policy's conditions with `CallsApplied` saying what `counts` and `refused` say, or
/// `None` when its status says so already.
fn calls_conditions(
    policy: &Policy,
    counts: CallCounts,
    refused: &[String],
    now: Time,
) -> Option<Vec<Condition>> {
    let status = policy.status.clone().unwrap_or_default();
    let applied = format!("{} of {} calls applied", counts.applied, counts.wanted);
    let said = if !refused.is_empty() {
        Said {
            type_: CALLS_CONDITION,
            status: "False",
            reason: "Refused",
            message: first_five(refused),
        }
    } else if counts.applied < counts.wanted {
        Said {
            type_: CALLS_CONDITION,
            status: "False",
            reason: "Pending",
            message: applied,
        }
    } else {
        Said {
            type_: CALLS_CONDITION,
            status: "True",
            reason: "Applied",
            message: applied,
        }
    };
    let unchanged = status.calls == Some(counts);
    replaced(
        &status.conditions,
        said,
        policy.meta().generation,
        unchanged,
        now,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::{PolicySpec, PolicyStatus};
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("time"))
    }

    #[test]
    fn the_condition_says_pending_refused_or_applied_and_is_written_only_on_change() {
        let mut policy = Policy::new("p", PolicySpec::default());
        policy.metadata.generation = Some(4);
        let counts = |wanted, applied, failed| CallCounts {
            wanted,
            applied,
            failed,
        };
        let pending = calls_conditions(&policy, counts(3, 1, 0), &[], at(1)).expect("written");
        assert_eq!(
            (pending[0].status.as_str(), pending[0].reason.as_str()),
            ("False", "Pending")
        );
        assert_eq!(pending[0].message, "1 of 3 calls applied");
        let refused = ["Pod a/b: HTTP 403: no".to_string()];
        let failed = calls_conditions(&policy, counts(3, 2, 1), &refused, at(2)).expect("written");
        assert_eq!(failed[0].reason, "Refused");
        assert_eq!(failed[0].message, "Pod a/b: HTTP 403: no");
        policy.status = Some(PolicyStatus {
            conditions: calls_conditions(&policy, counts(3, 3, 0), &[], at(3)).expect("written"),
            calls: Some(counts(3, 3, 0)),
            ..Default::default()
        });
        let status = policy.status.as_ref().expect("status");
        assert_eq!(status.conditions[0].status, "True");
        assert_eq!(
            calls_conditions(&policy, counts(3, 3, 0), &[], at(4)),
            None,
            "unchanged: no write"
        );
    }
}
