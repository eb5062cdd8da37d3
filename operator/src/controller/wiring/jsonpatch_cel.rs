//! A Policy's mutations as the API server's own: one CEL expression per `mutate[]` entry,
//! yielding the RFC 6902 JSONPatch (`list(JSONPatch)`) that a MutatingAdmissionPolicy mutation
//! applies, with the result of [`merge`](super::merge) on the same object.
//!
//! The API server evaluates a mutation's expression on the object as the previous mutation left
//! it and applies the ops in order. The expression is a tree of conditionals over the object
//! before the mutation, one per place the merge decides something, whose leaves are what one
//! branch of [`merge`](super::merge) does there: add an absent key (the patch's value,
//! materialised), replace a value (`overwrite`), remove a key (`null` with `overwrite`), append a
//! named element or a scalar. Ops touch disjoint paths except appends to one array, which keep
//! the patch's order, so computing them all first and applying them after is the merge.
//!
//! A `forEach` selects the element indices first (its `when` guard per element: a guard's error
//! fails the mutation, as the webhook's does under `failurePolicy: Fail`), then joins each
//! selected element's ops. A named element already present is found by its first index, as the
//! merge finds it.
//!
//! What the API server could not do exactly is refused with the reason ([`NotExact`]); the
//! Policy then stays on the webhook.
use serde_json::{Map, Value};

use gatehouse_api::v1alpha1::Mutation;
use gatehouse_engine::merge::materialize;

/// Why a mutation has no exact in-process form.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotExact {
    #[error("the merge at the root is not an object")]
    RootNotObject,
    #[error("{at}: a named array repeats a name (merged into one element in order)")]
    RepeatedName { at: String },
    #[error(
        "{at}: an array of scalars other than strings (JSON and CEL compare numbers differently)"
    )]
    NonStringScalars { at: String },
    #[error("{at}: a null inside a value (a JSONPatch value cannot carry it)")]
    NullInValue { at: String },
    #[error("{at}: an integer beyond 2^53 (the API server writes it as a string)")]
    LargeInteger { at: String },
    #[error(
        "a forEach guard under failurePolicy Ignore (the webhook skips one failing element, the API server the whole mutation)"
    )]
    GuardedForEachUnderIgnore,
}

/// A JSON pointer being built: literal segments and CEL expressions (indices) in order.
#[derive(Clone, Debug, Default)]
struct Pointer(Vec<Segment>);

#[derive(Clone, Debug)]
enum Segment {
    Key(String),
    Index(String),
}

impl Pointer {
    fn key(&self, key: &str) -> Pointer {
        let mut p = self.clone();
        p.0.push(Segment::Key(key.to_string()));
        p
    }

    fn index(&self, index: String) -> Pointer {
        let mut p = self.clone();
        p.0.push(Segment::Index(index));
        p
    }

    /// The pointer as a CEL string expression; keys escaped now (`~0`, `~1`), indices at run time.
    fn cel(&self, suffix: &str) -> String {
        let mut parts: Vec<String> = Vec::new();
        let mut literal = String::new();
        for segment in &self.0 {
            literal.push('/');
            match segment {
                Segment::Key(k) => literal.push_str(&k.replace('~', "~0").replace('/', "~1")),
                Segment::Index(e) => {
                    parts.push(string_literal(&literal));
                    literal.clear();
                    parts.push(format!("string({e})"));
                }
            }
        }
        literal.push_str(suffix);
        if !literal.is_empty() || parts.is_empty() {
            parts.push(string_literal(&literal));
        }
        parts.join(" + ")
    }

    /// Where the pointer is, for messages (`spec.containers[].env`).
    fn describe(&self) -> String {
        let mut out = String::new();
        for segment in &self.0 {
            match segment {
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
                Segment::Index(_) => out.push_str("[]"),
            }
        }
        if out.is_empty() { "merge".into() } else { out }
    }
}

/// The ops of one place: a CEL expression of type `list(JSONPatch)`, or nothing to do.
type Ops = Option<String>;

fn concat(parts: Vec<String>) -> Ops {
    (!parts.is_empty()).then(|| parts.join(" + "))
}

fn op(op: &str, path: String, value: Option<String>) -> String {
    match value {
        Some(v) => format!("[JSONPatch{{op: \"{op}\", path: {path}, value: {v}}}]"),
        None => format!("[JSONPatch{{op: \"{op}\", path: {path}}}]"),
    }
}

/// `condition ? then : otherwise`, where a missing branch is no op.
fn choose(condition: String, then: Ops, otherwise: Ops) -> Ops {
    match (then, otherwise) {
        (None, None) => None,
        (t, o) => Some(format!(
            "({condition} ? {} : {})",
            t.unwrap_or_else(|| "[]".into()),
            o.unwrap_or_else(|| "[]".into())
        )),
    }
}

/// Builds the ops of one merge as a tree: each condition is written once, at the place it
/// decides; `depth` names comprehension variables apart.
struct Translation {
    overwrite: bool,
}

impl Translation {
    /// Merging the object `patch` into `target`, a CEL expression known to be a map.
    fn object(
        &self,
        target: &str,
        at: &Pointer,
        patch: &Map<String, Value>,
        depth: usize,
    ) -> Result<Ops, NotExact> {
        let mut parts = Vec::new();
        for (key, value) in patch {
            let key_lit = string_literal(key);
            let child = format!("{target}[{key_lit}]");
            let here = at.key(key);
            if value.is_null() {
                if self.overwrite {
                    parts.push(format!(
                        "({key_lit} in {target} ? {} : [])",
                        op("remove", here.cel(""), None)
                    ));
                }
                continue;
            }
            let materialized = literal(&materialize(value, self.overwrite), &here)?;
            let present = self.value(&child, &here, value, depth)?;
            let add = Some(op("add", here.cel(""), Some(materialized)));
            parts.extend(choose(
                format!("{key_lit} in {target} && {child} != null"),
                present,
                add,
            ));
        }
        Ok(concat(parts))
    }

    /// Merging `patch` into `target`, a CEL expression known to be present and not null.
    fn value(
        &self,
        target: &str,
        at: &Pointer,
        patch: &Value,
        depth: usize,
    ) -> Result<Ops, NotExact> {
        let replace = if self.overwrite {
            Some(op(
                "replace",
                at.cel(""),
                Some(literal(&materialize(patch, true), at)?),
            ))
        } else {
            None
        };
        let (kind, inner) = match patch {
            Value::Object(p) => ("map", self.object(target, at, p, depth)?),
            Value::Array(items) if is_named(items) => {
                ("list", self.named(target, at, items, depth)?)
            }
            Value::Array(items) if is_scalars(items) => ("list", self.scalars(target, at, items)?),
            _ => return Ok(replace),
        };
        Ok(choose(format!("type({target}) == {kind}"), inner, replace))
    }

    /// Elements of `patch` merged by name into the list `target`.
    fn named(
        &self,
        target: &str,
        at: &Pointer,
        patch: &[Value],
        depth: usize,
    ) -> Result<Ops, NotExact> {
        let names: Vec<&str> = patch.iter().filter_map(name_of).collect();
        if names
            .iter()
            .enumerate()
            .any(|(i, n)| names[..i].contains(n))
        {
            return Err(NotExact::RepeatedName { at: at.describe() });
        }
        let mut parts = Vec::new();
        for (element, name) in patch.iter().zip(names) {
            let name_lit = string_literal(name);
            let is_it = |v: &str| {
                format!("type({v}) == map && \"name\" in {v} && {v}[\"name\"] == {name_lit}")
            };
            let (e, j) = (format!("e{depth}"), format!("j{depth}"));
            let exists = format!("{target}.exists({e}, {})", is_it(&e));
            let add = Some(op(
                "add",
                at.cel("/-"),
                Some(literal(&materialize(element, self.overwrite), at)?),
            ));
            // The first index of the element, bound once by a one-element comprehension.
            let found = self.value(
                &format!("{target}[{j}]"),
                &at.index(j.clone()),
                element,
                depth + 1,
            )?;
            let present = found.map(|ops| {
                format!(
                    "[lists.range(size({target})).filter({j}, {})[0]].map({j}, {ops})[0]",
                    is_it(&format!("{target}[{j}]"))
                )
            });
            parts.extend(choose(exists, present, add));
        }
        Ok(concat(parts))
    }

    /// The union of the list `target` and the strings of `patch`, in the patch's order.
    fn scalars(&self, target: &str, at: &Pointer, patch: &[Value]) -> Result<Ops, NotExact> {
        let mut strings: Vec<String> = Vec::new();
        for item in patch {
            let s = item
                .as_str()
                .ok_or_else(|| NotExact::NonStringScalars { at: at.describe() })?;
            let lit = string_literal(s);
            if !strings.contains(&lit) {
                strings.push(lit);
            }
        }
        if strings.is_empty() {
            return Ok(None);
        }
        Ok(Some(format!(
            "[{}].filter(s, !(s in {target})).map(s, JSONPatch{{op: \"add\", path: {}, value: s}})",
            strings.join(", "),
            at.cel("/-")
        )))
    }
}

fn name_of(v: &Value) -> Option<&str> {
    v.as_object()?.get("name")?.as_str()
}

fn is_named(items: &[Value]) -> bool {
    items.iter().all(|e| name_of(e).is_some())
}

fn is_scalars(items: &[Value]) -> bool {
    items.iter().all(|e| !e.is_object() && !e.is_array())
}

/// A CEL string literal (JSON's escapes are CEL's).
pub(crate) fn string_literal(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// `value` as a CEL literal; members and elements are `dyn` so that mixed types check.
fn literal(value: &Value, at: &Pointer) -> Result<String, NotExact> {
    Ok(match value {
        Value::Null => {
            return Err(NotExact::NullInValue { at: at.describe() });
        }
        Value::Bool(b) => b.to_string(),
        Value::String(s) => string_literal(s),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) if i.unsigned_abs() < (1 << 53) => i.to_string(),
            (Some(_), _) => {
                return Err(NotExact::LargeInteger { at: at.describe() });
            }
            (None, Some(f)) if n.as_u64().is_none() => {
                let s = format!("{f:?}");
                if s.contains(['.', 'e', 'E']) {
                    s
                } else {
                    format!("{s}.0")
                }
            }
            _ => {
                return Err(NotExact::LargeInteger { at: at.describe() });
            }
        },
        Value::Array(items) => {
            let parts = items
                .iter()
                .map(|v| literal(v, at).map(|l| format!("dyn({l})")))
                .collect::<Result<Vec<_>, _>>()?;
            format!("[{}]", parts.join(", "))
        }
        Value::Object(map) => {
            let parts = map
                .iter()
                .map(|(k, v)| literal(v, at).map(|l| format!("{}: dyn({l})", string_literal(k))))
                .collect::<Result<Vec<_>, _>>()?;
            format!("{{{}}}", parts.join(", "))
        }
    })
}

/// The object `object[s1][s2]…` of a dotted `forEach` path, and the condition that it is a list
/// reached through maps (the merge's `array_at`).
fn array_at(path: &str) -> (String, String, Pointer) {
    let mut target = "object".to_string();
    let mut pointer = Pointer::default();
    let mut checks = Vec::new();
    for segment in path.split('.') {
        let lit = string_literal(segment);
        checks.push(format!("type({target}) == map && {lit} in {target}"));
        target = format!("{target}[{lit}]");
        pointer = pointer.key(segment);
    }
    checks.push(format!("type({target}) == list"));
    (target, checks.join(" && "), pointer)
}

/// The CEL expression (type `list(JSONPatch)`) of one `mutate[]` entry, or `None` when it can
/// never change anything (an empty merge). `ignore` is the Policy's `failurePolicy: Ignore`.
pub fn mutation_expression(mutation: &Mutation, ignore: bool) -> Result<Option<String>, NotExact> {
    let patch = mutation.merge.as_object().ok_or(NotExact::RootNotObject)?;
    let translation = Translation {
        overwrite: mutation.overwrite,
    };
    let guard = mutation.when.as_deref().map(|w| format!("({w})"));
    let expression = match &mutation.for_each {
        None => {
            let Some(ops) = translation.object("object", &Pointer::default(), patch, 0)? else {
                return Ok(None);
            };
            match guard {
                // The guard decides first: its error fails the mutation whatever the object.
                Some(g) => format!("{g} ? ({ops}) : []"),
                None => ops,
            }
        }
        Some(path) => {
            if guard.is_some() && ignore {
                return Err(NotExact::GuardedForEachUnderIgnore);
            }
            let (array, present, pointer) = array_at(path);
            let element = format!("{array}[i]");
            let Some(ops) = translation.object(&element, &pointer.index("i".into()), patch, 1)?
            else {
                return Ok(None);
            };
            let guard = guard
                .map(|g| format!(" && [{element}].all(element, {g})"))
                .unwrap_or_default();
            // Elements are selected first (a guard's error fails the mutation), then each
            // selected element's ops are joined.
            format!(
                "{present} ? lists.range(size({array})).filter(i, type({element}) == map{guard}).map(i, {ops}).flatten() : []"
            )
        }
    };
    Ok(Some(expression))
}

#[cfg(test)]
mod tests;
