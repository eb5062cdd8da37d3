use std::collections::BTreeSet;

use chrono::TimeZone;
use serde_json::json;

use super::*;
use crate::audit::judge::{AuditedKind, audit_copy};
use gatehouse_api::v1alpha1::{CallEffect, Effect, Policy, PolicySpec, Rule};

fn pod_kind() -> AuditedKind {
    AuditedKind {
        group: String::new(),
        version: "v1".into(),
        kind: "Pod".into(),
        resource: "pods".into(),
        namespaced: true,
    }
}

fn live(gate: bool, pods: &[serde_json::Value]) -> LivePolicy {
    let mut policy = Policy::new(
        "register",
        PolicySpec {
            effects: vec![Effect {
                call: Some(CallEffect {
                    url: "https://r.example/hook".into(),
                    timeout_seconds: 5,
                    gate,
                    ..CallEffect::default()
                }),
                ..Effect::default()
            }],
            ..PolicySpec::default()
        },
    );
    policy.spec.match_.rules = vec![Rule {
        operations: vec![gatehouse_api::v1alpha1::Operation::Create],
        api_groups: vec![String::new()],
        api_versions: vec!["v1".into()],
        resources: vec!["pods".into()],
        ..Rule::default()
    }];
    policy.metadata.uid = Some("p-uid".into());
    policy.metadata.generation = Some(3);
    LivePolicy {
        name: "register".into(),
        uid: "p-uid".into(),
        generation: 3,
        matcher: audit_copy(&policy).expect("auditable"),
        calls: vec![LiveCall {
            index: 0,
            url: "https://r.example/hook".into(),
            gate,
        }],
        triggers: vec![TriggerObjects {
            kind: pod_kind(),
            objects: pods.iter().map(|p| Arc::from(p.to_string())).collect(),
        }],
    }
}

fn pod(uid: &str, gated: bool) -> serde_json::Value {
    let gates = if gated {
        json!([{"name": "other"}, {"name": CALLS_GATE}])
    } else {
        json!([])
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{uid}"), "namespace": "team", "uid": uid},
        "spec": {"schedulingGates": gates}})
}

fn record(object_uid: &str, state: CallState, attempts: i64) -> Arc<Record> {
    Arc::new(Record {
        name: call_record_name(&call_key(object_uid, "p-uid", 0)),
        uid: format!("r-{object_uid}"),
        key: call_key(object_uid, "p-uid", 0),
        policy: "register".into(),
        policy_uid: "p-uid".into(),
        effect: 0,
        url: "https://r.example/hook".into(),
        object: Owner {
            api_version: "v1".into(),
            kind: "Pod".into(),
            namespace: "team".into(),
            name: format!("pod-{object_uid}"),
            uid: object_uid.into(),
        },
        state,
        attempts,
        next_attempt: None,
        failed_generation: None,
        result: None,
        last_error: None,
    })
}

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 7, 12, 0, 0)
        .single()
        .expect("time")
}

fn plan_with(policies: &[LivePolicy], records: &[Arc<Record>]) -> Plan {
    let labels = |_: &str| Some(std::collections::BTreeMap::new());
    let unplanned = BTreeSet::new();
    plan(
        policies,
        &World {
            namespaces: &labels,
            records,
            unplanned: &unplanned,
            now: now(),
            left_gated: &[],
            gating_unplanned: false,
        },
    )
}

use gatehouse_api::v1alpha1::call_record_name;

#[test]
fn a_new_object_is_applied_once_and_an_applied_one_is_left_alone() {
    let policy = live(false, &[pod("a", false), pod("b", false)]);
    let plan = plan_with(&[policy], &[record("b", CallState::Applied, 1)]);
    assert_eq!(plan.send.len(), 1);
    let send = &plan.send[0];
    assert_eq!(send.action, Action::Apply);
    assert_eq!(send.key, "a/p-uid/0");
    assert!(send.record.is_none(), "a first call makes its record first");
    assert!(send.snapshot.is_some());
    let counts = plan.counts["register"];
    assert_eq!((counts.wanted, counts.applied), (2, 1));
}

#[test]
fn a_gone_object_is_released_and_a_call_refused_on_its_only_try_is_dropped() {
    let policy = live(false, &[]);
    let records = [
        record("gone", CallState::Applied, 1),
        record("pending", CallState::Pending, 2),
        record("refused", CallState::Failed, 1),
    ];
    let plan = plan_with(&[policy], &records);
    let released: BTreeSet<&str> = plan
        .send
        .iter()
        .filter(|s| s.action == Action::Release)
        .map(|s| s.object.uid.as_str())
        .collect();
    assert_eq!(released, BTreeSet::from(["gone", "pending"]));
    assert!(plan.send.iter().all(|s| s.snapshot.is_none()));
    assert_eq!(plan.drop.len(), 1);
    assert_eq!(plan.drop[0].object.uid, "refused");
}

#[test]
fn a_retry_waits_for_its_time_and_a_refusal_waits_for_a_new_generation() {
    let policy = live(false, &[pod("later", false), pod("refused", false)]);
    let mut later = (*record("later", CallState::Pending, 1)).clone();
    let at = now() + chrono::Duration::seconds(7);
    later.next_attempt = Some(at);
    let mut refused = (*record("refused", CallState::Failed, 1)).clone();
    refused.failed_generation = Some(3);
    let plan = plan_with(&[policy], &[Arc::new(later), Arc::new(refused.clone())]);
    assert!(plan.send.is_empty(), "{:?}", plan.send);
    assert_eq!(plan.next, Some(at));
    refused.failed_generation = Some(2);
    let policy = live(false, &[pod("refused", false)]);
    let plan = plan_with(&[policy], &[Arc::new(refused)]);
    assert_eq!(plan.send.len(), 1, "a changed Policy tries again");
}

#[test]
fn a_gated_pod_leaves_the_gate_only_once_its_call_is_applied() {
    let policy = live(true, &[pod("waits", true), pod("done", true)]);
    let plan = plan_with(
        &[policy],
        &[
            record("waits", CallState::Pending, 1),
            record("done", CallState::Applied, 1),
        ],
    );
    let opened: Vec<&str> = plan.ungate.iter().map(|p| p.uid.as_str()).collect();
    assert_eq!(opened, ["done"]);
    assert_eq!(plan.ungate[0].gate_index, 1);
}

#[test]
fn a_pass_sends_at_most_its_share() {
    let pods: Vec<_> = (0..SENDS_PER_PASS + 5)
        .map(|i| pod(&format!("u{i}"), false))
        .collect();
    let plan = plan_with(&[live(false, &pods)], &[]);
    assert_eq!(plan.send.len(), SENDS_PER_PASS);
    assert!(plan.more);
}

#[test]
fn a_pod_a_going_policy_left_at_the_gate_is_let_go_unless_a_live_one_gates_it() {
    let left = TriggerObjects {
        kind: pod_kind(),
        objects: vec![
            Arc::from(pod("orphan", true).to_string()),
            Arc::from(pod("held", true).to_string()),
        ],
    };
    let labels = |_: &str| Some(std::collections::BTreeMap::new());
    let unplanned = BTreeSet::new();
    let live_policy = live(true, &[pod("held", true)]);
    let records = [record("held", CallState::Pending, 1)];
    let world = |gating_unplanned| World {
        namespaces: &labels,
        records: &records,
        unplanned: &unplanned,
        now: now(),
        left_gated: std::slice::from_ref(&left),
        gating_unplanned,
    };
    let plan_of =
        |gating_unplanned| plan(std::slice::from_ref(&live_policy), &world(gating_unplanned));
    let opened: Vec<String> = plan_of(false)
        .ungate
        .iter()
        .map(|p| p.uid.clone())
        .collect();
    assert_eq!(opened, ["orphan"]);
    assert!(
        plan_of(true).ungate.is_empty(),
        "a gating Policy unplanned: nobody leaves"
    );
}
