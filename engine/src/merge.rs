//! The one mutation primitive: merge a JSON patch into a JSON value, idempotently.
//!
//! The API server may call a mutating webhook again (`reinvocationPolicy: IfNeeded`), and a
//! Policy's result is fed back through its own mutations (see [`super::mutate`]), so every rule
//! below is chosen to make `merge(merge(x, p), p) == merge(x, p)` hold for every `x` and `p`:
//!
//! * **object into object**: each key of the patch is merged into the same key of the target;
//!   a key absent from the target (or `null` there: JSON null means "unset" in Kubernetes) gets
//!   the patch's value *materialised* — what merging it into an empty value of its type yields, so
//!   that merging it once more changes nothing.
//! * **`null` in the patch**: with `overwrite` the key is removed; without, it is ignored (an
//!   absent key is not set to null, an existing one is kept). Nulls never reach the target, since
//!   "set to null" and "remove" would disagree on the second application.
//! * **array into array**, classified by the patch's elements:
//!   * *named*: every element is an object whose `name` is a string. Each element merges into the
//!     first target element that is an object of the same `name`, or is appended (materialised)
//!     when there is none. Duplicate names within the patch merge into the same element in order.
//!   * *scalars*: every element is a string, number, bool or null. The union: elements not
//!     present in the target are appended, in patch order; existing order and duplicates in the
//!     target are kept.
//!   * anything else (mixed arrays, objects without a string `name`, nested arrays) is atomic:
//!     treated as a scalar.
//!   * an empty patch array is a no-op (the union with nothing); use `null` to remove an array.
//! * **scalars and mismatched types**: the target is kept, unless `overwrite`, in which case it is
//!   replaced by the materialised patch.
//!
//! A top-level `null` patch is a no-op: null only has a meaning as an object member.

use serde_json::{Map, Value};

/// Merges `patch` into `target` with the semantics of the module documentation.
pub fn merge(target: &mut Value, patch: &Value, overwrite: bool) {
    merge_changed(target, patch, overwrite);
}

/// [`merge`], telling whether `target` changed: lets a caller detect a fixed point without
/// keeping a copy to compare with.
pub fn merge_changed(target: &mut Value, patch: &Value, overwrite: bool) -> bool {
    match (target, patch) {
        (_, Value::Null) => false,
        (target @ Value::Null, patch) => replace(target, materialize(patch, overwrite)),
        (Value::Object(t), Value::Object(p)) => merge_object(t, p, overwrite),
        (Value::Array(t), Value::Array(p)) if array_kind(p) != ArrayKind::Atomic => {
            merge_array(t, p, overwrite)
        }
        (target, patch) => overwrite && replace(target, materialize(patch, overwrite)),
    }
}

fn replace(target: &mut Value, value: Value) -> bool {
    let changed = *target != value;
    *target = value;
    changed
}

/// The value an absent target takes when `patch` is merged into it: the patch with object nulls
/// dropped and named/scalar arrays de-duplicated, exactly as merging it into an empty object or
/// array would leave it. A fixed point: `merge(materialize(p), p) == materialize(p)`.
pub fn materialize(patch: &Value, overwrite: bool) -> Value {
    match patch {
        Value::Object(p) => {
            let mut t = Map::new();
            merge_object(&mut t, p, overwrite);
            Value::Object(t)
        }
        Value::Array(p) if array_kind(p) != ArrayKind::Atomic => {
            let mut t = Vec::new();
            merge_array(&mut t, p, overwrite);
            Value::Array(t)
        }
        other => other.clone(),
    }
}

fn merge_object(
    target: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    overwrite: bool,
) -> bool {
    let mut changed = false;
    for (key, value) in patch {
        if value.is_null() {
            if overwrite {
                changed |= target.remove(key).is_some();
            }
            continue;
        }
        match target.get_mut(key) {
            Some(existing) => changed |= merge_changed(existing, value, overwrite),
            None => {
                target.insert(key.clone(), materialize(value, overwrite));
                changed = true;
            }
        }
    }
    changed
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ArrayKind {
    Named,
    Scalars,
    Atomic,
}

/// Classifies a patch array. Empty arrays are "named" (any non-atomic kind would do: merging
/// nothing is a no-op either way).
fn array_kind(patch: &[Value]) -> ArrayKind {
    if patch.iter().all(|e| name_of(e).is_some()) {
        ArrayKind::Named
    } else if patch.iter().all(|e| !e.is_object() && !e.is_array()) {
        ArrayKind::Scalars
    } else {
        ArrayKind::Atomic
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.as_object()?.get("name")?.as_str()
}

/// Merges a named or scalar patch array (see [`array_kind`]) into `target`.
fn merge_array(target: &mut Vec<Value>, patch: &[Value], overwrite: bool) -> bool {
    match array_kind(patch) {
        // Two elements of the same name can, with `overwrite`, set a field and unset it again:
        // each step's "changed" is then no guide to the net result, so compare with a snapshot.
        // (Without `overwrite` a merge only adds, so no later element can take a change back.)
        ArrayKind::Named if overwrite && repeats_a_name(patch) => {
            let before = target.clone();
            merge_array_named(target, patch, overwrite);
            *target != before
        }
        ArrayKind::Named => merge_array_named(target, patch, overwrite),
        ArrayKind::Scalars => {
            let mut changed = false;
            for element in patch {
                if !target.contains(element) {
                    target.push(element.clone());
                    changed = true;
                }
            }
            changed
        }
        ArrayKind::Atomic => {
            let changed = overwrite && target.as_slice() != patch;
            if changed {
                *target = patch.to_vec();
            }
            changed
        }
    }
}

/// Merges each element of a named patch array into the target element of the same name, or
/// appends it.
fn merge_array_named(target: &mut Vec<Value>, patch: &[Value], overwrite: bool) -> bool {
    let mut changed = false;
    for element in patch {
        let name = name_of(element);
        match target.iter_mut().find(|t| name_of(t) == name) {
            Some(existing) => changed |= merge_changed(existing, element, overwrite),
            None => {
                target.push(materialize(element, overwrite));
                changed = true;
            }
        }
    }
    changed
}

/// Whether two elements of a named patch array share a name. Patch arrays are a handful of
/// elements, so the quadratic scan beats building a set.
fn repeats_a_name(patch: &[Value]) -> bool {
    patch.iter().enumerate().any(|(i, e)| {
        patch[..i]
            .iter()
            .any(|earlier| name_of(earlier) == name_of(e))
    })
}

/// Whether `path` is a well-formed `forEach` path: dot-separated, non-empty segments of
/// `[A-Za-z0-9_-]`.
pub fn is_valid_path(path: &str) -> bool {
    path.split('.').all(|segment| {
        !segment.is_empty()
            && segment
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    })
}

/// The array at the dotted `path` of `root`, if every segment names an object member and the last
/// one holds an array.
pub fn array_at<'a>(root: &'a Value, path: &str) -> Option<&'a Vec<Value>> {
    path.split('.')
        .try_fold(root, |v, segment| v.as_object()?.get(segment))?
        .as_array()
}

/// Mutable [`array_at`].
pub fn array_at_mut<'a>(root: &'a mut Value, path: &str) -> Option<&'a mut Vec<Value>> {
    path.split('.')
        .try_fold(root, |v, segment| v.as_object_mut()?.get_mut(segment))?
        .as_array_mut()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn merged(target: Value, patch: Value, overwrite: bool) -> Value {
        let mut t = target;
        merge(&mut t, &patch, overwrite);
        t
    }

    #[test]
    fn defaults_only_absent_keys() {
        let t = json!({"a": 1, "b": {"c": 2}});
        let p = json!({"a": 9, "b": {"c": 9, "d": 3}, "e": 4});
        assert_eq!(
            merged(t.clone(), p.clone(), false),
            json!({"a": 1, "b": {"c": 2, "d": 3}, "e": 4})
        );
        assert_eq!(
            merged(t, p, true),
            json!({"a": 9, "b": {"c": 9, "d": 3}, "e": 4})
        );
    }

    #[test]
    fn null_removes_only_with_overwrite_and_is_never_set() {
        let t = json!({"a": 1, "b": 2});
        let p = json!({"a": null, "c": null, "d": {"x": null, "y": 1}});
        assert_eq!(
            merged(t.clone(), p.clone(), true),
            json!({"b": 2, "d": {"y": 1}})
        );
        assert_eq!(merged(t, p, false), json!({"a": 1, "b": 2, "d": {"y": 1}}));
    }

    #[test]
    fn a_null_target_counts_as_absent() {
        assert_eq!(
            merged(json!({"a": null}), json!({"a": {"b": 1}}), false),
            json!({"a": {"b": 1}})
        );
    }

    #[test]
    fn named_arrays_merge_by_name() {
        let t = json!({"c": [{"name": "app", "image": "app:1"}]});
        let p = json!({"c": [{"name": "app", "image": "x", "tty": true}, {"name": "proxy", "image": "envoy"}]});
        assert_eq!(
            merged(t, p, false),
            json!({"c": [{"name": "app", "image": "app:1", "tty": true}, {"name": "proxy", "image": "envoy"}]})
        );
    }

    #[test]
    fn duplicate_names_in_a_patch_fold_into_one_element() {
        let p = json!({"c": [{"name": "a", "v": 1}, {"name": "a", "v": 2, "w": 3}]});
        assert_eq!(
            merged(json!({}), p.clone(), false),
            json!({"c": [{"name": "a", "v": 1, "w": 3}]})
        );
        assert_eq!(
            merged(json!({}), p, true),
            json!({"c": [{"name": "a", "v": 2, "w": 3}]})
        );
    }

    #[test]
    fn scalar_arrays_are_unioned() {
        let t = json!({"drop": ["NET_RAW", "NET_RAW"]});
        let p = json!({"drop": ["BPF", "NET_RAW", "BPF"]});
        assert_eq!(
            merged(t, p, false),
            json!({"drop": ["NET_RAW", "NET_RAW", "BPF"]})
        );
    }

    #[test]
    fn other_arrays_are_atomic() {
        let t = json!({"a": [[1]]});
        let p = json!({"a": [[2], {"x": null}]});
        assert_eq!(merged(t.clone(), p.clone(), false), t);
        assert_eq!(merged(t, p, true), json!({"a": [[2], {"x": null}]}));
    }

    #[test]
    fn mismatched_types_are_scalars() {
        assert_eq!(
            merged(json!({"a": "s"}), json!({"a": {"b": 1}}), false),
            json!({"a": "s"})
        );
        assert_eq!(
            merged(json!({"a": "s"}), json!({"a": {"b": 1, "c": null}}), true),
            json!({"a": {"b": 1}})
        );
        assert_eq!(
            merged(json!({"a": [1]}), json!({"a": 2}), true),
            json!({"a": 2})
        );
    }

    #[test]
    fn a_name_repeated_to_undo_itself_reports_no_change() {
        let x = json!({"c": [{"name": "x"}]});
        let p = json!({"c": [{"name": "x", "v": false}, {"name": "x", "v": null}]});
        let mut y = x.clone();
        assert!(!merge_changed(&mut y, &p, true));
        assert_eq!(y, x);
        // The same patch on a target that had the field: removed, and said so.
        let mut z = json!({"c": [{"name": "x", "v": true}]});
        assert!(merge_changed(&mut z, &p, true));
        assert_eq!(z, x);
    }

    #[test]
    fn paths() {
        assert!(is_valid_path("spec.containers"));
        assert!(is_valid_path("spec.init-containers_2"));
        for bad in [
            "",
            ".spec",
            "spec.",
            "spec..c",
            "spec.c[0]",
            "spec c",
            "spec/c",
        ] {
            assert!(!is_valid_path(bad), "{bad}");
        }
        let mut v = json!({"spec": {"containers": [1], "x": 1}});
        assert_eq!(array_at(&v, "spec.containers"), Some(&vec![json!(1)]));
        assert_eq!(array_at(&v, "spec.x"), None);
        assert_eq!(array_at(&v, "spec.nope.deeper"), None);
        assert!(array_at_mut(&mut v, "spec.containers").is_some());
    }
}
