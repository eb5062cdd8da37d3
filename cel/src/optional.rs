//! The list functions of cel-go's optional library that the `cel` crate's does not have
//! (`cel.OptionalTypes()` at its current version, which Kubernetes enables):
//!
//! * `first()`, `last()`: the first and last element of a list, as an optional (none when the
//!   list is empty);
//! * `optional.unwrap(list)`, `list.unwrapOpt()`: the values of a list of optionals, the empty
//!   ones left out.
use ::cel::common::types::{CelList, CelOptional, LIST_TYPE};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::{elements, take};

/// Registers the functions on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("first", "list.first()", LIST_TYPE, vec![], first)?;
    env.add_member_overload("last", "list.last()", LIST_TYPE, vec![], last)?;
    env.add_overload(
        "optional.unwrap",
        "optional.unwrap(list)",
        vec![LIST_TYPE],
        unwrap,
    )?;
    env.add_member_overload("unwrapOpt", "list.unwrapOpt()", LIST_TYPE, vec![], unwrap)
}

/// The element `pick` chooses of the receiver's, as an optional.
fn element_of<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    pick: impl for<'a> Fn(&'a [&'a (dyn Val + 'v)]) -> Option<&'a &'a (dyn Val + 'v)>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements(list.as_ref(), function)?;
    let picked = pick(&items).map(|item| item.clone_as_boxed());
    Ok(CowVal::owned(CelOptional::from(picked)))
}

fn first<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    element_of(args, "first", |items| items.first())
}

fn last<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    element_of(args, "last", |items| items.last())
}

fn unwrap<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let mut values: Vec<Box<dyn Val + 'v>> = Vec::new();
    for item in elements(list.as_ref(), "unwrapOpt")? {
        let optional = item.downcast_ref::<CelOptional<'_>>().ok_or_else(|| {
            ExecutionError::function_error("unwrapOpt", "list elements must be optionals")
        })?;
        if let Some(value) = optional.inner() {
            values.push(value.clone_as_boxed());
        }
    }
    Ok(CowVal::Owned(Box::new(CelList::from(values))))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, compile, eval_bool};

    fn eval(source: &str) -> Result<bool, String> {
        let object = json!({"spec": {"items": [3, 4]}});
        let request = json!({"operation": "CREATE"});
        let program = compile(source).map_err(|e| e.to_string())?;
        eval_bool(&program, &Activation::new(Some(&object), None, &request))
            .map_err(|e| e.to_string())
    }

    /// cel-go v0.29.2 `cel/cel_test.go` (`TestOptionalValues`), its list rows.
    #[test]
    fn answers_as_cel_go_does() {
        for source in [
            "[1, 2, 3].first() == optional.of(1)",
            "[1, 2, 3].last() == optional.of(3)",
            "[].first() == optional.none() && [].last() == optional.none()",
            "object.spec.items.first().value() == 3 && object.spec.items.last().orValue(0) == 4",
            "optional.unwrap([optional.of(1), optional.none(), optional.of(2)]) == [1, 2]",
            "[optional.none(), optional.of('a')].unwrapOpt() == ['a']",
            "[].unwrapOpt() == []",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
        let err = eval("dyn([1]).unwrapOpt() == [1]").unwrap_err();
        assert!(err.contains("optionals"), "{err}");
    }
}
