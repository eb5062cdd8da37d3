//! The variables of one evaluation.
use std::sync::OnceLock;

use ::cel::common::types::CelNull;
use ::cel::common::value::{CowVal, Val};
use ::cel::context::VariableResolver;
use serde_json::Value;

use super::convert::{largest_collection, to_val};

/// The variables of one evaluation: `object`, `oldObject` and `request` (null when absent),
/// converted to CEL values on first use and then borrowed by every expression of the review, so
/// a guard that only reads `element` never pays for converting the whole object.
pub struct Activation<'a> {
    object: Lazy<'a>,
    old_object: Lazy<'a>,
    request: Lazy<'a>,
}

/// A JSON value, its CEL conversion and the size of its largest collection, each worked out on
/// first use.
struct Lazy<'a> {
    json: Option<&'a Value>,
    val: OnceLock<Box<dyn Val + 'a>>,
    largest: OnceLock<usize>,
}

impl<'a> Lazy<'a> {
    fn new(json: Option<&'a Value>) -> Self {
        Lazy {
            json,
            val: OnceLock::new(),
            largest: OnceLock::new(),
        }
    }

    fn get(&self) -> &(dyn Val + 'a) {
        self.val
            .get_or_init(|| match self.json {
                Some(v) => to_val(v),
                None => Box::new(CelNull),
            })
            .as_ref()
    }

    fn largest(&self) -> usize {
        *self
            .largest
            .get_or_init(|| self.json.map_or(0, largest_collection))
    }
}

impl<'a> Activation<'a> {
    /// Binds the three variables every expression sees.
    pub fn new(
        object: Option<&'a Value>,
        old_object: Option<&'a Value>,
        request: &'a Value,
    ) -> Self {
        Activation {
            object: Lazy::new(object),
            old_object: Lazy::new(old_object),
            request: Lazy::new(Some(request)),
        }
    }

    /// These variables plus `element`, for a `forEach` guard.
    pub fn with_element<'b>(&'b self, element: &'b Value) -> ElementActivation<'b, 'a> {
        ElementActivation {
            base: self,
            element: to_val(element),
            largest: largest_collection(element),
        }
    }
}

/// The variables of an evaluation, and how large their collections are.
pub trait Bindings: VariableResolver {
    /// The size of the largest array or object among the `variables` named.
    fn largest_collection(&self, variables: &[&str]) -> usize;
}

impl Bindings for Activation<'_> {
    fn largest_collection(&self, variables: &[&str]) -> usize {
        [
            ("object", &self.object),
            ("oldObject", &self.old_object),
            ("request", &self.request),
        ]
        .into_iter()
        .filter(|(name, _)| variables.contains(name))
        .map(|(_, lazy)| lazy.largest())
        .max()
        .unwrap_or(0)
    }
}

impl Bindings for ElementActivation<'_, '_> {
    fn largest_collection(&self, variables: &[&str]) -> usize {
        let element = if variables.contains(&"element") {
            self.largest
        } else {
            0
        };
        element.max(self.base.largest_collection(variables))
    }
}

impl VariableResolver for Activation<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let value: &(dyn Val + 'b) = match variable {
            "object" => self.object.get(),
            "oldObject" => self.old_object.get(),
            "request" => self.request.get(),
            _ => return None,
        };
        Some(CowVal::Borrowed(value))
    }
}

/// An [`Activation`] plus the `element` of a `forEach`.
pub struct ElementActivation<'b, 'a> {
    base: &'b Activation<'a>,
    element: Box<dyn Val + 'b>,
    largest: usize,
}

impl VariableResolver for ElementActivation<'_, '_> {
    fn resolve<'c>(&'c self, variable: &str) -> Option<CowVal<'c, 'c>> {
        if variable == "element" {
            Some(CowVal::Borrowed(self.element.as_ref()))
        } else {
            self.base.resolve(variable)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{compile, eval_bool};
    use serde_json::json;

    #[test]
    fn element_is_bound_in_for_each_guards() {
        let object = json!({});
        let request = json!({});
        let element = json!({"name": "proxy"});
        let vars = Activation::new(Some(&object), None, &request);
        let program = compile("element.name == 'proxy'").unwrap();
        assert_eq!(eval_bool(&program, &vars.with_element(&element)), Ok(true));
        assert!(eval_bool(&program, &vars).is_err());
    }
}
