//! [`diff`]: `json_patch::diff` in one pass over the two documents, without building a pointer
//! for every node.
//!
//! `json_patch::diff` (json-patch 4.2) visits every node of both documents, pushing and popping
//! a JSON-pointer token (an escaped string append) for every object key and array index even
//! where the two sides are identical. A mutation typically changes a few fields of a large
//! object, so almost all of that work produces nothing. Comparing subtrees for equality before
//! descending avoids the pointers but compares the changed region once per level above it. [`diff`]
//! instead walks both documents once, in lockstep, and only materializes a pointer (from a chain of
//! borrowed tokens on the stack) when it emits an operation. It returns exactly the same [`Patch`]
//! (same operations, same order, same paths, same values).
//!
//! What it saves (`cargo bench -p gatehouse --bench engine`, "diff"): a 10-container Pod against
//! five Policies' result, 11.2 against 24.4 µs for `json_patch::diff`, 2.17x faster; 13 µs, 25 %
//! of a single-Policy review. A mutating group whose members read the object answers with one
//! such diff of the whole object.
//!
//! Why the result is identical, by the structure of json-patch 4.2's `diff_impl`:
//!
//! * **Objects** (`diff_object`): for each `(key, right_value)` of the right map in its iteration
//!   order, recurse with `key` pushed if the left map has the key, else emit `add`; then, for
//!   each key of the left map in its iteration order that the right map lacks, emit `remove`.
//!   `walk` does the same over the same maps (whatever their iteration order, BTreeMap or
//!   `preserve_order`: the lockstep cursor is only a shortcut for the lookup), and materializes
//!   paths with the same `PointerBuf::push_back`, so escaping (`~0`, `~1`, empty keys) is
//!   identical.
//! * **Arrays** (`diff_array`): for `idx < min(len)` it recurses at `idx`; removals only start at
//!   `idx == right.len()` (left longer), and `shift` counts them, so every removal's index is
//!   `right.len()`; additions (right longer) are at `idx` for `left.len()..right.len()`. While both
//!   elements exist `shift` is 0, so the recursion path is `idx`. `walk` emits the same
//!   sequence.
//! * **Anything else** (scalars, or differing types): nothing when equal, else the operations of
//!   `json_patch::diff` on the pair itself, with each path prefixed by the pair's pointer. At the
//!   top of a sub-diff the pointer is the root, and `diff_impl` only ever extends the pointer it is
//!   given, so prefixing every path is the same as having started with the prefix.
//!
//! `operator/tests/engine_diff_props.rs` checks the equality against `json_patch::diff` on
//! generated documents.
use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::{Map, Value};

use super::merge::Reach;

/// The RFC 6902 patch from `original` to `mutated`: always equal to
/// `json_patch::diff(original, mutated)`, computed in one pass.
pub fn diff(original: &Value, mutated: &Value) -> Patch {
    let mut patch = Patch::default();
    walk(original, mutated, &Path::Root, &mut patch.0);
    patch
}

/// [`diff`] of `original` against an object that equals it outside `reach`, given as its
/// [`Reach::copy`] after the change (`mutated`): the same patch, without copying, comparing or
/// even visiting what `reach` leaves out. Operations outside `reach` cannot exist, since both
/// sides agree there; inside it, `walk`'s order is kept (the members of `mutated` in its map
/// order, then the removed members in `original`'s).
pub fn diff_within(
    original: &Map<String, Value>,
    mutated: &Map<String, Value>,
    reach: &Reach,
) -> Patch {
    let mut patch = Patch::default();
    walk_within(original, mutated, reach, &Path::Root, &mut patch.0);
    patch
}

fn walk_within(
    left: &Map<String, Value>,
    right: &Map<String, Value>,
    reach: &Reach,
    path: &Path<'_>,
    ops: &mut Vec<PatchOperation>,
) {
    for (key, right_value) in right {
        match (left.get(key), reach.member(key), right_value) {
            // Copied in part: both sides hold only the reached members.
            (Some(Value::Object(l)), Some(Some(sub)), Value::Object(r)) => {
                walk_within(l, r, sub, &Path::Key(path, key), ops);
            }
            (Some(left_value), _, _) => walk(left_value, right_value, &Path::Key(path, key), ops),
            (None, _, _) => ops.push(PatchOperation::Add(AddOperation {
                path: path.pointer_to(key),
                value: right_value.clone(),
            })),
        }
    }
    for key in left.keys() {
        if reach.member(key).is_some() && !right.contains_key(key) {
            ops.push(PatchOperation::Remove(RemoveOperation {
                path: path.pointer_to(key),
            }));
        }
    }
}

/// Where `walk` is: a chain of tokens borrowed from the documents, turned into a
/// [`PointerBuf`] only for the nodes that get an operation.
enum Path<'a> {
    Root,
    Key(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl Path<'_> {
    fn pointer(&self) -> PointerBuf {
        match self {
            Path::Root => PointerBuf::new(),
            Path::Key(parent, key) => parent.pointer_to(*key),
            Path::Index(parent, idx) => parent.pointer_to(*idx),
        }
    }

    fn pointer_to<'t>(&self, token: impl Into<json_patch::jsonptr::Token<'t>>) -> PointerBuf {
        let mut pointer = self.pointer();
        pointer.push_back(token);
        pointer
    }
}

/// Appends the operations `json_patch::diff` emits for `left` → `right` at `path`.
fn walk(left: &Value, right: &Value, path: &Path<'_>, ops: &mut Vec<PatchOperation>) {
    match (left, right) {
        (Value::Object(left_obj), Value::Object(right_obj)) => {
            // Both maps usually hold mostly the same keys in the same order: take the left entry
            // from a cursor when it is the one wanted, and look it up otherwise.
            let mut cursor = left_obj.iter().peekable();
            let mut matched = 0;
            for (key, right_value) in right_obj {
                let left_value = match cursor.peek() {
                    Some((left_key, _)) if *left_key == key => cursor.next().map(|(_, v)| v),
                    _ => left_obj.get(key),
                };
                match left_value {
                    Some(left_value) => {
                        matched += 1;
                        walk(left_value, right_value, &Path::Key(path, key), ops);
                    }
                    None => ops.push(PatchOperation::Add(AddOperation {
                        path: path.pointer_to(key),
                        value: right_value.clone(),
                    })),
                }
            }
            // Every left key met on the right: nothing to remove.
            if matched < left_obj.len() {
                for key in left_obj.keys() {
                    if !right_obj.contains_key(key) {
                        ops.push(PatchOperation::Remove(RemoveOperation {
                            path: path.pointer_to(key),
                        }));
                    }
                }
            }
        }
        (Value::Array(left_arr), Value::Array(right_arr)) => {
            for (idx, (left_value, right_value)) in left_arr.iter().zip(right_arr).enumerate() {
                walk(left_value, right_value, &Path::Index(path, idx), ops);
            }
            // Left longer: json_patch removes at `idx - shift`, which is always right.len().
            for _ in right_arr.len()..left_arr.len() {
                ops.push(PatchOperation::Remove(RemoveOperation {
                    path: path.pointer_to(right_arr.len()),
                }));
            }
            // Right longer: json_patch adds at each index past the end of left.
            for (idx, right_value) in right_arr.iter().enumerate().skip(left_arr.len()) {
                ops.push(PatchOperation::Add(AddOperation {
                    path: path.pointer_to(idx),
                    value: right_value.clone(),
                }));
            }
        }
        _ if left == right => {}
        _ => {
            // Scalars or differing types: json_patch's own operations, under `path`.
            let pointer = path.pointer();
            for mut op in json_patch::diff(left, right).0 {
                prefix(&mut op, &pointer);
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
