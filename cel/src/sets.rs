//! cel-go's sets extension (`ext.Sets()`, which Kubernetes enables): lists taken as sets, with
//! CEL's equality (so `1`, `1u` and `1.0` are one element).
//!
//! * `sets.contains(a, b)`: every element of `b` is in `a`;
//! * `sets.equivalent(a, b)`: each contains the other;
//! * `sets.intersects(a, b)`: some element is in both.
use ::cel::common::types::{CelBool, LIST_TYPE};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::{elements, take};

/// Registers the extension's functions on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    for (name, op) in [
        (
            "sets.contains",
            contains as ::cel::common::functions::Function,
        ),
        ("sets.equivalent", equivalent),
        ("sets.intersects", intersects),
    ] {
        env.add_overload(
            name,
            &format!("{name}(list,list)"),
            vec![LIST_TYPE, LIST_TYPE],
            op,
        )?;
    }
    Ok(())
}

fn holds(set: &[&dyn Val], item: &dyn Val) -> bool {
    set.iter().any(|member| member.equals(item))
}

/// `f(a, b)` over the two lists' elements.
fn of_two<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    f: impl Fn(&[&dyn Val], &[&dyn Val]) -> bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [a, b] = take(args)?;
    let (a, b) = (
        elements(a.as_ref(), function)?,
        elements(b.as_ref(), function)?,
    );
    Ok(CowVal::owned(CelBool::from(f(&a, &b))))
}

fn contains<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    of_two(args, "sets.contains", |a, b| b.iter().all(|x| holds(a, *x)))
}

fn equivalent<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    of_two(args, "sets.equivalent", |a, b| {
        b.iter().all(|x| holds(a, *x)) && a.iter().all(|x| holds(b, *x))
    })
}

fn intersects<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    of_two(args, "sets.intersects", |a, b| {
        b.iter().any(|x| holds(a, *x))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, compile, eval_bool};

    /// cel-go v0.29.2 `ext/sets_test.go`, its rows without variables.
    #[test]
    fn answers_as_cel_go_does() {
        let object = json!({});
        let request = json!({"operation": "CREATE"});
        for source in [
            "sets.contains([], [])",
            "sets.contains([1], [])",
            "sets.contains([1], [1])",
            "sets.contains([1], [1, 1])",
            "sets.contains([1, 1], [1])",
            "sets.contains([2, 1], [1])",
            "sets.contains([1, 2, 3, 4], [2, 3])",
            "sets.contains([1], [1.0, 1])",
            "sets.contains([1, 2], [2u, 2.0])",
            "sets.contains([1, 2u], [2, 2.0])",
            "sets.contains([1, 2.0, 3u], [1.0, 2u, 3])",
            "sets.contains([[1], [2, 3]], [[2, 3.0]])",
            "!sets.contains([1], [2])",
            "!sets.contains([1], [1, 2])",
            "!sets.contains([1], [\"1\", 1])",
            "!sets.contains([1], [1.1, 1u])",
            "sets.equivalent([], [])",
            "sets.equivalent([1], [1])",
            "sets.equivalent([1], [1, 1])",
            "sets.equivalent([1, 1], [1])",
            "sets.equivalent([1], [1u, 1.0])",
            "sets.equivalent([1, 2, 3], [3u, 2.0, 1])",
            "sets.equivalent([[1.0], [2, 3]], [[1], [2, 3.0]])",
            "!sets.equivalent([2, 1], [1])",
            "!sets.equivalent([1], [1, 2])",
            "!sets.equivalent([1, 2], [2u, 2, 2.0])",
            "!sets.equivalent([1, 2], [1u, 2, 2.3])",
            "sets.intersects([1], [1])",
            "sets.intersects([1], [1, 1])",
            "sets.intersects([1, 1], [1])",
            "sets.intersects([2, 1], [1])",
            "sets.intersects([1], [1, 2])",
            "sets.intersects([1], [1.0, 2])",
            "sets.intersects([1, 2], [2u, 2, 2.0])",
            "sets.intersects([1, 2], [1u, 2, 2.3])",
            "sets.intersects([[1], [2, 3]], [[1, 2], [2, 3.0]])",
            "!sets.intersects([], [])",
            "!sets.intersects([1], [])",
            "!sets.intersects([1], [2])",
            "!sets.intersects([1], [\"1\", 2])",
            "!sets.intersects([1], [1.1, 2u])",
        ] {
            let program = compile(source).unwrap_or_else(|e| panic!("{source}: {e}"));
            assert_eq!(
                eval_bool(&program, &Activation::new(Some(&object), None, &request)),
                Ok(true),
                "{source}"
            );
        }
    }
}
