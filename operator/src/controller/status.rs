//! Policy status as a pure function of what the reconcile decided.
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use gatehouse_api::v1alpha1::{EnforcementPoint, Policy, PolicyStatus};

/// Condition type saying whether the Policy is wired into the webhook configurations.
pub const READY: &str = "Ready";
/// Reason of a Policy that failed `validate()`.
pub const REASON_INVALID: &str = "InvalidSpec";
/// Reason of a wired Policy.
pub const REASON_WIRED: &str = "Wired";
/// Reason of a Policy whose entries the API server refused although `validate()` passed.
pub const REASON_REJECTED: &str = "RejectedByAPIServer";
/// Reason of a Policy the API server enforces in-process.
pub const REASON_IN_PROCESS: &str = "InProcess";
/// Reason of a valid Policy with nothing to do at admission (companion objects only).
pub const REASON_EFFECTS_ONLY: &str = "EffectsOnly";
/// Reason of a Policy that asks to run in-process and cannot.
pub const REASON_NOT_IN_PROCESS: &str = "CannotRunInProcess";

/// What the reconcile made of one Policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Valid and present in the applied configurations: matched by Gatehouse inside a shared
    /// entry, or (`own_entry`, its conditions read `authorizer`) by the API server in an entry of
    /// its own.
    Wired {
        own_entry: bool,
        /// Why it does not run in-process.
        webhook_because: String,
    },
    /// Enforced by the API server itself, as `generated` (the generated objects, by kind and
    /// name); `type_warnings`: what the API server's type checking says of them.
    InProcess {
        generated: String,
        type_warnings: Option<String>,
    },
    /// Valid, with nothing to do at admission: its companion objects are the effects loop's.
    EffectsOnly,
    /// `enforcement: InProcess`, and this is why it cannot be: enforced nowhere.
    NotInProcess(String),
    /// Invalid: every problem, each with its field path.
    Invalid(Vec<String>),
    /// Valid, but the API server refused the configuration with its entries: the API server's
    /// message. Left out so that it cannot block the other Policies.
    Rejected(String),
}

/// What the `Ready` condition says of a verdict.
struct Ready {
    status: &'static str,
    reason: &'static str,
    message: String,
}

/// The `Ready` condition's status, reason and message for `outcome`.
fn ready(policy: &Policy, outcome: &Verdict) -> Ready {
    let (status, reason, message) = match outcome {
        // Stable texts: naming the shared entry would rewrite every member's status whenever
        // the membership changes.
        Verdict::Wired {
            own_entry: false,
            webhook_because,
        } => (
            "True",
            REASON_WIRED,
            format!(
                "wired into the Gatehouse webhook configurations: Gatehouse matches it inside a \
                 shared webhook entry (not in-process: {webhook_because})"
            ),
        ),
        Verdict::Wired {
            own_entry: true,
            webhook_because,
        } => (
            "True",
            REASON_WIRED,
            format!(
                "wired into the Gatehouse webhook configurations in its own webhook entry {}: \
                 its match conditions use authorizer, which only the API server can evaluate \
                 (not in-process: {webhook_because})",
                gatehouse_engine::entry::entry_name(
                    policy.metadata.name.as_deref().unwrap_or_default()
                )
            ),
        ),
        Verdict::InProcess {
            generated,
            type_warnings,
        } => (
            "True",
            REASON_IN_PROCESS,
            format!(
                "enforced in-process by the API server as {generated}{}",
                type_warnings
                    .as_ref()
                    .map(|w| format!(" ({w}; a warning: the API server enforces it all the same)"))
                    .unwrap_or_default()
            ),
        ),
        Verdict::EffectsOnly => (
            "True",
            REASON_EFFECTS_ONLY,
            "nothing runs at admission: the effects loop keeps this Policy's companion objects \
             (see the CompanionsInPlace condition)"
                .to_string(),
        ),
        Verdict::NotInProcess(reason) => (
            "False",
            REASON_NOT_IN_PROCESS,
            format!("spec.enforcement is InProcess, which this Policy cannot be: {reason}"),
        ),
        Verdict::Invalid(problems) => ("False", REASON_INVALID, problems.join("; ")),
        Verdict::Rejected(message) => (
            "False",
            REASON_REJECTED,
            format!(
                "the API server refused this Policy's webhook entries or generated admission \
                 policy, so they are left out: {message}"
            ),
        ),
    };
    Ready {
        status,
        reason,
        message,
    }
}

/// The status the Policy should have, or `None` when what it has already says the same (so an
/// unchanged Policy costs no write). `lastTransitionTime` moves only when the status flips.
pub fn desired_status(policy: &Policy, outcome: &Verdict, now: Time) -> Option<PolicyStatus> {
    let generation = policy.metadata.generation;
    let Ready {
        status,
        reason,
        message,
    } = ready(policy, outcome);
    let enforcement = match outcome {
        Verdict::Wired { .. } => Some(EnforcementPoint::Webhook),
        Verdict::InProcess { .. } => Some(EnforcementPoint::InProcess),
        _ => None,
    };
    let current = policy.status.as_ref();
    let previous = current.and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    if let Some(prev) = previous
        && current.and_then(|s| s.enforcement) == enforcement
        && prev.status == status
        && prev.reason == reason
        && prev.message == message
        && prev.observed_generation == generation
        && current.and_then(|s| s.observed_generation) == generation
    {
        return None;
    }
    let last_transition_time = match previous {
        Some(prev) if prev.status == status => prev.last_transition_time.clone(),
        _ => now,
    };
    let mut conditions: Vec<Condition> = current
        .map(|s| {
            s.conditions
                .iter()
                .filter(|c| c.type_ != READY)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    conditions.push(Condition {
        type_: READY.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    });
    // The audit's time is the audit's to write (a merge patch leaves it as it is).
    Some(PolicyStatus {
        observed_generation: generation,
        conditions,
        enforcement,
        last_audit_time: None,
        companions: None,
        calls: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gatehouse_api::v1alpha1::PolicySpec;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    fn policy(generation: i64, status: Option<PolicyStatus>) -> Policy {
        let mut p = Policy::new("p", PolicySpec::default());
        p.metadata.generation = Some(generation);
        p.status = status;
        p
    }

    /// The status to write, if any, for `p` wired in a shared entry at `now`.
    fn wired_status(p: Policy, now: Time) -> Option<PolicyStatus> {
        desired_status(
            &p,
            &Verdict::Wired {
                own_entry: false,
                webhook_because: "spec.enforcement is Webhook".into(),
            },
            now,
        )
    }

    #[test]
    fn invalid_lists_every_problem_and_is_not_ready() {
        let out = Verdict::Invalid(vec!["spec.a: bad".into(), "spec.b: worse".into()]);
        let s = desired_status(&policy(3, None), &out, at(10)).unwrap();
        assert_eq!(s.observed_generation, Some(3));
        let c = &s.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert_eq!(c.message, "spec.a: bad; spec.b: worse");
        assert_eq!(c.observed_generation, Some(3));
    }

    #[test]
    fn unchanged_status_needs_no_write_and_keeps_transition_time() {
        let first = wired_status(policy(1, None), at(10)).unwrap();
        assert!(wired_status(policy(1, Some(first.clone())), at(20)).is_none());
        // New generation, same truth: rewritten, but the transition time stays.
        let second = wired_status(policy(2, Some(first)), at(30)).unwrap();
        assert_eq!(second.observed_generation, Some(2));
        assert_eq!(second.conditions[0].last_transition_time, at(10));
    }

    #[test]
    fn rejected_carries_the_api_servers_message() {
        let out = Verdict::Rejected("webhooks[1].matchConditions[0].expression: Invalid".into());
        let s = desired_status(&policy(4, None), &out, at(10)).unwrap();
        let c = &s.conditions[0];
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "RejectedByAPIServer")
        );
        assert!(
            c.message
                .ends_with("webhooks[1].matchConditions[0].expression: Invalid")
        );
    }

    #[test]
    fn flipping_moves_the_transition_time() {
        let wired = wired_status(policy(1, None), at(10)).unwrap();
        let bad = desired_status(
            &policy(2, Some(wired)),
            &Verdict::Invalid(vec!["x: y".into()]),
            at(50),
        )
        .unwrap();
        assert_eq!(bad.conditions.len(), 1);
        assert_eq!(bad.conditions[0].last_transition_time, at(50));
    }
}
