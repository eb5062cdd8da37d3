//! JSON to CEL values.
use std::collections::HashMap;

use ::cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use ::cel::common::value::Val;
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
            Box::new(CelMap::from(
                map.iter()
                    .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val_sized(v, largest)))
                    .collect::<HashMap<_, _>>(),
            ))
        }
    }
}
