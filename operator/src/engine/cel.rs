//! CEL for Policies: one shared environment, compile-time checks of the variables an expression
//! may use, and evaluation against an admission request.
//!
//! Expressions are compiled once per Policy generation ([`compile`]) and the resulting
//! [`Program`]s are evaluated on every request against borrowed views of the request's JSON
//! ([`Activation`]), so the hot path converts the reviewed object into CEL values once per review
//! and copies no strings.
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock, OnceLock};

use ::cel::common::ast::{EntryExpr, Expr, IdedExpr};
use ::cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use ::cel::common::value::{CowVal, Val};
use ::cel::context::VariableResolver;
use ::cel::{Context, Env, Program, Value as CelValue};
use serde_json::Value;

/// Why an expression could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CelError {
    /// Building the shared environment (stdlib plus extensions) failed; a bug, not a user error.
    #[error("the CEL environment could not be built: {0}")]
    Environment(String),
    /// The source does not parse.
    #[error("does not compile: {0}")]
    Parse(String),
    /// Evaluation raised an error (missing key, no matching overload, ...).
    #[error("evaluation failed: {0}")]
    Execute(String),
    /// Evaluation succeeded but did not produce a bool.
    #[error("returned {0}, want bool")]
    NotBool(String),
}

/// Where an expression appears in a Policy: decides which variables it may reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// `spec.validate[i].expression`.
    Validation,
    /// `spec.mutate[i].when`; `element` is bound only when the mutation has a `forEach`.
    When { for_each: bool },
    /// `spec.match.conditions[i].expression`, which the API server also gives `authorizer`.
    MatchCondition,
}

impl Site {
    /// The variables an expression at this site may reference.
    pub fn variables(self) -> &'static [&'static str] {
        match self {
            Site::Validation | Site::When { for_each: false } => {
                &["object", "oldObject", "request"]
            }
            Site::When { for_each: true } => &["object", "oldObject", "request", "element"],
            Site::MatchCondition => &["object", "oldObject", "request", "authorizer"],
        }
    }
}

/// Identifiers that name types (`type(x) == string`) rather than variables.
const TYPE_NAMES: &[&str] = &[
    "bool",
    "bytes",
    "double",
    "dyn",
    "int",
    "list",
    "map",
    "null_type",
    "string",
    "type",
    "uint",
];

/// Function namespaces of the extensions in the environment: `strings.quote(s)` parses as a call
/// on the identifier `strings`, which is not a variable.
const FUNCTION_NAMESPACES: &[&str] = &["strings", "lists", "math", "base64", "optional"];

/// The environment every Policy expression is compiled and run in: the standard library plus the
/// strings, lists and math extensions, which Kubernetes' own CEL environment also offers. Built
/// once; compiling against and executing with the same `Env` keeps macros and overloads in sync.
static ENV: LazyLock<Result<Arc<Env>, CelError>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    for extension in [
        ::cel::extensions::strings as fn(&mut Env) -> Result<(), ::cel::DeclarationError>,
        ::cel::extensions::lists,
        ::cel::extensions::math,
    ] {
        env.add_extension(extension)
            .map_err(|e| CelError::Environment(e.to_string()))?;
    }
    Ok(Arc::new(env))
});

fn env() -> Result<&'static Arc<Env>, CelError> {
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

/// The variables `program` reads that `site` does not provide, sorted.
///
/// `Program::references()` lists every identifier, including those a comprehension binds
/// (`c` in `object.spec.containers.all(c, has(c.resources))`), so this walks the AST itself and
/// only reports identifiers free at the root.
pub fn unknown_variables(program: &Program, site: Site) -> Vec<String> {
    let mut free = BTreeSet::new();
    free_identifiers(program.expression(), &mut Vec::new(), &mut free);
    free.into_iter()
        .filter(|name| !site.variables().contains(name) && !TYPE_NAMES.contains(name))
        .map(str::to_string)
        .collect()
}

fn free_identifiers<'e>(
    expr: &'e IdedExpr,
    bound: &mut Vec<&'e str>,
    free: &mut BTreeSet<&'e str>,
) {
    match &expr.expr {
        Expr::Ident(name) => {
            // `@`-prefixed names are the accumulators macros introduce.
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                free.insert(name);
            }
        }
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                let namespace = matches!(&target.expr, Expr::Ident(n)
                    if FUNCTION_NAMESPACES.contains(&n.as_str()) && !bound.contains(&n.as_str()));
                if !namespace {
                    free_identifiers(target, bound, free);
                }
            }
            for arg in &call.args {
                free_identifiers(arg, bound, free);
            }
        }
        Expr::Comprehension(c) => {
            free_identifiers(&c.iter_range, bound, free);
            free_identifiers(&c.accu_init, bound, free);
            let depth = bound.len();
            bound.push(&c.iter_var);
            if let Some(v) = &c.iter_var2 {
                bound.push(v);
            }
            bound.push(&c.accu_var);
            free_identifiers(&c.loop_cond, bound, free);
            free_identifiers(&c.loop_step, bound, free);
            free_identifiers(&c.result, bound, free);
            bound.truncate(depth);
        }
        Expr::List(list) => {
            for e in &list.elements {
                free_identifiers(e, bound, free);
            }
        }
        Expr::Map(map) => entries(&map.entries, bound, free),
        Expr::Struct(s) => entries(&s.entries, bound, free),
        Expr::Select(select) => free_identifiers(&select.operand, bound, free),
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

fn entries<'e>(
    entries: &'e [::cel::common::ast::IdedEntryExpr],
    bound: &mut Vec<&'e str>,
    free: &mut BTreeSet<&'e str>,
) {
    for entry in entries {
        match &entry.expr {
            EntryExpr::StructField(f) => free_identifiers(&f.value, bound, free),
            EntryExpr::MapEntry(m) => {
                free_identifiers(&m.key, bound, free);
                free_identifiers(&m.value, bound, free);
            }
        }
    }
}

/// Converts JSON to a CEL value that borrows the JSON's strings.
///
/// Integers become `int` when they fit (as in Kubernetes, where JSON numbers without a fraction
/// are `int`), so `object.spec.replicas > 1` compares like with like.
pub fn to_val(value: &Value) -> Box<dyn Val + '_> {
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Box::new(CelInt::from(i))
            } else if let Some(u) = n.as_u64() {
                Box::new(CelUInt::from(u))
            } else {
                Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN)))
            }
        }
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => {
            Box::new(CelList::from(items.iter().map(to_val).collect::<Vec<_>>()))
        }
        Value::Object(map) => Box::new(CelMap::from(
            map.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// The variables of one evaluation: `object`, `oldObject` and `request` (null when absent),
/// converted to CEL values on first use and then borrowed by every expression of the review, so
/// a guard that only reads `element` never pays for converting the whole object.
pub struct Activation<'a> {
    object: Lazy<'a>,
    old_object: Lazy<'a>,
    request: Lazy<'a>,
}

/// A JSON value and its CEL conversion, made on first use.
struct Lazy<'a> {
    json: Option<&'a Value>,
    val: OnceLock<Box<dyn Val + 'a>>,
}

impl<'a> Lazy<'a> {
    fn new(json: Option<&'a Value>) -> Self {
        Lazy {
            json,
            val: OnceLock::new(),
        }
    }

    fn get(&self) -> &(dyn Val + 'a) {
        self.val
            .get_or_init(|| match self.json {
                Some(v) => to_val(v),
                None => Box::new(CelNull),
            })
            .as_ref()
    }
}

impl<'a> Activation<'a> {
    /// Binds the three variables every expression sees.
    pub fn new(
        object: Option<&'a Value>,
        old_object: Option<&'a Value>,
        request: &'a Value,
    ) -> Self {
        Activation {
            object: Lazy::new(object),
            old_object: Lazy::new(old_object),
            request: Lazy::new(Some(request)),
        }
    }

    /// These variables plus `element`, for a `forEach` guard.
    pub fn with_element<'b>(&'b self, element: &'b Value) -> ElementActivation<'b, 'a> {
        ElementActivation {
            base: self,
            element: to_val(element),
        }
    }
}

impl VariableResolver for Activation<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let value: &(dyn Val + 'b) = match variable {
            "object" => self.object.get(),
            "oldObject" => self.old_object.get(),
            "request" => self.request.get(),
            _ => return None,
        };
        Some(CowVal::Borrowed(value))
    }
}

/// An [`Activation`] plus the `element` of a `forEach`.
pub struct ElementActivation<'b, 'a> {
    base: &'b Activation<'a>,
    element: Box<dyn Val + 'b>,
}

impl VariableResolver for ElementActivation<'_, '_> {
    fn resolve<'c>(&'c self, variable: &str) -> Option<CowVal<'c, 'c>> {
        if variable == "element" {
            Some(CowVal::Borrowed(self.element.as_ref()))
        } else {
            self.base.resolve(variable)
        }
    }
}

/// Runs `program` and insists on a bool.
pub fn eval_bool(program: &Program, vars: &dyn VariableResolver) -> Result<bool, CelError> {
    let mut context = Context::with_env(Arc::clone(env()?));
    context.set_variable_resolver(vars);
    match program.execute(&context) {
        Ok(CelValue::Bool(b)) => Ok(b),
        Ok(other) => Err(CelError::NotBool(type_name(&other).to_string())),
        Err(e) => Err(CelError::Execute(e.to_string())),
    }
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
        assert!(matches!(
            run("object.spec.missing", &pod),
            Err(CelError::Execute(_))
        ));
        assert_eq!(run("1", &pod), Err(CelError::NotBool("int".into())));
    }

    #[test]
    fn element_is_bound_in_for_each_guards() {
        let object = json!({});
        let request = json!({});
        let element = json!({"name": "proxy"});
        let vars = Activation::new(Some(&object), None, &request);
        let program = compile("element.name == 'proxy'").unwrap();
        assert_eq!(eval_bool(&program, &vars.with_element(&element)), Ok(true));
        assert!(eval_bool(&program, &vars).is_err());
    }

    #[test]
    fn comprehension_variables_are_not_unknown() {
        let p = compile("object.spec.containers.all(c, has(c.resources)) && objct.x == 1").unwrap();
        assert_eq!(unknown_variables(&p, Site::Validation), vec!["objct"]);
        let p = compile("element.name == 'a' && type(object) == map").unwrap();
        assert_eq!(unknown_variables(&p, Site::Validation), vec!["element"]);
        assert!(unknown_variables(&p, Site::When { for_each: true }).is_empty());
        let p = compile("authorizer.requestResource.check('get').allowed()").unwrap();
        assert!(unknown_variables(&p, Site::MatchCondition).is_empty());
        let p = compile("strings.quote(object.metadata.name) != ''").unwrap();
        assert!(unknown_variables(&p, Site::Validation).is_empty());
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
