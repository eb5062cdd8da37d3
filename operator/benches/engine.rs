//! Cost of an admission review: a 10-container Pod against a 10-Policy set (merges, forEach with
//! and without guards, CEL validations, a match condition), next to a baseline that only parses the
//! AdmissionReview and serialises an empty answer, which is the floor any webhook pays.
//!
//! Then each performance layer of the engine against the simple code it stands in for, on the same
//! Pod and Policies: what it saves, also as a share of one review. A layer stays only while this
//! shows a gain; its doc comment quotes the figure.
//!
//! `cargo bench -p gatehouse --bench engine` (`ONLY=groups` for the last table, `ONLY=libraries`
//! for Kubernetes' CEL libraries). No external harness: each case is calibrated to
//! about 200ms per sample, seven interleaved samples are taken, and the median time per iteration
//! is printed with its ratio to the baseline.
use std::hint::black_box;
use std::time::{Duration, Instant};

use gatehouse::api::v1alpha1::Policy;
use gatehouse::cli::eval::admit;
use gatehouse::engine::cel::{self, Activation, Needs};
use gatehouse::engine::rule_table::RuleTable;
use gatehouse::engine::{self, CompiledPolicy, Phase, Response, diff, mutate};
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

fn body() -> Vec<u8> {
    review(pod())
}

/// The AdmissionReview of a CREATE of `pod`, with the Pod's own name and namespace.
fn review(pod: Value) -> Vec<u8> {
    let meta = &pod["metadata"];
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["devs"]},
            "object": pod,
        }
    })
    .to_string()
    .into_bytes()
}

fn policy(name: &str, priority: i32, extra: Value) -> CompiledPolicy {
    let mut spec = json!({
        "priority": priority,
        "match": {"rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
    });
    if let (Value::Object(s), Value::Object(e)) = (&mut spec, extra) {
        s.extend(e);
    }
    let p: Policy = serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1", "kind": "Policy", "metadata": {"name": name}, "spec": spec,
    }))
    .expect("bench Policy decodes");
    engine::compile(&p).expect("bench Policy is valid")
}

fn policies() -> Vec<CompiledPolicy> {
    vec![
        policy(
            "inject-proxy",
            10,
            json!({"mutate": [{"merge": {"spec": {"containers": [
            {"name": "proxy", "image": "envoy:1.31", "resources": {"limits": {"cpu": "100m"}}}]}}}]}),
        ),
        policy(
            "drop-bpf",
            20,
            json!({"mutate": [{"forEach": "spec.containers",
            "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}]}),
        ),
        policy(
            "non-root",
            30,
            json!({"mutate": [{"forEach": "spec.containers",
            "when": "!has(element.securityContext.runAsNonRoot)",
            "merge": {"securityContext": {"runAsNonRoot": true}}}]}),
        ),
        policy(
            "labels",
            40,
            json!({"mutate": [{"merge": {"metadata": {"labels": {"gatehouse.dev/managed": "true"}}}}]}),
        ),
        policy(
            "pull-policy",
            50,
            json!({"mutate": [{"forEach": "spec.containers",
            "when": "element.image.contains(':')", "merge": {"imagePullPolicy": "IfNotPresent"}}]}),
        ),
        policy(
            "require-limits",
            100,
            json!({"validate": [{"expression":
            "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
            "message": "every container must declare resource limits"}]}),
        ),
        policy(
            "tagged-images",
            100,
            json!({"validate": [{"expression":
            "object.spec.containers.all(c, c.image.contains(':') && !c.image.endsWith(':latest'))",
            "message": "images must be pinned"}]}),
        ),
        policy(
            "registry",
            100,
            json!({"validate": [{"expression":
            "object.spec.containers.all(c, c.image.startsWith('registry.example.com/') || c.name == 'proxy')",
            "message": "images come from the company registry", "action": "Warn"}]}),
        ),
        policy(
            "shop-only",
            100,
            json!({
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
                      "conditions": [{"name": "in-shop", "expression": "request.namespace == 'shop'"}]},
            "validate": [{"expression": "object.metadata.labels.tier in ['web', 'worker']", "message": "tier label required"}]}),
        ),
        policy(
            "ports",
            100,
            json!({"validate": [{"expression":
            "object.spec.containers.all(c, !has(c.ports) || c.ports.all(p, p.containerPort > 1024))",
            "message": "no privileged ports"}]}),
        ),
    ]
}

/// Iterations that take about 200ms, found by doubling.
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
/// from other processes (the machine is shared) hits them alike and the ratios stay meaningful.
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
    match std::env::var("ONLY").as_deref() {
        Ok("groups") => return groups(),
        Ok("libraries") => return libraries(&body()),
        _ => {}
    }
    let body = body();
    let policies = policies();

    let mut baseline = || {
        let req = engine::parse_request(black_box(&body)).expect("parses");
        black_box(engine::encoded_review(&req, &Response::allow()));
    };

    // What the webhook server does per HTTP request: one Policy per request. Ten requests, one
    // per Policy in the phase it is registered for; reported per request.
    let mut per_policy = || {
        for p in &policies {
            let req = engine::parse_request(black_box(&body)).expect("parses");
            let phase = if p.has_mutations() {
                Phase::Mutating
            } else {
                Phase::Validating
            };
            let resp = engine::decide(&req, p, phase);
            black_box(engine::encoded_review(&req, &resp));
        }
    };

    // What `gatehouse eval` (and the API server's chain) does: all ten Policies, mutations feeding
    // each other, reinvocation bookkeeping, then validation of the final object.
    let mut chain = || {
        let req = engine::parse_request(black_box(&body)).expect("parses");
        let admission = admit(&req, &policies);
        black_box(engine::admission::review_value(
            &admission.request,
            &admission.response,
        ));
    };

    let times = measure(&mut [&mut baseline, &mut per_policy, &mut chain]);
    let (baseline, per_policy, chain) = (times[0], times[1] / 10, times[2]);
    let ratio = |d: Duration| d.as_secs_f64() / baseline.as_secs_f64();
    println!(
        "engine benchmark: 10-container Pod, 10 Policies ({} bytes of AdmissionReview)",
        body.len()
    );
    println!("  baseline: parse the review + serialise an empty answer  {baseline:>9.1?}");
    println!(
        "  review:   one Policy per request (parse, decide, answer)  {per_policy:>9.1?}  {:>5.1}x baseline",
        ratio(per_policy)
    );
    println!(
        "  chain:    all 10 Policies in API-server order (eval)      {chain:>9.1?}  {:>5.1}x baseline",
        ratio(chain)
    );
    layers(&body, &policies, per_policy);
    libraries(&body);
    groups();
}

/// One validating review with a Policy calling Kubernetes' quantity and CIDR libraries on every
/// container, beside the same review with a plain expression reading the same fields.
fn libraries(body: &[u8]) {
    let plain = policy(
        "plain",
        100,
        json!({"validate": [{"expression": "object.spec.containers.all(c, has(c.resources.limits.memory) && has(c.resources.limits.cpu) && c.resources.limits.memory != '' && c.resources.limits.cpu != '') && '10.1.2.3' != ''", "message": "m"}]}),
    );
    let libraries = policy(
        "libraries",
        100,
        json!({"validate": [{"expression": "object.spec.containers.all(c, quantity(c.resources.limits.memory).compareTo(quantity('1Gi')) <= 0 && quantity(c.resources.limits.cpu).isLessThan(quantity('2'))) && cidr('10.0.0.0/8').containsIP('10.1.2.3')", "message": "m"}]}),
    );
    let review_with = |p: &CompiledPolicy| {
        let req = engine::parse_request(black_box(body)).expect("parses");
        let resp = engine::decide(&req, p, Phase::Validating);
        assert!(resp.allowed, "the bench Pod passes");
        black_box(engine::encoded_review(&req, &resp));
    };
    let times = measure(&mut [&mut || review_with(&plain), &mut || review_with(&libraries)]);
    println!("Kubernetes' CEL libraries (one validating Policy, 10 containers):");
    println!(
        "  plain expression over the limits               {:>9.1?}",
        times[0]
    );
    println!(
        "  quantity() on 20 limits and a cidr() check      {:>9.1?}  {:>5.2}x plain",
        times[1],
        times[1].as_secs_f64() / times[0].as_secs_f64()
    );
}

/// A review of the one-container Pod of `tests/bench/admission-load`.
fn load_body() -> Vec<u8> {
    review(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod-1", "namespace": "bench-load"},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1.0",
            "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}}]}
    }))
}

/// A group's scope once its rule table has matched the request, as in the server.
fn with_rules<'a>(namespace: engine::Namespace<'a>, rules: &'a [bool]) -> engine::chain::Scope<'a> {
    engine::chain::Scope {
        namespace,
        matched: false,
        rules: Some(rules),
    }
}

/// The cost of a shared entry as its membership grows: the mutating and the validating group of
/// `tests/bench/admission-load` (each mutating Policy sets one of eight labels and drops a
/// capability, each validating one checks limits), half of `total` each, one request to both
/// (parse, the members, the answer) against the same with 16 Policies in all. With a
/// namespaceSelector each, as there.
fn groups() {
    let body = load_body();
    let labels = std::collections::BTreeMap::from([(
        "kubernetes.io/metadata.name".to_string(),
        "bench-load".to_string(),
    )]);
    let namespace = engine::Namespace::Labels(&labels);
    let sets: Vec<(Vec<CompiledPolicy>, Vec<CompiledPolicy>)> = [16, 64, 256]
        .into_iter()
        .map(|total: usize| {
            let selector = json!({"matchLabels": {"kubernetes.io/metadata.name": "bench-load"}});
            let rules = json!([{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "Namespaced"}]);
            let matching = json!({"rules": rules, "namespaceSelector": selector});
            let mutating = (0..total / 2)
                .map(|i| {
                    policy(&format!("bench-mutate-{i}"), 0, json!({"match": matching, "mutate": [
                        {"merge": {"metadata": {"labels": {format!("bench-{}", i % 8): "yes"}}}},
                        {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
                    ]}))
                })
                .collect();
            let validating = (0..total / 2)
                .map(|i| {
                    policy(&format!("bench-validate-{i}"), 0, json!({"match": matching, "validate": [
                        {"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}
                    ]}))
                })
                .collect();
            (mutating, validating)
        })
        .collect();
    let mut runs: Vec<Box<dyn FnMut()>> = sets
        .iter()
        .map(|(mutating, validating)| {
            let mutating: Vec<&CompiledPolicy> = mutating.iter().collect();
            let validating: Vec<&CompiledPolicy> = validating.iter().collect();
            // As the server does: each group's rules in one table, made when its membership is.
            let (mutating_rules, validating_rules) = (
                RuleTable::of(mutating.iter().copied()),
                RuleTable::of(validating.iter().copied()),
            );
            let body = body.clone();
            Box::new(move || {
                let req = engine::parse_request(black_box(&body)).expect("parses");
                let out = engine::chain::mutate(
                    &req,
                    &mutating,
                    gatehouse::api::v1alpha1::ReinvocationPolicy::IfNeeded,
                    with_rules(namespace, &mutating_rules.matching(&req)),
                );
                black_box(engine::encoded_review(&req, &out.response));
                let req = engine::parse_request(black_box(&body)).expect("parses");
                let out = engine::chain::validate(
                    &req,
                    &validating,
                    with_rules(namespace, &validating_rules.matching(&req)),
                );
                black_box(engine::encoded_review(&req, &out.response));
            }) as Box<dyn FnMut()>
        })
        .collect();
    let mut cases: Vec<&mut dyn FnMut()> = runs
        .iter_mut()
        .map(|f| &mut **f as &mut dyn FnMut())
        .collect();
    let t = measure(&mut cases);
    println!(
        "groups (admission-load's Policies; a mutating and a validating request, in-process):"
    );
    for (total, time) in [16, 64, 256].into_iter().zip(&t) {
        println!(
            "  {total:>3} Policies {time:>9.1?}  {:>5.2}x 16, {:>6.2?} per member",
            time.as_secs_f64() / t[0].as_secs_f64(),
            *time / total as u32
        );
    }
}

/// Each layer against its reference; `review` is the time of one single-Policy review.
fn layers(body: &[u8], policies: &[CompiledPolicy], review: Duration) {
    let req = engine::parse_request(body).expect("parses");
    let pod = req.object.clone().expect("a Pod");
    let request = req.cel_variable();
    let mutating: Vec<&CompiledPolicy> = policies.iter().filter(|p| p.has_mutations()).collect();
    let apply = |p: &CompiledPolicy, object: &Value| {
        mutate::apply(p, object, None, &request).expect("mutates")
    };
    let mut mutated = pod.clone();
    for p in &mutating {
        mutated = apply(p, &mutated).object;
    }
    let report = |layer: &str, fast: Duration, reference: Duration, reviews: u32| {
        let saved = reference.saturating_sub(fast) / reviews;
        println!(
            "  {layer:<11} {fast:>9.1?} against {reference:>9.1?}: {}, saves {saved:>7.1?} ({:>4.1}% of a review)",
            if fast.is_zero() {
                "spared".to_string()
            } else {
                format!(
                    "{:>4.2}x faster",
                    reference.as_secs_f64() / fast.as_secs_f64()
                )
            },
            100.0 * saved.as_secs_f64() / review.as_secs_f64()
        );
    };
    println!(
        "performance layers (fast path against its reference; share of a {review:.1?} review):"
    );

    // The typed decoder against JSON value first, then the request: every review parses.
    let t = measure(&mut [
        &mut || drop(black_box(engine::parse_request(black_box(body)))),
        &mut || {
            drop(black_box(engine::admission::request::parse_generic(
                black_box(body),
            )))
        },
    ]);
    report("parse", t[0], t[1], 1);

    // The one-pass diff against json_patch::diff: the whole Pod against all five Policies' result.
    let t = measure(&mut [
        &mut || drop(black_box(diff::diff(&pod, black_box(&mutated)))),
        &mut || drop(black_box(json_patch::diff(&pod, black_box(&mutated)))),
    ]);
    report("diff", t[0], t[1], 1);

    // Reach: copying, mutating and diffing what the list can reach, against the whole Pod. Once
    // per mutating Policy, so the saving is per review.
    let t = measure(&mut [
        &mut || {
            for p in &mutating {
                black_box(mutate::patch(p, &pod, None, &request).expect("mutates"));
            }
        },
        &mut || {
            for p in &mutating {
                black_box(diff::diff(&pod, &apply(p, &pod).object));
            }
        },
    ]);
    report("reach", t[0], t[1], mutating.len() as u32);

    // Without `overwrite`, a pass that changes nothing proves the fixed point; with one, every
    // pass after the first compares against a snapshot: the copy of the Pod this spares.
    let t = measure(&mut [&mut || drop(black_box(pod.clone()))]);
    report("no snapshot", Duration::ZERO, t[0], 1);

    // Needs analysis: converting only what the validations read of the Pod, against all of it.
    let programs: Vec<_> = policies
        .iter()
        .flat_map(|p| &p.spec().validate)
        .map(|v| {
            let program = cel::compile(&v.expression).expect("compiles");
            let needs = Needs::of(&program);
            (program, needs)
        })
        .collect();
    let t = measure(&mut [
        &mut || {
            for (program, needs) in &programs {
                let vars = Activation::with_needs(Some(&pod), None, &request, needs);
                black_box(cel::eval_bool(program, &vars).expect("evaluates"));
            }
        },
        &mut || {
            for (program, _) in &programs {
                let vars = Activation::new(Some(&pod), None, &request);
                black_box(cel::eval_bool(program, &vars).expect("evaluates"));
            }
        },
    ]);
    report("needs", t[0], t[1], programs.len() as u32);
}
