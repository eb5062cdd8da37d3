//! A shared entry's members as one chain: order, one working copy, per-member matching and
//! failurePolicy, and what each member did.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use std::collections::BTreeMap;

use gatehouse_api::v1alpha1::{Policy, ReinvocationPolicy};
use gatehouse_engine::chain::{self, Decision, Matching};
use gatehouse_engine::{
    CompiledPolicy, Namespace, Phase, Request, Response, admit_one, compile, parse_request,
};
use serde_json::{Value, json};

fn policy(name: &str, spec: Value) -> CompiledPolicy {
    let mut spec = spec;
    if spec.get("match").is_none() {
        spec["match"] = json!({"rules": [{"operations": ["CREATE", "UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]});
    }
    let p: Policy = serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("test Policy decodes");
    compile(&p).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn request(operation: &str, labels: Value) -> Request {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": labels}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}});
    let mut r = json!({
        "uid": "uid-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "web", "namespace": "shop", "operation": operation,
    });
    match operation {
        "DELETE" => r["oldObject"] = pod,
        "UPDATE" => {
            r["object"] = pod.clone();
            r["oldObject"] = pod;
        }
        _ => r["object"] = pod,
    }
    let body =
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r});
    parse_request(body.to_string().as_bytes()).expect("test review parses")
}

const ASSUMED: Matching<'static> = Matching {
    namespace: Namespace::Assumed,
    matched: false,
};

fn decisions<'a>(outcome: &chain::Outcome<'a>) -> Vec<(&'a str, Decision)> {
    outcome
        .evaluated
        .iter()
        .map(|e| (e.policy.name(), e.decision))
        .collect()
}

fn label(req: &Request, outcome: &chain::Outcome<'_>, key: &str) -> Option<String> {
    outcome.object(req)?["metadata"]["labels"][key]
        .as_str()
        .map(str::to_string)
}

#[test]
fn members_run_in_order_on_one_working_copy_and_answer_with_one_patch() {
    let first = policy(
        "a-first",
        json!({"mutate": [{"merge": {"metadata": {"labels": {"stage": "one"}}}}]}),
    );
    // Matches only what the first one produced: it sees the working copy, not the original.
    let second = policy(
        "b-second",
        json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": [{"name": "after-first", "expression": "object.metadata.labels.stage == 'one'"}],
            },
            "mutate": [{"when": "object.metadata.labels.stage == 'one'", "merge": {"metadata": {"labels": {"second": "ran"}}}}],
        }),
    );
    let req = request("CREATE", json!({"app": "web"}));
    let out = chain::admit_mutating(&req, &[&first, &second], ReinvocationPolicy::Never, ASSUMED);
    assert!(out.response.allowed);
    assert_eq!(
        decisions(&out),
        [
            ("a-first", Decision::Patched),
            ("b-second", Decision::Patched)
        ]
    );
    // One patch, original → final, holding both members' changes.
    let object = out.object(&req).unwrap();
    assert_eq!(object["metadata"]["labels"]["stage"], "one");
    assert_eq!(label(&req, &out, "second").as_deref(), Some("ran"));
}

#[test]
fn an_ignore_member_whose_cel_throws_does_not_block_its_group() {
    let broken = policy(
        "a-broken",
        json!({
            "failurePolicy": "Ignore",
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": [{"name": "throws", "expression": "object.metadata.labels.missing == 'x'"}],
            },
            "mutate": [{"merge": {"metadata": {"labels": {"broken": "ran"}}}}],
        }),
    );
    let fine = policy(
        "b-fine",
        json!({"failurePolicy": "Ignore", "mutate": [{"merge": {"metadata": {"labels": {"fine": "ran"}}}}]}),
    );
    let req = request("CREATE", json!({"app": "web"}));
    let out = chain::admit_mutating(&req, &[&broken, &fine], ReinvocationPolicy::Never, ASSUMED);
    assert!(out.response.allowed);
    assert_eq!(
        decisions(&out),
        [
            ("a-broken", Decision::Ignored),
            ("b-fine", Decision::Patched)
        ]
    );
    assert_eq!(label(&req, &out, "fine").as_deref(), Some("ran"));
    assert_eq!(label(&req, &out, "broken"), None);
    assert!(
        out.response
            .warnings
            .iter()
            .any(|w| w.contains("a-broken") && w.contains("failurePolicy is Ignore")),
        "{:?}",
        out.response.warnings
    );
}

#[test]
fn a_fail_member_whose_cel_throws_denies_naming_itself() {
    let broken = policy(
        "broken",
        json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": [{"name": "throws", "expression": "object.metadata.labels.missing == 'x'"}],
            },
            "validate": [{"expression": "true", "message": "never"}],
        }),
    );
    let out = chain::admit_validating(&request("CREATE", json!({})), &[&broken], ASSUMED);
    assert!(!out.response.allowed);
    let status = out.response.status.as_ref().unwrap();
    assert_eq!(status.code, 500);
    assert!(
        status.message.contains("policy \"broken\""),
        "{}",
        status.message
    );
}

#[test]
fn a_validating_group_reports_every_denial_and_warning() {
    let deny = |name: &str, action: &str| {
        policy(
            name,
            json!({"validate": [{"expression": "has(object.metadata.labels.team)", "message": format!("{name} wants a team"), "action": action}]}),
        )
    };
    let (a, b, w) = (deny("a", "Deny"), deny("b", "Deny"), deny("w", "Warn"));
    let ok = policy(
        "ok",
        json!({"validate": [{"expression": "true", "message": "never"}]}),
    );
    let out = chain::admit_validating(&request("CREATE", json!({})), &[&a, &ok, &b, &w], ASSUMED);
    let status = out.response.status.as_ref().unwrap();
    assert_eq!(status.code, 403);
    assert!(status.message.contains("a wants a team") && status.message.contains("b wants a team"));
    assert!(
        out.response
            .warnings
            .iter()
            .any(|m| m.contains("w wants a team"))
    );
    assert_eq!(
        decisions(&out),
        [
            ("a", Decision::Denied),
            ("ok", Decision::Allowed),
            ("b", Decision::Denied),
            ("w", Decision::Allowed)
        ]
    );
}

#[test]
fn validating_members_that_read_alike_decide_as_each_would_alone() {
    let validate = |name: &str, extra: Value, expression: &str| {
        let mut spec =
            json!({"validate": [{"expression": expression, "message": format!("{name} says no")}]});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        policy(name, spec)
    };
    let pairs = "object.spec.containers.all(a, object.spec.containers.all(b, a.name == b.name || a.image != ''))";
    // Alike needs in pairs (team, containers, pairs), one reading `request`, one reading all.
    let members = [
        validate("team-1", json!({}), "has(object.metadata.labels.team)"),
        validate(
            "containers-1",
            json!({}),
            "object.spec.containers.all(c, c.image != '')",
        ),
        validate("team-2", json!({}), "object.metadata.labels.team == 'a'"),
        validate("user", json!({}), "request.userInfo.username != 'mallory'"),
        validate("pairs-fail", json!({}), pairs),
        validate(
            "containers-2",
            json!({}),
            "size(object.spec.containers) < 3",
        ),
        validate("pairs-ignore", json!({"failurePolicy": "Ignore"}), pairs),
        validate(
            "whole",
            json!({}),
            "object.kind == 'Pod' && size(object.spec.containers) > 0",
        ),
    ];
    let refs: Vec<&CompiledPolicy> = members.iter().collect();
    for req in [
        with_containers(2),
        with_containers(5),
        with_containers(2_000),
    ] {
        let out = chain::admit_validating(&req, &refs, ASSUMED);
        // Each alone, as its own entry would have decided.
        let alone: Vec<Response> = members
            .iter()
            .map(|p| admit_one(&req, p, Phase::Validating))
            .collect();
        let expected: Vec<(&str, bool)> = members
            .iter()
            .zip(&alone)
            .map(|(p, r)| (p.name(), r.allowed))
            .collect();
        let got: Vec<(&str, bool)> = out
            .evaluated
            .iter()
            .map(|e| (e.policy.name(), e.decision != Decision::Denied))
            .collect();
        assert_eq!(got, expected);
        let over_budget: Vec<bool> = alone.iter().map(|r| r.over_budget).collect();
        let got_over: Vec<bool> = out.evaluated.iter().map(|e| e.over_budget).collect();
        assert_eq!(got_over, over_budget);
        let denials: Vec<Response> = alone.iter().filter(|r| !r.allowed).cloned().collect();
        assert_eq!(
            out.response.message(),
            chain::combine(denials).as_ref().and_then(Response::message)
        );
        for r in &alone {
            for w in &r.warnings {
                assert!(out.response.warnings.contains(w), "{w}");
            }
        }
    }
}

#[test]
fn selectors_choose_members_inside_a_shared_entry() {
    let by_ns = policy(
        "by-ns",
        json!({
            "match": {
                "rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "namespaceSelector": {"matchLabels": {"team": "a"}},
            },
            "validate": [{"expression": "false", "message": "team a says no"}],
        }),
    );
    let by_object = policy(
        "by-object",
        json!({
            "match": {
                "rules": [{"operations": ["*"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"tier": "db"}},
            },
            "validate": [{"expression": "false", "message": "db says no"}],
        }),
    );
    let members = [&by_ns, &by_object];
    let team_a = BTreeMap::from([("team".to_string(), "a".to_string())]);
    let team_b = BTreeMap::from([("team".to_string(), "b".to_string())]);
    let scope = |labels| Matching {
        namespace: Namespace::Labels(labels),
        matched: false,
    };
    let web = request("CREATE", json!({"tier": "web"}));
    assert!(
        !chain::admit_validating(&web, &members, scope(&team_a))
            .response
            .allowed
    );
    assert!(
        chain::admit_validating(&web, &members, scope(&team_b))
            .response
            .allowed
    );
    // objectSelector on DELETE reads oldObject; on UPDATE either object.
    for op in ["DELETE", "UPDATE", "CREATE"] {
        let db = request(op, json!({"tier": "db"}));
        let out = chain::admit_validating(&db, &members, scope(&team_b));
        assert_eq!(
            out.response.message(),
            Some("policy \"by-object\": db says no"),
            "{op}"
        );
    }
    // The API server matched an own entry: no matching here at all.
    let matched = Matching {
        namespace: Namespace::Unknown("not read"),
        matched: true,
    };
    assert!(
        !chain::admit_validating(&web, &[&by_object], matched)
            .response
            .allowed
    );
}

#[test]
fn members_of_a_group_match_by_their_own_rules() {
    let rules = |operations: Value, resources: Value| json!([{"operations": operations, "apiGroups": [""], "apiVersions": ["v1"], "resources": resources}]);
    let pods_create = policy(
        "pods-create",
        json!({"match": {"rules": rules(json!(["CREATE"]), json!(["pods"]))},
               "mutate": [{"merge": {"metadata": {"labels": {"created": "yes"}}}}]}),
    );
    let pods_update = policy(
        "pods-update",
        json!({"match": {"rules": rules(json!(["UPDATE"]), json!(["pods"]))},
               "mutate": [{"merge": {"metadata": {"labels": {"updated": "yes"}}}}]}),
    );
    let status = policy(
        "status-only",
        json!({"match": {"rules": rules(json!(["*"]), json!(["pods/status"]))},
               "mutate": [{"merge": {"metadata": {"labels": {"status": "yes"}}}}]}),
    );
    let selective = policy(
        "selective",
        json!({"match": {"rules": rules(json!(["*"]), json!(["*"])), "objectSelector": {"matchLabels": {"tier": "db"}}},
               "validate": [{"expression": "false", "message": "db says no"}]}),
    );
    let members = [&pods_create, &pods_update, &status, &selective];
    let req = request("CREATE", json!({"tier": "db"}));
    let out = chain::admit_mutating(&req, &members, ReinvocationPolicy::Never, ASSUMED);
    assert_eq!(
        decisions(&out),
        [
            ("pods-create", Decision::Patched),
            ("pods-update", Decision::Skipped),
            ("status-only", Decision::Skipped),
            ("selective", Decision::Allowed),
        ]
    );
    let out = chain::admit_validating(&req, &members, ASSUMED);
    assert_eq!(
        out.response.message(),
        Some("policy \"selective\": db says no")
    );
}

#[test]
fn an_if_needed_group_reruns_members_until_the_chain_settles() {
    // `a` only acts once `b` has run: with IfNeeded it runs again, as its own entry would have
    // been reinvoked.
    let a = policy(
        "a",
        json!({"mutate": [{"when": "has(object.metadata.labels.b)", "merge": {"metadata": {"labels": {"a": "after-b"}}}}]}),
    );
    let b = policy(
        "b",
        json!({"mutate": [{"merge": {"metadata": {"labels": {"b": "ran"}}}}]}),
    );
    let req = request("CREATE", json!({}));
    let never = chain::admit_mutating(&req, &[&a, &b], ReinvocationPolicy::Never, ASSUMED);
    assert_eq!(label(&req, &never, "a"), None);
    let if_needed = chain::admit_mutating(&req, &[&a, &b], ReinvocationPolicy::IfNeeded, ASSUMED);
    assert_eq!(label(&req, &if_needed, "a").as_deref(), Some("after-b"));
    // a ran before b changed the object, so it runs again; then b, which ran before a's
    // change, confirms; nothing ran before the last change any more.
    assert_eq!(
        decisions(&if_needed),
        [
            ("a", Decision::Allowed),
            ("b", Decision::Patched),
            ("a", Decision::Patched),
            ("b", Decision::Allowed)
        ]
    );
    // A lone member that changed the object is not asked again.
    let alone = chain::admit_mutating(&req, &[&b], ReinvocationPolicy::IfNeeded, ASSUMED);
    assert_eq!(decisions(&alone), [("b", Decision::Patched)]);
    // Called again with its own output (the API server's reinvocation): nothing to do.
    let mut again = req.clone();
    again.object = if_needed.object(&req);
    assert!(again.object.is_some());
    let twice = chain::admit_mutating(&again, &[&a, &b], ReinvocationPolicy::IfNeeded, ASSUMED);
    assert!(
        twice.response.patch.0.is_empty(),
        "{:?}",
        twice.response.patch
    );
}

/// A review of a Pod with `n` containers.
fn with_containers(n: usize) -> Request {
    let mut req = request("CREATE", json!({}));
    let containers: Vec<Value> = (0..n)
        .map(|i| json!({"name": format!("c{i}"), "image": "app:1"}))
        .collect();
    req.object.as_mut().expect("a CREATE has an object")["spec"]["containers"] = json!(containers);
    req
}

#[test]
fn an_expression_over_budget_at_run_time_is_not_run_and_its_failure_policy_decides() {
    let pairs = "object.spec.containers.all(a, object.spec.containers.all(b, a.name == b.name || a.image != ''))";
    let fail = policy(
        "pairs-fail",
        json!({"validate": [{"expression": pairs, "message": "no"}]}),
    );
    let ignore = policy(
        "pairs-ignore",
        json!({"failurePolicy": "Ignore", "validate": [{"expression": pairs, "message": "no"}]}),
    );
    let guard = policy(
        "guarded",
        json!({"failurePolicy": "Ignore", "mutate": [{"when": pairs, "merge": {"metadata": {"labels": {"ran": "yes"}}}}]}),
    );
    // Within the assumed size it runs.
    let small = with_containers(10);
    let out = chain::admit_validating(&small, &[&fail, &ignore], ASSUMED);
    assert!(out.response.allowed, "{:?}", out.response.message());
    assert!(out.evaluated.iter().all(|e| !e.over_budget));
    // With 2,000 containers the estimate is far over the budget: not evaluated.
    let huge = with_containers(2_000);
    let out = chain::admit_validating(&huge, &[&fail], ASSUMED);
    assert!(!out.response.allowed);
    let status = out.response.status.as_ref().unwrap();
    assert_eq!(status.code, 500);
    assert!(
        status.message.contains("cost budget exceeded") && status.message.contains("2000 elements"),
        "{}",
        status.message
    );
    assert!(out.evaluated[0].over_budget);
    let out = chain::admit_validating(&huge, &[&ignore], ASSUMED);
    assert!(out.response.allowed);
    assert!(
        out.response
            .warnings
            .iter()
            .any(|w| w.contains("cost budget exceeded")),
        "{:?}",
        out.response.warnings
    );
    assert_eq!(out.evaluated[0].decision, Decision::Ignored);
    let out = chain::admit_mutating(&huge, &[&guard], ReinvocationPolicy::Never, ASSUMED);
    assert!(out.response.allowed);
    assert_eq!(label(&huge, &out, "ran"), None);
    assert!(out.evaluated[0].over_budget);
}

/// A Policy's validations share one call budget (10M, as a ValidatingAdmissionPolicy binding's):
/// each runs while the rest can pay for its estimate, the first that cannot fails with the
/// Policy's failurePolicy, and none after it runs. Match conditions share a smaller one (2.5M).
#[test]
fn a_policys_expressions_share_the_call_budget() {
    let pairs = "object.spec.containers.all(a, object.spec.containers.all(b, a.name == b.name || a.image != ''))";
    let validate: Vec<Value> = (0..30)
        .map(|i| json!({"expression": pairs, "message": format!("rule {i} says no")}))
        .collect();
    let many = policy("many", json!({"validate": validate}));
    // 250 containers: each validation is under the per-expression budget, 30 are over the call's.
    let out = chain::admit_validating(&with_containers(250), &[&many], ASSUMED);
    assert!(!out.response.allowed);
    let status = out.response.status.as_ref().unwrap();
    assert_eq!(status.code, 500, "{}", status.message);
    assert!(
        status.message.contains("running out of cost budget"),
        "{}",
        status.message
    );
    assert_eq!(
        status.message.matches("spec.validate[").count(),
        1,
        "no validation runs after the budget is spent: {}",
        status.message
    );
    assert!(out.evaluated[0].over_budget);
    // Small requests are charged the assumed size: thirty such validations fit.
    let out = chain::admit_validating(&with_containers(3), &[&many], ASSUMED);
    assert!(out.response.allowed, "{:?}", out.response.message());

    let conditions: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("c{i}"), "expression": pairs}))
        .collect();
    let matched = policy(
        "matched",
        json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": conditions,
            },
            "validate": [{"expression": "false", "message": "matched"}],
        }),
    );
    let out = chain::admit_validating(&with_containers(250), &[&matched], ASSUMED);
    let message = out.response.message().unwrap_or_default().to_string();
    assert!(message.contains("running out of cost budget"), "{message}");
    let out = chain::admit_validating(&with_containers(3), &[&matched], ASSUMED);
    assert_eq!(out.response.message(), Some("policy \"matched\": matched"));
}

/// Members whose lists only touch what they reach share a copy of just that part; a member that
/// reads the object to match (objectSelector, a condition over `object`) must still see what
/// the earlier members wrote, so it makes the chain work on the whole object.
#[test]
fn a_member_matching_on_the_object_sees_earlier_members_writes() {
    let tier = policy(
        "a-tier",
        json!({"mutate": [{"merge": {"metadata": {"labels": {"tier": "db"}}}}]}),
    );
    let by_selector = policy(
        "b-selector",
        json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "objectSelector": {"matchLabels": {"tier": "db"}},
            },
            "mutate": [{"merge": {"metadata": {"labels": {"selected": "yes"}}}}],
        }),
    );
    let by_condition = policy(
        "c-condition",
        json!({
            "match": {
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                "conditions": [{"name": "db", "expression": "object.metadata.labels.tier == 'db'"}],
            },
            "mutate": [{"merge": {"spec": {"containers": [{"name": "backup", "image": "backup:1"}]}}}],
        }),
    );
    let req = request("CREATE", json!({"app": "web"}));
    let out = chain::admit_mutating(
        &req,
        &[&tier, &by_selector, &by_condition],
        ReinvocationPolicy::Never,
        ASSUMED,
    );
    assert!(out.response.allowed);
    assert_eq!(
        decisions(&out),
        [
            ("a-tier", Decision::Patched),
            ("b-selector", Decision::Patched),
            ("c-condition", Decision::Patched)
        ]
    );
    let object = out.object(&req).unwrap();
    assert_eq!(object["metadata"]["labels"]["selected"], "yes");
    assert_eq!(object["spec"]["containers"][1]["name"], "backup");

    // Without them, the other two share the reached part and answer with a patch within it.
    let sidecar = policy(
        "d-sidecar",
        json!({"mutate": [{"merge": {"spec": {"containers": [{"name": "proxy", "image": "proxy:1"}]}}}]}),
    );
    let out = chain::admit_mutating(&req, &[&tier, &sidecar], ReinvocationPolicy::Never, ASSUMED);
    let object = out.object(&req).unwrap();
    assert_eq!(object["metadata"]["labels"]["tier"], "db");
    assert_eq!(object["metadata"]["labels"]["app"], "web");
    assert_eq!(object["spec"]["containers"][1]["name"], "proxy");
    assert_eq!(out.response.patch.0.len(), 2, "{:?}", out.response.patch);
}
