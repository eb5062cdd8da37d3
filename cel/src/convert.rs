//! JSON to CEL values.
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use ::cel::ExecutionError;
use ::cel::common::traits::{Adder, Container, Indexer, Iterable, Sizer, Zeroer};
use ::cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt, DYN_TYPE,
    LIST_TYPE, MAP_TYPE, Type,
};
use ::cel::common::value::{Builtin, BuiltinRef, CowVal, Val};
use serde_json::Value;

/// Converts JSON to a CEL value that borrows the JSON's strings.
///
/// Integers become `int` when they fit (as in Kubernetes, where JSON numbers without a fraction
/// are `int`), so `object.spec.replicas > 1` compares like with like. An array or object is
/// converted when an expression first reads it, one level at a time ([`LazyJson`]): a review
/// pays for the parts of the object its expressions read, not for the whole object.
pub fn to_val(value: &Value) -> Box<dyn Val + '_> {
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(_) | Value::Object(_) => Box::new(LazyJson(Arc::new(Node {
            json: value,
            converted: OnceLock::new(),
        }))),
    }
}

/// The size of the largest array or object in `value`, itself included.
pub fn largest_collection(value: &Value) -> usize {
    match value {
        Value::Array(items) => items
            .iter()
            .map(largest_collection)
            .fold(items.len(), usize::max),
        Value::Object(map) => map
            .values()
            .map(largest_collection)
            .fold(map.len(), usize::max),
        _ => 0,
    }
}

/// One level of `json`: a list or map whose elements are [`to_val`]'s, so still unconverted.
fn convert_level(json: &Value) -> Box<dyn Val + '_> {
    match json {
        Value::Array(items) => {
            Box::new(CelList::from(items.iter().map(to_val).collect::<Vec<_>>()))
        }
        Value::Object(map) => Box::new(CelMap::from(
            map.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
        scalar => to_val(scalar),
    }
}

/// A JSON array or object as a CEL list or map, converted on first use and shared by its
/// copies.
///
/// It is the list or map to everything that asks (`downcast_ref::<CelMap>`, equality either way
/// round, the operators, the libraries), because it answers with the converted value. Copies
/// count a reference: the interpreter copies every element a comprehension binds
/// (`containers.all(c, …)` copies each container), which for a plain map is its whole subtree.
#[derive(Debug, Clone)]
struct LazyJson<'v>(Arc<Node<'v>>);

#[derive(Debug)]
struct Node<'v> {
    json: &'v Value,
    converted: OnceLock<Box<dyn Val + 'v>>,
}

impl<'v> LazyJson<'v> {
    fn value(&self) -> &(dyn Val + 'v) {
        self.0
            .converted
            .get_or_init(|| convert_level(self.0.json))
            .as_ref()
    }
}

impl<'v> Val for LazyJson<'v> {
    fn get_type(&self) -> &Type {
        match self.0.json {
            Value::Array(_) => &LIST_TYPE,
            _ => &MAP_TYPE,
        }
    }

    /// A list or a map, by value: no one static type. Only the overload macros ask, for the
    /// Rust types of their parameters, and none takes this one.
    fn cel_type() -> &'static Type {
        &DYN_TYPE
    }

    fn as_adder<'b, 'w>(&'b self) -> Option<&'b (dyn Adder + 'w)>
    where
        Self: 'w,
    {
        self.value().as_adder()
    }

    fn as_container(&self) -> Option<&dyn Container> {
        self.value().as_container()
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        self.value().as_indexer()
    }

    fn into_indexer<'w>(self: Box<Self>) -> Option<Box<dyn Indexer + 'w>>
    where
        Self: 'w,
    {
        Some(self)
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        self.value().as_iterable()
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        self.value().as_sizer()
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        self.value().as_zeroer()
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.value().equals(other)
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }

    fn as_builtin<'b, 'w>(&'b self) -> BuiltinRef<'b, 'w>
    where
        Self: 'w,
    {
        self.value().as_builtin()
    }

    fn into_builtin<'w>(self: Box<Self>) -> Option<Builtin<'w>>
    where
        Self: 'w,
    {
        let converted = match Arc::try_unwrap(self.0) {
            Ok(node) => node
                .converted
                .into_inner()
                .unwrap_or_else(|| convert_level(node.json)),
            // Shared: a copy of this level (its elements are shared in turn).
            Err(shared) => LazyJson(shared).value().clone_as_boxed(),
        };
        converted.into_builtin()
    }
}

impl<'v> Indexer for LazyJson<'v> {
    fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match self.value().as_indexer() {
            Some(indexer) => indexer.get(key),
            None => Err(ExecutionError::function_error("_[_]", "not indexable")),
        }
    }

    fn steal<'w>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        // The elements are shared: copy the one asked for (a reference count for a container).
        self.get(key).map(CowVal::into_owned)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, compile, eval_bool};

    /// A JSON object or array is a map or list to every operator, function and macro, either
    /// way round, however much of it was converted before.
    #[test]
    fn objects_and_arrays_behave_as_maps_and_lists() {
        let object = json!({
            "metadata": {"name": "web", "labels": {"app": "web", "tier": "front"}},
            "spec": {"containers": [{"name": "a", "ports": [80, 443]}, {"name": "b"}], "empty": {}},
        });
        let request = json!({});
        let vars = Activation::new(Some(&object), None, &request);
        for source in [
            "object.metadata.labels == {'app': 'web', 'tier': 'front'}",
            "{'app': 'web', 'tier': 'front'} == object.metadata.labels",
            "object.metadata.labels != {'app': 'web'}",
            "'app' in object.metadata.labels && !('x' in object.metadata.labels)",
            "has(object.spec.containers) && !has(object.spec.volumes)",
            "size(object.metadata.labels) == 2 && object.spec.containers.size() == 2",
            "object.spec.containers.all(c, has(c.name))",
            "object.spec.containers.exists(c, c.name == 'b' && !has(c.ports))",
            "object.spec.containers[0].ports == [80, 443] && [80, 443] == object.spec.containers[0].ports",
            "object.spec.containers.map(c, c.name) == ['a', 'b']",
            "object.spec.containers[0].ports + [8080] == [80, 443, 8080]",
            "80 in object.spec.containers[0].ports",
            "object.metadata.labels.all(k, k in ['app', 'tier'])",
            "object.metadata.labels.transformMap(k, v, v + '!') == {'app': 'web!', 'tier': 'front!'}",
            "type(object.metadata) == map && type(object.spec.containers) == list",
            "!optional.ofNonZeroValue(object.spec.empty).hasValue()",
            "object.spec.containers.filter(c, c.name == 'a')[0].ports.size() == 2",
            "[object.spec.containers[1], object.spec.containers[0]].map(c, c.name) == ['b', 'a']",
            "sets.contains(object.spec.containers[0].ports, [443])",
            "object.spec.containers[0].ports.isSorted() && object.spec.containers[0].ports.sum() == 523",
        ] {
            let program = compile(source).unwrap();
            assert_eq!(eval_bool(&program, &vars), Ok(true), "{source}");
        }
    }
}
