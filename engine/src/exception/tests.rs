use serde_json::{Value, json};

use super::*;
use crate::admission::parse_request;
use crate::chain;
use crate::matcher::Namespace;

fn request(operation: &str, name: &str, namespace: &str, labels: Value) -> Request {
    let object = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let mut r = json!({
        "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": name, "namespace": namespace, "operation": operation,
        "userInfo": {"username": "alice"},
    });
    if operation == "DELETE" {
        r["oldObject"] = object;
    } else {
        r["object"] = object;
    }
    let review =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r});
    parse_request(review.to_string().as_bytes()).unwrap()
}

fn exception(spec: Value) -> PolicyException {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "PolicyException",
        "metadata": {"name": "legacy", "namespace": "gatehouse"},
        "spec": spec,
    }))
    .unwrap()
}

fn team_policy() -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": "team"},
        "spec": {
            "match": {"rules": [{"operations": ["CREATE", "DELETE"], "apiGroups": [""],
                                 "apiVersions": ["v1"], "resources": ["pods"]}]},
            "validate": [
                {"expression": "object == null || 'team' in object.metadata.labels", "message": "needs team"},
                {"expression": "object == null || 'owner' in object.metadata.labels", "message": "needs owner"},
            ],
        },
    }))
    .unwrap()
}

/// What the engine answers `req` with `policy` exempted by `exceptions`.
fn allowed(exceptions: &[PolicyException], req: &Request) -> (bool, String) {
    let honoured: Vec<&PolicyException> = exceptions.iter().collect();
    let policy = exempted(&team_policy(), &exemptions_of("team", &honoured));
    let compiled = crate::compile(&policy).expect("the exempted Policy compiles");
    let outcome = chain::admit(req, &[&compiled], Namespace::Assumed);
    (
        outcome.response.allowed(),
        outcome.response.message().unwrap_or_default().to_string(),
    )
}

#[test]
fn a_whole_policy_exemption_covers_exactly_what_it_matches() {
    let by_name = exception(
        json!({"policies": ["team"], "match": {"namespaces": ["shop"], "names": ["legacy"]}}),
    );
    let exceptions = [by_name];
    let bare = json!({"app": "x"});
    assert!(
        allowed(
            &exceptions,
            &request("CREATE", "legacy", "shop", bare.clone())
        )
        .0
    );
    assert!(
        !allowed(
            &exceptions,
            &request("CREATE", "other", "shop", bare.clone())
        )
        .0
    );
    assert!(!allowed(&exceptions, &request("CREATE", "legacy", "elsewhere", bare)).0);
}

#[test]
fn a_rule_exemption_leaves_the_other_rules() {
    let first_rule = exception(json!({"policies": ["team"], "rules": [0],
        "match": {"objectSelector": {"matchLabels": {"legacy": "yes"}}}}));
    let (ok, message) = allowed(
        &[first_rule],
        &request("CREATE", "web", "shop", json!({"legacy": "yes"})),
    );
    assert!(!ok);
    assert!(
        message.contains("needs owner") && !message.contains("needs team"),
        "{message}"
    );
}

#[test]
fn selectors_match_as_label_selectors_do() {
    let selector =
        |s: Value| exception(json!({"policies": ["team"], "match": {"objectSelector": s}}));
    let cases = [
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}),
            json!({"tier": "b"}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}),
            json!({"tier": "b"}),
            false,
        ),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]}),
            json!({}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            json!({"tier": ""}),
            true,
        ),
        (
            json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
            json!({"tier": "a"}),
            false,
        ),
        (
            json!({"matchLabels": {"quote\"d": "v"}}),
            json!({"quote\"d": "v"}),
            true,
        ),
    ];
    for (s, labels, exempt) in cases {
        let req = request("CREATE", "web", "shop", labels.clone());
        assert_eq!(
            allowed(&[selector(s.clone())], &req).0,
            exempt,
            "{s} on {labels}"
        );
        let compiled =
            CompiledExemption::new(exemptions_of("team", &[&selector(s.clone())]).remove(0))
                .unwrap();
        assert_eq!(compiled.holds(&req), exempt, "audit: {s} on {labels}");
    }
    // On DELETE, the old object's labels.
    let on_delete = selector(json!({"matchLabels": {"tier": "a"}}));
    let compiled = CompiledExemption::new(exemptions_of("team", &[&on_delete]).remove(0)).unwrap();
    assert!(compiled.holds(&request("DELETE", "web", "shop", json!({"tier": "a"}))));
}

#[test]
fn other_policies_are_untouched_and_condition_names_are_distinct() {
    let e = exception(json!({"policies": ["other"], "match": {"names": ["x"]}}));
    assert!(exemptions_of("team", &[&e]).is_empty());
    assert_ne!(condition_name("a/b"), condition_name("a/c"));
    assert!(condition_name(&"x".repeat(300)).len() <= 63);
}

#[test]
fn whole_policy_exemptions_are_one_condition_and_an_unknown_operator_exempts_nothing() {
    let a = exception(json!({"policies": ["team"], "match": {"names": ["a"]}}));
    let mut b = exception(json!({"policies": ["team"], "match": {"names": ["b"]}}));
    b.metadata.name = Some("other".into());
    let policy = exempted(&team_policy(), &exemptions_of("team", &[&a, &b]));
    assert_eq!(policy.spec.match_.conditions.len(), 1);
    let odd = exception(json!({"policies": ["team"], "match": {"objectSelector":
        {"matchExpressions": [{"key": "tier", "operator": "Gt", "values": ["1"]}]}}}));
    let req = request("CREATE", "web", "shop", json!({}));
    assert!(!allowed(&[odd], &req).0, "an unknown operator exempted");
}
