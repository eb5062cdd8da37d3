//! The environment every Policy expression is compiled and run in.
use std::sync::{Arc, LazyLock};

use ::cel::{Context, Env, Program, Value as CelValue};

use super::CelError;
use super::activation::Bindings;
use super::check::free_identifiers;
use crate::cost;

/// The environment every Policy expression is compiled and run in: the standard library plus the
/// strings, lists and sets extensions and Kubernetes' regex, lists, quantity, IP/CIDR, semver,
/// URL and format libraries, as Kubernetes' own CEL environment has them (it has no math extension, so neither
/// has this one). Built once; compiling against and executing with the same `Env` keeps macros
/// and overloads in sync.
static ENV: LazyLock<Result<Arc<Env>, CelError>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    for extension in [
        super::extensions::library as fn(&mut Env) -> Result<(), ::cel::DeclarationError>,
        super::time::library,
        super::regex::library,
        super::lists::library,
        super::sets::library,
        super::quantity::library,
        super::net::library,
        super::semver::library,
        super::url::library,
        super::format::library,
        super::comprehensions::library,
        super::optional::library,
    ] {
        env.add_extension(extension)
            .map_err(|e| CelError::Environment(e.to_string()))?;
    }
    Ok(Arc::new(env))
});

pub(super) fn env() -> Result<&'static Arc<Env>, CelError> {
    ENV.as_ref().map_err(Clone::clone)
}

/// Parses `source` into a program of the shared environment.
pub fn compile(source: &str) -> Result<Program, CelError> {
    env()?
        .compile(source)
        .map_err(|e| CelError::Parse(one_line(&e.to_string())))
}

/// Parse errors come as `ERROR: <input>:L:C: message` lines, each followed by a caret diagram; a
/// Problem is one line, so keep the positions and messages only.
fn one_line(s: &str) -> String {
    let errors: Vec<&str> = s
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ERROR: "))
        .map(|l| l.strip_prefix("<input>:").unwrap_or(l))
        .collect();
    if errors.is_empty() {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    } else {
        errors.join("; ")
    }
}

/// Runs `program` and insists on a bool. A program whose cost depends on the request's
/// collections is first estimated with their actual sizes, and not run past the budget.
pub fn eval_bool(program: &Program, vars: &dyn Bindings) -> Result<bool, CelError> {
    checked_eval(program, sized_by(program).as_deref(), vars)
}

/// The variables an evaluation may bind.
const VARIABLES: [&str; 4] = ["object", "oldObject", "request", "element"];

/// The variables whose collection sizes decide the cost of `program`; `None` when its cost does
/// not depend on the request.
pub(super) fn sized_by(program: &Program) -> Option<Vec<&'static str>> {
    cost::depends_on_input(program).then(|| {
        let free = free_identifiers(program);
        VARIABLES.into_iter().filter(|v| free.contains(v)).collect()
    })
}

/// [`eval_bool`] with [`sized_by`] worked out already.
pub(super) fn checked_eval(
    program: &Program,
    sized_by: Option<&[&str]>,
    vars: &dyn Bindings,
) -> Result<bool, CelError> {
    if let Some(variables) = sized_by {
        let largest = vars.largest_collection(variables) as u64;
        if let Some(reason) = cost::over_budget(program, largest) {
            return Err(CelError::OverBudget(reason));
        }
    }
    run(program, vars)
}

/// Runs `program`, with no cost check, and insists on a bool.
pub(super) fn run(program: &Program, vars: &dyn Bindings) -> Result<bool, CelError> {
    let mut context = Context::with_env(Arc::clone(env()?));
    context.set_variable_resolver(vars);
    match program.execute(&context) {
        Ok(CelValue::Bool(b)) => Ok(b),
        Ok(other) => Err(CelError::NotBool(type_name(&other).to_string())),
        Err(e) => Err(CelError::Execute(e.to_string())),
    }
}

/// Runs `program` for the value it computes, as JSON (a map's keys as strings), within the cost
/// budget of a validation.
pub fn eval_json(program: &Program, vars: &dyn Bindings) -> Result<serde_json::Value, CelError> {
    if let Some(variables) = sized_by(program) {
        let largest = vars.largest_collection(&variables) as u64;
        if let Some(reason) = cost::over_budget(program, largest) {
            return Err(CelError::OverBudget(reason));
        }
    }
    let mut context = Context::with_env(Arc::clone(env()?));
    context.set_variable_resolver(vars);
    let value = program
        .execute(&context)
        .map_err(|e| CelError::Execute(e.to_string()))?;
    value
        .json()
        .map_err(|e| CelError::Execute(format!("a {} has no JSON form: {e}", type_name(&value))))
}

fn type_name(v: &CelValue) -> &'static str {
    match v {
        CelValue::List(_) => "list",
        CelValue::Map(_) => "map",
        CelValue::Function(..) => "function",
        CelValue::Int(_) => "int",
        CelValue::UInt(_) => "uint",
        CelValue::Float(_) => "double",
        CelValue::String(_) => "string",
        CelValue::Bytes(_) => "bytes",
        CelValue::Bool(_) => "bool",
        CelValue::Opaque(_) => "opaque",
        CelValue::Struct(_) => "struct",
        CelValue::Null => "null",
        CelValue::Duration(_) => "google.protobuf.Duration",
        CelValue::Timestamp(_) => "google.protobuf.Timestamp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Activation;
    use serde_json::{Value, json};

    fn run(src: &str, object: &Value) -> Result<bool, CelError> {
        let program = compile(src)?;
        let request = json!({"operation": "CREATE", "userInfo": {"username": "alice"}});
        let vars = Activation::new(Some(object), None, &request);
        eval_bool(&program, &vars)
    }

    #[test]
    fn evaluates_against_the_object_and_request() {
        let pod = json!({"spec": {"replicas": 3, "containers": [{"name": "a"}, {"name": "b"}]}});
        assert_eq!(run("object.spec.replicas > 1", &pod), Ok(true));
        assert_eq!(run("object.spec.replicas == 3", &pod), Ok(true));
        assert_eq!(
            run("object.spec.containers.all(c, c.name.size() == 1)", &pod),
            Ok(true)
        );
        assert_eq!(run("oldObject == null", &pod), Ok(true));
        assert_eq!(run("request.userInfo.username == 'alice'", &pod), Ok(true));
        assert_eq!(run("'ABC'.lowerAscii() == 'abc'", &pod), Ok(true));
        // Timestamps and durations, as in Kubernetes' environment.
        assert_eq!(
            run(
                "timestamp('2026-01-01T00:00:00Z') + duration('1h') == timestamp('2026-01-01T01:00:00Z')",
                &pod
            ),
            Ok(true)
        );
        assert_eq!(run("duration('90m') > duration('1h')", &pod), Ok(true));
        assert_eq!(
            run(
                "timestamp('2026-03-04T05:06:07Z').getFullYear() == 2026",
                &pod
            ),
            Ok(true)
        );
        assert_eq!(
            run("math.greatest(1, 2) == 2", &pod).map_err(|_| ()),
            Err(())
        );
        assert!(matches!(
            run("object.spec.missing", &pod),
            Err(CelError::Execute(_))
        ));
        assert_eq!(run("1", &pod), Err(CelError::NotBool("int".into())));
    }

    #[test]
    fn parse_errors_are_one_line() {
        let Err(CelError::Parse(msg)) = compile("object.spec.(") else {
            panic!("expected a parse error");
        };
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with("1:13: Syntax error"), "{msg}");
    }
}
