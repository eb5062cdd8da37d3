//! `gatehouse eval` end to end, through `cli::eval::run` with the fixtures in testdata/.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use std::path::PathBuf;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use gatehouse::cli::eval::{EvalArgs, run};
use serde_json::{Value, json};

mod offline;
use offline::{Run, run_command};

fn data(rel: &str) -> String {
    format!("{}/testdata/{rel}", env!("CARGO_MANIFEST_DIR"))
}

/// A review fixture of the engine crate, which parses reviews.
fn review(name: &str) -> String {
    format!(
        "{}/../engine/testdata/reviews/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.out)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.out))
    }
    fn patch(&self) -> Value {
        let review = self.json();
        assert_eq!(review["response"]["patchType"], "JSONPatch", "{review}");
        let b64 = review["response"]["patch"]
            .as_str()
            .expect("patch is a base64 string");
        serde_json::from_slice(&BASE64.decode(b64).expect("base64")).expect("JSON patch")
    }
}

fn eval(args: &[&str]) -> Run {
    run_command::<EvalArgs>("gatehouse-eval", args, run)
}

/// A scratch file unique to the test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, contents: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("gatehouse-eval-{}-{name}", std::process::id()));
        std::fs::write(&path, contents).unwrap();
        Scratch(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn proxy() -> Value {
    json!({
        "name": "proxy",
        "image": "envoyproxy/envoy:v1.31.0",
        "args": ["--config-path", "/etc/envoy/envoy.yaml"],
        "ports": [{"name": "proxy", "containerPort": 15001}],
    })
}

#[test]
fn sidecar_injection_patches_exactly_one_container_in() {
    let r = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.patch(),
        json!([{"op": "add", "path": "/spec/containers/1", "value": proxy()}])
    );
    let review = r.json();
    assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(review["response"]["allowed"], true);
    assert_eq!(
        review["response"]["uid"],
        "00000000-0000-0000-0000-000000000000"
    );
}

#[test]
fn sidecar_injection_applied_again_changes_nothing() {
    let first = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        &data("objects/pod.yaml"),
        "--output",
        "object",
    ]);
    assert_eq!(first.code, 0, "{}", first.err);
    let injected = first.json();
    assert_eq!(injected["spec"]["containers"].as_array().unwrap().len(), 2);
    let again = Scratch::new("injected.json", &first.out);
    let second = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        again.path(),
    ]);
    assert_eq!(second.code, 0, "{}", second.err);
    let response = &second.json()["response"];
    assert!(response.get("patch").is_none(), "{response}");
    assert!(response.get("patchType").is_none(), "{response}");
}

#[test]
fn reinvocation_keeps_a_single_proxy() {
    // inject-proxy (priority 10, IfNeeded) runs first; drop-bpf (priority 100) then changes the
    // object, so inject-proxy is called again, and must not add a second proxy.
    let r = eval(&[
        "--policy",
        &data("policies/drop-bpf.yaml"),
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        &data("objects/pod.yaml"),
        "--output",
        "object",
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    let containers = r.json()["spec"]["containers"].clone();
    let names: Vec<&str> = containers
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["app", "proxy"]);
    for c in containers.as_array().unwrap() {
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            json!(["BPF"]),
            "{c}"
        );
    }
}

#[test]
fn the_object_selector_opts_pods_out() {
    let opted_out = Scratch::new(
        "opt-out.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: quiet\n  labels:\n    gatehouse.dev/inject: \"false\"\nspec:\n  containers:\n  - name: app\n    image: app:1\n",
    );
    let r = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        opted_out.path(),
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    assert!(r.json()["response"].get("patch").is_none());
}

#[test]
fn kubewarden_capabilities_example_drops_bpf() {
    let args = [
        "--policy",
        &data("policies/drop-bpf.yaml"),
        "--object",
        &data("objects/security-context-demo-4.yaml"),
    ];
    let r = eval(&args);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.patch(),
        json!([{"op": "add", "path": "/spec/containers/0/securityContext/capabilities/drop", "value": ["BPF"]}])
    );
    let object = eval(&[&args[..], &["--output", "object"]].concat());
    assert_eq!(
        object.json(),
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "security-context-demo-4"},
            "spec": {"containers": [{
                "name": "sec-ctx-4",
                "image": "gcr.io/google-samples/node-hello:1.0",
                "securityContext": {"capabilities": {"add": ["NET_ADMIN", "SYS_TIME"], "drop": ["BPF"]}},
            }]},
        })
    );
}

#[test]
fn a_validation_deny_exits_1_with_the_message() {
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--object",
        &data("objects/pod-no-limits.yaml"),
    ]);
    assert_eq!(r.code, 1);
    let message = "policy \"require-limits\": every container must declare resource limits";
    assert!(r.err.contains(&format!("denied: {message}")), "{}", r.err);
    let response = &r.json()["response"];
    assert_eq!(response["allowed"], false);
    assert_eq!(response["status"]["code"], 403);
    assert_eq!(response["status"]["reason"], "Forbidden");
    assert_eq!(response["status"]["message"], message);
}

#[test]
fn a_warning_admits_and_is_reported() {
    let r = eval(&[
        "--policy",
        &data("policies/warn-latest.yaml"),
        "--object",
        &data("objects/pod-latest.yaml"),
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    let warning = "policy \"warn-latest\": images should be pinned, not :latest";
    assert!(r.err.contains(&format!("warning: {warning}")), "{}", r.err);
    let response = &r.json()["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["warnings"], json!([warning]));
}

#[test]
fn an_invalid_policy_exits_2_listing_every_problem() {
    let file = data("policies/invalid.yaml");
    let r = eval(&["--policy", &file, "--object", &data("objects/pod.yaml")]);
    assert_eq!(r.code, 2);
    assert!(r.out.is_empty());
    let prefix = format!("{file}: policy \"broken\": ");
    let expected = [
        "spec.timeoutSeconds: must be between 1 and 30, got 60",
        "spec.match.rules[0].resources[0]: \"pods/status/extra\" is not a resource",
        "spec.mutate[0].forEach: \"spec..containers\" is not a dotted path",
        "spec.mutate[0].when: does not compile: ",
        "spec.validate[0].expression: unknown variable \"objct\"",
    ];
    let lines: Vec<&str> = r.err.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert_eq!(lines.len(), expected.len(), "{}", r.err);
    for want in expected {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{prefix}{want}"))),
            "missing {want:?} in\n{}",
            r.err
        );
    }
    assert!(!r.err.contains("\"fine\""), "{}", r.err);
}

#[test]
fn a_malformed_review_exits_2() {
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--request",
        &review("malformed.json"),
    ]);
    assert_eq!(r.code, 2);
    assert!(
        r.err
            .contains("malformed AdmissionReview: missing \"request.uid\""),
        "{}",
        r.err
    );

    let garbage = Scratch::new("garbage.json", "{\"apiVersion\": ");
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--request",
        garbage.path(),
    ]);
    assert_eq!(r.code, 2, "{}", r.err);

    let wrong = Scratch::new(
        "v1beta1.json",
        r#"{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}"#,
    );
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--request",
        wrong.path(),
    ]);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("admission.k8s.io/v1beta1"), "{}", r.err);
}

#[test]
fn unreadable_files_exit_2() {
    let r = eval(&[
        "--policy",
        "/nonexistent/policy.yaml",
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(r.code, 2);
    assert!(r.err.contains("/nonexistent/policy.yaml"), "{}", r.err);
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--object",
        "/nonexistent/pod.yaml",
    ]);
    assert_eq!(r.code, 2);
    let not_a_policy = eval(&[
        "--policy",
        &data("objects/pod.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(not_a_policy.code, 2);
    assert!(
        not_a_policy
            .err
            .contains("is not a gatehouse.dev/v1alpha1 Policy"),
        "{}",
        not_a_policy.err
    );
}

#[test]
fn validators_judge_the_final_object() {
    // The Pod declares limits, so require-limits alone admits it; the injected proxy does not, and
    // validation runs after every mutation.
    let alone = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(alone.code, 0, "{}", alone.err);
    let r = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(r.code, 1, "{}", r.err);
    assert!(
        r.err.contains(
            "denied: policy \"require-limits\": every container must declare resource limits"
        ),
        "{}",
        r.err
    );
    let response = &r.json()["response"];
    assert_eq!(response["allowed"], false);
    assert!(
        response.get("patch").is_none(),
        "a denied request carries no patch"
    );
}

#[test]
fn a_review_file_is_answered_with_its_uid() {
    let r = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--request",
        &review("pod-create.json"),
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(
        r.json()["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(
        r.patch(),
        json!([{"op": "add", "path": "/spec/containers/1", "value": proxy()}])
    );
}

#[test]
fn the_synthesised_request_follows_the_flags() {
    // A DELETE carries the object as oldObject: nothing to mutate, and inject-proxy (CREATE only)
    // does not even match.
    let r = eval(&[
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--object",
        &data("objects/pod.yaml"),
        "--operation",
        "DELETE",
        "--output",
        "object",
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
    assert_eq!(r.json(), Value::Null);

    let p = Scratch::new(
        "namespace-policy.yaml",
        r#"
apiVersion: gatehouse.dev/v1alpha1
kind: Policy
metadata: {name: where}
spec:
  match:
    rules: [{operations: ["UPDATE"], apiGroups: [""], apiVersions: ["v1"], resources: ["pods/status"], scope: Namespaced}]
  validate:
    - expression: "request.namespace == 'prod' && request.subResource == 'status' && request.userInfo.username == 'gatehouse-eval' && oldObject != null"
      message: wrong request
"#,
    );
    let r = eval(&[
        "--policy",
        p.path(),
        "--object",
        &data("objects/pod.yaml"),
        "--old-object",
        &data("objects/pod.yaml"),
        "--operation",
        "UPDATE",
        "--namespace",
        "prod",
        "--resource",
        "pods/status",
    ]);
    assert_eq!(r.code, 0, "{}", r.err);
}

#[test]
fn plural_guesses() {
    use gatehouse::cli::synthetic::plural;
    for (kind, want) in [
        ("Pod", "pods"),
        ("Ingress", "ingresses"),
        ("NetworkPolicy", "networkpolicies"),
        ("Endpoints", "endpoints"),
        ("Gateway", "gateways"),
        ("StorageClass", "storageclasses"),
    ] {
        assert_eq!(plural(kind), want);
    }
}

#[test]
fn the_binary_exits_with_the_decision() {
    let gatehouse = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gatehouse"))
            .arg("eval")
            .args(args)
            .output()
            .expect("the gatehouse binary runs")
    };
    let admitted = gatehouse(&[
        "--policy",
        &data("policies/drop-bpf.yaml"),
        "--object",
        &data("objects/security-context-demo-4.yaml"),
    ]);
    assert_eq!(
        admitted.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&admitted.stderr)
    );
    let denied = gatehouse(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--object",
        &data("objects/pod-no-limits.yaml"),
    ]);
    assert_eq!(denied.status.code(), Some(1));
    let bad = gatehouse(&[
        "--policy",
        &data("policies/invalid.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("spec.validate[0].expression: unknown variable \"objct\"")
    );
}

#[test]
fn cel_the_api_server_refuses_exits_2_with_the_field_and_reason() {
    let policy = Scratch::new(
        "refused-cel.yaml",
        r#"apiVersion: gatehouse.dev/v1alpha1
kind: Policy
metadata:
  name: refused-cel
spec:
  match:
    rules:
      - operations: ["CREATE"]
        apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["pods"]
  validate:
    - expression: "foo(object)"
      message: refused
    - expression: "object.metadata.name.startsWith(1)"
      message: refused
    - expression: "quantity(object.spec.containers[0].resources.limits.cpu).isLessThan(2)"
      message: refused
    - expression: "object.metadata.name.matches('[')"
      message: refused
    - expression: "[1, 'a'].size() == 2"
      message: refused
"#,
    );
    let r = eval(&[
        "--policy",
        policy.path(),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert_eq!(r.code, 2, "{}", r.err);
    assert!(r.out.is_empty(), "{}", r.out);
    for (field, reason) in [
        ("spec.validate[0].expression", "unknown function \"foo\""),
        (
            "spec.validate[1].expression",
            "found no matching overload for 'startsWith' applied to 'dyn.(int)'",
        ),
        (
            "spec.validate[2].expression",
            "found no matching overload for 'isLessThan' applied to 'kubernetes.Quantity.(int)'",
        ),
        (
            "spec.validate[3].expression",
            "invalid regular expression \"[\"",
        ),
        (
            "spec.validate[4].expression",
            "a list literal mixes int and string",
        ),
    ] {
        assert!(
            r.err
                .lines()
                .any(|l| l.contains(&format!("{field}: ")) && l.contains(reason)),
            "no {field} refused with {reason:?} in\n{}",
            r.err
        );
    }
}

#[test]
fn explain_says_where_each_policy_would_run() {
    let run = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--policy",
        &data("policies/inject-proxy.yaml"),
        "--policy",
        &data("policies/warn-latest.yaml"),
        "--object",
        &data("objects/pod.yaml"),
        "--explain",
    ]);
    // The injected sidecar has no limits: denied, and explained all the same.
    assert_eq!(run.code, 1, "{}", run.err);
    assert!(
        run.err.contains(
            "policy \"require-limits\" runs in-process, as ValidatingAdmissionPolicy gatehouse-require-limits"
        ),
        "{}",
        run.err
    );
    assert!(
        run.err
            .contains("policy \"inject-proxy\" runs webhook: spec.reinvocationPolicy"),
        "{}",
        run.err
    );
    // A Warn rule never denies: a Warn Policy under Fail runs in-process too.
    assert!(
        run.err.contains(
            "policy \"warn-latest\" runs in-process, as ValidatingAdmissionPolicy gatehouse-warn-latest"
        ),
        "{}",
        run.err
    );
    // Without the flag, nothing of the kind.
    let quiet = eval(&[
        "--policy",
        &data("policies/require-limits.yaml"),
        "--object",
        &data("objects/pod.yaml"),
    ]);
    assert!(!quiet.err.contains("runs"), "{}", quiet.err);
}

#[test]
fn a_namespaced_policy_judges_its_own_namespace_only() {
    let policy = Scratch::new(
        "tenant.yaml",
        r#"apiVersion: gatehouse.dev/v1alpha1
kind: NamespacedPolicy
metadata: {name: owner, namespace: team-a}
spec:
  match:
    rules: [{operations: [CREATE], apiGroups: [""], apiVersions: [v1], resources: [pods]}]
  validate:
  - {expression: "has(object.metadata.labels) && 'owner' in object.metadata.labels", message: "name an owner"}
"#,
    );
    let pod = |ns: &str| {
        Scratch::new(
            &format!("pod-{ns}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {ns}}}\nspec: {{containers: [{{name: a, image: a}}]}}\n"
            ),
        )
    };
    let (own, other) = (pod("team-a"), pod("team-b"));
    let denied = eval(&["--policy", policy.path(), "--object", own.path()]);
    assert_eq!(
        denied.json()["response"]["allowed"],
        false,
        "{}",
        denied.out
    );
    assert!(denied.out.contains("name an owner"), "{}", denied.out);
    let admitted = eval(&["--policy", policy.path(), "--object", other.path()]);
    assert_eq!(
        admitted.json()["response"]["allowed"],
        true,
        "{}",
        admitted.out
    );

    // Reaching past its namespace is refused, with the field.
    let wide = Scratch::new(
        "wide.yaml",
        &std::fs::read_to_string(policy.path())
            .unwrap()
            .replace("resources: [pods]", "resources: [namespaces]"),
    );
    let refused = eval(&["--policy", wide.path(), "--object", own.path()]);
    assert!(
        refused.err.contains("spec.match.rules[0].resources[0]"),
        "{}",
        refused.err
    );
}
