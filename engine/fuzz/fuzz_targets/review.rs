//! Any body the webhook port receives: decoded, then reviewed by a mutating and a validating
//! group. Never a panic; a mutating answer's patch applies to the object it was computed from.
#![no_main]

use std::sync::OnceLock;

use gatehouse_api::v1alpha1::{Policy, ReinvocationPolicy};
use gatehouse_engine::chain::{self, Matching};
use gatehouse_engine::{CompiledPolicy, Namespace, compile, parse_request};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

fn policies() -> &'static [CompiledPolicy] {
    static POLICIES: OnceLock<Vec<CompiledPolicy>> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let all = json!({"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]});
        [
            json!({"match": all, "mutate": [{"merge": {"metadata": {"labels": {"fuzzed": "yes"}}}}]}),
            json!({"match": all, "mutate": [{"forEach": "spec.containers", "when": "has(element.image) && !element.image.startsWith('registry.internal/')", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}]}),
            json!({"match": all, "validate": [{"expression": "!has(object.spec) || !has(object.spec.containers) || object.spec.containers.all(c, has(c.resources))", "message": "resources"}]}),
        ]
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            let p: Policy = serde_json::from_value(json!({
                "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy",
                "metadata": {"name": format!("p{i}")}, "spec": spec,
            }))
            .expect("fuzz Policy decodes");
            compile(&p).expect("fuzz Policy compiles")
        })
        .collect()
    })
}

fuzz_target!(|body: &[u8]| {
    let Ok(req) = parse_request(body) else { return };
    let scope = Matching { namespace: Namespace::Assumed, matched: false };
    let all: Vec<&CompiledPolicy> = policies().iter().collect();
    let out = chain::admit_mutating(&req, &all[..2], ReinvocationPolicy::IfNeeded, scope);
    if out.response.allowed && !out.response.patch.0.is_empty() {
        let mut object = req.object.clone().unwrap_or(Value::Null);
        json_patch::patch(&mut object, &out.response.patch).expect("the answer's patch applies");
    }
    let _ = chain::admit_validating(&req, &all[2..], scope);
});
