//! JSON to CEL values.
use std::collections::HashMap;
use std::sync::Arc;

use ::cel::ExecutionError;
use ::cel::common::traits::{Container, Indexer, Iterable, Sizer, Zeroer};
use ::cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt, Type,
};
use ::cel::common::value::{Builtin, BuiltinRef, CowVal, Val};
use serde_json::Value;

/// Converts JSON to a CEL value that borrows the JSON's strings.
///
/// Integers become `int` when they fit (as in Kubernetes, where JSON numbers without a fraction
/// are `int`), so `object.spec.replicas > 1` compares like with like.
pub fn to_val(value: &Value) -> Box<dyn Val + '_> {
    to_val_sized(value, &mut 0)
}

/// [`to_val`], raising `largest` to the size of the largest array or object converted.
pub(super) fn to_val_sized<'v>(value: &'v Value, largest: &mut usize) -> Box<dyn Val + 'v> {
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
        Value::Array(items) => {
            *largest = (*largest).max(items.len());
            Box::new(CelList::from(
                items
                    .iter()
                    .map(|item| to_val_sized(item, largest))
                    .collect::<Vec<_>>(),
            ))
        }
        Value::Object(map) => {
            *largest = (*largest).max(map.len());
            Box::new(SharedMap(Arc::new(CelMap::from(
                map.iter()
                    .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val_sized(v, largest)))
                    .collect::<HashMap<_, _>>(),
            ))))
        }
    }
}

/// A JSON object as a CEL map whose copies share its entries.
///
/// The interpreter copies every element a comprehension binds (`containers.all(c, …)` copies
/// each container), and a plain map copies its whole subtree; this one counts a reference. It
/// is a map to everything that asks (`downcast_ref::<CelMap>`, equality either way round, the
/// libraries), because it answers with the map it shares.
#[derive(Debug, Clone)]
struct SharedMap<'v>(Arc<CelMap<'v>>);

impl<'v> Val for SharedMap<'v> {
    fn get_type(&self) -> &Type {
        <Self as Val>::cel_type()
    }

    fn cel_type() -> &'static Type {
        <CelMap<'_> as Val>::cel_type()
    }

    fn as_container(&self) -> Option<&dyn Container> {
        Some(self.0.as_ref())
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self.0.as_ref())
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
        Some(self.0.as_ref())
    }

    fn as_sizer(&self) -> Option<&dyn Sizer> {
        Some(self.0.as_ref())
    }

    fn as_zeroer(&self) -> Option<&dyn Zeroer> {
        Some(self.0.as_ref())
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.0.equals(other)
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
        BuiltinRef::Map(self.0.as_ref())
    }

    fn into_builtin<'w>(self: Box<Self>) -> Option<Builtin<'w>>
    where
        Self: 'w,
    {
        let map = Arc::try_unwrap(self.0).unwrap_or_else(|shared| shared.as_ref().clone());
        Some(Builtin::Map(map))
    }
}

impl<'v> Indexer for SharedMap<'v> {
    fn get<'b, 'w>(&'b self, key: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.0.get(key)
    }

    fn steal<'w>(self: Box<Self>, key: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        // The entries are shared: copy the one asked for (a reference count for a map).
        self.0.get(key).map(CowVal::into_owned)
    }
}
