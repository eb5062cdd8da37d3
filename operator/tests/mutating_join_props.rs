//! Joined mutations, as a property: where the mutate lists of consecutive members with one
//! match join into one list that the translation makes one mutation of, the engine stores with
//! that list what it stores running the members one after the other.
// Helpers of a test may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used)]
use gatehouse::controller::wiring::mutating_join::joined_mutate;
use gatehouse::controller::wiring::mutating_policy::{footprints_of, policy_mutations};
use gatehouse_api::v1alpha1::Policy;
use gatehouse_engine::{compile, mutate};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "labels", "name"]).prop_map(str::to_string)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<bool>().prop_map(Value::Bool),
        (0i64..3).prop_map(Value::from),
        prop::sample::select(vec!["x", "y", "z"]).prop_map(Value::from),
    ]
}

fn object_of(inner: impl Strategy<Value = Value>, size: usize) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(key(), inner, 0..size)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
}

/// An object named from a tiny set, so that names collide.
fn named(inner: impl Strategy<Value = Value>) -> impl Strategy<Value = Value> {
    (prop::sample::select(vec!["x", "y"]), object_of(inner, 3)).prop_map(|(n, mut o)| {
        if let Value::Object(m) = &mut o {
            m.insert("name".to_string(), json!(n));
        }
        o
    })
}

fn value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(3, 24, 3, |inner| {
            prop_oneof![
                prop::collection::vec(
                    prop::sample::select(vec!["s", "t"]).prop_map(Value::from),
                    0..3
                )
                .prop_map(Value::Array),
                prop::collection::vec(named(inner.clone()), 1..3).prop_map(Value::Array),
                object_of(inner, 3),
            ]
        })
        .boxed()
}

/// An object shaped like a Kubernetes one: `metadata` and `spec.c`, a list of named objects.
fn target() -> impl Strategy<Value = Value> {
    (
        object_of(value(), 3),
        prop::collection::vec(named(value()), 0..3),
    )
        .prop_map(|(metadata, c)| json!({"metadata": metadata, "spec": {"c": c}}))
}

/// A plain mutation (no overwrite, no guard): a merge at the root, or into each of `spec.c`.
fn mutation() -> impl Strategy<Value = Value> {
    (any::<bool>(), object_of(value(), 3), object_of(value(), 2)).prop_map(
        |(each, root, element)| {
            if each {
                let mut element = element;
                if let Value::Object(m) = &mut element {
                    m.remove("name");
                }
                json!({"forEach": "spec.c", "merge": element})
            } else {
                json!({"merge": {"metadata": root}})
            }
        },
    )
}

fn policy(name: &str, mutate: &[Value]) -> Policy {
    serde_json::from_value(json!({
        "apiVersion": "gatehouse.dev/v1alpha1",
        "kind": "Policy",
        "metadata": {"name": name},
        "spec": {
            "match": {"rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]},
            "mutate": mutate,
        }
    }))
    .unwrap()
}

/// What the engine stores for `object` under each Policy in turn.
fn stored(policies: &[Policy], object: &Value) -> Value {
    let mut object = object.clone();
    for p in policies {
        let compiled = compile(p).unwrap();
        mutate::settle(&compiled, &mut object, None, &json!({})).unwrap();
    }
    object
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn joined_members_store_what_the_members_store_one_after_the_other(
        x in target(),
        lists in prop::collection::vec(prop::collection::vec(mutation(), 1..3), 2..5),
    ) {
        let members: Vec<Policy> = lists
            .iter()
            .enumerate()
            .map(|(i, list)| policy(&format!("p{i}"), list))
            .collect();
        // Only what a member's own validation accepts (a merge may be refused as invalid).
        prop_assume!(members.iter().all(|p| compile(p).is_ok()));
        let typed: Vec<&[gatehouse_api::v1alpha1::Mutation]> =
            members.iter().map(|p| p.spec.mutate.as_slice()).collect();
        let Some(joined_list) = joined_mutate(&typed) else {
            return Ok(());
        };
        let mut joined = members[0].clone();
        joined.spec.mutate = joined_list;
        let one = policy_mutations(&joined, &footprints_of(&joined, None), false)
            .is_ok_and(|m| m.len() == 1);
        // Lists that do not join into one mutation are not joined: nothing to compare.
        if !one || compile(&joined).is_err() {
            return Ok(());
        }
        prop_assert_eq!(stored(std::slice::from_ref(&joined), &x), stored(&members, &x));
    }
}

/// The benchmark's shape joins: sixteen Policies each adding a label and dropping a capability
/// in every container are one mutation.
#[test]
fn sixteen_labels_and_one_capability_are_one_mutation() {
    let members: Vec<Policy> = (0..16)
        .map(|i| {
            policy(
                &format!("p{i}"),
                &[
                    json!({"merge": {"metadata": {"labels": {format!("l{i}"): "yes"}}}}),
                    json!({"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}),
                ],
            )
        })
        .collect();
    let typed: Vec<&[gatehouse_api::v1alpha1::Mutation]> =
        members.iter().map(|p| p.spec.mutate.as_slice()).collect();
    let mut joined = members[0].clone();
    joined.spec.mutate = joined_mutate(&typed).unwrap();
    assert_eq!(joined.spec.mutate.len(), 2);
    let mutations = policy_mutations(&joined, &footprints_of(&joined, None), false).unwrap();
    assert_eq!(mutations.len(), 1);
}
