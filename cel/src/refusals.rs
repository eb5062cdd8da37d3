//! Everything the API server refuses when an expression is written, in one list: what a Policy's
//! admission check, `gatehouse eval` and the parity corpus all ask.
use ::cel::Program;
use ::cel::common::ast::{Expr, IdedExpr, LiteralValue};

use super::ast::children;
use super::check::Site;
use super::{CelError, functions, regex, time, types};

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
    reasons.extend(if site == Site::Computed {
        types::value_type_errors(program)
    } else {
        types::type_errors(program)
    });
    Ok(reasons)
}

/// `timestamp(…)` and `duration(…)` calls on a constant that does not parse, each with the
/// reason: Kubernetes' literal validators refuse them when written. They are parsed with the
/// grammars the calls use at run time ([`time`]).
fn invalid_time_literals(program: &Program) -> Vec<String> {
    let mut invalid = Vec::new();
    walk(program.expression(), &mut invalid);
    invalid
}

fn walk(expr: &IdedExpr, invalid: &mut Vec<String>) {
    if let Expr::Call(call) = &expr.expr
        && call.target.is_none()
        && let [argument] = call.args.as_slice()
        && let Expr::Literal(literal) = &argument.expr
    {
        let judged = match (call.func_name.as_str(), literal) {
            (time::DURATION, LiteralValue::String(text)) => {
                Some(time::parse_duration(text.inner()).map(|_| ()))
            }
            (time::TIMESTAMP, LiteralValue::String(text)) => {
                Some(time::parse_timestamp(text.inner()).map(|_| ()))
            }
            (time::TIMESTAMP, LiteralValue::Int(seconds)) => {
                Some(time::timestamp_of_seconds(*seconds.inner()).map(|_| ()))
            }
            _ => None,
        };
        if let Some(Err(reason)) = judged {
            let function = time::written_as(&call.func_name).unwrap_or_default();
            invalid.push(format!("{function}: invalid literal: {reason}"));
        }
    }
    for child in children(expr) {
        walk(child, invalid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile;

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
        assert!(bad[0].starts_with("timestamp: invalid literal"), "{bad:?}");
        let bad = refused("duration('1x') == duration('1s')");
        assert!(bad[0].contains("unknown unit \"x\""), "{bad:?}");
        assert_eq!(
            refused("duration('1µs') > duration('0s')"),
            Vec::<String>::new()
        );
        assert_eq!(
            refused("timestamp(253402300800) > timestamp(0)").len(),
            1,
            "past the year 9999"
        );
        // A computed argument is the run time's to judge.
        assert_eq!(
            refused("duration(object.spec.timeout) > duration('1s')"),
            Vec::<String>::new()
        );
    }
}
