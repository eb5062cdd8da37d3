//! cel-go's two-variable comprehensions (`ext.TwoVarComprehensions`), which Kubernetes enables:
//! `all(i, v, p)`, `exists(i, v, p)`, `existsOne(i, v, p)` (and `exists_one`),
//! `transformList(i, v, [filter,] t)`, `transformMap(k, v, [filter,] t)` and
//! `transformMapEntry(k, v, [filter,] e)`; over a list `i` is the index and `v` the element,
//! over a map `k` is the key and `v` its value.
//!
//! The `cel` crate parses a comprehension with a second variable but its interpreter never binds
//! it, so each macro expands to a one-variable comprehension over `@entries(range)`, the
//! `[index or key, value]` pairs of the range, and binds the two names for the step the way
//! `cel.bind` does: a comprehension over an empty list whose accumulator is the name. Shadowing
//! therefore follows the interpreter's own scoping, with no rewriting of the user's expression.
use std::collections::HashMap;

use ::cel::common::ast::{
    CallExpr, ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr, operators,
};
use ::cel::common::types::{CelInt, CelList, CelMap, CelMapKey, DYN_TYPE, Kind, MAP_TYPE};
use ::cel::common::value::{CowVal, FromVal, Val};
use ::cel::parser::{Macro, MacroExprHelper, ParseError};
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::take;

/// The internal function giving a range's `[index or key, value]` pairs; `@` keeps it out of
/// what a Policy can write.
pub const ENTRIES: &str = "@entries";
/// cel-go's `cel.@mapInsert`: a map with one more entry, or two maps merged; a key already
/// present is an error.
pub(super) const MAP_INSERT: &str = "@mapInsert";
/// The accumulator of every comprehension the macros make.
const ACCUMULATOR: &str = "@result";
/// The variable holding one pair of `@entries`.
const PAIR: &str = "@pair";

/// The kind of comprehension a macro expands to.
#[derive(Clone, Copy)]
enum Shape {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

/// Registers the macros and the functions their expansions call.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    for (name, shape, arg_counts) in [
        ("all", Shape::All, &[3][..]),
        ("exists", Shape::Exists, &[3]),
        ("existsOne", Shape::ExistsOne, &[3]),
        ("exists_one", Shape::ExistsOne, &[3]),
        ("transformList", Shape::TransformList, &[3, 4]),
        ("transformMap", Shape::TransformMap, &[3, 4]),
        ("transformMapEntry", Shape::TransformMapEntry, &[3, 4]),
    ] {
        for &count in arg_counts {
            env.add_macro(Macro::receiver(name, count, move |helper, target, args| {
                expand(shape, helper, target, args).map(Some)
            }))?;
        }
    }
    env.add_overload(ENTRIES, "@entries_dyn", vec![DYN_TYPE], entries)?;
    env.add_overload(
        MAP_INSERT,
        "@mapInsert_map_key_value",
        vec![MAP_TYPE, DYN_TYPE, DYN_TYPE],
        map_insert,
    )?;
    env.add_overload(
        MAP_INSERT,
        "@mapInsert_map_map",
        vec![MAP_TYPE, MAP_TYPE],
        map_insert,
    )?;
    Ok(())
}

/// A macro's operands once checked: the range, the two variable names, the optional filter
/// and the body.
struct Operands {
    range: IdedExpr,
    first: String,
    second: String,
    filter: Option<IdedExpr>,
    body: IdedExpr,
}

/// The expressions of the comprehension a macro expands to, but for its range and variable.
struct Parts {
    init: IdedExpr,
    condition: IdedExpr,
    step: IdedExpr,
    result: IdedExpr,
}

/// Makes a node of the expansion, with an id of its own.
type Node<'a> = dyn FnMut(Expr) -> IdedExpr + 'a;

fn expand(
    shape: Shape,
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<IdedExpr, ParseError> {
    let Operands {
        range,
        first,
        second,
        filter,
        body,
    } = operands(helper, target, args)?;
    let mut node = |expr: Expr| helper.next_expr(expr);
    let parts = match shape {
        Shape::All => quantifier(&mut node, true, body),
        Shape::Exists => quantifier(&mut node, false, body),
        Shape::ExistsOne => exists_one(&mut node, body),
        Shape::TransformList | Shape::TransformMap | Shape::TransformMapEntry => {
            transform(&mut node, shape, &first, filter, body)
        }
    };
    // The step, with `second` then `first` bound to the pair's parts around it.
    let mut step = parts.step;
    for (index, variable) in [(1, second), (0, first)] {
        let pair = node(Expr::Ident(PAIR.into()));
        let at = node(Expr::Literal(LiteralValue::Int(CelInt::from(index))));
        let part = node(call(operators::INDEX, vec![pair, at]));
        step = bind(&mut node, variable, part, step);
    }
    let pairs = node(call(ENTRIES, vec![range]));
    Ok(node(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: pairs,
        iter_var: PAIR.into(),
        iter_var2: None,
        accu_var: ACCUMULATOR.into(),
        accu_init: parts.init,
        loop_cond: parts.condition,
        loop_step: step,
        result: parts.result,
    }))))
}

/// The receiver and arguments of a two-variable macro, or why they cannot be expanded.
fn operands(
    helper: &MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Operands, ParseError> {
    let Some(range) = target.take() else {
        return Err(helper.new_error(0, "a two-variable comprehension needs a receiver"));
    };
    if let Expr::Literal(_) = range.expr {
        return Err(helper.new_error(
            range.id,
            "expression of a scalar type cannot be range of a comprehension",
        ));
    }
    let mut taken = std::mem::take(args).into_iter();
    let (Some(first), Some(second)) = (taken.next(), taken.next()) else {
        return Err(helper.new_error(range.id, "a two-variable comprehension needs two names"));
    };
    let rest: Vec<IdedExpr> = taken.collect();
    let first = name(helper, first)?;
    let second = name(helper, second)?;
    if first == second {
        return Err(helper.new_error(range.id, format!("duplicate variable name: {first}")));
    }
    if [&first, &second]
        .iter()
        .any(|n| *n == ACCUMULATOR || *n == "__result__")
    {
        return Err(helper.new_error(
            range.id,
            "iteration variable overwrites accumulator variable",
        ));
    }
    let (filter, body) = match <[IdedExpr; 2]>::try_from(rest) {
        Ok([filter, body]) => (Some(filter), body),
        Err(mut one) => match one.pop() {
            Some(body) => (None, body),
            None => return Err(helper.new_error(range.id, "missing the comprehension's body")),
        },
    };
    Ok(Operands {
        range,
        first,
        second,
        filter,
        body,
    })
}

/// `all` (when `all`) or `exists`: a bool accumulator, combined with each `body` until decided.
fn quantifier(node: &mut Node<'_>, all: bool, body: IdedExpr) -> Parts {
    let init = node(Expr::Literal(LiteralValue::Boolean(all.into())));
    let going_on = if all {
        accumulator(node)
    } else {
        let acc = accumulator(node);
        node(call(operators::LOGICAL_NOT, vec![acc]))
    };
    let condition = node(call(operators::NOT_STRICTLY_FALSE, vec![going_on]));
    let combine = if all {
        operators::LOGICAL_AND
    } else {
        operators::LOGICAL_OR
    };
    let acc = accumulator(node);
    let step = node(call(combine, vec![acc, body]));
    Parts {
        init,
        condition,
        step,
        result: accumulator(node),
    }
}

/// `existsOne`: a count of the elements `body` holds for, which must end at one.
fn exists_one(node: &mut Node<'_>, body: IdedExpr) -> Parts {
    let init = node(Expr::Literal(LiteralValue::Int(CelInt::from(0))));
    let acc = accumulator(node);
    let one = node(Expr::Literal(LiteralValue::Int(CelInt::from(1))));
    let counted = node(call(operators::ADD, vec![acc, one]));
    let unchanged = accumulator(node);
    let step = node(call(operators::CONDITIONAL, vec![body, counted, unchanged]));
    let acc = accumulator(node);
    let one = node(Expr::Literal(LiteralValue::Int(CelInt::from(1))));
    let result = node(call(operators::EQUALS, vec![acc, one]));
    Parts {
        init,
        condition: literal_true(node),
        step,
        result,
    }
}

/// `transformList`, `transformMap` or `transformMapEntry`: a list or map grown by `body` for
/// each element, or for those `filter` holds for.
fn transform(
    node: &mut Node<'_>,
    shape: Shape,
    first: &str,
    filter: Option<IdedExpr>,
    body: IdedExpr,
) -> Parts {
    let acc = accumulator(node);
    let (init, grown) = match shape {
        Shape::TransformList => {
            let element = node(Expr::List(ListExpr::new(vec![body])));
            (
                node(Expr::List(ListExpr::new(Vec::new()))),
                node(call(operators::ADD, vec![acc, element])),
            )
        }
        Shape::TransformMap => {
            let key = node(Expr::Ident(first.to_string()));
            (
                node(Expr::Map(MapExpr::default())),
                node(call(MAP_INSERT, vec![acc, key, body])),
            )
        }
        _ => (
            node(Expr::Map(MapExpr::default())),
            node(call(MAP_INSERT, vec![acc, body])),
        ),
    };
    let step = match filter {
        Some(filter) => {
            let unchanged = accumulator(node);
            node(call(operators::CONDITIONAL, vec![filter, grown, unchanged]))
        }
        None => grown,
    };
    Parts {
        init,
        condition: literal_true(node),
        step,
        result: accumulator(node),
    }
}

/// A call of the global function `func`.
fn call(func: &str, args: Vec<IdedExpr>) -> Expr {
    Expr::Call(CallExpr {
        func_name: func.to_string(),
        target: None,
        args,
    })
}

fn accumulator(node: &mut Node<'_>) -> IdedExpr {
    node(Expr::Ident(ACCUMULATOR.into()))
}

fn literal_true(node: &mut Node<'_>) -> IdedExpr {
    node(Expr::Literal(LiteralValue::Boolean(true.into())))
}

/// `within`, with `variable` bound to `value`: a comprehension over an empty list whose
/// accumulator is the variable.
fn bind(node: &mut Node<'_>, variable: String, value: IdedExpr, within: IdedExpr) -> IdedExpr {
    let empty = node(Expr::List(ListExpr::new(Vec::new())));
    let never = node(Expr::Literal(LiteralValue::Boolean(false.into())));
    let same = node(Expr::Ident(variable.clone()));
    node(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: empty,
        iter_var: "#unused".into(),
        iter_var2: None,
        accu_var: variable,
        accu_init: value,
        loop_cond: never,
        loop_step: same,
        result: within,
    })))
}

fn name(helper: &MacroExprHelper<'_>, expr: IdedExpr) -> Result<String, ParseError> {
    match expr.expr {
        Expr::Ident(name) => Ok(name),
        _ => Err(helper.new_error(expr.id, "argument must be a simple name")),
    }
}

/// `@entries(range)`: `[index, element]` for each element of a list, `[key, value]` for each
/// entry of a map.
fn entries<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [range] = take(args)?;
    let pair = |first: Box<dyn Val>, second: Box<dyn Val>| -> Box<dyn Val> {
        Box::new(CelList::from(vec![first, second]))
    };
    let range = range.as_ref();
    let pairs: Vec<Box<dyn Val>> = match range.get_type().kind() {
        Kind::List => {
            let mut items = range
                .as_iterable()
                .ok_or_else(|| ExecutionError::function_error(ENTRIES, "not a list"))?
                .iter();
            let mut pairs = Vec::new();
            while let Some(item) = items.next() {
                let index = i64::try_from(pairs.len())
                    .map_err(|e| ExecutionError::function_error(ENTRIES, e))?;
                pairs.push(pair(Box::new(CelInt::from(index)), item.clone_as_boxed()));
            }
            pairs
        }
        Kind::Map => map_of(range)?
            .inner()
            .iter()
            .map(|(key, value)| pair(key.inner().clone_as_boxed(), value.clone_as_boxed()))
            .collect(),
        _ => {
            return Err(ExecutionError::function_error(
                ENTRIES,
                format!(
                    "expression of type '{}' cannot be range of a comprehension",
                    range.get_type().name()
                ),
            ));
        }
    };
    Ok(CowVal::owned(CelList::from(pairs)))
}

fn map_of<'a, 'v>(val: &'a (dyn Val + 'v)) -> Result<&'a CelMap<'v>, ExecutionError> {
    CelMap::from_val(val).ok_or_else(|| ExecutionError::function_error(MAP_INSERT, "not a map"))
}

/// `@mapInsert(m, k, v)` and `@mapInsert(m, other)`.
fn map_insert<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let mut args = args.into_iter();
    let Some(map) = args.next() else {
        return Err(ExecutionError::invalid_argument_count(2, 0));
    };
    let mut merged: HashMap<CelMapKey<'static>, Box<dyn Val>> = map_of(map.as_ref())?
        .inner()
        .iter()
        .map(|(k, v)| (k.clone().into_static(), v.clone_as_boxed()))
        .collect();
    let additions: Vec<(CelMapKey<'static>, Box<dyn Val>)> = match (args.next(), args.next()) {
        (Some(key), Some(value)) => vec![(key_of(key.as_ref())?, value.clone_as_boxed())],
        (Some(other), None) => map_of(other.as_ref())?
            .inner()
            .iter()
            .map(|(k, v)| (k.clone().into_static(), v.clone_as_boxed()))
            .collect(),
        _ => {
            return Err(ExecutionError::function_error(
                MAP_INSERT,
                "no entry to insert",
            ));
        }
    };
    for (key, value) in additions {
        if merged.contains_key(&key) {
            return Err(ExecutionError::function_error(
                MAP_INSERT,
                format!("insert failed: key {} already exists", key_text(&key)),
            ));
        }
        merged.insert(key, value);
    }
    Ok(CowVal::owned(CelMap::from(merged)))
}

fn key_of(val: &dyn Val) -> Result<CelMapKey<'static>, ExecutionError> {
    CelMapKey::try_from(val.clone_as_boxed())
        .map(CelMapKey::into_static)
        .map_err(|_| {
            ExecutionError::function_error(
                MAP_INSERT,
                format!("unsupported map key type: {}", val.get_type().name()),
            )
        })
}

/// A key as Go's `%v` prints it in cel-go's message.
fn key_text(key: &CelMapKey<'_>) -> String {
    match key {
        CelMapKey::Bool(b) => b.inner().to_string(),
        CelMapKey::Int(i) => i.inner().to_string(),
        CelMapKey::UInt(u) => u.inner().to_string(),
        CelMapKey::String(s) => s.inner().to_string(),
    }
}
