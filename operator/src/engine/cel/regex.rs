//! Kubernetes' regex library (`k8s.io/apiserver/pkg/cel/library/regex.go`): `find` and `findAll`
//! on strings, beside the standard library's `matches`.
//!
//! * `s.find(re)`: the first match of `re` in `s`, or `''`;
//! * `s.findAll(re)`: every match, in order; `s.findAll(re, n)`: at most `n` (all for a
//!   negative `n`, none for `0`).
//!
//! A pattern that does not compile fails the call; one written as a constant is refused when
//! the Policy is written ([`invalid_constant_patterns`]).
use ::cel::common::ast::{Expr, IdedExpr, LiteralValue};
use ::cel::common::types::{CelInt, CelList, CelString};
use ::cel::common::value::Val;
use ::cel::{DeclarationError, Env, ExecutionError, Program};
use regex::Regex;

use super::scope::children;

/// Functions whose argument is a regular expression.
const PATTERN_FUNCTIONS: &[&str] = &["matches", "find", "findAll"];

/// Registers `find` and `findAll` on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    ::cel::add_member_overload!(env, fn find: (CelString<'_>, CelString<'_>) -> Result<CelString<'_>>)?;
    ::cel::add_member_overload!(env, fn find_all: (CelString<'_>, CelString<'_>) -> Result<CelList<'_>>)?;
    ::cel::add_member_overload!(
        env,
        fn find_all_n: (CelString<'_>, CelString<'_>, CelInt) -> Result<CelList<'_>>,
        name = "findAll"
    )?;
    Ok(())
}

fn compile(function: &str, pattern: &CelString<'_>) -> Result<Regex, ExecutionError> {
    Regex::new(pattern.inner()).map_err(|e| ExecutionError::function_error(function, e))
}

fn find(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelString<'static>, ExecutionError> {
    let re = compile("find", pattern)?;
    Ok(re
        .find(this.inner())
        .map(|m| m.as_str().to_string())
        .unwrap_or_default()
        .into())
}

fn find_all(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelList<'static>, ExecutionError> {
    find_all_n(this, pattern, &CelInt::from(-1))
}

fn find_all_n(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
    limit: &CelInt,
) -> Result<CelList<'static>, ExecutionError> {
    let re = compile("findAll", pattern)?;
    let limit = usize::try_from(*limit.inner()).unwrap_or(usize::MAX);
    let found: Vec<Box<dyn Val>> = re
        .find_iter(this.inner())
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_string())) as Box<dyn Val>)
        .collect();
    Ok(CelList::from(found))
}

/// The constant patterns of `matches`, `find` and `findAll` calls in `program` that do not
/// compile, with the reason: Kubernetes refuses such an expression when it is written.
pub fn invalid_constant_patterns(program: &Program) -> Vec<String> {
    let mut invalid = Vec::new();
    walk(program.expression(), &mut invalid);
    invalid
}

fn walk(expr: &IdedExpr, invalid: &mut Vec<String>) {
    if let Expr::Call(call) = &expr.expr
        && PATTERN_FUNCTIONS.contains(&call.func_name.as_str())
    {
        // `s.find(re[, n])`, or `matches(s, re)` without a receiver.
        let position = usize::from(call.target.is_none());
        if let Some(Expr::Literal(LiteralValue::String(pattern))) =
            call.args.get(position).map(|a| &a.expr)
            && let Err(e) = Regex::new(pattern)
        {
            invalid.push(format!(
                "{}: invalid regular expression {:?}: {}",
                call.func_name,
                pattern.to_string(),
                reason(&e.to_string())
            ));
        }
    }
    for child in children(expr) {
        walk(child, invalid);
    }
}

/// The regex crate explains an error over several lines, with a caret diagram, the reason last;
/// a Problem is one line.
fn reason(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == ' '))
        .unwrap_or(message)
        .to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::engine::cel::{Activation, compile, eval_bool};

    /// Evaluates `source` with `object.str` = "this is a 123 string 456", the string of
    /// apiextensions-apiserver's CEL validation tests for `find` and `findAll` (v0.37.2,
    /// `validation_test.go`, where the expressions read `self.str`).
    fn eval(source: &str) -> Result<bool, crate::engine::cel::CelError> {
        let object = json!({"str": "this is a 123 string 456"});
        let request = json!({"operation": "CREATE"});
        eval_bool(
            &compile(source)?,
            &Activation::new(Some(&object), None, &request),
        )
    }

    #[test]
    fn find_and_find_all_answer_as_kubernetes_does() {
        for source in [
            "object.str.find('[0-9]+') == '123'",
            "object.str.find('[0-9]+') != '456'",
            "object.str.find('xyz') == ''",
            "object.str.findAll('[0-9]+') == ['123', '456']",
            "object.str.findAll('[0-9]+', 0) == []",
            "object.str.findAll('[0-9]+', 1) == ['123']",
            "object.str.findAll('[0-9]+', 2) == ['123', '456']",
            "object.str.findAll('[0-9]+', 3) == ['123', '456']",
            "object.str.findAll('[0-9]+', -1) == ['123', '456']",
            "object.str.findAll('xyz') == []",
            "object.str.findAll('xyz', 1) == []",
            // k8s.io/apiserver pkg/cel/library tests.
            "'a 1 b 2'.find('[0-9]') == '1'",
            "'abc 123 def 123'.find('123') == '123'",
            "'abc 123 def 123'.findAll('123') == ['123', '123']",
            "'abc 123 def 123'.findAll('123', 1) == ['123']",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
    }

    #[test]
    fn constant_patterns_that_do_not_compile_are_found_when_written() {
        for source in [
            "object.str.find(')') == ''",
            "object.str.findAll(')') == []",
            "object.str.findAll(')', 1) == []",
            "object.str.matches('(')",
        ] {
            let program = compile(source).expect("parses");
            let invalid = invalid_constant_patterns(&program);
            assert_eq!(invalid.len(), 1, "{source}: {invalid:?}");
            assert!(
                invalid[0].contains("invalid regular expression"),
                "{invalid:?}"
            );
        }
        let fine = compile("object.str.matches('^[a-z]+$') && object.str.find(object.re) == ''")
            .expect("parses");
        assert!(invalid_constant_patterns(&fine).is_empty());
        // A pattern known only at run time fails the call.
        let object = json!({"str": "x", "re": ")"});
        let request = json!({"operation": "CREATE"});
        let program = compile("object.str.find(object.re) == ''").expect("parses");
        assert!(eval_bool(&program, &Activation::new(Some(&object), None, &request)).is_err());
    }
}
