//! Idempotence of mutations, as properties: `m(m(x)) == m(x)`.
//!
//! The generators deliberately produce the hard cases: arrays of objects where some have a
//! `name` and some don't, names that are not strings, duplicate names within one patch, `null`
//! values at every depth, mismatched types, and `forEach` paths that hit arrays, scalars and
//! nothing. Nothing is filtered away.
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::merge::{materialize, merge};
use gatehouse_engine::{chain, compile, mutate};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c", "name", "spec"]).prop_map(str::to_string)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0i64..3).prop_map(Value::from),
        prop::sample::select(vec!["x", "y", "z"]).prop_map(Value::from),
    ]
}

fn object_of(inner: impl Strategy<Value = Value>, size: usize) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), inner, 0..size)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

/// An object with a string `name` (mostly from a tiny set, so that names collide) or, now and
/// then, a non-string one.
fn named(inner: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    let name = prop_oneof![
        4 => prop::sample::select(vec!["x", "y"]).prop_map(Value::from),
        1 => leaf(),
    ];
    (name, object_of(inner, 3)).prop_map(|(n, mut o)| {
        if let Value::Object(m) = &mut o {
            m.insert("name".to_string(), n);
        }
        o
    })
}

fn value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(4, 48, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(named(inner.clone()), 0..4).prop_map(Value::Array),
                object_of(inner.clone(), 4),
                named(inner),
            ]
        })
        .boxed()
}

fn object() -> BoxedStrategy<Value> {
    object_of(value(), 5).boxed()
}

/// A target shaped like a Kubernetes object: `spec.c` is usually an array of (named) objects.
fn target() -> impl Strategy<Value = Value> {
    let containers = prop_oneof![
        4 => prop::collection::vec(prop_oneof![3 => named(value()), 1 => value()], 0..4)
            .prop_map(Value::Array),
        1 => value(),
    ];
    (object(), containers, object()).prop_map(|(mut root, c, mut spec)| {
        if let Value::Object(s) = &mut spec {
            s.insert("c".to_string(), c);
        }
        if let Value::Object(r) = &mut root {
            r.insert("spec".to_string(), spec);
        }
        root
    })
}

fn merged(mut x: Value, p: &Value, overwrite: bool) -> Value {
    merge(&mut x, p, overwrite);
    x
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn merge_is_idempotent(x in target(), p in object(), overwrite in any::<bool>()) {
        let once = merged(x, &p, overwrite);
        let twice = merged(once.clone(), &p, overwrite);
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn merge_of_any_values_is_idempotent(x in value(), p in value(), overwrite in any::<bool>()) {
        let once = merged(x, &p, overwrite);
        let twice = merged(once.clone(), &p, overwrite);
        prop_assert_eq!(twice, once);
    }

    #[test]
    fn materialize_is_a_fixed_point(p in value(), overwrite in any::<bool>()) {
        let m = materialize(&p, overwrite);
        prop_assert_eq!(merged(m.clone(), &p, overwrite), m);
    }

    #[test]
    fn no_null_reaches_an_object_member(x in target(), p in object(), overwrite in any::<bool>()) {
        // Nulls already in the target are the target's business; none may come from the patch.
        let mut clean = x.clone();
        strip_nulls(&mut clean);
        let out = merged(clean, &p, overwrite);
        // Nulls inside atomic (replaced or inserted verbatim) arrays are allowed: look only at
        // members reachable without crossing an array.
        fn member_nulls(v: &Value) -> usize {
            match v {
                Value::Object(m) => m.values().map(|v| usize::from(v.is_null()) + member_nulls(v)).sum(),
                _ => 0,
            }
        }
        prop_assert_eq!(member_nulls(&out), 0);
    }
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// A mutation as a Policy would spell it. Guards are drawn from expressions over `element` and
/// `object` that later mutations can flip, which is what makes lists hard.
fn mutation(guards: bool) -> impl Strategy<Value = Value> {
    mutation_with(guards, any::<bool>())
}

/// [`mutation`] with `overwrite` drawn from `overwrite`.
fn mutation_with(
    guards: bool,
    overwrite: impl Strategy<Value = bool>,
) -> impl Strategy<Value = Value> {
    let for_each = prop_oneof![
        3 => Just(None),
        3 => Just(Some("spec.c")),
        1 => Just(Some("spec")),
        1 => Just(Some("nope.c")),
    ];
    let when_each = prop::sample::select(vec![
        "true",
        "false",
        "!has(element.a)",
        "has(element.name) && element.name == 'x'",
        "!has(object.b)",
    ]);
    let when_root = prop::sample::select(vec!["true", "!has(object.b)", "has(object.a)"]);
    (
        for_each,
        when_each,
        when_root,
        any::<bool>(),
        object(),
        overwrite,
    )
        .prop_map(
            move |(for_each, when_each, when_root, guarded, mut merge, overwrite)| {
                if let (Some(_), Value::Object(m)) = (for_each, &mut merge) {
                    // Ruled out by validation: a forEach merge may not mention `name`.
                    m.remove("name");
                }
                let mut m = json!({"merge": merge, "overwrite": overwrite});
                if let Some(path) = for_each {
                    m["forEach"] = json!(path);
                }
                if guards && guarded {
                    m["when"] = json!(if for_each.is_some() {
                        when_each
                    } else {
                        when_root
                    });
                }
                m
            },
        )
}

/// Mutate lists whose guards mostly do not read `object`: plain merges (guards over constants
/// only) before `forEach` merges (guards over `element` only), mostly without overwrite. About
/// one mutation in ten overwrites or has a guard over `object`, and guarded `forEach`s followed
/// by one over the same path occur.
fn element_guarded() -> impl Strategy<Value = Vec<Value>> {
    let plain = (
        prop::option::of(prop::sample::select(vec![
            "true",
            "false",
            "oldObject == null",
        ])),
        object(),
    )
        .prop_map(|(when, merge)| {
            let mut m = json!({"merge": merge});
            if let Some(when) = when {
                m["when"] = json!(when);
            }
            m
        });
    let for_each = (
        prop::sample::select(vec!["spec.c", "spec", "nope.c"]),
        prop::option::of(prop::sample::select(vec![
            "true",
            "!has(element.a)",
            "has(element.name) && element.name == 'x'",
        ])),
        object(),
    )
        .prop_map(|(path, when, mut merge)| {
            if let Value::Object(m) = &mut merge {
                // Ruled out by validation: a forEach merge may not mention `name`.
                m.remove("name");
            }
            let mut m = json!({"forEach": path, "merge": merge});
            if let Some(when) = when {
                m["when"] = json!(when);
            }
            m
        });
    let spoiler = prop_oneof![
        18 => Just(None),
        1 => Just(Some(json!({"overwrite": true}))),
        1 => Just(Some(json!({"when": "!has(object.b)"}))),
    ];
    (
        prop::collection::vec(plain, 0..3),
        prop::collection::vec(for_each, 1..3),
        spoiler,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(plain, for_each, spoiler, at)| {
            let mut list: Vec<Value> = plain.into_iter().chain(for_each).collect();
            if let Some(Value::Object(extra)) = spoiler {
                let i = at.index(list.len());
                if let Value::Object(m) = &mut list[i] {
                    m.extend(extra);
                }
            }
            list
        })
}

fn policy(mutate: Vec<Value>, failure_policy: &str) -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": "prop"},
        "spec": {
            "failurePolicy": failure_policy,
            "match": {"rules": [{"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"]}]},
            "mutate": mutate,
        }
    }))
    .expect("the generated Policy decodes")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    /// Without guards, a whole mutate list always settles, and applying it again changes nothing.
    #[test]
    fn a_mutate_list_is_idempotent(x in target(), list in prop::collection::vec(mutation(false), 1..5)) {
        let compiled = compile(&policy(list, "Fail")).expect("the generated Policy is valid");
        let request = json!({});
        let once = applied(&compiled, &x, None, &request).expect("no guards, no errors");
        prop_assert!(once.run.settled);
        let twice = applied(&compiled, &once.object, None, &request).expect("no errors");
        prop_assert!(twice.run.settled);
        prop_assert_eq!(twice.object, once.object);
    }

    /// With guards, whenever the list settles (the engine warns when it does not), applying it
    /// again changes nothing.
    #[test]
    fn a_guarded_mutate_list_is_idempotent_when_it_settles(
        x in target(),
        list in prop::collection::vec(mutation(true), 1..5),
    ) {
        // Guards may fail (`has(element.a)` on a scalar element): with failurePolicy Ignore that
        // element is skipped, so the case is still exercised rather than dropped.
        let compiled = compile(&policy(list, "Ignore")).expect("the generated Policy is valid");
        let request = json!({});
        let once = applied(&compiled, &x, None, &request).expect("Ignore never fails");
        if once.run.settled {
            let twice = applied(&compiled, &once.object, None, &request).expect("settled");
            prop_assert_eq!(twice.object, once.object);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// `merge_changed` is what fixed-point detection relies on: it must say exactly whether the
    /// target changed.
    #[test]
    fn merge_changed_tells_the_truth(x in target(), p in object(), overwrite in any::<bool>()) {
        let mut y = x.clone();
        let changed = gatehouse_engine::merge::merge_changed(&mut y, &p, overwrite);
        prop_assert_eq!(changed, y != x);
    }
}

fn named_policy(name: &str, mutate: Vec<Value>, reinvocation: &str) -> Policy {
    let mut p = policy(mutate, "Fail");
    p.metadata.name = Some(name.to_string());
    p.spec.reinvocation_policy = serde_json::from_value(json!(reinvocation)).expect("a policy");
    p
}

fn review_of(object: &Value) -> gatehouse_engine::Request {
    gatehouse_engine::parse_request(&body_of(object)).expect("a valid review")
}

/// Policies `p0`, `p1`, … with the mutate lists `lists`, compiled, and their reinvocation policy.
fn compiled_chain(
    lists: Vec<Vec<Value>>,
    reinvocation: &str,
) -> (
    Vec<gatehouse_engine::CompiledPolicy>,
    gatehouse_api::v1alpha1::ReinvocationPolicy,
) {
    let compiled = lists
        .into_iter()
        .enumerate()
        .map(|(i, list)| {
            compile(&named_policy(&format!("p{i}"), list, reinvocation)).expect("valid")
        })
        .collect();
    let policy = serde_json::from_value(json!(reinvocation)).expect("a reinvocation policy");
    (compiled, policy)
}

/// Members offered the request with nothing matched beforehand and any Namespace.
fn unscoped() -> chain::Matching<'static> {
    chain::Matching {
        namespace: gatehouse_engine::Namespace::Assumed,
        matched: false,
    }
}

/// What `mutate::settle` made of a copy of an object.
struct Mutated {
    object: Value,
    run: mutate::Run,
}

/// `mutate::settle` on a copy of `object`.
fn applied(
    policy: &gatehouse_engine::CompiledPolicy,
    object: &Value,
    old_object: Option<&Value>,
    request: &Value,
) -> Result<Mutated, mutate::MutateError> {
    let mut object = object.clone();
    let run = mutate::settle(policy, &mut object, old_object, request)?.run;
    Ok(Mutated { object, run })
}

/// An AdmissionReview creating `object`.
fn body_of(object: &Value) -> Vec<u8> {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Thing"},
            "resource": {"group": "", "version": "v1", "resource": "things"},
            "namespace": "ns",
            "operation": "CREATE",
            "object": object,
        }
    })
    .to_string()
    .into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// A shared entry runs its members as a chain on one working copy. With `IfNeeded` the API
    /// server may call the entry again with the chain's own output (reinvocation): whenever the
    /// chain settled (it warns when it does not), that second call changes nothing.
    #[test]
    fn a_chain_of_policies_is_idempotent(
        x in target(),
        lists in prop::collection::vec(prop::collection::vec(mutation(false), 1..4), 1..5),
    ) {
        let (compiled, policy) = compiled_chain(lists, "IfNeeded");
        let members: Vec<&gatehouse_engine::CompiledPolicy> = compiled.iter().collect();
        let scope = unscoped();
        let once = chain::admit_mutating(&review_of(&x), &members, policy, scope);
        prop_assert!(once.response.allowed, "{:?}", once.response.message());
        let after = once.object(&review_of(&x)).expect("an object");
        if once.response.warnings.iter().any(|w| w.contains("did not settle")) {
            return Ok(());
        }
        let twice = chain::admit_mutating(&review_of(&after), &members, policy, scope);
        prop_assert!(twice.response.patch.0.is_empty(), "second call patched: {:?}", twice.response.patch);
    }

    /// An `IfNeeded` group runs again the members that ran before a later change. The
    /// reference is the simple one: every member, round after round, until a whole round
    /// changes nothing. The generator favours what makes a rerun necessary: elements added to
    /// an array an earlier member's forEach merges into.
    #[test]
    fn an_if_needed_chain_ends_where_whole_rounds_do(
        x in target(),
        lists in prop::collection::vec(
            prop::collection::vec(
                prop_oneof![
                    2 => mutation_with(false, prop::bool::weighted(0.1)),
                    // What makes an earlier member run again: adding elements to the array
                    // another member's forEach merges into.
                    1 => named(value()).prop_map(|e| json!({"merge": {"spec": {"c": [e]}}})),
                    1 => object().prop_map(|mut m| {
                        if let Value::Object(o) = &mut m {
                            o.remove("name");
                        }
                        json!({"forEach": "spec.c", "merge": m})
                    }),
                ],
                1..4,
            ),
            1..6,
        ),
    ) {
        let compiled: Vec<gatehouse_engine::CompiledPolicy> = lists
            .into_iter()
            .enumerate()
            .map(|(i, list)| compile(&named_policy(&format!("p{i}"), list, "IfNeeded")).expect("valid"))
            .collect();
        let members: Vec<&gatehouse_engine::CompiledPolicy> = compiled.iter().collect();
        let scope = unscoped();
        let req = review_of(&x);
        let out = chain::admit_mutating(&req, &members, gatehouse_api::v1alpha1::ReinvocationPolicy::IfNeeded, scope);
        prop_assert!(out.response.allowed, "{:?}", out.response.message());
        if out.response.warnings.iter().any(|w| w.contains("did not settle")) {
            return Ok(());
        }
        let request = req.cel_variable();
        let mut object = x.clone();
        let mut settled = false;
        for _ in 0..compiled.len() + 2 {
            let before = object.clone();
            for policy in &compiled {
                object = applied(policy, &object, None, &request).expect("no guards").object;
            }
            if object == before {
                settled = true;
                break;
            }
        }
        prop_assume!(settled);
        prop_assert_eq!(out.object(&req), Some(object));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The members of a mutating group change one working copy in place. The reference is the simple one: each member's
    /// `mutate::settle` on the previous member's output, in order. The chain's patch must end
    /// where the reference does, a member must count as patched exactly when its mutations
    /// changed the object, and a member whose guard fails under `Fail` must deny.
    #[test]
    fn a_chain_ends_where_its_members_applied_one_after_the_other(
        x in target(),
        lists in prop::collection::vec(
            prop_oneof![
                2 => element_guarded(),
                1 => prop::collection::vec(mutation(true), 1..4),
            ],
            1..5,
        ),
    ) {
        let compiled: Vec<gatehouse_engine::CompiledPolicy> = lists
            .into_iter()
            .enumerate()
            .map(|(i, list)| compile(&named_policy(&format!("p{i}"), list, "Never")).expect("valid"))
            .collect();
        let members: Vec<&gatehouse_engine::CompiledPolicy> = compiled.iter().collect();
        let scope = unscoped();
        let req = review_of(&x);
        let out = chain::admit_mutating(&req, &members, gatehouse_api::v1alpha1::ReinvocationPolicy::Never, scope);

        let request = req.cel_variable();
        let mut object = x.clone();
        let mut decisions = Vec::new();
        for policy in &compiled {
            match applied(policy, &object, None, &request) {
                Ok(mutated) => {
                    decisions.push(if mutated.object != object {
                        chain::Decision::Patched
                    } else if !mutated.run.ignored.is_empty() {
                        chain::Decision::Ignored
                    } else {
                        chain::Decision::Allowed
                    });
                    object = mutated.object;
                }
                Err(e) => {
                    prop_assert!(!out.response.allowed, "{} failed, yet the chain allowed", e);
                    return Ok(());
                }
            }
        }
        prop_assert!(out.response.allowed, "{:?}", out.response.message());
        prop_assert_eq!(out.object(&req), Some(object));
        let reported: Vec<chain::Decision> = out.evaluated.iter().map(|e| e.decision).collect();
        prop_assert_eq!(reported, decisions);
    }
}
