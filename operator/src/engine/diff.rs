//! [`diff`]: `json_patch::diff` without walking the parts of a document that did not change.
//!
//! `json_patch::diff` (json-patch 4.2) visits every node of both documents, pushing and popping
//! a JSON-pointer token for every object key and array index even where the two sides are
//! identical. A mutation typically changes a few fields of a large object, so almost all of that
//! work produces nothing. [`diff`] returns exactly the same [`Patch`] (same operations, same
//! order, same paths, same values) while skipping subtrees that compare equal.
//!
//! Why the result is identical, by the structure of json-patch 4.2's `diff_impl`:
//!
//! * **Equal values produce no operations.** Objects recurse key by key, arrays index by index
//!   (equal arrays have equal lengths, so no add/remove), and scalars emit nothing when `==`.
//!   By induction `a == b` implies `json_patch::diff(a, b)` is empty, so skipping an equal pair is
//!   exact.
//! * **Objects** (`diff_object`): for each `(key, right_value)` of the right map in its iteration
//!   order, recurse with `key` pushed if the left map has the key, else emit `add`; then, for
//!   each key of the left map in its iteration order that the right map lacks, emit `remove`.
//!   [`diff`] does the same over the same maps (whatever their iteration order, BTreeMap or
//!   `preserve_order`), only skipping equal pairs, and pushes keys with the same
//!   `PointerBuf::push_back`, so escaping (`~0`, `~1`, empty keys) is identical.
//! * **Arrays** (`diff_array`): for `idx < min(len)` it recurses at `idx`; removals only start at
//!   `idx == right.len()` (left longer), and `shift` counts them, so every removal's index is
//!   `right.len()`; additions (right longer) are at `idx` for `left.len()..right.len()`. While both
//!   elements exist `shift` is 0, so the recursion path is `idx`. [`diff`] emits the same
//!   sequence.
//! * **Anything else** (scalars, or differing types): the operations of `json_patch::diff` on the
//!   pair itself, with each path prefixed by the pair's pointer. At the top of a sub-diff the
//!   pointer is the root, and `diff_impl` only ever extends the pointer it is given, so prefixing
//!   every path is the same as having started with the prefix.
//!
//! `operator/tests/engine_diff_props.rs` checks the equality against `json_patch::diff` on
//! generated documents.
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::Value;

/// The RFC 6902 patch from `original` to `mutated`: always equal to
/// `json_patch::diff(original, mutated)`, computed without visiting equal subtrees.
pub fn diff(original: &Value, mutated: &Value) -> Patch {
    let mut patch = Patch::default();
    if original != mutated {
        let mut pointer = PointerBuf::new();
        walk(original, mutated, &mut pointer, &mut patch.0);
    }
    patch
}

/// Appends the operations `json_patch::diff` emits for `left` → `right` at `pointer`.
/// Callers only pass pairs that differ (equal pairs emit nothing).
fn walk(left: &Value, right: &Value, pointer: &mut PointerBuf, ops: &mut Vec<PatchOperation>) {
    match (left, right) {
        (Value::Object(left_obj), Value::Object(right_obj)) => {
            for (key, right_value) in right_obj {
                match left_obj.get(key) {
                    Some(left_value) => {
                        if left_value != right_value {
                            pointer.push_back(key);
                            walk(left_value, right_value, pointer, ops);
                            pointer.pop_back();
                        }
                    }
                    None => {
                        let mut path = pointer.clone();
                        path.push_back(key);
                        ops.push(PatchOperation::Add(AddOperation {
                            path,
                            value: right_value.clone(),
                        }));
                    }
                }
            }
            for key in left_obj.keys() {
                if !right_obj.contains_key(key) {
                    let mut path = pointer.clone();
                    path.push_back(key);
                    ops.push(PatchOperation::Remove(RemoveOperation { path }));
                }
            }
        }
        (Value::Array(left_arr), Value::Array(right_arr)) => {
            for (idx, (left_value, right_value)) in left_arr.iter().zip(right_arr).enumerate() {
                if left_value != right_value {
                    pointer.push_back(idx);
                    walk(left_value, right_value, pointer, ops);
                    pointer.pop_back();
                }
            }
            // Left longer: json_patch removes at `idx - shift`, which is always right.len().
            for _ in right_arr.len()..left_arr.len() {
                let mut path = pointer.clone();
                path.push_back(right_arr.len());
                ops.push(PatchOperation::Remove(RemoveOperation { path }));
            }
            // Right longer: json_patch adds at each index past the end of left.
            for (idx, right_value) in right_arr.iter().enumerate().skip(left_arr.len()) {
                let mut path = pointer.clone();
                path.push_back(idx);
                ops.push(PatchOperation::Add(AddOperation {
                    path,
                    value: right_value.clone(),
                }));
            }
        }
        _ => {
            // Scalars or differing types: json_patch's own operations, under `pointer`.
            for mut op in json_patch::diff(left, right).0 {
                prefix(&mut op, pointer);
                ops.push(op);
            }
        }
    }
}

/// Prefixes `op`'s path with `prefix` (a no-op at the root).
fn prefix(op: &mut PatchOperation, prefix: &PointerBuf) {
    if prefix.is_root() {
        return;
    }
    // json_patch::diff only emits add, remove and replace; the rest are handled for completeness.
    let (path, from) = match op {
        PatchOperation::Add(op) => (&mut op.path, None),
        PatchOperation::Remove(op) => (&mut op.path, None),
        PatchOperation::Replace(op) => (&mut op.path, None),
        PatchOperation::Test(op) => (&mut op.path, None),
        PatchOperation::Move(op) => (&mut op.path, Some(&mut op.from)),
        PatchOperation::Copy(op) => (&mut op.path, Some(&mut op.from)),
    };
    *path = prefix.concat(path);
    if let Some(from) = from {
        *from = prefix.concat(from);
    }
}
