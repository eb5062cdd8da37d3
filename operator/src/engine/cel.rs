//! CEL for Policies: one shared environment, compile-time checks of the variables an expression
//! may use, and evaluation against an admission request.
//!
//! Expressions are compiled once per Policy generation ([`compile`]) and the resulting
//! [`Program`]s are evaluated on every request against borrowed views of the request's JSON
//! ([`Activation`]), so the hot path converts the reviewed object into CEL values once per review
//! and copies no strings.
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Not evaluated: with the collections of this request, the estimated cost exceeds the
    /// budget ([`super::cost`]).
    #[error("{0}")]
    OverBudget(String),
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

/// Whether `program` reads the variable `name` (free at the root, not bound by a macro).
pub fn reads_variable(program: &Program, name: &str) -> bool {
    let mut free = BTreeSet::new();
    free_identifiers(program.expression(), &mut Vec::new(), &mut free);
    free.contains(name)
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
    to_val_sized(value, &mut 0)
}

/// [`to_val`], raising `largest` to the size of the largest array or object converted.
fn to_val_sized<'v>(value: &'v Value, largest: &mut usize) -> Box<dyn Val + 'v> {
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
            *largest = (*largest).max(items.len());
            Box::new(CelList::from(
                items
                    .iter()
                    .map(|item| to_val_sized(item, largest))
                    .collect::<Vec<_>>(),
            ))
        }
        Value::Object(map) => {
            *largest = (*largest).max(map.len());
            Box::new(CelMap::from(
                map.iter()
                    .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val_sized(v, largest)))
                    .collect::<HashMap<_, _>>(),
            ))
        }
    }
}

/// What expressions read of one JSON variable, found by walking their AST ([`Needs::of`]): the
/// conversion to CEL ([`to_val_pruned`]) then skips the rest, which no evaluation can observe.
///
/// A variable reached only through constant field selections (`element.image`,
/// `has(c.resources.limits)`) and as the range of one-variable comprehensions needs only those
/// fields and elements; any other use (the bare variable, an index, an optional selection) needs
/// the whole value. Selecting a field keeps the key exactly when the JSON has it, so a missing
/// key fails with the same error, and a value that is not an object is always converted whole,
/// so a selection on it fails the same way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Need {
    /// The whole value: everything below is ignored.
    full: bool,
    /// Fields selected on the value, when it is an object.
    fields: BTreeMap<String, Need>,
    /// What a comprehension reads of each element, when the value is a list it iterates.
    elements: Option<Box<Need>>,
}

impl Need {
    fn full() -> Self {
        Need {
            full: true,
            ..Need::default()
        }
    }

    /// Only tested with `has()` by its parent: its value is never read.
    fn presence_only(&self) -> bool {
        !self.full && self.fields.is_empty() && self.elements.is_none()
    }

    fn merge(&mut self, other: Need) {
        if self.full {
            return;
        }
        if other.full {
            *self = Need::full();
            return;
        }
        for (field, need) in other.fields {
            self.fields.entry(field).or_default().merge(need);
        }
        if let Some(elements) = other.elements {
            match &mut self.elements {
                Some(mine) => mine.merge(*elements),
                None => self.elements = Some(elements),
            }
        }
    }

    /// The need at `path` below this one, created on the way.
    fn at(&mut self, path: &[&str]) -> &mut Need {
        path.iter().fold(self, |need, field| {
            need.fields.entry((*field).to_string()).or_default()
        })
    }
}

/// What a set of programs reads of each variable; `None` for a variable none of them references.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Needs {
    object: Option<Need>,
    old_object: Option<Need>,
    request: Option<Need>,
    element: Option<Need>,
}

/// The variables [`Needs`] tracks, in slot order.
const TRACKED: [&str; 4] = ["object", "oldObject", "request", "element"];

impl Needs {
    /// What `program` reads of `object`, `oldObject`, `request` and `element`.
    pub fn of(program: &Program) -> Needs {
        let mut walk = NeedWalk {
            slots: vec![None; TRACKED.len()],
            scope: Vec::new(),
        };
        walk.visit(program.expression());
        let mut slots = walk.slots.into_iter();
        let mut next = || slots.next().flatten();
        Needs {
            object: next(),
            old_object: next(),
            request: next(),
            element: next(),
        }
    }

    /// What any of `programs` reads.
    pub fn union<'p>(programs: impl IntoIterator<Item = &'p Program>) -> Needs {
        let mut all = Needs::default();
        for program in programs {
            all.merge(Needs::of(program));
        }
        all
    }

    fn merge(&mut self, other: Needs) {
        fn one(mine: &mut Option<Need>, other: Option<Need>) {
            match (mine.as_mut(), other) {
                (Some(m), Some(o)) => m.merge(o),
                (None, o @ Some(_)) => *mine = o,
                (_, None) => {}
            }
        }
        one(&mut self.object, other.object);
        one(&mut self.old_object, other.old_object);
        one(&mut self.request, other.request);
        one(&mut self.element, other.element);
    }

    /// Whether the programs reference `request` at all: when not, the caller need not build it.
    pub fn reads_request(&self) -> bool {
        self.request.is_some()
    }

    /// Whether the programs reference `object` at all.
    pub fn reads_object(&self) -> bool {
        self.object.is_some()
    }

    /// What the programs read of `element`; `None` when they do not reference it.
    pub fn element(&self) -> Option<&Need> {
        self.element.as_ref()
    }
}

/// Where an identifier in scope gets its value.
#[derive(Clone, Copy)]
enum Slot {
    /// A tracked variable or a comprehension variable iterating over a tracked path: uses are
    /// recorded in `NeedWalk::slots`.
    Tracked(usize),
    /// A comprehension variable whose values come from an expression already needed whole.
    Opaque,
}

struct NeedWalk<'e> {
    slots: Vec<Option<Need>>,
    /// Comprehension variables, innermost last.
    scope: Vec<(&'e str, Slot)>,
}

impl<'e> NeedWalk<'e> {
    /// The slot `name` refers to, innermost binding first, as the interpreter resolves it.
    fn slot(&mut self, name: &str) -> Option<Slot> {
        if let Some(absolute) = name.strip_prefix('.') {
            // `.object` skips the comprehension scopes: not worth modelling, so all of it.
            if let Some(i) = TRACKED.iter().position(|t| *t == absolute) {
                self.slots[i] = Some(Need::full());
            }
            return None;
        }
        if let Some((_, slot)) = self.scope.iter().rev().find(|(n, _)| *n == name) {
            return Some(*slot);
        }
        TRACKED.iter().position(|t| *t == name).map(Slot::Tracked)
    }

    /// Records that `need` is read at `path` of the identifier `name`.
    fn record(&mut self, name: &str, path: &[&str], need: Need) {
        if let Some(Slot::Tracked(i)) = self.slot(name) {
            self.slots[i].get_or_insert_default().at(path).merge(need);
        }
    }

    fn visit(&mut self, expr: &'e IdedExpr) {
        match &expr.expr {
            Expr::Ident(name) => self.record(name, &[], Need::full()),
            Expr::Select(select) => match select_chain(expr) {
                Some((name, path)) => {
                    // `has(x.a.b)` only needs `b` to be present or not on `x.a`.
                    let need = if select.test {
                        Need::default()
                    } else {
                        Need::full()
                    };
                    self.record(name, &path, need);
                }
                None => self.visit(&select.operand),
            },
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    self.visit(target);
                }
                for arg in &call.args {
                    self.visit(arg);
                }
            }
            Expr::Comprehension(c) => {
                let depth = self.scope.len();
                let range = match (&c.iter_var2, select_chain(&c.iter_range)) {
                    (None, Some((name, path))) if !is_test(&c.iter_range) => {
                        match self.slot(name) {
                            Some(Slot::Tracked(_)) => Some((name, path)),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let element_slot = match range {
                    Some(_) => {
                        self.slots.push(None);
                        Slot::Tracked(self.slots.len() - 1)
                    }
                    None => {
                        self.visit(&c.iter_range);
                        Slot::Opaque
                    }
                };
                self.visit(&c.accu_init);
                self.scope.push((&c.iter_var, element_slot));
                if let Some(v) = &c.iter_var2 {
                    self.scope.push((v, Slot::Opaque));
                }
                self.scope.push((&c.accu_var, Slot::Opaque));
                self.visit(&c.loop_cond);
                self.visit(&c.loop_step);
                self.visit(&c.result);
                self.scope.truncate(depth);
                if let (Some((name, path)), Slot::Tracked(i)) = (range, element_slot) {
                    // An unused element still counts: the comprehension iterates every one.
                    let elements = self.slots[i].take().unwrap_or_default();
                    let need = Need {
                        elements: Some(Box::new(elements)),
                        ..Need::default()
                    };
                    self.record(name, &path, need);
                }
            }
            Expr::List(list) => {
                for e in &list.elements {
                    self.visit(e);
                }
            }
            Expr::Map(map) => self.visit_entries(&map.entries),
            Expr::Struct(s) => self.visit_entries(&s.entries),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }

    fn visit_entries(&mut self, entries: &'e [::cel::common::ast::IdedEntryExpr]) {
        for entry in entries {
            match &entry.expr {
                EntryExpr::StructField(f) => self.visit(&f.value),
                EntryExpr::MapEntry(m) => {
                    self.visit(&m.key);
                    self.visit(&m.value);
                }
            }
        }
    }
}

fn is_test(expr: &IdedExpr) -> bool {
    matches!(&expr.expr, Expr::Select(s) if s.test)
}

/// `x.a.b` (or `has(x.a.b)`) as `("x", ["a", "b"])`: field selections down to an identifier, only
/// the outermost of which may be a `has()` test.
fn select_chain(expr: &IdedExpr) -> Option<(&str, Vec<&str>)> {
    let mut path = Vec::new();
    let mut e = expr;
    loop {
        match &e.expr {
            Expr::Ident(name) => {
                path.reverse();
                return Some((name, path));
            }
            Expr::Select(s) if !s.test || std::ptr::eq(e, expr) => {
                path.push(s.field.as_str());
                e = &s.operand;
            }
            _ => return None,
        }
    }
}

/// [`to_val`] of the parts of `value` that `need` says are read; the rest is left out (or, for a
/// value only tested for presence, replaced by null).
pub fn to_val_pruned<'a>(value: &'a Value, need: &Need) -> Box<dyn Val + 'a> {
    to_val_pruned_sized(value, need, &mut 0)
}

/// [`to_val_pruned`], raising `largest` to the size of the largest collection converted.
fn to_val_pruned_sized<'a>(
    value: &'a Value,
    need: &Need,
    largest: &mut usize,
) -> Box<dyn Val + 'a> {
    if need.full {
        return to_val_sized(value, largest);
    }
    match value {
        _ if need.presence_only() => Box::new(CelNull),
        Value::Object(map) if need.elements.is_none() => {
            let fields: HashMap<_, _> = need
                .fields
                .iter()
                .filter_map(|(field, need)| {
                    let (key, value) = map.get_key_value(field.as_str())?;
                    Some((
                        CelMapKey::from(key.as_str()),
                        to_val_pruned_sized(value, need, largest),
                    ))
                })
                .collect();
            *largest = (*largest).max(fields.len());
            Box::new(CelMap::from(fields))
        }
        Value::Array(items) if need.fields.is_empty() => match &need.elements {
            Some(elements) => {
                *largest = (*largest).max(items.len());
                Box::new(CelList::from(
                    items
                        .iter()
                        .map(|item| to_val_pruned_sized(item, elements, largest))
                        .collect::<Vec<_>>(),
                ))
            }
            None => to_val_sized(value, largest),
        },
        _ => to_val_sized(value, largest),
    }
}

/// The variables of one evaluation: `object`, `oldObject` and `request` (null when absent),
/// converted to CEL values on first use and then borrowed by every expression of the review, so
/// a guard that only reads `element` never pays for converting the whole object. With
/// [`Activation::with_needs`], only what the expressions read is converted.
pub struct Activation<'a> {
    object: Lazy<'a>,
    old_object: Lazy<'a>,
    request: Lazy<'a>,
}

/// A JSON value and its CEL conversion, made on first use.
struct Lazy<'a> {
    json: Option<&'a Value>,
    /// `None`: all of it.
    need: Option<&'a Need>,
    /// The value, and the size of the largest collection in it.
    val: OnceLock<(Box<dyn Val + 'a>, usize)>,
}

impl<'a> Lazy<'a> {
    fn new(json: Option<&'a Value>, need: Option<&'a Need>) -> Self {
        Lazy {
            json,
            need,
            val: OnceLock::new(),
        }
    }

    fn converted(&self) -> &(Box<dyn Val + 'a>, usize) {
        self.val.get_or_init(|| {
            let mut largest = 0;
            let val = match (self.json, self.need) {
                (Some(v), Some(need)) => to_val_pruned_sized(v, need, &mut largest),
                (Some(v), None) => to_val_sized(v, &mut largest),
                (None, _) => Box::new(CelNull),
            };
            (val, largest)
        })
    }

    fn get(&self) -> &(dyn Val + 'a) {
        self.converted().0.as_ref()
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
            object: Lazy::new(object, None),
            old_object: Lazy::new(old_object, None),
            request: Lazy::new(Some(request), None),
        }
    }

    /// [`Activation::new`] for expressions that read no more than `needs`: converts only that.
    pub fn with_needs(
        object: Option<&'a Value>,
        old_object: Option<&'a Value>,
        request: &'a Value,
        needs: &'a Needs,
    ) -> Self {
        Activation {
            object: Lazy::new(object, needs.object.as_ref()),
            old_object: Lazy::new(old_object, needs.old_object.as_ref()),
            request: Lazy::new(Some(request), needs.request.as_ref()),
        }
    }

    /// These variables plus `element`, for a `forEach` guard.
    pub fn with_element<'b>(&'b self, element: &'b Value) -> ElementActivation<'b, 'a> {
        self.with_element_need(element, None)
    }

    /// [`Activation::with_element`] for a guard that reads no more than `need` of `element`
    /// (all of it when `None`).
    pub fn with_element_need<'b>(
        &'b self,
        element: &'b Value,
        need: Option<&Need>,
    ) -> ElementActivation<'b, 'a> {
        let mut largest = 0;
        let element = match need {
            Some(need) => to_val_pruned_sized(element, need, &mut largest),
            None => to_val_sized(element, &mut largest),
        };
        ElementActivation {
            base: self,
            element,
            largest,
        }
    }
}

/// The variables of an evaluation, and how large their collections are.
pub trait Bindings: VariableResolver {
    /// The size of the largest array or object among the `variables` named (as converted,
    /// converting them if that has not happened yet).
    fn largest_collection(&self, variables: &BTreeSet<&str>) -> usize;
}

impl Bindings for Activation<'_> {
    fn largest_collection(&self, variables: &BTreeSet<&str>) -> usize {
        [
            ("object", &self.object),
            ("oldObject", &self.old_object),
            ("request", &self.request),
        ]
        .into_iter()
        .filter(|(name, _)| variables.contains(name))
        .map(|(_, lazy)| lazy.converted().1)
        .max()
        .unwrap_or(0)
    }
}

impl Bindings for ElementActivation<'_, '_> {
    fn largest_collection(&self, variables: &BTreeSet<&str>) -> usize {
        let element = if variables.contains("element") {
            self.largest
        } else {
            0
        };
        element.max(self.base.largest_collection(variables))
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
    largest: usize,
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

/// Runs `program` and insists on a bool. A program whose cost depends on the request's
/// collections is first estimated with their actual sizes, and not run past the budget.
pub fn eval_bool(program: &Program, vars: &dyn Bindings) -> Result<bool, CelError> {
    if super::cost::depends_on_input(program) {
        let mut free = BTreeSet::new();
        free_identifiers(program.expression(), &mut Vec::new(), &mut free);
        let largest = vars.largest_collection(&free) as u64;
        if let Some(reason) = super::cost::over_budget(program, largest) {
            return Err(CelError::OverBudget(reason));
        }
    }
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
    fn pruned_conversion_evaluates_like_the_whole_value() {
        let objects = [
            json!({"spec": {"containers": [
                {"name": "a", "image": "x:1", "resources": {"limits": {"cpu": 1}}, "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "registry.internal/y", "resources": null},
                "not-an-object",
                {"name": "c", "securityContext": {"runAsNonRoot": true}}
            ]}, "metadata": {"labels": {"tier": "web"}, "name": "n"}}),
            json!({"spec": {"containers": {"a": {"image": "x"}}}, "metadata": "s"}),
            json!({"spec": "nope"}),
            json!({"spec": {"containers": []}}),
            json!([1, 2]),
            json!(null),
        ];
        let sources = [
            "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))",
            "object.spec.containers.all(c, c.image.contains(':'))",
            "object.spec.containers.exists(c, !has(c.ports) || c.ports.all(p, p.containerPort > 1024))",
            "object.spec.containers.exists_one(c, true)",
            "object.spec.containers.filter(c, has(c.name)).size() == 2",
            "object.spec.containers.map(c, c.name).size() > 0",
            "size(object.spec.containers) == 4",
            "object.spec.containers.all(i, c, true)",
            "object.metadata.labels.tier in ['web', 'worker']",
            "has(object.metadata.name) && object.metadata.labels.all(k, k == 'tier')",
            "object.metadata == {'labels': {'tier': 'web'}, 'name': 'n'}",
            "[object.spec].all(s, has(s.containers))",
            "object.spec.containers.all(object, has(object.name))",
            ".object.metadata.name == 'n'",
            "object.?spec.hasValue()",
            "object['spec'].containers.size() == 4",
            "type(object.spec) == map",
            "object.spec.containers[0].image == 'x:1'",
            "element.image.startsWith('registry.internal/')",
            "!has(element.securityContext.runAsNonRoot)",
            "element.resources.limits.cpu == 1",
            "has(element.resources)",
            "object.spec",
        ];
        let request = json!({"namespace": "shop"});
        for source in sources {
            let program = compile(source).unwrap();
            let needs = Needs::of(&program);
            for object in &objects {
                let full = Activation::new(Some(object), None, &request);
                let pruned = Activation::with_needs(Some(object), None, &request, &needs);
                assert_eq!(
                    eval_bool(&program, &pruned),
                    eval_bool(&program, &full),
                    "{source} on {object}"
                );
                for element in object
                    .pointer("/spec/containers")
                    .into_iter()
                    .flat_map(|c| c.as_array().into_iter().flatten())
                {
                    assert_eq!(
                        eval_bool(
                            &program,
                            &pruned.with_element_need(element, needs.element())
                        ),
                        eval_bool(&program, &full.with_element(element)),
                        "{source} on element {element}"
                    );
                }
            }
        }
    }

    #[test]
    fn needs_keep_only_what_is_read() {
        let needs = |src: &str| Needs::of(&compile(src).unwrap());
        let n = needs("object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))");
        let object = json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "a", "resources": {"limits": {"cpu": 1}, "requests": {}}}, {"name": "b"}]}});
        let pruned = to_val_pruned(&object, n.object.as_ref().unwrap());
        let expected = json!({"spec": {"containers": [{"resources": {"limits": null}}, {}]}});
        assert!(pruned.equals(to_val(&expected).as_ref()), "{pruned:?}");
        assert!(!n.reads_request() && n.element().is_none());
        let n = needs("!element.image.startsWith('registry.internal/')");
        assert!(n.object.is_none());
        let element = json!({"name": "a", "image": "x", "env": [{"name": "A"}]});
        let pruned = to_val_pruned(&element, n.element().unwrap());
        assert!(pruned.equals(to_val(&json!({"image": "x"})).as_ref()));
        assert_eq!(
            needs("object.spec == {}").object,
            Some(Need {
                fields: [("spec".to_string(), Need::full())].into(),
                ..Need::default()
            })
        );
        assert_eq!(needs("size(object) > 0").object, Some(Need::full()));
        assert_eq!(needs(".object.x == 1").object, Some(Need::full()));
        assert!(needs("request.namespace == 'a'").reads_request());
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
