//! Kubernetes' lists library (`k8s.io/apiserver/pkg/cel/library/lists.go`, version 0): member
//! functions on lists beside the lists extension's.
//!
//! * `isSorted()`: whether the elements are in ascending order;
//! * `sum()`: the sum of numbers or durations (`0` for an empty list);
//! * `min()`, `max()`: the least and greatest element (an error for an empty list);
//! * `indexOf(x)`, `lastIndexOf(x)`: the first and last position of an element equal to `x`
//!   (structural equality), or `-1`.
use std::cmp::Ordering;

use ::cel::common::types::{
    CelBool, CelInt, DOUBLE_TYPE, DURATION_TYPE, DYN_TYPE, INT_TYPE, LIST_TYPE, Type, UINT_TYPE,
};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};

/// Registers the library's overloads on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("isSorted", "list.isSorted()", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list.sum()", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list.min()", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list.max()", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list.indexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list.lastIndexOf(dyn)",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    Ok(())
}

/// The `N` arguments of a call (the receiver first).
pub(super) fn take<'b, 'v, const N: usize>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<[CowVal<'b, 'v>; N], ExecutionError> {
    <[CowVal<'b, 'v>; N]>::try_from(args)
        .map_err(|args| ExecutionError::invalid_argument_count(N, args.len()))
}

/// The elements of `list`, borrowed.
pub(super) fn elements<'a, 'v>(
    list: &'a (dyn Val + 'v),
    function: &str,
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let iterable = list
        .as_iterable()
        .ok_or_else(|| ExecutionError::function_error(function, "not a list"))?;
    let mut items = iterable.iter();
    let mut out = Vec::new();
    while let Some(item) = items.next() {
        out.push(item);
    }
    Ok(out)
}

/// How `a` orders against `b`, as `<` does; elements that cannot be ordered fail the call.
fn compare(a: &dyn Val, b: &dyn Val, function: &str) -> Result<Ordering, ExecutionError> {
    a.as_comparer()
        .ok_or_else(|| {
            ExecutionError::function_error(function, "list elements must be comparable")
        })?
        .compare(b)
        .map_err(|e| ExecutionError::function_error(function, e))
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements(list.as_ref(), "isSorted")?;
    for pair in items.windows(2) {
        if compare(pair[0], pair[1], "isSorted")? == Ordering::Greater {
            return Ok(CowVal::owned(CelBool::from(false)));
        }
    }
    Ok(CowVal::owned(CelBool::from(true)))
}

/// Types `sum` adds, as Kubernetes declares it: numbers and durations.
const SUMMABLE: [&Type; 4] = [&INT_TYPE, &UINT_TYPE, &DOUBLE_TYPE, &DURATION_TYPE];

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements(list.as_ref(), "sum")?;
    let Some((first, rest)) = items.split_first() else {
        return Ok(CowVal::owned(CelInt::from(0)));
    };
    let mut total: Box<dyn Val + 'v> = first.clone_as_boxed();
    if let Some(other) = items
        .iter()
        .find(|item| !SUMMABLE.contains(&item.get_type()))
    {
        return Err(ExecutionError::function_error(
            "sum",
            format!(
                "found no matching overload for a list of {:?}",
                other.get_type().kind()
            ),
        ));
    }
    for item in rest {
        let added = total
            .as_adder()
            .ok_or_else(|| ExecutionError::function_error("sum", "elements cannot be added"))?
            .add(*item)?
            .into_owned();
        total = added;
    }
    Ok(CowVal::Owned(total))
}

/// The element of `list` that `keep` prefers to every other (the first of equals).
fn extreme<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    keep: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements(list.as_ref(), function)?;
    let Some((first, rest)) = items.split_first() else {
        return Err(ExecutionError::function_error(
            function,
            format!("{function} called on empty list"),
        ));
    };
    let mut best = *first;
    // Like the ordering operators, elements of another type do not compare.
    compare(best, best, function)?;
    for item in rest {
        if compare(*item, best, function)? == keep {
            best = *item;
        }
    }
    Ok(CowVal::Owned(best.clone_as_boxed()))
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "min", Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "max", Ordering::Greater)
}

fn position<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    last: bool,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, wanted] = take(args)?;
    let items = elements(list.as_ref(), function)?;
    let found = if last {
        items.iter().rposition(|item| item.equals(wanted.as_ref()))
    } else {
        items.iter().position(|item| item.equals(wanted.as_ref()))
    };
    let index = found.map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX));
    Ok(CowVal::owned(CelInt::from(index)))
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "indexOf", false)
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    position(args, "lastIndexOf", true)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::{Activation, CelError, compile, eval_bool};

    /// Evaluates `source` over the lists of apiextensions-apiserver's CEL validation tests of
    /// this library (v0.37.2, `validation_test.go`, where the expressions read `self.…`).
    fn eval(source: &str) -> Result<bool, CelError> {
        let object = json!({
            "ints": [1, 2, 2, 3], "unsortedInts": [2, 1], "emptyInts": [],
            "doubles": [1.5, 2.0, 2.0, 3.5], "unsortedDoubles": [2.5, 1.5], "emptyDoubles": [],
            "strings": ["a", "b", "b", "c"], "unsortedStrings": ["b", "a"], "emptyStrings": [],
            "objs": [{"f1": "a", "f2": "a"}, {"f1": "a", "f2": "b"}, {"f1": "a", "f2": "b"}, {"f1": "a", "f2": "c"}],
        });
        let request = json!({"operation": "CREATE"});
        eval_bool(
            &compile(source)?,
            &Activation::new(Some(&object), None, &request),
        )
    }

    #[test]
    fn answers_as_kubernetes_does() {
        for source in [
            "object.ints.sum() == 8",
            "object.ints.min() == 1",
            "object.ints.max() == 3",
            "object.emptyInts.sum() == 0",
            "object.ints.isSorted()",
            "object.emptyInts.isSorted()",
            "object.unsortedInts.isSorted() == false",
            "object.doubles.sum() == 9.0",
            "object.doubles.min() == 1.5",
            "object.doubles.max() == 3.5",
            "object.doubles.isSorted()",
            "object.unsortedDoubles.isSorted() == false",
            "[duration('1s'), duration('1m'), duration('1m'), duration('1h')].sum() == duration('1h2m1s')",
            "[duration('1s'), duration('1h')].min() == duration('1s')",
            "[duration('1s'), duration('1h')].max() == duration('1h')",
            "[duration('1m'), duration('1s')].isSorted() == false",
            "object.strings.min() == 'a'",
            "object.strings.max() == 'c'",
            "object.strings.isSorted()",
            "object.emptyStrings.isSorted()",
            "object.unsortedStrings.isSorted() == false",
            "[timestamp('2000-01-01T00:00:00Z'), timestamp('2010-01-01T00:00:00Z')].min() == timestamp('2000-01-01T00:00:00Z')",
            "[timestamp('2000-01-01T00:00:00Z'), timestamp('2000-02-01T00:00:00Z'), timestamp('2000-02-01T00:00:00Z')].indexOf(timestamp('2000-02-01T00:00:00Z')) == 1",
            "[timestamp('2000-01-01T00:00:00Z'), timestamp('2000-02-01T00:00:00Z'), timestamp('2000-02-01T00:00:00Z')].lastIndexOf(timestamp('2000-02-01T00:00:00Z')) == 2",
            "[timestamp('2000-01-01T00:00:00Z')].indexOf(timestamp('2005-02-01T00:00:00Z')) == -1",
            "[[1], [2]].indexOf([1]) == 0",
            "[{'a': 1}, {'b': 2}].lastIndexOf({'b': 2}) == 1",
            "object.objs.indexOf(object.objs[1]) == 1",
            "object.objs.lastIndexOf(object.objs[1]) == 2",
            "([0] + object.emptyInts).min() == 0",
            "dyn([]).sum() == 0",
            "dyn([1, 2]).sum() == 3",
            "dyn([1.0, 2.0]).sum() == 3.0",
            "[].sum() == 0",
            // The strings extension's indexOf keeps working beside the list one.
            "'abcb'.indexOf('b') == 1 && 'abcb'.lastIndexOf('b') == 3",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
    }

    #[test]
    fn refuses_what_kubernetes_refuses() {
        for (source, reason) in [
            ("object.emptyInts.min() == 1", "min called on empty list"),
            ("object.emptyInts.max() == 3", "max called on empty list"),
            (
                "object.emptyStrings.min() == 'a'",
                "min called on empty list",
            ),
            ("['a', 'b'].sum() == 'c'", "sum"),
            ("[[1], [2]].min() == [1]", "min"),
            ("[{'a': 1}, {'b': 2}].max() == {'b': 2}", "max"),
        ] {
            match eval(source) {
                Err(CelError::Execute(message)) => {
                    assert!(message.contains(reason), "{source}: {message}")
                }
                other => panic!("{source}: {other:?}"),
            }
        }
    }
}
