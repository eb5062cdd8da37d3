use serde_json::json;

use super::*;
use crate::controller::wiring::Endpoint;
use crate::controller::wiring::probe::{PROBE_LABEL, probe, probe_message};

fn wiring() -> Wiring {
    Wiring {
        endpoint: Endpoint::Url {
            base: "https://127.0.0.1:8443".into(),
        },
        excluded_namespaces: vec!["kube-system".into(), "gatehouse-system".into()],
        home_namespace: "gatehouse-system".into(),
        owner_cluster_role: None,
        owner: None,
        max_admission_policies:
            crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES,
    }
}

fn policy(name: &str, spec: serde_json::Value) -> Policy {
    let mut full = json!({
        "match": {
            "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}],
        },
    });
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        for (k, v) in extra {
            full.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": name}, "spec": full,
    }))
    .unwrap()
}

fn json_of<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap()
}

#[test]
fn a_deny_policy_becomes_a_policy_and_a_deny_binding_with_every_match_field() {
    let p = policy(
        "limits",
        json!({
            "failurePolicy": "Ignore",
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": ["", "apps"], "apiVersions": ["v1"], "resources": ["pods", "deployments/scale"], "scope": "*"}],
                "namespaceSelector": {"matchLabels": {"team": "a"}},
                "objectSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                "conditions": [{"name": "not-dry", "expression": "request.dryRun != true"}],
            },
            "validate": [
                {"expression": "has(object.spec)", "message": "needs a spec"},
                {"expression": "object.metadata.name.size() < 20", "message": "name too long"},
            ],
        }),
    );
    let generated = validating_admission_policy(&p, &wiring()).unwrap();
    assert_eq!(
        json_of(&generated.policy),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {
                "name": "gatehouse-limits",
                "labels": {"app.kubernetes.io/managed-by": "gatehouse", "gatehouse.dev/generated": "validating"},
                "annotations": {"gatehouse.dev/policy": "limits"},
            },
            "spec": {
                "failurePolicy": "Ignore",
                "matchConditions": [{"name": "not-dry", "expression": "request.dryRun != true"}],
                "matchConstraints": {
                    "matchPolicy": "Equivalent",
                    "namespaceSelector": {
                        "matchLabels": {"team": "a"},
                        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gatehouse-system", "kube-system"]}],
                    },
                    "objectSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                    "resourceRules": [{"operations": ["CREATE"], "apiGroups": ["", "apps"], "apiVersions": ["v1"], "resources": ["pods", "deployments/scale"], "scope": "*"}],
                },
                "validations": [
                    {"expression": "has(object.spec)", "message": "needs a spec", "reason": "Forbidden"},
                    {"expression": "object.metadata.name.size() < 20", "message": "name too long", "reason": "Forbidden"},
                ],
            },
        })
    );
    assert_eq!(
        json_of(&generated.binding),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": generated.policy.metadata.clone(),
            "spec": {"policyName": "gatehouse-limits", "validationActions": ["Deny"]},
        })
    );
}

#[test]
fn a_warn_policy_is_bound_to_warn_when_its_errors_are_ignored() {
    let p = policy(
        "advice",
        json!({"failurePolicy": "Ignore", "validate": [{"expression": "true", "message": "m", "action": "Warn"}]}),
    );
    let generated = validating_admission_policy(&p, &wiring()).unwrap();
    let binding = generated.binding.spec;
    assert_eq!(binding.validation_actions, ["Warn"]);
    // No selector of the user's: the exclusion alone.
    let constraints = generated.policy.spec.unwrap().match_constraints.unwrap();
    assert_eq!(
        json_of(&constraints.namespace_selector),
        json!({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["gatehouse-system", "kube-system"]}]})
    );
    assert_eq!(json_of(&constraints.object_selector), json!({}));
}

#[test]
fn what_the_api_server_would_answer_differently_stays_on_the_webhook_with_the_reason() {
    let cases = [
        (
            json!({"mutate": [{"merge": {"metadata": {"labels": {"a": "b"}}}}]}),
            "spec.mutate",
        ),
        (
            json!({"effects": [{"ipam": {"pool": "p"}}], "validate": [{"expression": "true", "message": "m"}]}),
            "spec.effects",
        ),
        (
            json!({"validate": [{"expression": "true", "message": "m"}, {"expression": "true", "message": "w", "action": "Warn"}]}),
            "spec.validate[1].action",
        ),
        (
            json!({"validate": [{"expression": "true", "message": "ok"}, {"expression": "true", "message": "two\nlines"}]}),
            "spec.validate[1].message",
        ),
        (
            json!({"validate": [{"expression": "true", "message": "  "}]}),
            "spec.validate[0].message",
        ),
    ];
    for (spec, field) in cases {
        let p = policy("p", spec.clone());
        let reason = validating_admission_policy(&p, &wiring()).unwrap_err();
        assert!(reason.starts_with(field), "{spec}: {reason}");
    }
}

#[test]
fn generated_names_fit_the_api_servers_limit_and_stay_distinct() {
    assert_eq!(generated_name("short"), "gatehouse-short");
    let a = format!("{}a", "x".repeat(252));
    let b = format!("{}b", "x".repeat(252));
    let (na, nb) = (generated_name(&a), generated_name(&b));
    assert!(na.len() <= 253 && nb.len() <= 253, "{na} {nb}");
    assert_ne!(na, nb);
    assert_eq!(na, generated_name(&a));
    assert!(na.starts_with("gatehouse-xxx"));
}

#[test]
fn the_probe_denies_only_its_own_lease() {
    let probe = probe("t-42", "gatehouse-system", &wiring());
    let spec = json_of(&probe.policy.spec);
    assert_eq!(
        spec["matchConditions"][0]["expression"],
        r#"object.metadata.name == "t-42""#
    );
    assert_eq!(
        spec["matchConstraints"]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "gatehouse-system"
    );
    assert_eq!(spec["validations"][0]["message"], probe_message("t-42"));
    let binding = json_of(&probe.binding.spec);
    assert_eq!(
        binding["matchResources"]["objectSelector"]["matchLabels"][PROBE_LABEL],
        "t-42"
    );
    assert_eq!(binding["validationActions"], json!(["Deny"]));
}

#[test]
fn auto_runs_in_process_where_it_can_and_says_why_not_elsewhere() {
    let deny = json!([{"expression": "true", "message": "m"}]);
    let warn_fail = json!([{"expression": "true", "message": "m", "action": "Warn"}]);
    let w = wiring();
    let policy = |enforcement: &str, validate: serde_json::Value| {
        policy(
            "p",
            json!({"enforcement": enforcement, "validate": validate}),
        )
    };
    assert!(matches!(
        place(&policy("Auto", deny.clone()), &w, true),
        Placement::InProcess(_)
    ));
    // A Warn rule never refuses, on either path: with Fail too, it runs in-process.
    let Placement::InProcess(objects) = place(&policy("Auto", warn_fail.clone()), &w, true) else {
        panic!("a Warn Policy stays on the webhook");
    };
    assert_eq!(objects.binding.spec.validation_actions, ["Warn"]);
    assert!(matches!(
        place(&policy("Auto", deny.clone()), &w, false),
        Placement::Webhook(r) if r.contains("does not serve")
    ));
    assert!(matches!(
        place(&policy("Webhook", deny.clone()), &w, true),
        Placement::Webhook(r) if r == "spec.enforcement is Webhook"
    ));
    assert!(matches!(
        place(&policy("InProcess", deny.clone()), &w, true),
        Placement::InProcess(_)
    ));
    assert!(matches!(
        place(&policy("InProcess", warn_fail), &w, true),
        Placement::InProcess(_)
    ));
    assert!(matches!(
        place(&policy("InProcess", deny), &w, false),
        Placement::Refused(r) if r.contains("does not serve")
    ));
}

#[test]
fn type_checking_warnings_count_only_at_the_current_generation() {
    let p = policy(
        "typed",
        json!({"validate": [{"expression": "object.spec.nope == 1", "message": "m"}]}),
    );
    let mut stored = validating_admission_policy(&p, &wiring()).unwrap().policy;
    stored.metadata.generation = Some(2);
    assert_eq!(type_check_warnings(&stored), None);
    let status = |generation: i64| {
        serde_json::from_value(json!({
            "observedGeneration": generation,
            "typeChecking": {"expressionWarnings": [
                {"fieldRef": "spec.validations[0].expression", "warning": "apps/v1, Kind=Pod: ERROR: undefined field 'nope'"},
            ]},
        }))
        .unwrap()
    };
    stored.status = Some(status(1));
    assert_eq!(
        type_check_warnings(&stored),
        None,
        "an earlier generation's"
    );
    stored.status = Some(status(2));
    assert_eq!(
        type_check_warnings(&stored).as_deref(),
        Some(
            "the API server's type checking of ValidatingAdmissionPolicy gatehouse-typed: \
             spec.validations[0].expression: apps/v1, Kind=Pod: ERROR: undefined field 'nope'"
        )
    );
    stored.status =
        Some(serde_json::from_value(json!({"observedGeneration": 2, "typeChecking": {}})).unwrap());
    assert_eq!(
        type_check_warnings(&stored),
        None,
        "checked, and nothing found"
    );
}
