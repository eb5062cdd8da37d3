//! The cost of one admission review in process: a 10-container Pod reviewed by one Policy, next
//! to a baseline that only parses the AdmissionReview and serialises an empty answer (the floor
//! any webhook pays), and a validating Policy calling Kubernetes' quantity and CIDR libraries on
//! every container next to a plain expression reading the same fields.
//!
//! `cargo bench -p gatehouse-engine --bench engine`. No external harness: each case is calibrated to
//! about 200 ms per sample, seven interleaved samples are taken, and the median time per review
//! is printed with its ratio. Figures go to `operator/benches/README.md`; the end-to-end
//! benchmarks (`tests/bench/admission-load`, `webhook-https.sh`) are what decide a change.
use std::hint::black_box;
use std::time::{Duration, Instant};

use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine as engine;
use gatehouse_engine::{CompiledPolicy, Phase, Response};
use serde_json::{Value, json};

fn pod() -> Value {
    let containers: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "name": format!("c{i}"),
                "image": format!("registry.example.com/team/app-{i}:1.{i}.0"),
                "args": ["--port", format!("{}", 8000 + i)],
                "env": [{"name": "MODE", "value": "prod"}, {"name": "INDEX", "value": format!("{i}")}],
                "ports": [{"name": "http", "containerPort": 8000 + i}],
                "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m"}},
                "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}},
            })
        })
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bench", "namespace": "shop", "labels": {"app": "bench", "tier": "web"}},
        "spec": {"containers": containers, "restartPolicy": "Always"},
    })
}

/// The AdmissionReview of a CREATE of the bench Pod.
fn review() -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "bench",
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["devs"]},
            "object": pod(),
        }
    })
    .to_string()
    .into_bytes()
}

fn policy(name: &str, body: Value) -> CompiledPolicy {
    let mut spec = json!({
        "match": {"rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
    });
    if let (Value::Object(s), Value::Object(b)) = (&mut spec, body) {
        s.extend(b);
    }
    let p: Policy = serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("bench Policy decodes");
    engine::compile(&p).expect("bench Policy is valid")
}

/// Iterations that take about 200 ms, found by doubling.
fn calibrate(f: &mut dyn FnMut()) -> u32 {
    let mut iterations = 1u32;
    loop {
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        if start.elapsed() > Duration::from_millis(200) {
            return iterations;
        }
        iterations *= 2;
    }
}

/// Median time per iteration of each case. Samples of the cases are interleaved, so that load
/// from other processes hits them alike and the ratios stay meaningful.
fn measure(cases: &mut [&mut dyn FnMut()]) -> Vec<Duration> {
    const SAMPLES: usize = 7;
    let iterations: Vec<u32> = cases.iter_mut().map(|f| calibrate(*f)).collect();
    let mut samples = vec![Vec::with_capacity(SAMPLES); cases.len()];
    for _ in 0..SAMPLES {
        for (i, f) in cases.iter_mut().enumerate() {
            let start = Instant::now();
            for _ in 0..iterations[i] {
                f();
            }
            samples[i].push(start.elapsed() / iterations[i]);
        }
    }
    samples
        .into_iter()
        .map(|mut s| {
            s.sort();
            s[SAMPLES / 2]
        })
        .collect()
}

fn main() {
    let body = review();
    let proxy = policy(
        "inject-proxy",
        json!({"mutate": [{"merge": {"spec": {"containers": [
            {"name": "proxy", "image": "envoy:1.31", "resources": {"limits": {"cpu": "100m"}}}]}}}]}),
    );
    let plain = policy(
        "plain",
        json!({"validate": [{"expression": "object.spec.containers.all(c, has(c.resources.limits.memory) && has(c.resources.limits.cpu) && c.resources.limits.memory != '' && c.resources.limits.cpu != '') && '10.1.2.3' != ''", "message": "m"}]}),
    );
    let libraries = policy(
        "libraries",
        json!({"validate": [{"expression": "object.spec.containers.all(c, quantity(c.resources.limits.memory).compareTo(quantity('1Gi')) <= 0 && quantity(c.resources.limits.cpu).isLessThan(quantity('2'))) && cidr('10.0.0.0/8').containsIP('10.1.2.3')", "message": "m"}]}),
    );
    let mut baseline = || {
        let req = engine::parse_request(black_box(&body)).expect("parses");
        black_box(engine::encoded_review(&req, &Response::allow()));
    };
    let review_with = |p: &CompiledPolicy, phase: Phase| {
        let req = engine::parse_request(black_box(&body)).expect("parses");
        let resp = engine::admit_one(&req, p, phase);
        assert!(resp.allowed(), "the bench Pod is admitted");
        black_box(engine::encoded_review(&req, &resp));
    };
    let times = measure(&mut [
        &mut baseline,
        &mut || review_with(&proxy, Phase::Mutating),
        &mut || review_with(&plain, Phase::Validating),
        &mut || review_with(&libraries, Phase::Validating),
    ]);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "one review of a 10-container Pod ({} bytes of AdmissionReview):",
        body.len()
    );
    println!(
        "  baseline: parse the review, serialise an empty answer  {:>9.1?}",
        times[0]
    );
    println!(
        "  one mutating Policy (a merge)                          {:>9.1?}  {:>5.2}x baseline",
        times[1],
        ratio(times[1], times[0])
    );
    println!(
        "  one validating Policy, a plain expression              {:>9.1?}  {:>5.2}x baseline",
        times[2],
        ratio(times[2], times[0])
    );
    println!(
        "  one validating Policy, 40 quantity() and a cidr()      {:>9.1?}  {:>5.2}x plain",
        times[3],
        ratio(times[3], times[2])
    );
}
