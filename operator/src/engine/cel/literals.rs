//! Kubernetes compiles CEL with homogeneous aggregate literals: the elements of a list literal,
//! and the keys and the values of a map literal, must have one type (`[1, 'a']` and `[1, 2.0]`
//! are refused when the policy is written). Gatehouse has no type checker, so it refuses the
//! literals whose elements' types it can tell from the syntax alone — literals and literals of
//! literals; anything computed counts as `dyn` and agrees with every type, as in the checker.
use ::cel::Program;
use ::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue};

use super::scope::children;

/// The literals of `program` whose elements' types differ, each with the two types.
pub fn mixed_type_literals(program: &Program) -> Vec<String> {
    let mut mixed = Vec::new();
    type_of(program.expression(), &mut mixed);
    mixed
}

/// The static type of `expr` as far as its syntax says (`None`: `dyn`), recording mixed
/// literals inside it on the way.
fn type_of(expr: &IdedExpr, mixed: &mut Vec<String>) -> Option<String> {
    match &expr.expr {
        Expr::Literal(literal) => match literal {
            LiteralValue::Boolean(_) => Some("bool".into()),
            LiteralValue::Bytes(_) => Some("bytes".into()),
            LiteralValue::Double(_) => Some("double".into()),
            LiteralValue::Int(_) => Some("int".into()),
            LiteralValue::String(_) => Some("string".into()),
            LiteralValue::UInt(_) => Some("uint".into()),
            // null is assignable to several types; leave it to the run time.
            LiteralValue::Null => None,
        },
        Expr::List(list) => {
            let types: Vec<Option<String>> =
                list.elements.iter().map(|e| type_of(e, mixed)).collect();
            let element = common(types.into_iter(), "list", mixed);
            Some(format!("list({})", element.as_deref().unwrap_or("dyn")))
        }
        Expr::Map(map) => {
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for entry in &map.entries {
                match &entry.expr {
                    EntryExpr::MapEntry(m) => {
                        keys.push(type_of(&m.key, mixed));
                        values.push(type_of(&m.value, mixed));
                    }
                    EntryExpr::StructField(f) => {
                        type_of(&f.value, mixed);
                    }
                }
            }
            let key = common(keys.into_iter(), "map key", mixed);
            let value = common(values.into_iter(), "map value", mixed);
            Some(format!(
                "map({}, {})",
                key.as_deref().unwrap_or("dyn"),
                value.as_deref().unwrap_or("dyn")
            ))
        }
        Expr::Call(_) | Expr::Select(_) | Expr::Comprehension(_) | Expr::Struct(_) => {
            for child in children(expr) {
                type_of(child, mixed);
            }
            None
        }
        Expr::Ident(_) | Expr::Unspecified => None,
    }
}

/// The one type of `types` (`None` when none is known); records the first disagreement.
fn common(
    types: impl Iterator<Item = Option<String>>,
    what: &str,
    mixed: &mut Vec<String>,
) -> Option<String> {
    let mut first: Option<String> = None;
    for t in types.flatten() {
        match &first {
            None => first = Some(t),
            Some(f) if !compatible(f, &t) => {
                mixed.push(format!("a {what} literal mixes {f} and {t}"));
                return None;
            }
            Some(_) => {}
        }
    }
    first
}

/// Types agree where they are equal, `dyn` agreeing with anything at any depth.
fn compatible(a: &str, b: &str) -> bool {
    if a == b || a == "dyn" || b == "dyn" {
        return true;
    }
    match (a.split_once('('), b.split_once('(')) {
        (Some((ka, ra)), Some((kb, rb))) if ka == kb => {
            let (ra, rb) = (&ra[..ra.len() - 1], &rb[..rb.len() - 1]);
            let (pa, pb) = (split_top(ra), split_top(rb));
            pa.len() == pb.len() && pa.iter().zip(&pb).all(|(x, y)| compatible(x, y))
        }
        _ => false,
    }
}

/// `int, list(int, dyn)` → `["int", "list(int, dyn)"]`: the parameters of a type, split at the
/// commas outside parentheses.
fn split_top(params: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in params.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(params[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(params[start..].trim());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cel::compile;

    fn mixed(source: &str) -> Vec<String> {
        mixed_type_literals(&compile(source).expect("parses"))
    }

    #[test]
    fn literals_of_one_type_pass_and_mixed_ones_are_named() {
        for fine in [
            "[1, 2, 3].sum() == 6",
            "[[1], [2, 3]] == [[1], [2, 3]]",
            "[object.a, 1, object.b] == []",
            "{'a': 1, 'b': 2}.size() == 2",
            "[[], [1]].size() == 2",
            "[1, null].size() == 2",
            "object.spec.containers.all(c, c.name in ['a', 'b'])",
        ] {
            assert_eq!(mixed(fine), Vec::<String>::new(), "{fine}");
        }
        assert_eq!(
            mixed("[1, 'a'].size() == 2"),
            ["a list literal mixes int and string"]
        );
        assert_eq!(
            mixed("sets.contains([1], [1.0, 1])"),
            ["a list literal mixes double and int"]
        );
        assert_eq!(
            mixed("[[1.0], [2, 3]] == []"),
            ["a list literal mixes list(double) and list(int)"]
        );
        assert_eq!(
            mixed("{'a': 1, 'b': 'x'}.size() == 2"),
            ["a map value literal mixes int and string"]
        );
        assert_eq!(
            mixed("[1u, 2].size() == 2"),
            ["a list literal mixes uint and int"]
        );
    }
}
