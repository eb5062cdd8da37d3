//! The engine through its public API: AdmissionReview parsing, the wire form of responses, the
//! mutating and validating decisions, failure policies and the matcher.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine as engine;
use gatehouse_engine::{
    CompiledPolicy, MatchError, Namespace, Phase, Request, ReviewError, admit_one,
    admit_policy_object, compile, encoded_review, parse_request,
};
use serde_json::{Value, json};

fn policy(name: &str, spec: Value) -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": name, "generation": 1},
        "spec": spec,
    }))
    .expect("test Policy decodes")
}

fn compiled(name: &str, spec: Value) -> CompiledPolicy {
    compile(&policy(name, spec)).expect("test Policy is valid")
}

fn pod_rules() -> Value {
    json!({"rules": [{"operations": ["CREATE", "UPDATE", "DELETE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]})
}

fn review_body(request: Value) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
        .to_string()
        .into_bytes()
}

fn pod(containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}}, "spec": {"containers": containers}})
}

fn request(operation: &str, object: Option<Value>, old_object: Option<Value>) -> Request {
    let mut r = json!({
        "uid": "uid-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "name": "web",
        "namespace": "shop",
        "operation": operation,
        "userInfo": {"username": "alice", "groups": ["devs"]},
    });
    if let Some(o) = object {
        r["object"] = o;
    }
    if let Some(o) = old_object {
        r["oldObject"] = o;
    }
    parse_request(&review_body(r)).expect("test review parses")
}

fn create(object: Value) -> Request {
    request("CREATE", Some(object), None)
}

fn wire(req: &Request, resp: &engine::Response) -> Value {
    serde_json::from_slice(&encoded_review(req, resp)).expect("response is JSON")
}

fn decoded_patch(wire: &Value) -> Value {
    let b64 = wire["response"]["patch"]
        .as_str()
        .expect("patch is a base64 string");
    serde_json::from_slice(&BASE64.decode(b64).expect("valid base64")).expect("patch is JSON")
}

fn sidecar() -> CompiledPolicy {
    compiled(
        "inject-proxy",
        json!({"match": pod_rules(), "mutate": [{"merge": {"spec": {"containers": [{"name": "proxy", "image": "envoy"}]}}}]}),
    )
}

#[test]
fn parse_review_reports_what_is_wrong() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "not JSON"),
        (b"[1]".to_vec(), "not a JSON object"),
        (
            json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}).to_string().into_bytes(),
            "apiVersion \"admission.k8s.io/v1beta1\"",
        ),
        (
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {"uid": "u"}}).to_string().into_bytes(),
            "kind \"Pod\"",
        ),
        (
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).to_string().into_bytes(),
            "missing \"request\"",
        ),
        (review_body(json!({"operation": "CREATE"})), "missing \"request.uid\""),
        (review_body(json!({"uid": "u", "operation": "CREATE"})), "request: missing field `kind`"),
        (
            review_body(json!({"uid": "u", "kind": {"version": "v1", "kind": "Pod"}, "resource": {"version": "v1", "resource": "pods"}, "operation": "*"})),
            "operation \"*\"",
        ),
    ];
    for (body, want) in cases {
        let err: ReviewError = parse_request(&body).expect_err(want);
        assert!(
            err.to_string().contains(want),
            "{err} should contain {want}"
        );
    }
}

#[test]
fn a_kubernetes_review_parses() {
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/reviews/pod-create.json"
    ))
    .unwrap();
    let req = parse_request(&body).unwrap();
    assert_eq!(req.uid(), "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(req.kind_name(), "Pod");
    assert_eq!(req.namespace(), "shop");
    assert_eq!(req.name(), "web");
    assert_eq!(req.operation(), "CREATE");
    assert!(req.old_object.is_none(), "oldObject: null is absent");
    assert_eq!(
        req.user_info.groups,
        ["system:authenticated", "my-admin-group"]
    );
}

#[test]
fn a_mutation_goes_on_the_wire_as_a_base64_json_patch() {
    let req = create(pod(json!([{"name": "app", "image": "app:1"}])));
    let resp = admit_one(&req, &sidecar(), Phase::Mutating);
    assert!(resp.allowed() && resp.patched());
    let wire = wire(&req, &resp);
    assert_eq!(wire["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(wire["kind"], "AdmissionReview");
    assert_eq!(wire["response"]["uid"], "uid-1");
    assert_eq!(wire["response"]["allowed"], true);
    assert_eq!(wire["response"]["patchType"], "JSONPatch");
    assert_eq!(
        decoded_patch(&wire),
        json!([{"op": "add", "path": "/spec/containers/1", "value": {"name": "proxy", "image": "envoy"}}])
    );
    assert!(wire["response"].get("status").is_none());
}

#[test]
fn applying_the_patch_and_reviewing_again_patches_nothing() {
    let req = create(pod(json!([{"name": "app", "image": "app:1"}])));
    let policy = sidecar();
    let first = admit_one(&req, &policy, Phase::Mutating);
    let mut object = req.object.clone().unwrap();
    json_patch::patch(&mut object, &first.patch).unwrap();
    let again = admit_one(&create(object), &policy, Phase::Mutating);
    assert!(again.allowed() && !again.patched());
    let wire = wire(&req, &again);
    assert!(wire["response"].get("patch").is_none());
    assert!(wire["response"].get("patchType").is_none());
}

#[test]
fn a_delete_is_not_mutated() {
    let req = request("DELETE", None, Some(pod(json!([{"name": "app"}]))));
    let resp = admit_one(&req, &sidecar(), Phase::Mutating);
    assert!(resp.allowed() && !resp.patched());
}

fn limits() -> CompiledPolicy {
    compiled(
        "require-limits",
        json!({"match": pod_rules(), "validate": [
            {"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "every container must declare resource limits"},
            {"expression": "object.spec.containers.all(c, c.image.contains(':'))", "message": "images must be tagged"},
            {"expression": "object.spec.containers.size() < 2", "message": "one container is plenty", "action": "Warn"},
        ]}),
    )
}

#[test]
fn a_deny_names_the_policy_and_the_rule() {
    let req = create(pod(json!([{"name": "app", "image": "app:1"}])));
    let resp = admit_one(&req, &limits(), Phase::Validating);
    assert!(!resp.allowed());
    let wire = wire(&req, &resp);
    assert_eq!(wire["response"]["uid"], "uid-1");
    assert_eq!(wire["response"]["allowed"], false);
    assert_eq!(wire["response"]["status"]["code"], 403);
    assert_eq!(wire["response"]["status"]["reason"], "Forbidden");
    assert_eq!(
        wire["response"]["status"]["message"],
        "policy \"require-limits\": every container must declare resource limits"
    );
}

#[test]
fn several_denials_are_joined_and_warnings_kept() {
    let req = create(pod(
        json!([{"name": "a", "image": "a"}, {"name": "b", "image": "b"}]),
    ));
    let resp = admit_one(&req, &limits(), Phase::Validating);
    assert_eq!(
        resp.message(),
        Some(
            "policy \"require-limits\": every container must declare resource limits; \
             policy \"require-limits\": images must be tagged"
        )
    );
    assert_eq!(
        resp.warnings,
        ["policy \"require-limits\": one container is plenty"]
    );
    let wire = wire(&req, &resp);
    assert_eq!(
        wire["response"]["warnings"][0],
        "policy \"require-limits\": one container is plenty"
    );
}

#[test]
fn compliant_objects_are_allowed_without_status() {
    let req = create(pod(
        json!([{"name": "a", "image": "a:1", "resources": {"limits": {"cpu": "1"}}}]),
    ));
    let resp = admit_one(&req, &limits(), Phase::Validating);
    assert!(resp.allowed() && resp.warnings.is_empty() && resp.status.is_none());
    // A validating-only Policy reached through the mutating webhook changes nothing.
    assert!(!admit_one(&req, &limits(), Phase::Mutating).patched());
}

fn broken(failure_policy: &str) -> CompiledPolicy {
    compiled(
        "broken",
        json!({"match": pod_rules(), "failurePolicy": failure_policy, "validate": [
            {"expression": "object.spec.nodeName == 'x'", "message": "m1"},
            {"expression": "object.metadata.name", "message": "m2"},
        ]}),
    )
}

#[test]
fn run_time_errors_follow_the_failure_policy() {
    let req = create(pod(json!([])));
    let fail = admit_one(&req, &broken("Fail"), Phase::Validating);
    assert!(!fail.allowed());
    let status = fail.status.clone().unwrap();
    assert_eq!(
        (status.code, status.reason.as_str()),
        (500, "InternalError")
    );
    assert!(status.message.contains("policy \"broken\": spec.validate[0].expression: evaluation failed: No such key: nodeName"), "{}", status.message);
    assert!(
        status
            .message
            .contains("policy \"broken\": spec.validate[1].expression: returned string, want bool"),
        "{}",
        status.message
    );

    let ignore = admit_one(&req, &broken("Ignore"), Phase::Validating);
    assert!(ignore.allowed());
    assert_eq!(ignore.warnings.len(), 2);
    assert!(
        ignore
            .warnings
            .iter()
            .all(|w| w.starts_with("policy \"broken\": ") && w.contains("failurePolicy is Ignore"))
    );
}

#[test]
fn a_warn_rule_that_fails_at_run_time_warns_whatever_the_failure_policy() {
    let req = create(pod(json!([])));
    let spec = json!({"match": pod_rules(), "failurePolicy": "Fail", "validate": [
        {"expression": "object.spec.nodeName == 'x'", "message": "advice", "action": "Warn"},
        {"expression": "object.metadata.name == 'web'", "message": "named web"},
    ]});
    let resp = admit_one(&req, &compiled("advisory", spec), Phase::Validating);
    assert!(resp.allowed(), "{:?}", resp.status);
    assert_eq!(resp.warnings.len(), 1);
    assert!(
        resp.warnings[0]
            .starts_with("policy \"advisory\": spec.validate[0].expression: evaluation failed"),
        "{:?}",
        resp.warnings
    );
    // A Deny rule beside it still fails closed.
    let spec = json!({"match": pod_rules(), "failurePolicy": "Fail", "validate": [
        {"expression": "object.spec.nodeName == 'x'", "message": "advice", "action": "Warn"},
        {"expression": "object.spec.nodeName == 'x'", "message": "strict"},
    ]});
    let resp = admit_one(&req, &compiled("mixed", spec), Phase::Validating);
    assert!(!resp.allowed());
    assert_eq!(resp.warnings.len(), 1, "{:?}", resp.warnings);
}

#[test]
fn a_failing_when_follows_the_failure_policy() {
    let spec = |fp: &str| {
        json!({"match": pod_rules(), "failurePolicy": fp, "mutate": [
            {"forEach": "spec.containers", "when": "element.securityContext.privileged == false", "merge": {"securityContext": {"runAsNonRoot": true}}},
        ]})
    };
    let req = create(pod(json!([{"name": "app"}])));
    let fail = admit_one(&req, &compiled("guarded", spec("Fail")), Phase::Mutating);
    assert!(!fail.allowed() && !fail.patched());
    assert!(
        fail.message()
            .unwrap()
            .starts_with("policy \"guarded\": spec.mutate[0].when: evaluation failed")
    );
    let ignore = admit_one(&req, &compiled("guarded", spec("Ignore")), Phase::Mutating);
    assert!(ignore.allowed() && !ignore.patched());
    assert_eq!(
        ignore.warnings.len(),
        1,
        "reported once, however many passes: {:?}",
        ignore.warnings
    );
    assert!(ignore.warnings[0].starts_with("policy \"guarded\": spec.mutate[0].when"));
}

#[test]
fn guards_see_element_object_and_request() {
    let policy = compiled(
        "guards",
        json!({"match": pod_rules(), "mutate": [
            {"forEach": "spec.containers", "when": "element.name != 'proxy' && request.userInfo.username == 'alice'", "merge": {"tty": true}},
            {"when": "oldObject == null && object.metadata.labels.app == 'web'", "merge": {"metadata": {"labels": {"seen": "yes"}}}},
        ]}),
    );
    let req = create(pod(json!([{"name": "app"}, {"name": "proxy"}])));
    let resp = admit_one(&req, &policy, Phase::Mutating);
    let mut object = req.object.clone().unwrap();
    json_patch::patch(&mut object, &resp.patch).unwrap();
    assert_eq!(
        object["spec"]["containers"],
        json!([{"name": "app", "tty": true}, {"name": "proxy"}])
    );
    assert_eq!(object["metadata"]["labels"]["seen"], "yes");
}

#[test]
fn a_for_each_before_an_append_still_reaches_the_new_element() {
    // The list is applied to a fixed point, so the appended sidecar gets the forEach's merge too
    // and a reinvocation has nothing left to do.
    let policy = compiled(
        "both",
        json!({"match": pod_rules(), "mutate": [
            {"forEach": "spec.containers", "merge": {"securityContext": {"allowPrivilegeEscalation": false}}},
            {"merge": {"spec": {"containers": [{"name": "proxy", "image": "envoy"}]}}},
        ]}),
    );
    let req = create(pod(json!([{"name": "app"}])));
    let resp = admit_one(&req, &policy, Phase::Mutating);
    let mut object = req.object.clone().unwrap();
    json_patch::patch(&mut object, &resp.patch).unwrap();
    let sc = json!({"allowPrivilegeEscalation": false});
    assert_eq!(object["spec"]["containers"][0]["securityContext"], sc);
    assert_eq!(object["spec"]["containers"][1]["securityContext"], sc);
    assert!(!admit_one(&create(object), &policy, Phase::Mutating).patched());
}

#[test]
fn compiled_policies_are_shared_across_threads() {
    let policy = Arc::new(limits());
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let policy = Arc::clone(&policy);
            std::thread::spawn(move || {
                let req = create(pod(json!([{"name": "a", "image": "a:1"}])));
                admit_one(&req, &policy, Phase::Validating).allowed()
            })
        })
        .collect();
    for h in handles {
        assert!(!h.join().unwrap());
    }
}

#[test]
fn the_policy_webhook_lists_every_problem() {
    let bad = json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "bad"},
        "spec": {"match": {"rules": []}, "timeoutSeconds": 0},
    });
    let resp = admit_policy_object(&create(bad));
    assert!(!resp.allowed());
    let status = resp.status.unwrap();
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        status.message,
        "Policy \"bad\" is invalid: spec: at least one of mutate, validate or effects must be set; \
         spec.timeoutSeconds: must be between 1 and 30, got 0; spec.match.rules: must not be empty"
    );
    let good = serde_json::to_value(policy(
        "good",
        json!({"match": pod_rules(), "validate": [{"expression": "true", "message": "m"}]}),
    ))
    .unwrap();
    assert!(admit_policy_object(&create(good)).allowed());
    let undecodable = json!({"apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "u"}, "spec": {"match": 1}});
    let resp = admit_policy_object(&create(undecodable));
    assert!(
        resp.message()
            .unwrap()
            .starts_with("Policy \"u\" is invalid: spec: ")
    );
}

fn matcher(match_: Value) -> CompiledPolicy {
    compiled(
        "m",
        json!({"match": match_, "validate": [{"expression": "true", "message": "m"}]}),
    )
}

fn with_resource(
    mut req: Request,
    group: &str,
    version: &str,
    resource: &str,
    sub: Option<&str>,
) -> Request {
    req.resource.group = group.into();
    req.resource.version = version.into();
    req.resource.resource = resource.into();
    req.sub_resource = sub.map(str::to_string);
    req
}

/// Matching with every namespaceSelector taken as matching (no Namespace labels at hand).
fn matches(req: &Request, policy: &CompiledPolicy) -> Result<bool, MatchError> {
    engine::matches(req, policy, Namespace::Assumed)
}

#[test]
fn namespace_selectors_match_like_the_api_server() {
    let policy = matcher(json!({
        "rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"], "scope": "*"}],
        "namespaceSelector": {"matchLabels": {"team": "a"}},
    }));
    let team_a: std::collections::BTreeMap<String, String> =
        [("team".to_string(), "a".to_string())].into();
    let team_b: std::collections::BTreeMap<String, String> =
        [("team".to_string(), "b".to_string())].into();
    let pod_req = create(pod(json!([])));
    assert!(engine::matches(&pod_req, &policy, Namespace::Labels(&team_a)).unwrap());
    assert!(!engine::matches(&pod_req, &policy, Namespace::Labels(&team_b)).unwrap());
    let err = engine::matches(&pod_req, &policy, Namespace::Unknown("gone")).unwrap_err();
    assert!(
        err.to_string()
            .contains("labels of namespace \"shop\" are unknown"),
        "{err}"
    );
    // A Namespace object is judged by its own labels (the old object's on DELETE), whatever
    // the lookup says.
    let ns = |labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x", "labels": labels}});
    let mut ns_create = request("CREATE", Some(ns(json!({"team": "a"}))), None);
    ns_create.kind.kind = "Namespace".into();
    ns_create.namespace = String::new();
    ns_create = with_resource(ns_create, "", "v1", "namespaces", None);
    assert!(engine::matches(&ns_create, &policy, Namespace::Labels(&team_b)).unwrap());
    let mut ns_delete = ns_create.clone();
    ns_delete.operation = gatehouse_api::v1alpha1::Operation::Delete;
    ns_delete.object = None;
    ns_delete.old_object = Some(ns(json!({"team": "b"})));
    assert!(!engine::matches(&ns_delete, &policy, Namespace::Labels(&team_a)).unwrap());
    // Any other cluster-scoped object always matches.
    let mut node = with_resource(create(pod(json!([]))), "", "v1", "nodes", None);
    node.namespace = String::new();
    assert!(engine::matches(&node, &policy, Namespace::Unknown("none")).unwrap());
}

#[test]
fn rules_also_match_the_original_request_resource() {
    // matchPolicy Equivalent: the shared entry's union named apps/v1, the request was made at
    // a version only this Policy names.
    let policy = matcher(
        json!({"rules": [{"operations": ["CREATE"], "apiGroups": ["apps"], "apiVersions": ["v1beta2"], "resources": ["deployments"]}]}),
    );
    let mut req = with_resource(create(pod(json!([]))), "apps", "v1", "deployments", None);
    assert!(!matches(&req, &policy).unwrap());
    req.request_resource = Some(gatehouse_engine::admission::GroupVersionResource {
        group: "apps".into(),
        version: "v1beta2".into(),
        resource: "deployments".into(),
    });
    assert!(matches(&req, &policy).unwrap());
}

#[test]
fn rules_match_like_the_api_server() {
    let rule = |resources: Value, scope: &str| {
        matcher(
            json!({"rules": [{"operations": ["CREATE"], "apiGroups": ["", "apps"], "apiVersions": ["v1"], "resources": resources, "scope": scope}]}),
        )
    };
    let pod_req = create(pod(json!([])));
    let status_req = with_resource(create(pod(json!([]))), "", "v1", "pods", Some("status"));
    let deploy = with_resource(create(pod(json!([]))), "apps", "v1", "deployments", None);
    let scale = with_resource(
        create(pod(json!([]))),
        "apps",
        "v1",
        "deployments",
        Some("scale"),
    );
    let batch = with_resource(create(pod(json!([]))), "batch", "v1", "jobs", None);
    let beta = with_resource(create(pod(json!([]))), "", "v1beta1", "pods", None);

    let cases = [
        (json!(["pods"]), "*", &pod_req, true),
        (json!(["pods"]), "*", &status_req, false),
        (json!(["pods/status"]), "*", &status_req, true),
        (json!(["pods/*"]), "*", &status_req, true),
        (json!(["pods/*"]), "*", &pod_req, true),
        (json!(["*"]), "*", &deploy, true),
        (json!(["*"]), "*", &scale, false),
        (json!(["*/scale"]), "*", &scale, true),
        (json!(["*/*"]), "*", &scale, true),
        (json!(["*"]), "*", &batch, false),
        (json!(["*"]), "*", &beta, false),
        (json!(["pods"]), "Namespaced", &pod_req, true),
        (json!(["pods"]), "Cluster", &pod_req, false),
    ];
    for (resources, scope, req, want) in cases {
        let got = matches(req, &rule(resources.clone(), scope)).unwrap();
        assert_eq!(
            got,
            want,
            "{resources} {scope} vs {}/{}",
            req.resource.resource,
            req.sub_resource()
        );
    }
    let update = request("UPDATE", Some(pod(json!([]))), Some(pod(json!([]))));
    assert!(!matches(&update, &rule(json!(["pods"]), "*")).unwrap());
}

#[test]
fn object_selectors_read_the_object_or_the_old_one() {
    let select = |selector: Value| {
        matcher(json!({"rules": pod_rules()["rules"], "objectSelector": selector}))
    };
    let web = create(pod(json!([])));
    assert!(matches(&web, &select(json!({"matchLabels": {"app": "web"}}))).unwrap());
    assert!(!matches(&web, &select(json!({"matchLabels": {"app": "db"}}))).unwrap());
    let expr = |op: &str, values: Value| {
        select(json!({"matchExpressions": [{"key": "app", "operator": op, "values": values}]}))
    };
    assert!(matches(&web, &expr("In", json!(["web", "api"]))).unwrap());
    assert!(!matches(&web, &expr("NotIn", json!(["web"]))).unwrap());
    assert!(matches(&web, &expr("Exists", json!([]))).unwrap());
    assert!(!matches(&web, &expr("DoesNotExist", json!([]))).unwrap());
    let tier = select(
        json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]}),
    );
    assert!(
        matches(&web, &tier).unwrap(),
        "NotIn matches an absent label"
    );
    assert!(
        matches(&web, &select(json!({}))).unwrap(),
        "an empty selector matches everything"
    );
    let delete = request("DELETE", None, Some(pod(json!([]))));
    assert!(matches(&delete, &select(json!({"matchLabels": {"app": "web"}}))).unwrap());
}

#[test]
fn match_conditions_must_all_hold() {
    let conditions = |exprs: &[&str]| {
        let list: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| json!({"name": format!("c{i}"), "expression": e}))
            .collect();
        matcher(json!({"rules": pod_rules()["rules"], "conditions": list}))
    };
    let req = create(pod(json!([])));
    assert!(
        matches(
            &req,
            &conditions(&[
                "request.namespace == 'shop'",
                "object.metadata.name == 'web'"
            ])
        )
        .unwrap()
    );
    assert!(
        !matches(
            &req,
            &conditions(&["true", "request.userInfo.username == 'bob'"])
        )
        .unwrap()
    );
    let err = matches(&req, &conditions(&["object.nope"])).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.match.conditions[0] (\"c0\"): evaluation failed"),
        "{err}"
    );
}

#[test]
fn patch_paths_escape_slashes_and_tildes() {
    let policy = compiled(
        "labels",
        json!({"match": pod_rules(), "mutate": [{"merge": {"metadata": {"labels": {"gatehouse.dev/managed": "true", "a~b": "x"}}}}]}),
    );
    let req = create(pod(json!([])));
    let resp = admit_one(&req, &policy, Phase::Mutating);
    let ops = decoded_patch(&wire(&req, &resp));
    let paths: Vec<&str> = ops
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "/metadata/labels/a~0b",
            "/metadata/labels/gatehouse.dev~1managed"
        ]
    );
    let mut object = req.object.clone().unwrap();
    json_patch::patch(&mut object, &resp.patch).unwrap();
    assert_eq!(
        object["metadata"]["labels"],
        json!({"app": "web", "gatehouse.dev/managed": "true", "a~b": "x"})
    );
}

/// An ipam effect marks a Pod on CREATE (gate + pool label, on top of the Policy's own
/// mutations, in one patch) and nothing else: no other operation, nothing twice.
#[test]
fn an_ipam_effect_marks_created_pods_only() {
    let p = compiled(
        "ipam",
        json!({
            "match": pod_rules(),
            "mutate": [{"merge": {"metadata": {"labels": {"team": "a"}}}}],
            "effects": [{"ipam": {"pool": "pods-v4"}}],
        }),
    );
    let original = pod(json!([{"name": "app", "image": "app:1"}]));
    let resp = admit_one(
        &request("CREATE", Some(original.clone()), None),
        &p,
        Phase::Mutating,
    );
    assert!(resp.allowed);
    let mut marked = original.clone();
    json_patch::patch(&mut marked, &resp.patch).unwrap();
    assert_eq!(
        marked["metadata"]["labels"]["gatehouse.dev/ipam-pool"],
        "pods-v4"
    );
    assert_eq!(marked["metadata"]["labels"]["team"], "a");
    assert_eq!(
        marked["metadata"]["annotations"]["gatehouse.dev/ipam-pool"],
        "pods-v4"
    );
    assert_eq!(
        marked["spec"]["schedulingGates"],
        json!([{"name": "gatehouse.dev/ipam"}])
    );
    // Reinvocation on the marked Pod changes nothing.
    let again = admit_one(
        &request("CREATE", Some(marked.clone()), None),
        &p,
        Phase::Mutating,
    );
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
    // UPDATE is mutated but never marked (the API server refuses new gates after CREATE).
    let update = admit_one(
        &request("UPDATE", Some(original.clone()), Some(original.clone())),
        &p,
        Phase::Mutating,
    );
    let mut updated = original.clone();
    json_patch::patch(&mut updated, &update.patch).unwrap();
    assert!(updated["spec"].get("schedulingGates").is_none());
    // A Policy with only effects still answers, with only the mark.
    let only = compiled(
        "only",
        json!({"match": pod_rules(), "effects": [{"ipam": {"pool": "p", "annotation": "example.com/ip"}}]}),
    );
    assert!(only.is_mutating() && !only.has_mutations());
    let resp = admit_one(
        &request("CREATE", Some(original), None),
        &only,
        Phase::Mutating,
    );
    // The gate, the pool label, and the pool annotation the node's CNI plugin reads.
    assert_eq!(resp.patch.0.len(), 3, "{:?}", resp.patch);
}

#[test]
fn ipam_effects_are_validated() {
    let problems = |spec: Value| -> Vec<String> {
        engine::validate(&policy("p", spec))
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let got = problems(json!({
        "match": {"rules": [{"operations": ["UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"], "resources": ["deployments"]}]},
        "effects": [{"ipam": {"pool": "Bad_Pool", "annotation": "has space"}}, {}, {"ipam": {"pool": "p", "annotation": "gatehouse.dev/ipam-address"}}],
    }));
    for want in [
        "spec.effects[0].ipam.pool: \"Bad_Pool\" is not an IPPool name",
        "spec.effects[0].ipam.annotation: \"has space\" is not a valid qualified name",
        "spec.effects[0].ipam: allocates to Pods on CREATE, but no rule",
        "spec.effects[1]: must set exactly one effect (ipam, object or call)",
        "spec.effects[2].ipam: a Policy allocates at most one address",
        "spec.effects[2].ipam.annotation: \"gatehouse.dev/ipam-address\" is Gatehouse's own",
    ] {
        assert!(
            got.iter().any(|g| g.starts_with(want)),
            "missing {want:?} in {got:#?}"
        );
    }
    assert!(
        problems(json!({"match": pod_rules(), "effects": [{"ipam": {"pool": "pods-v4"}}]}))
            .is_empty()
    );
}
