//! The walks over an expression's AST: [`free_identifiers`] resolves identifiers against
//! comprehension scopes (for the variable checks, [`super::check`]); [`children`] serves the
//! checks that need no scoping.
use std::collections::BTreeSet;

use ::cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr};

/// Function namespaces of the extensions in the environment: `strings.quote(s)` parses as a call
/// on the identifier `strings`, which is not a variable.
pub(super) const FUNCTION_NAMESPACES: &[&str] = &[
    "strings", "lists", "math", "base64", "optional", "sets", "ip", "format",
];

/// The identifiers `expr` reads that no enclosing comprehension binds, as the interpreter
/// resolves them: leading-dot names (`.object`, which skip the comprehension scopes) with their
/// dot, and accumulators (`@result`) included.
pub(super) fn free_identifiers(expr: &IdedExpr) -> BTreeSet<&str> {
    let mut free = BTreeSet::new();
    collect(expr, &mut Vec::new(), &mut free);
    free
}

fn collect<'e>(expr: &'e IdedExpr, bound: &mut Vec<&'e str>, free: &mut BTreeSet<&'e str>) {
    let is_free = |name: &str, bound: &[&str]| name.starts_with('.') || !bound.contains(&name);
    match &expr.expr {
        Expr::Ident(name) => {
            if is_free(name, bound) {
                free.insert(name);
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                let namespace = matches!(&target.expr, Expr::Ident(n)
                    if FUNCTION_NAMESPACES.contains(&n.as_str()) && is_free(n, bound));
                if !namespace {
                    collect(target, bound, free);
                }
            }
            for arg in &call.args {
                collect(arg, bound, free);
            }
        }
        Expr::Comprehension(c) => {
            collect(&c.iter_range, bound, free);
            collect(&c.accu_init, bound, free);
            let depth = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            collect(&c.loop_cond, bound, free);
            collect(&c.loop_step, bound, free);
            collect(&c.result, bound, free);
            bound.truncate(depth);
        }
        _ => {
            for child in children(expr) {
                collect(child, bound, free);
            }
        }
    }
}

/// The direct sub-expressions of `expr`, in source order: for the checks that look at every call
/// or literal and need no scoping ([`super::functions`], [`super::regex`], [`super::types`]).
pub(super) fn children(expr: &IdedExpr) -> Vec<&IdedExpr> {
    match &expr.expr {
        Expr::Call(call) => call
            .target
            .iter()
            .map(|t| t.as_ref())
            .chain(&call.args)
            .collect(),
        Expr::Select(select) => vec![&select.operand],
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => entry_children(&map.entries),
        Expr::Struct(s) => entry_children(&s.entries),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The keys and values of map entries, the values of struct fields.
fn entry_children(entries: &[IdedEntryExpr]) -> Vec<&IdedExpr> {
    entries
        .iter()
        .flat_map(|e| match &e.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })
        .collect()
}
