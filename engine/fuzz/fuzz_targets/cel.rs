//! A CEL expression from a Policy, compiled and evaluated against a Pod: never a panic, and an
//! expression is either refused, evaluated, or stopped by its cost budget.
#![no_main]

use std::sync::OnceLock;

use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::{Phase, compile, admit_one, parse_request};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn request() -> &'static gatehouse_engine::Request {
    static REQUEST: OnceLock<gatehouse_engine::Request> = OnceLock::new();
    REQUEST.get_or_init(|| {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "operation": "CREATE", "namespace": "shop",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "userInfo": {"username": "alice", "groups": ["dev"]},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "shop", "labels": {"app": "web"}, "annotations": {"a": "1"}},
                "spec": {"containers": [{"name": "app", "image": "app:1", "resources": {"limits": {"cpu": "1"}}},
                                        {"name": "side", "image": "side:2"}]}},
        }});
        parse_request(body.to_string().as_bytes()).expect("the fuzz review parses")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(expression) = std::str::from_utf8(data) else { return };
    let Ok(policy) = serde_json::from_value::<Policy>(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": "fuzz"},
        "spec": {
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
            "validate": [{"expression": expression, "message": "fuzzed"}],
        },
    })) else {
        return;
    };
    let Ok(compiled) = compile(&policy) else { return };
    let _ = admit_one(request(), &compiled, Phase::Validating);
});
