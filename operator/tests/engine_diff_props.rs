//! `engine::diff::diff` is `json_patch::diff`, as properties: for generated pairs of documents the
//! two patches serialize identically (same operations, order, paths and values), and applying the
//! patch to the original gives the mutated document.
//!
//! Pairs are either independent (mostly different everywhere) or derived from one document by a
//! few edits (so most subtrees are shared, the case the optimization skips). Keys include ones
//! that need escaping in a JSON pointer (`a/b`, `~x`, `~1`) and the empty key.
use gatehouse::engine::diff::diff;
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Value, json};

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "a", "b", "c", "name", "a/b", "~x", "~1", "", "c~0/d", "/",
    ])
    .prop_map(str::to_string)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-2i64..3).prop_map(Value::from),
        prop::sample::select(vec![0.5f64, -0.0, 0.0, 1.0]).prop_map(Value::from),
        prop::sample::select(vec!["x", "y", "", "a/b"]).prop_map(Value::from),
    ]
}

fn value() -> BoxedStrategy<Value> {
    leaf()
        .prop_recursive(5, 64, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
            ]
        })
        .boxed()
}

fn object() -> BoxedStrategy<Value> {
    prop::collection::btree_map(key(), value(), 0..7)
        .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>()))
        .boxed()
}

/// One edit somewhere in a document: follow `steps` down (each picks a child), then `kind`.
#[derive(Debug, Clone)]
struct Edit {
    steps: Vec<Index>,
    kind: u8,
    pick: Index,
    key: String,
    value: Value,
}

fn edit() -> impl Strategy<Value = Edit> {
    (
        prop::collection::vec(any::<Index>(), 0..6),
        0u8..5,
        any::<Index>(),
        key(),
        value(),
    )
        .prop_map(|(steps, kind, pick, key, value)| Edit {
            steps,
            kind,
            pick,
            key,
            value,
        })
}

fn child<'a>(v: &'a mut Value, i: &Index) -> Option<&'a mut Value> {
    match v {
        Value::Object(m) if !m.is_empty() => {
            let n = i.index(m.len());
            m.values_mut().nth(n)
        }
        Value::Array(a) if !a.is_empty() => {
            let n = i.index(a.len());
            a.get_mut(n)
        }
        _ => None,
    }
}

fn apply_edit(doc: &mut Value, e: &Edit) {
    let mut node = doc;
    for step in &e.steps {
        if child(node, step).is_none() {
            break;
        }
        // Re-borrow: the check above proved the child exists.
        node = match child(node, step) {
            Some(c) => c,
            None => return,
        };
    }
    let pick = e.pick;
    match (e.kind, &mut *node) {
        (0, n) => *n = e.value.clone(),
        (1, Value::Object(m)) => {
            m.insert(e.key.clone(), e.value.clone());
        }
        (1, Value::Array(a)) => {
            let at = pick.index(a.len() + 1);
            a.insert(at, e.value.clone());
        }
        (2, Value::Object(m)) if !m.is_empty() => {
            let k = m.keys().nth(pick.index(m.len())).cloned();
            if let Some(k) = k {
                m.remove(&k);
            }
        }
        (2, Value::Array(a)) if !a.is_empty() => {
            a.remove(pick.index(a.len()));
        }
        (3, Value::Array(a)) => a.truncate(a.len() / 2),
        (3, Value::Object(m)) => {
            m.insert(e.key.clone(), json!({"nested": e.value.clone()}));
        }
        (4, Value::Array(a)) => a.push(e.value.clone()),
        (_, n) => *n = e.value.clone(),
    }
}

fn check(a: &Value, b: &Value) -> Result<(), TestCaseError> {
    let ours = diff(a, b);
    let theirs = json_patch::diff(a, b);
    let ours_json = serde_json::to_string(&ours).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let theirs_json =
        serde_json::to_string(&theirs).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&ours_json, &theirs_json);
    prop_assert_eq!(&ours, &theirs);
    let mut patched = a.clone();
    json_patch::patch(&mut patched, &ours).map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(&patched, b);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn independent_pairs(a in value(), b in value()) {
        check(&a, &b)?;
    }

    #[test]
    fn independent_objects(a in object(), b in object()) {
        check(&a, &b)?;
    }

    #[test]
    fn derived_pairs(a in object(), edits in prop::collection::vec(edit(), 0..5)) {
        let mut b = a.clone();
        for e in &edits {
            apply_edit(&mut b, e);
        }
        check(&a, &b)?;
        check(&b, &a)?;
    }

    #[test]
    fn derived_values(a in value(), edits in prop::collection::vec(edit(), 1..4)) {
        let mut b = a.clone();
        for e in &edits {
            apply_edit(&mut b, e);
        }
        check(&a, &b)?;
    }
}

#[test]
fn escaped_keys_and_shared_subtrees() {
    let a = json!({
        "metadata": {"labels": {"a/b": "1", "~x": "2", "": "3"}, "name": "p"},
        "spec": {"containers": [
            {"name": "c", "image": "i", "env": [{"name": "A", "value": "1"}]},
            {"name": "d", "image": "j"}
        ]},
        "big": {"unchanged": [1, 2, 3, {"deep": true}]}
    });
    let b = json!({
        "metadata": {"labels": {"a/b": "9", "~x": "2", "new~/": "4"}, "name": "p"},
        "spec": {"containers": [
            {"name": "c", "image": "i2", "env": [{"name": "A", "value": "1"}, {"name": "B"}]},
            {"name": "d", "image": "j"},
            {"name": "e"}
        ]},
        "big": {"unchanged": [1, 2, 3, {"deep": true}]}
    });
    let ours = diff(&a, &b);
    assert_eq!(ours, json_patch::diff(&a, &b));
    let paths: Vec<String> = ours.0.iter().map(|op| op.path().to_string()).collect();
    assert_eq!(
        paths,
        [
            "/metadata/labels/a~1b",
            "/metadata/labels/new~0~1",
            "/metadata/labels/",
            "/spec/containers/0/env/1",
            "/spec/containers/0/image",
            "/spec/containers/2",
        ]
    );
}

#[test]
fn roots_and_arrays() {
    for (a, b) in [
        (json!(null), json!({"x": 1})),
        (json!({"x": 1}), json!(1)),
        (json!([1, 2, 3]), json!([1])),
        (json!([1]), json!([1, 2, 3])),
        (json!([]), json!([[], {}])),
        (json!({"": {"": 1}}), json!({"": {"": 2}})),
        (json!({"a": [1, {"b": 2}]}), json!({"a": [1, {"b": 3}, 4]})),
        (json!({"a": 1}), json!({"a": 1})),
    ] {
        assert_eq!(diff(&a, &b), json_patch::diff(&a, &b), "{a} -> {b}");
    }
}
