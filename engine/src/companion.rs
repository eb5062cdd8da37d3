//! Companion objects, pure: the checks of an object effect when its Policy is written, the
//! companion rendered for one stored trigger, and whether a stored companion is in place.
//!
//! Rendering needs no client: the loop hands in the trigger, the source of a clone and the
//! companion kind's scope, as discovery and its caches have them.
use serde_json::{Map, Value};

use gatehouse_api::v1alpha1::{COMPANION_POLICY_LABEL, COMPANION_TRIGGER_LABEL, ObjectEffect};
use gatehouse_cel::k8s_names::{is_dns1123_label, is_dns1123_subdomain};
use gatehouse_cel::{self as cel, Activation, CelError, Site};

use super::problem::{Problem, check_k8s_name};

/// Fields of a companion's metadata a template or a computed field may set.
const SETTABLE_METADATA: [&str; 4] = ["name", "namespace", "labels", "annotations"];

/// Top-level fields no template sets: they name the object's kind or are the API server's.
const NOT_SETTABLE: [&str; 3] = ["apiVersion", "kind", "status"];

/// An object effect with its computed fields compiled.
#[derive(Debug)]
pub struct CompiledObjectEffect {
    pub effect: ObjectEffect,
    fields: Vec<CompiledField>,
}

#[derive(Debug)]
struct CompiledField {
    path: Vec<String>,
    program: cel::Expression,
}

impl CompiledObjectEffect {
    /// The template's `apiVersion`.
    pub fn api_version(&self) -> &str {
        self.effect.template["apiVersion"]
            .as_str()
            .unwrap_or_default()
    }

    /// The template's `kind`.
    pub fn kind(&self) -> &str {
        self.effect.template["kind"].as_str().unwrap_or_default()
    }

    /// The namespace the template names, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.effect.template["metadata"]["namespace"]
            .as_str()
            .filter(|n| !n.is_empty())
    }
}

/// Checks the object effect at `path` (`spec.effects[i].object`), compiling its fields; `None`
/// when something does not compile or hold.
pub fn check(
    path: &str,
    effect: &ObjectEffect,
    problems: &mut Vec<Problem>,
) -> Option<CompiledObjectEffect> {
    let before = problems.len();
    let template = &effect.template;
    let at = |field: &str| format!("{path}.template.{field}");
    let Some(top) = template.as_object() else {
        problems.push(Problem::new(
            format!("{path}.template"),
            "must be an object",
        ));
        return None;
    };
    for field in ["apiVersion", "kind"] {
        if top
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            problems.push(Problem::new(
                at(field),
                "must be set: it names the companion's kind",
            ));
        }
    }
    if top.contains_key("status") {
        problems.push(Problem::new(
            at("status"),
            "is the API server's to write, not a template's",
        ));
    }
    check_metadata(path, effect, problems);
    if let Some(source) = &effect.clone_from {
        check_k8s_name(
            &format!("{path}.cloneFrom.name"),
            &source.name,
            "name",
            is_dns1123_subdomain,
            problems,
        );
        if !source.namespace.is_empty() {
            check_k8s_name(
                &format!("{path}.cloneFrom.namespace"),
                &source.namespace,
                "namespace name",
                is_dns1123_label,
                problems,
            );
        }
    }
    let fields = check_fields(path, effect, problems);
    (problems.len() == before).then_some(CompiledObjectEffect {
        effect: effect.clone(),
        fields: fields?,
    })
}

/// The template's metadata: only what a companion sets, a valid name (or a field computing
/// it), a valid namespace, none of Gatehouse's own labels.
fn check_metadata(path: &str, effect: &ObjectEffect, problems: &mut Vec<Problem>) {
    let at = |field: &str| format!("{path}.template.{field}");
    let metadata = &effect.template["metadata"];
    if let Some(extra) = metadata
        .as_object()
        .and_then(|m| m.keys().find(|k| !SETTABLE_METADATA.contains(&k.as_str())))
    {
        problems.push(Problem::new(
            at(&format!("metadata.{extra}")),
            format!(
                "only {} are set on a companion",
                SETTABLE_METADATA.join(", ")
            ),
        ));
    }
    let named_by_field = effect.fields.iter().any(|f| f.path == "metadata.name");
    match metadata["name"].as_str() {
        Some(name) => check_k8s_name(
            &at("metadata.name"),
            name,
            "name",
            is_dns1123_subdomain,
            problems,
        ),
        None if named_by_field => {}
        None => problems.push(Problem::new(
            at("metadata.name"),
            "must be set (or computed by a field with path metadata.name)",
        )),
    }
    if let Some(namespace) = metadata["namespace"].as_str() {
        check_k8s_name(
            &at("metadata.namespace"),
            namespace,
            "namespace name",
            is_dns1123_label,
            problems,
        );
    }
    for (field, labels) in [
        ("labels", &metadata["labels"]),
        ("annotations", &metadata["annotations"]),
    ] {
        if let Some(own) = labels.as_object().and_then(|l| {
            l.keys()
                .find(|k| k.starts_with("gatehouse.dev/companion-of"))
        }) {
            problems.push(Problem::new(
                at(&format!("metadata.{field}")),
                format!("{own:?} is Gatehouse's own: it names the companion's trigger and Policy"),
            ));
        }
    }
}

/// Checks and compiles the computed fields of the effect at `path`.
fn check_fields(
    path: &str,
    effect: &ObjectEffect,
    problems: &mut Vec<Problem>,
) -> Option<Vec<CompiledField>> {
    let mut compiled = Vec::new();
    let mut all_compiled = true;
    for (j, field) in effect.fields.iter().enumerate() {
        let at = format!("{path}.fields[{j}]");
        let segments: Vec<String> = field.path.split('.').map(str::to_string).collect();
        if let Err(reason) = settable(&segments, &effect.template, effect.clone_from.is_some()) {
            problems.push(Problem::new(format!("{at}.path"), reason));
        }
        let expression_path = format!("{at}.expression");
        match cel::compile(&field.expression) {
            Ok(program) => {
                for unknown in cel::unknown_variables(&program, Site::Computed) {
                    problems.push(Problem::new(
                        &expression_path,
                        format!("unknown variable {unknown:?} (a computed field sees only object, the stored trigger)"),
                    ));
                }
                match cel::refusals(&program, Site::Computed) {
                    Ok(reasons) => problems.extend(
                        reasons
                            .into_iter()
                            .map(|r| Problem::new(&expression_path, r)),
                    ),
                    Err(e) => problems.push(Problem::new(&expression_path, e.to_string())),
                }
                if let Err(too_costly) = gatehouse_cel::cost::check(&program) {
                    problems.push(Problem::new(&expression_path, too_costly));
                }
                compiled.push(CompiledField {
                    path: segments,
                    program: cel::Expression::new(program),
                });
            }
            Err(e) => {
                all_compiled = false;
                problems.push(Problem::new(expression_path, e.to_string()));
            }
        }
    }
    all_compiled.then_some(compiled)
}

/// Whether a computed field may be written at `path` of `template`: inside the settable
/// metadata or under a top-level field the template has (any, for a clone, whose data comes
/// from its source), never through a value that is not an object.
fn settable(path: &[String], template: &Value, cloned: bool) -> Result<(), String> {
    let Some(first) = path.first().filter(|_| path.iter().all(|s| !s.is_empty())) else {
        return Err("must be a dotted path of non-empty field names".to_string());
    };
    if NOT_SETTABLE.contains(&first.as_str()) {
        return Err(format!("{first} is not the template's to set"));
    }
    if first == "metadata" {
        let second = path.get(1).map(String::as_str).unwrap_or_default();
        let leaf = matches!(second, "name" | "namespace") && path.len() == 2;
        let keyed = matches!(second, "labels" | "annotations") && path.len() == 3;
        if !(leaf || keyed) {
            return Err(
                "inside metadata only name, namespace, labels.<key> and annotations.<key> are set"
                    .to_string(),
            );
        }
    } else if template.get(first).is_none() && !cloned {
        return Err(format!(
            "names a path outside the template: it has no top-level field {first:?}"
        ));
    }
    let mut node = template;
    for segment in &path[..path.len() - 1] {
        match node.get(segment) {
            Some(next) if next.is_object() => node = next,
            Some(_) => {
                return Err(format!(
                    "crosses {segment:?}, which the template sets to a value that is not an object"
                ));
            }
            None => break,
        }
    }
    Ok(())
}

/// The stored object a companion is made for.
#[derive(Clone, Copy, Debug)]
pub struct Trigger<'a> {
    pub api_version: &'a str,
    pub kind: &'a str,
    /// Its object as stored.
    pub object: &'a Value,
    /// Whether its kind is namespaced.
    pub namespaced: bool,
}

impl Trigger<'_> {
    /// The trigger's UID.
    pub fn uid(&self) -> &str {
        self.object["metadata"]["uid"].as_str().unwrap_or_default()
    }

    /// The namespace a namespaced companion goes to by default: the trigger's own, or, for a
    /// Namespace, the Namespace itself. `None` for another cluster-scoped trigger.
    pub fn home_namespace(&self) -> Option<&str> {
        let metadata = &self.object["metadata"];
        if self.api_version == "v1" && self.kind == "Namespace" {
            metadata["name"].as_str()
        } else if self.namespaced {
            metadata["namespace"].as_str()
        } else {
            None
        }
    }
}

/// Why a companion could not be rendered for a trigger.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RenderError {
    #[error("fields[{index}] ({path}): {error}")]
    Field {
        index: usize,
        path: String,
        error: CelError,
    },
    #[error(
        "a namespaced {kind} for a cluster-scoped trigger needs metadata.namespace in the template"
    )]
    NoNamespace { kind: String },
    #[error("{kind} is cluster-scoped: the template must not name a namespace")]
    NamespaceOnClusterScoped { kind: String },
    #[error("metadata.name is not a string after the fields were written")]
    NoName,
}

/// What a companion is rendered from besides its effect and trigger.
#[derive(Clone, Copy, Debug)]
pub struct RenderInput<'a> {
    /// The UID of the Policy that asks for it.
    pub policy_uid: &'a str,
    /// Whether the companion's kind is namespaced.
    pub namespaced: bool,
    /// The source of a clone, as stored.
    pub clone_source: Option<&'a Value>,
}

/// The companion `effect` makes for `trigger`: the clone source's data (if any) under the
/// template, the computed fields written in order, the namespace, the labels naming trigger and
/// Policy, and an owner reference to the trigger where Kubernetes allows one.
pub fn render(
    effect: &CompiledObjectEffect,
    trigger: Trigger<'_>,
    input: RenderInput<'_>,
) -> Result<Value, RenderError> {
    let kind = effect.kind().to_string();
    let mut companion = Map::new();
    if let Some(Value::Object(source)) = input.clone_source {
        for (key, value) in source {
            if !matches!(key.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
                companion.insert(key.clone(), value.clone());
            }
        }
    }
    let mut companion = Value::Object(companion);
    crate::merge::merge(&mut companion, &effect.effect.template, true);
    let request = Value::Null;
    let vars = Activation::new(Some(trigger.object), None, &request);
    for (index, field) in effect.fields.iter().enumerate() {
        let value =
            cel::eval_json(field.program.program(), &vars).map_err(|error| RenderError::Field {
                index,
                path: field.path.join("."),
                error,
            })?;
        set_path(&mut companion, &field.path, value);
    }
    let metadata = &mut companion["metadata"];
    if !metadata["name"].is_string() {
        return Err(RenderError::NoName);
    }
    let named = metadata["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    match (input.namespaced, named, trigger.home_namespace()) {
        (false, Some(_), _) => return Err(RenderError::NamespaceOnClusterScoped { kind }),
        (false, None, _) => {}
        (true, Some(_), _) => {}
        (true, None, Some(home)) => metadata["namespace"] = Value::from(home),
        (true, None, None) => return Err(RenderError::NoNamespace { kind }),
    }
    metadata["labels"][COMPANION_TRIGGER_LABEL] = Value::from(trigger.uid());
    metadata["labels"][COMPANION_POLICY_LABEL] = Value::from(input.policy_uid);
    // An owner reference may name a cluster-scoped owner, or one in the companion's namespace.
    let companion_namespace = metadata["namespace"].as_str();
    let owner_namespace = trigger.object["metadata"]["namespace"].as_str();
    if !trigger.namespaced || (input.namespaced && companion_namespace == owner_namespace) {
        metadata["ownerReferences"] = serde_json::json!([{
            "apiVersion": trigger.api_version,
            "kind": trigger.kind,
            "name": trigger.object["metadata"]["name"],
            "uid": trigger.uid(),
        }]);
    }
    Ok(companion)
}

/// Writes `value` at `path` of `object`, creating the objects on the way.
fn set_path(object: &mut Value, path: &[String], value: Value) {
    let mut node = object;
    for segment in path {
        if !node.is_object() {
            *node = Value::Object(Map::new());
        }
        node = &mut node[segment.as_str()];
    }
    *node = value;
}

/// Whether `stored` holds everything `desired` says: each field of `desired` is there with the
/// same value (fields others added are theirs); a list equal item by item, except owner
/// references, where the desired one must be among them.
pub fn in_place(desired: &Value, stored: &Value) -> bool {
    holds(desired, stored, &mut Vec::new())
}

fn holds<'a>(desired: &'a Value, stored: &Value, at: &mut Vec<&'a str>) -> bool {
    match (desired, stored) {
        (Value::Object(want), Value::Object(have)) => want.iter().all(|(key, value)| {
            at.push(key);
            let held = have.get(key).is_some_and(|h| holds(value, h, at));
            at.pop();
            held
        }),
        (Value::Array(want), Value::Array(have)) if at == &["metadata", "ownerReferences"] => want
            .iter()
            .all(|w| have.iter().any(|h| holds(w, h, &mut Vec::new()))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len()
                && want
                    .iter()
                    .zip(have)
                    .all(|(w, h)| holds(w, h, &mut Vec::new()))
        }
        // 1 and 1.0 are one number to the API server.
        (Value::Number(want), Value::Number(have)) => want.as_f64() == have.as_f64(),
        _ => desired == stored,
    }
}

#[cfg(test)]
mod tests;
