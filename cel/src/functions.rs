//! The functions an expression calls that Gatehouse's environment does not declare, so that a
//! Policy calling one is refused when it is written instead of failing on every request.
//!
//! The `cel` crate has no type checker and keeps its function table private, so each called
//! name is asked of the environment the way a call would ask it: a call with no arguments
//! fails as an undeclared reference exactly when no overload of that name exists (a declared
//! name fails for want of a matching overload instead).
use std::collections::BTreeSet;
use std::sync::Arc;

use ::cel::common::ast::{Expr, IdedExpr};
use ::cel::{Context, ExecutionError, Program};

use super::CelError;
use super::ast::{FUNCTION_NAMESPACES, children};
use super::check::{Site, reads_variable};
use super::environment::{compile, env};

/// The methods of `authorizer` (Kubernetes' authz library): only the API server evaluates a
/// condition that reads it (the engine gives such a Policy an entry of its own).
const AUTHORIZER_METHODS: &[&str] = &[
    "allowed",
    "check",
    "error",
    "errored",
    "fieldSelector",
    "group",
    "labelSelector",
    "name",
    "namespace",
    "path",
    "reason",
    "resource",
    "serviceAccount",
    "subresource",
];

/// One call in an expression, as the interpreter resolves it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Call<'e> {
    /// `size`, or `strings.quote` for a call on a function namespace.
    name: String,
    /// The original function name: what a receiver call looks up.
    function: &'e str,
    /// Called on a receiver (`x.f()`) rather than as `f(x)`.
    receiver: bool,
}

/// The functions `program` calls that the environment does not declare, sorted; a condition
/// that reads `authorizer` may call its methods.
pub fn unknown_functions(program: &Program, site: Site) -> Result<Vec<String>, CelError> {
    let mut calls = BTreeSet::new();
    collect(program.expression(), &mut calls);
    let authorizer = site == Site::MatchCondition && reads_variable(program, "authorizer");
    let mut unknown = BTreeSet::new();
    for call in calls {
        if authorizer && AUTHORIZER_METHODS.contains(&call.function) {
            continue;
        }
        if !declared(&call)? {
            unknown.insert(call.name);
        }
    }
    Ok(unknown.into_iter().collect())
}

/// Operators (`_+_`, `@in`, `!_`) are not names a Policy can misspell.
fn is_name(function: &str) -> bool {
    function.chars().next().is_some_and(char::is_alphabetic)
}

fn collect<'e>(expr: &'e IdedExpr, calls: &mut BTreeSet<Call<'e>>) {
    if let Expr::Call(call) = &expr.expr
        && is_name(&call.func_name)
    {
        let namespace = call.target.as_deref().and_then(|t| match &t.expr {
            Expr::Ident(n) if FUNCTION_NAMESPACES.contains(&n.as_str()) => Some(n),
            _ => None,
        });
        calls.insert(Call {
            name: match namespace {
                Some(ns) => format!("{ns}.{}", call.func_name),
                None => call.func_name.clone(),
            },
            function: &call.func_name,
            receiver: call.target.is_some() && namespace.is_none(),
        });
    }
    for child in children(expr) {
        collect(child, calls);
    }
}

/// Whether the environment declares an overload of `call`'s name of its kind: a receiver call
/// is probed as `0.f()`, any other as `f()` (`ns.f()` on a namespace).
fn declared(call: &Call<'_>) -> Result<bool, CelError> {
    let probe = if call.receiver {
        format!("0.{}()", call.function)
    } else {
        format!("{}()", call.name)
    };
    let program = compile(&probe)?;
    let context = Context::with_env(Arc::clone(env()?));
    // The probe reads no variable: whatever it finds undeclared is the function (or, for
    // `ns.f()`, the namespace taken for a variable because no `ns.f` exists).
    Ok(!matches!(
        program.execute(&context),
        Err(ExecutionError::UndeclaredReference(_))
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown(source: &str, site: Site) -> Vec<String> {
        let program = compile(source).expect("compiles");
        unknown_functions(&program, site).expect("the environment builds")
    }

    #[test]
    fn functions_the_environment_declares_are_known() {
        for source in [
            "object.metadata.name.startsWith('a') && size(object.spec.containers) > 0",
            "object.spec.containers.all(c, c.image.matches('^example'))",
            "'ABC'.lowerAscii() == 'abc' && strings.quote('x') != ''",
            "lists.range(3).map(i, i * 2) == [0, 2, 4] && [2, 1].sort() == [1, 2]",
            "int('1') + 1 == 2 && string(1) == '1' && type(1) == int",
            "optional.of(1).orValue(2) == 1 && object.?metadata.labels.orValue({}) == {}",
            "timestamp('2026-01-01T00:00:00Z') + duration('1h') > timestamp('2026-01-01T00:00:00Z')",
            "quantity(object.spec.cpu).isLessThan(quantity('1')) && [1, 2].sum() == 3",
            "sets.contains([1, 2], [1]) && 'a1'.find('[0-9]') == '1'",
            "cidr('10.0.0.0/8').containsIP(ip(object.spec.ip)) && ip(object.spec.ip).isLoopback()",
            "object.metadata.labels.all(k, v, format.labelValue().validate(v) == optional.none())",
            "object.spec.containers.transformMap(i, c, c.name).size() > 0",
        ] {
            assert_eq!(
                unknown(source, Site::Validation),
                Vec::<String>::new(),
                "{source}"
            );
        }
    }

    #[test]
    fn functions_it_does_not_declare_are_reported_by_name() {
        assert_eq!(
            unknown(
                "format.dns1123Label().validate(object.metadata.name) == optional.none() && object.nope()",
                Site::Validation
            ),
            ["nope"]
        );
        // Not in Kubernetes' environment for new expressions, so not in Gatehouse's.
        assert_eq!(
            unknown("math.greatest(1, 2) == 2", Site::Validation),
            ["math.greatest"]
        );
        assert_eq!(
            unknown("base64.encode(b'a') == 'YQ=='", Site::Validation),
            ["base64.encode"]
        );
        assert_eq!(
            unknown("foo(object) && object.bar()", Site::Validation),
            ["bar", "foo"]
        );
        assert_eq!(
            unknown("lists.nope(1) == 1", Site::Validation),
            ["lists.nope"]
        );
        // Two-variable comprehensions are macros; a third name is not.
        assert_eq!(
            unknown(
                "object.metadata.labels.all(k, v, v != '') && [1].all(a, b, c, true)",
                Site::Validation
            ),
            ["all"]
        );
    }

    #[test]
    fn authorizer_methods_are_left_to_the_api_server() {
        let source = "authorizer.group('').resource('pods').check('create').allowed()";
        assert!(unknown(source, Site::MatchCondition).is_empty());
        assert_eq!(
            unknown("object.allowed()", Site::MatchCondition),
            ["allowed"],
            "only where the condition reads authorizer"
        );
    }
}
