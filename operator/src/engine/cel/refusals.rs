//! Everything the API server refuses when an expression is written, in one list: what a Policy's
//! admission check, `gatehouse eval` and the parity corpus all ask.
use ::cel::Program;
use ::cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::activation::Activation;
use super::check::Site;
use super::scope::children;
use super::{CelError, compile, environment, functions, regex, types};

/// Why the API server would refuse `program` when it is written at `site`, one reason each:
/// unknown functions, constant patterns or time literals that do not parse, type errors.
pub fn refusals(program: &Program, site: Site) -> Result<Vec<String>, CelError> {
    let mut reasons: Vec<String> = functions::unknown_functions(program, site)?
        .into_iter()
        .map(|name| {
            format!(
                "unknown function {name:?}: Gatehouse's CEL environment does not declare it, so the expression would fail on every request"
            )
        })
        .collect();
    reasons.extend(regex::invalid_constant_patterns(program));
    reasons.extend(invalid_time_literals(program));
    reasons.extend(types::type_errors(program));
    Ok(reasons)
}

/// The functions whose constant argument Kubernetes parses when the expression is written
/// (cel-go's timestamp and duration literal validators).
const TIME_LITERALS: [&str; 2] = ["timestamp", "duration"];

/// `timestamp('…')` and `duration('…')` calls on a constant string that does not parse, each
/// with the reason; they are parsed exactly as at run time, by evaluating the call alone.
fn invalid_time_literals(program: &Program) -> Vec<String> {
    let mut invalid = Vec::new();
    walk(program.expression(), &mut invalid);
    invalid
}

fn walk(expr: &IdedExpr, invalid: &mut Vec<String>) {
    if let Expr::Call(call) = &expr.expr
        && call.target.is_none()
        && TIME_LITERALS.contains(&call.func_name.as_str())
        && let [argument] = call.args.as_slice()
        && let Expr::Literal(LiteralValue::String(text)) = &argument.expr
        && let Err(reason) = evaluate_alone(&call.func_name, text.inner())
    {
        invalid.push(format!(
            "{}: invalid literal {:?}: {reason}",
            call.func_name,
            text.inner()
        ));
    }
    for child in children(expr) {
        walk(child, invalid);
    }
}

/// Runs `function('<text>')` on its own: JSON's string escapes are CEL's.
fn evaluate_alone(function: &str, text: &str) -> Result<(), String> {
    let quoted = serde_json::to_string(text).map_err(|e| e.to_string())?;
    let program = compile(&format!("{function}({quoted}) == {function}({quoted})"))
        .map_err(|e| e.to_string())?;
    let empty = serde_json::Value::Null;
    match environment::run(&program, &Activation::new(None, None, &empty)) {
        Ok(_) => Ok(()),
        Err(CelError::Execute(reason)) => Err(reason),
        Err(other) => Err(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(source: &str) -> Vec<String> {
        let program = compile(source).unwrap();
        refusals(&program, Site::Validation).unwrap()
    }

    #[test]
    fn time_literals_that_do_not_parse_are_refused_when_written() {
        assert_eq!(
            refused("timestamp('2026-01-01T00:00:00Z') < timestamp('2027-01-01T00:00:00Z')"),
            Vec::<String>::new()
        );
        assert_eq!(
            refused("duration('1h30m') > duration('90s')"),
            Vec::<String>::new()
        );
        let bad = refused("timestamp('not a time') == timestamp('2026-01-01T00:00:00Z')");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(
            bad[0].starts_with("timestamp: invalid literal \"not a time\""),
            "{bad:?}"
        );
        let bad = refused("duration('1x') == duration('1s')");
        assert!(
            bad[0].starts_with("duration: invalid literal \"1x\""),
            "{bad:?}"
        );
        // A computed argument is the run time's to judge.
        assert_eq!(
            refused("duration(object.spec.timeout) > duration('1s')"),
            Vec::<String>::new()
        );
    }
}
