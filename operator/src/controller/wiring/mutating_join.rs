//! Joined mutations: consecutive members of a generated MutatingAdmissionPolicy with the same
//! match run as one mutation when their merges can be written as one.
//!
//! The API server decodes, converts and defaults the object for every mutation of a policy it
//! calls, so what a request pays grows with the number of mutations, not with what they write
//! (16 mutations adding a label each cost a create far more than one adding 16). Members with
//! one match share one guard; their `mutate[]` lists, applied one after the other, equal one
//! list whose entries are the union of theirs ([`joined_mutate`]): a parent the first creates is
//! created once, with what the later ones add under it. Whether that list is then one mutation
//! is the translation's call (one pass, entries writing apart: [`super::mutating_policy`]).
use serde_json::{Map, Value};

use gatehouse_api::v1alpha1::Mutation;

/// One `mutate[]` list that does what `lists` do applied one after the other, where it can be
/// said exactly: every entry a plain merge (no `overwrite`, no `when`), entries with the same
/// `forEach` (or none) merged into one, each merge the union of theirs with the earlier one's
/// value kept where both set a scalar ([`union`]). `None` where a pair of merges cannot be
/// joined (values of different kinds at one place).
pub fn joined_mutate(lists: &[&[Mutation]]) -> Option<Vec<Mutation>> {
    let mut joined: Vec<Mutation> = Vec::new();
    for entry in lists.iter().flat_map(|l| l.iter()) {
        if entry.overwrite || entry.when.is_some() {
            return None;
        }
        match joined.iter_mut().find(|j| j.for_each == entry.for_each) {
            Some(j) => j.merge = union(&j.merge, &entry.merge)?,
            None => joined.push(entry.clone()),
        }
    }
    Some(joined)
}

/// The merge that does what merging `first` and then `later` (neither overwriting) does, where
/// there is one. A merge adds what is absent and goes into what is present when it is of the
/// same kind (an object into a map, named elements into a list by name, strings into a list of
/// strings), and leaves anything else as it is; so:
/// - objects: every key of either, in order, the shared ones joined;
/// - named arrays: `first`'s elements (each joined with `later`'s of the same name), then
///   `later`'s other names (neither repeating a name);
/// - arrays of strings: `first`'s, then `later`'s not among them;
/// - scalars: `first`'s (the later merge finds the place taken);
///
/// and `None` for values of different kinds, where which of them goes in depends on what the
/// object holds there.
pub fn union(first: &Value, later: &Value) -> Option<Value> {
    match (first, later) {
        (Value::Object(a), Value::Object(b)) => {
            let mut out = Map::new();
            for (key, value) in a {
                let joined = match b.get(key) {
                    Some(other) => union(value, other)?,
                    None => value.clone(),
                };
                out.insert(key.clone(), joined);
            }
            for (key, value) in b {
                if !a.contains_key(key) {
                    out.insert(key.clone(), value.clone());
                }
            }
            Some(Value::Object(out))
        }
        (Value::Array(a), Value::Array(b)) if named(a) && named(b) => {
            // A merge repeating a name merges both into one element: no exact union.
            if repeats_a_name(a) || repeats_a_name(b) {
                return None;
            }
            let mut out = Vec::new();
            for element in a {
                let same = b.iter().find(|e| name_of(e) == name_of(element));
                out.push(match same {
                    Some(other) => union(element, other)?,
                    None => element.clone(),
                });
            }
            out.extend(
                b.iter()
                    .filter(|e| !a.iter().any(|x| name_of(x) == name_of(e)))
                    .cloned(),
            );
            Some(Value::Array(out))
        }
        (Value::Array(a), Value::Array(b)) if strings(a) && strings(b) => {
            let mut out = a.clone();
            out.extend(b.iter().filter(|v| !a.contains(v)).cloned());
            Some(Value::Array(out))
        }
        (Value::Array(_), _)
        | (_, Value::Array(_))
        | (Value::Object(_), _)
        | (_, Value::Object(_)) => None,
        (Value::Null, _) | (_, Value::Null) => None,
        (scalar, _) => Some(scalar.clone()),
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.as_object()?.get("name")?.as_str()
}

/// A non-empty array of objects that all have a name.
fn named(items: &[Value]) -> bool {
    !items.is_empty() && items.iter().all(|e| name_of(e).is_some())
}

fn repeats_a_name(items: &[Value]) -> bool {
    items
        .iter()
        .enumerate()
        .any(|(i, e)| items[..i].iter().any(|x| name_of(x) == name_of(e)))
}

fn strings(items: &[Value]) -> bool {
    items.iter().all(Value::is_string)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn objects_join_key_by_key_and_the_first_scalar_stays() {
        let joined = union(
            &json!({"metadata": {"labels": {"a": "1", "c": "x"}}}),
            &json!({"metadata": {"labels": {"b": "2", "c": "y"}, "annotations": {"n": "v"}}}),
        );
        assert_eq!(
            joined,
            Some(
                json!({"metadata": {"labels": {"a": "1", "c": "x", "b": "2"}, "annotations": {"n": "v"}}})
            )
        );
    }

    #[test]
    fn named_elements_join_by_name_and_strings_by_value() {
        let joined = union(
            &json!({"containers": [{"name": "p", "image": "a"}], "args": ["x"]}),
            &json!({"containers": [{"name": "q"}, {"name": "p", "env": [{"name": "E"}]}], "args": ["y", "x"]}),
        );
        assert_eq!(
            joined,
            Some(json!({
                "containers": [{"name": "p", "image": "a", "env": [{"name": "E"}]}, {"name": "q"}],
                "args": ["x", "y"],
            }))
        );
    }

    #[test]
    fn values_of_other_kinds_do_not_join() {
        assert_eq!(union(&json!({"x": {"a": 1}}), &json!({"x": "s"})), None);
        assert_eq!(
            union(&json!({"x": ["s"]}), &json!({"x": [{"name": "n"}]})),
            None
        );
        assert_eq!(
            union(&json!({"x": 1}), &json!({"x": "s"})),
            Some(json!({"x": 1}))
        );
    }

    #[test]
    fn lists_join_per_for_each_and_refuse_overwrite_and_guards() {
        let label = |k: &str| Mutation {
            merge: json!({"metadata": {"labels": {k: "yes"}}}),
            ..Mutation::default()
        };
        let drop = Mutation {
            for_each: Some("spec.containers".into()),
            merge: json!({"securityContext": {"capabilities": {"drop": ["BPF"]}}}),
            ..Mutation::default()
        };
        let a = [label("a"), drop.clone()];
        let b = [label("b"), drop.clone()];
        let joined = joined_mutate(&[&a, &b]).unwrap();
        assert_eq!(joined.len(), 2);
        assert_eq!(
            joined[0].merge,
            json!({"metadata": {"labels": {"a": "yes", "b": "yes"}}})
        );
        assert_eq!(joined[1], drop);
        let overwrite = [Mutation {
            overwrite: true,
            ..label("c")
        }];
        assert_eq!(joined_mutate(&[&a, &overwrite]), None);
        let guarded = [Mutation {
            when: Some("true".into()),
            ..label("c")
        }];
        assert_eq!(joined_mutate(&[&a, &guarded]), None);
    }
}
