//! Whether a Policy's merges fit the schemas of the kinds it matches, as the API server publishes
//! them (OpenAPI v3).
//!
//! After a MutatingAdmissionPolicy's patch, the API server decodes the object strictly: a field
//! the kind's schema lacks, or a value of the wrong JSON type, fails the request (a 500, even
//! under `failurePolicy: Ignore`), where the webhook path's patch is decoded leniently and the
//! field dropped. So a mutating Policy runs in-process only when every field its merges name
//! exists with a type the value fits.
//!
//! The walk also says where a merge may create a struct: the API server defaults the fields of
//! a struct a mutation creates before the next mutation runs, the webhook path only after the
//! last ([`crate::controller::wiring::defaulting`]). A struct the schema marks `default: {}` (a Go value
//! field: `spec`, a container's `resources`) is always present and defaulted before admission;
//! one without (a pointer: `securityContext`, `livenessProbe`, a map's struct values) may be
//! absent, and a merge into it may create it. Creating it matters when it gets defaults: a
//! field of its schema has a `default` (a constant, or the zero value of a field always
//! serialized), or its type has a defaulting function
//! ([`crate::controller::wiring::derived_defaults::DEFAULTED_TYPES`]: a `livenessProbe` gets
//! `periodSeconds`); a container's `securityContext` gets none.
use serde_json::{Map, Value};

use crate::controller::wiring::derived_defaults::DEFAULTED_TYPES;
use gatehouse_api::v1alpha1::Mutation;

/// What is known of whether a Policy's merges fit its kinds' schemas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaFit {
    /// The merges fit; where they may create a struct.
    Fits(Vec<OptionalStruct>),
    /// A field or type the schemas lack, or a rule whose kinds cannot be known.
    Unfit(String),
    /// The schemas could not be read this time: nothing is known.
    Unread(String),
}

/// A struct that may be absent, which a `mutate[]` entry's merge writes into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionalStruct {
    /// The `mutate[]` index.
    pub mutation: usize,
    /// Its place: keys, with `[]` for "any element of this array".
    pub path: Vec<String>,
}

/// One kind's schema: the document's named schemas and the kind's own.
pub struct KindSchema<'a> {
    /// `components.schemas` of the group-version's OpenAPI v3 document.
    pub schemas: &'a Map<String, Value>,
    /// The kind's schema.
    pub root: &'a Value,
    /// The kind, for messages.
    pub kind: &'a str,
}

/// The kind's schema in `document` (an OpenAPI v3 document of one group-version), found by its
/// `x-kubernetes-group-version-kind`.
pub fn kind_schema<'a>(
    document: &'a Value,
    group: &str,
    version: &str,
    kind: &'a str,
) -> Option<KindSchema<'a>> {
    let schemas = document.get("components")?.get("schemas")?.as_object()?;
    let root = schemas.values().find(|s| {
        s.get("x-kubernetes-group-version-kind")
            .and_then(Value::as_array)
            .is_some_and(|gvks| {
                gvks.iter().any(|g| {
                    g.get("group").and_then(Value::as_str).unwrap_or_default() == group
                        && g.get("version").and_then(Value::as_str) == Some(version)
                        && g.get("kind").and_then(Value::as_str) == Some(kind)
                })
            })
    })?;
    Some(KindSchema {
        schemas,
        root,
        kind,
    })
}

/// Whether every `mutate[]` entry's merge fits `schema`, or the first field that does not; when
/// they fit, the structs they may create.
pub fn fits(
    mutations: &[Mutation],
    schema: &KindSchema<'_>,
) -> Result<Vec<OptionalStruct>, String> {
    let mut optional = Vec::new();
    for (i, m) in mutations.iter().enumerate() {
        let mut node = schema.root;
        let mut at = String::new();
        let mut place: Vec<String> = Vec::new();
        if let Some(path) = &m.for_each {
            for key in path.split('.') {
                at = join(&at, key);
                place.push(key.to_string());
                node = match child(schema, node, key) {
                    Child::Schema(n) => n,
                    Child::Anything => break,
                    Child::Missing => {
                        return Err(missing(i, &at, schema.kind));
                    }
                };
            }
            let resolved = resolve(schema, node);
            if unknown_allowed(resolved) {
                continue;
            }
            node = match resolved.get("items") {
                Some(items) => items,
                None => {
                    return Err(format!(
                        "spec.mutate[{i}].forEach: {at} is not an array in the {} schema",
                        schema.kind
                    ));
                }
            };
            at.push_str("[]");
            place.push("[]".to_string());
        }
        let mut found = Vec::new();
        let mut walk = Walk {
            schema,
            place,
            optional: &mut found,
        };
        walk.value_fits(node, &m.merge, &at)
            .map_err(|e| format!("spec.mutate[{i}]: {e}"))?;
        optional.extend(
            found
                .into_iter()
                .map(|path| OptionalStruct { mutation: i, path }),
        );
    }
    Ok(optional)
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn missing(i: usize, at: &str, kind: &str) -> String {
    format!("spec.mutate[{i}]: {at}: the {kind} schema has no such field")
}

/// A schema with its references followed (`$ref`, or a one-element `allOf` around one).
fn resolve<'a>(schema: &KindSchema<'a>, mut node: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let next = node
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .and_then(|name| schema.schemas.get(name))
            .or_else(|| {
                node.get("allOf")
                    .and_then(Value::as_array)
                    .filter(|all| all.len() == 1)
                    .map(|all| &all[0])
            });
        match next {
            Some(n) => node = n,
            None => break,
        }
    }
    node
}

/// The name of the named schema `node` refers to (through `allOf` and `$ref`), if any.
fn referred_name<'a>(schema: &KindSchema<'a>, mut node: &'a Value) -> Option<&'a str> {
    let mut name = None;
    for _ in 0..32 {
        if let Some(r) = node
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
        {
            name = Some(r);
            match schema.schemas.get(r) {
                Some(n) => node = n,
                None => break,
            }
        } else if let Some(first) = node
            .get("allOf")
            .and_then(Value::as_array)
            .filter(|all| all.len() == 1)
            .map(|all| &all[0])
        {
            node = first;
        } else {
            break;
        }
    }
    name
}

/// Whether a struct of schema `node`, once created, gets defaults: a field of it has a
/// `default`, or its type has a defaulting function.
fn defaulted_when_created(schema: &KindSchema<'_>, node: &Value) -> bool {
    let by_function =
        referred_name(schema, node).is_some_and(|name| DEFAULTED_TYPES.contains(&name));
    let by_schema = resolve(schema, node)
        .get("properties")
        .and_then(Value::as_object)
        .is_some_and(|fields| fields.values().any(|f| f.get("default").is_some()));
    by_function || by_schema
}

fn unknown_allowed(node: &Value) -> bool {
    node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
        && node.get("properties").is_none()
}

enum Child<'a> {
    Schema(&'a Value),
    /// Below a schema that keeps unknown fields.
    Anything,
    Missing,
}

fn child<'a>(schema: &KindSchema<'a>, node: &'a Value, key: &str) -> Child<'a> {
    let node = resolve(schema, node);
    if let Some(c) = node.get("properties").and_then(|p| p.get(key)) {
        return Child::Schema(c);
    }
    match node.get("additionalProperties") {
        Some(c @ Value::Object(_)) => return Child::Schema(c),
        Some(Value::Bool(true)) => return Child::Anything,
        _ => {}
    }
    if node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) {
        return Child::Anything;
    }
    Child::Missing
}

/// The JSON types a schema accepts: its `type`, the types of a `oneOf`/`anyOf`, both for
/// int-or-string; none said means any.
fn accepted_types(node: &Value) -> Vec<&str> {
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true))
        || node.get("format").and_then(Value::as_str) == Some("int-or-string")
    {
        return vec!["integer", "string"];
    }
    if let Some(t) = node.get("type").and_then(Value::as_str) {
        return vec![t];
    }
    ["oneOf", "anyOf"]
        .iter()
        .filter_map(|k| node.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(|alt| alt.get("type").and_then(Value::as_str))
        .collect()
}

/// One merge's walk through the schema.
struct Walk<'s, 'a> {
    schema: &'s KindSchema<'a>,
    /// Where the walk is, as keys with `[]` for elements.
    place: Vec<String>,
    /// The structs without a `default` the merge writes into.
    optional: &'s mut Vec<Vec<String>>,
}

impl Walk<'_, '_> {
    fn value_fits(&mut self, node: &Value, value: &Value, at: &str) -> Result<(), String> {
        let schema = self.schema;
        let node = resolve(schema, node);
        if value.is_null() {
            // A removal (with overwrite): nothing is written.
            return Ok(());
        }
        let types = accepted_types(node);
        let json_type = match value {
            Value::Object(_) => "object",
            Value::Array(_) => "array",
            Value::String(_) => "string",
            Value::Bool(_) => "boolean",
            Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
            Value::Number(_) => "number",
            Value::Null => "null",
        };
        let fits_type = types.is_empty()
            || types.contains(&json_type)
            || (json_type == "integer" && types.contains(&"number"));
        if !fits_type {
            let shown = if at.is_empty() { "the merge" } else { at };
            let article = if json_type.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            return Err(format!(
                "{shown}: {article} {json_type} where the {} schema wants {}",
                schema.kind,
                types.join(" or ")
            ));
        }
        match value {
            Value::Object(fields) => {
                if unknown_allowed(node) {
                    return Ok(());
                }
                for (key, v) in fields {
                    let here = join(at, key);
                    match child(schema, node, key) {
                        Child::Schema(c) => {
                            self.place.push(key.clone());
                            if v.is_object()
                                && c.get("default").is_none()
                                && defaulted_when_created(schema, c)
                            {
                                self.optional.push(self.place.clone());
                            }
                            let fitted = self.value_fits(c, v, &here);
                            self.place.pop();
                            fitted?;
                        }
                        Child::Anything => {}
                        Child::Missing => {
                            return Err(format!(
                                "{here}: the {} schema has no such field",
                                schema.kind
                            ));
                        }
                    }
                }
                Ok(())
            }
            Value::Array(items) => match node.get("items") {
                Some(item) => {
                    let here = format!("{at}[]");
                    self.place.push("[]".to_string());
                    let fitted = items
                        .iter()
                        .try_for_each(|v| self.value_fits(item, v, &here));
                    self.place.pop();
                    fitted
                }
                None => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
