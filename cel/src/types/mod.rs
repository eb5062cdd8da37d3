//! A type checker for what the API server's checker refuses when a policy is written and the
//! `cel` crate, which has none, would only fail at run time: a call no overload accepts
//! (`['a'].sum()`, `isSemver([1])`, `'a' && true`, a filter that is not a bool) and a list or map
//! literal mixing types (`[1, 'a']`: Kubernetes compiles with homogeneous aggregate literals).
//!
//! It infers what the syntax tells: literals, the results of the functions in [`SIGNATURES`],
//! comprehension variables from their ranges. Everything else — the request's variables, fields
//! read from them, functions not in the table — is `dyn`, which agrees with every type, so a call
//! is refused only when its argument types are known and no overload of the function takes them.
//! The table holds every function of Kubernetes' environment with all its overloads, so no
//! expression the API server accepts is refused here.
use std::collections::{HashMap, HashSet};
use std::sync::LazyLock;

use ::cel::Program;
use ::cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use super::comprehensions::ENTRIES;
use super::extensions::written_as;
use signatures::SIGNATURES;

mod request;
mod signatures;
mod ty;

use ty::Ty;

/// A parameter or result of a signature.
#[derive(Clone, Debug, PartialEq)]
enum Pattern {
    Exactly(Ty),
    /// A type parameter, bound by its first use.
    Param(char),
    List(Box<Pattern>),
    Map(Box<Pattern>, Box<Pattern>),
    Optional(Box<Pattern>),
}

#[derive(Debug)]
struct Overload {
    receiver: Option<Pattern>,
    args: Vec<Pattern>,
    result: Pattern,
}

/// The types of `program` that the API server's checker refuses, each with the reason; every
/// Policy expression is a condition, so one known to be of another type than `bool` is one.
pub fn type_errors(program: &Program) -> Vec<String> {
    let mut checker = Checker {
        overloads: LazyLock::force(&OVERLOADS),
        scope: Vec::new(),
        in_format: 0,
        errors: Vec::new(),
    };
    let result = checker.infer(program.expression());
    if !result.agrees(&Ty::Bool) {
        checker
            .errors
            .push(format!("must evaluate to bool but got {result}"));
    }
    checker.errors
}

/// The overloads of [`SIGNATURES`], parsed once: the table is a constant.
static OVERLOADS: LazyLock<HashMap<String, Vec<Overload>>> = LazyLock::new(overloads);

fn overloads() -> HashMap<String, Vec<Overload>> {
    let mut table: HashMap<String, Vec<Overload>> = HashMap::new();
    for signature in SIGNATURES {
        if let Some((name, overload)) = parse_signature(signature) {
            table.entry(name).or_default().push(overload);
        }
    }
    table
}

fn parse_signature(signature: &str) -> Option<(String, Overload)> {
    let (receiver, rest) = match signature.strip_prefix('[') {
        Some(rest) => {
            let (receiver, rest) = rest.split_once("] ")?;
            (Some(parse_pattern(receiver)?), rest)
        }
        None => (None, signature),
    };
    let open = rest.find('(')?;
    let close = rest.rfind(") ")?;
    let name = rest[..open].to_string();
    let args = split_top(&rest[open + 1..close])
        .into_iter()
        .filter(|a| !a.is_empty())
        .map(parse_pattern)
        .collect::<Option<Vec<_>>>()?;
    let result = parse_pattern(&rest[close + 2..])?;
    Some((
        name,
        Overload {
            receiver,
            args,
            result,
        },
    ))
}

fn parse_pattern(text: &str) -> Option<Pattern> {
    let text = text.trim();
    if let Some((kind, inner)) = text.split_once('(') {
        let params: Vec<Pattern> = split_top(inner.strip_suffix(')')?)
            .into_iter()
            .map(parse_pattern)
            .collect::<Option<_>>()?;
        return match (kind, params.as_slice()) {
            ("list", [e]) => Some(Pattern::List(Box::new(e.clone()))),
            ("optional_type", [e]) => Some(Pattern::Optional(Box::new(e.clone()))),
            ("map", [k, v]) => Some(Pattern::Map(Box::new(k.clone()), Box::new(v.clone()))),
            _ => None,
        };
    }
    Some(match text {
        "A" | "B" | "C" => Pattern::Param(text.chars().next()?),
        "dyn" => Pattern::Exactly(Ty::Dyn),
        "bool" => Pattern::Exactly(Ty::Bool),
        "int" => Pattern::Exactly(Ty::Int),
        "uint" => Pattern::Exactly(Ty::Uint),
        "double" => Pattern::Exactly(Ty::Double),
        "string" => Pattern::Exactly(Ty::String),
        "bytes" => Pattern::Exactly(Ty::Bytes),
        "type" => Pattern::Exactly(Ty::Type),
        "google.protobuf.Duration" => Pattern::Exactly(Ty::Duration),
        "google.protobuf.Timestamp" => Pattern::Exactly(Ty::Timestamp),
        other => Pattern::Exactly(Ty::Opaque(other.to_string())),
    })
}

/// `int, list(map(int, dyn))` → `["int", "list(map(int, dyn))"]`.
fn split_top(params: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in params.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
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

/// Type parameters bound while matching one overload.
#[derive(Default)]
struct Bindings {
    params: HashMap<char, Ty>,
    /// Parameters bound by a value of unknown type.
    unknown: HashSet<char>,
}

fn matches(pattern: &Pattern, ty: &Ty, bound: &mut Bindings) -> bool {
    match (pattern, ty) {
        // A parameter inside a pattern that a value of unknown type matched stays unknown:
        // `x.orValue(1)` on such an `x` is no more an `int` than `x` is an `optional(int)`.
        (Pattern::Param(name), _) if bound.unknown.contains(name) => true,
        // First, so that a declared `dyn` binds its parameter (and makes it `dyn`).
        (Pattern::Param(name), t) => match bound.params.get(name) {
            Some(previous) if !previous.agrees(t) => false,
            Some(previous) => {
                let narrower = previous.clone().narrower(t.clone());
                bound.params.insert(*name, narrower);
                true
            }
            None => {
                bound.params.insert(*name, t.clone());
                true
            }
        },
        (_, Ty::Dyn) => {
            for name in pattern.params() {
                bound.unknown.insert(name);
                bound.params.insert(name, Ty::Dyn);
            }
            true
        }
        (_, Ty::DeclaredDyn) => {
            // What the parameters inside the pattern stand for is `dyn` too.
            for name in pattern.params() {
                matches(&Pattern::Param(name), ty, bound);
            }
            true
        }
        (Pattern::Exactly(Ty::Dyn), _) => true,
        (Pattern::Exactly(Ty::List(e)), Ty::Pair(..)) => **e == Ty::Dyn,
        (Pattern::Exactly(p), t) => p.agrees(t),
        (Pattern::List(e), Ty::List(t)) => matches(e, t, bound),
        (Pattern::List(e), Ty::Pair(..)) => matches(e, &Ty::Dyn, bound),
        (Pattern::Optional(e), Ty::Optional(t)) => matches(e, t, bound),
        (Pattern::Map(k, v), Ty::Map(tk, tv)) => matches(k, tk, bound) && matches(v, tv, bound),
        _ => false,
    }
}

impl Pattern {
    /// The type parameters in the pattern.
    fn params(&self) -> Vec<char> {
        match self {
            Pattern::Exactly(_) => Vec::new(),
            Pattern::Param(name) => vec![*name],
            Pattern::List(e) | Pattern::Optional(e) => e.params(),
            Pattern::Map(k, v) => [k.params(), v.params()].concat(),
        }
    }
}

fn result_of(pattern: &Pattern, bound: &Bindings) -> Ty {
    match pattern {
        Pattern::Exactly(t) => t.clone(),
        Pattern::Param(name) => bound.params.get(name).cloned().unwrap_or(Ty::Dyn),
        Pattern::List(e) => Ty::List(Box::new(result_of(e, bound))),
        Pattern::Map(k, v) => Ty::Map(Box::new(result_of(k, bound)), Box::new(result_of(v, bound))),
        Pattern::Optional(e) => Ty::Optional(Box::new(result_of(e, bound))),
    }
}

struct Checker {
    overloads: &'static HashMap<String, Vec<Overload>>,
    /// Comprehension variables in scope, innermost last.
    scope: Vec<(String, Ty)>,
    /// How many `format` calls enclose the expression being inferred: cel-go's strings library
    /// exempts their literals (`'%d %s'.format([1, 'a'])`) from the homogeneous-literal rule.
    in_format: usize,
    errors: Vec<String>,
}

impl Checker {
    fn infer(&mut self, expr: &IdedExpr) -> Ty {
        match &expr.expr {
            Expr::Literal(literal) => match literal {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
                LiteralValue::Null => Ty::Null,
            },
            Expr::Ident(name) => self.ident(name),
            Expr::Select(select) => {
                let operand = self.infer(&select.operand);
                match (select.test, operand) {
                    (false, Ty::Optional(held)) if !held.is_scalar() => {
                        Ty::Optional(Box::new(field_of(*held)))
                    }
                    (_, Ty::Optional(held)) if held.is_scalar() => {
                        self.errors
                            .push(format!("type '{held}' does not support field selection"));
                        Ty::Dyn
                    }
                    (false, Ty::DeclaredDyn) => Ty::DeclaredDyn,
                    (_, Ty::Map(_, value)) if !select.test => *value,
                    (test, Ty::Opaque(name)) if request::fields(&name).is_some() => {
                        let field = request::fields(&name)
                            .and_then(|fields| fields.iter().find(|(f, _)| *f == select.field))
                            .and_then(|(_, ty)| parse_pattern(ty));
                        match field {
                            None => {
                                self.errors
                                    .push(format!("undefined field '{}'", select.field));
                                Ty::Dyn
                            }
                            Some(_) if test => Ty::Bool,
                            Some(pattern) => result_of(&pattern, &Bindings::default()),
                        }
                    }
                    (_, scalar) if scalar.is_scalar() => {
                        self.errors
                            .push(format!("type '{scalar}' does not support field selection"));
                        Ty::Dyn
                    }
                    (true, _) => Ty::Bool,
                    _ => Ty::Dyn,
                }
            }
            Expr::List(list) => {
                let types: Vec<Ty> = list
                    .elements
                    .iter()
                    .enumerate()
                    .map(|(i, e)| {
                        let ty = self.infer(e);
                        // An optional element `?x` adds the value it may hold.
                        if list.optional_indices.contains(&i) {
                            unwrap_optional(ty)
                        } else {
                            ty
                        }
                    })
                    .collect();
                Ty::List(Box::new(self.common(types, "list")))
            }
            Expr::Map(map) => {
                let (mut keys, mut values) = (Vec::new(), Vec::new());
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) => {
                            keys.push(self.infer(&m.key));
                            let value = self.infer(&m.value);
                            // An optional entry `?k: v` adds the value `v` may hold.
                            values.push(if m.optional {
                                unwrap_optional(value)
                            } else {
                                value
                            });
                        }
                        EntryExpr::StructField(f) => {
                            self.infer(&f.value);
                        }
                    }
                }
                let key = self.common(keys, "map key");
                let value = self.common(values, "map value");
                Ty::Map(Box::new(key), Box::new(value))
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    match &entry.expr {
                        EntryExpr::StructField(f) => self.infer(&f.value),
                        EntryExpr::MapEntry(m) => {
                            self.infer(&m.key);
                            self.infer(&m.value)
                        }
                    };
                }
                Ty::Dyn
            }
            Expr::Call(call) => {
                let format = call.func_name == "format";
                self.in_format += usize::from(format);
                let receiver = call.target.as_deref().map(|t| self.infer_target(t));
                let args: Vec<Ty> = call.args.iter().map(|a| self.infer(a)).collect();
                self.in_format -= usize::from(format);
                let name = match (call.target.as_deref(), &receiver) {
                    (
                        Some(IdedExpr {
                            expr: Expr::Ident(ns),
                            ..
                        }),
                        Some(None),
                    ) => {
                        format!("{ns}.{}", call.func_name)
                    }
                    _ => call.func_name.clone(),
                };
                if let (Some(Ty::Pair(first, second)), Some(at)) = (args.first(), call.args.get(1))
                    && call.func_name == operators::INDEX
                {
                    // Only the expansion of a two-variable comprehension indexes a pair, with 0
                    // (the index or key) or 1 (the value).
                    return match at.expr {
                        Expr::Literal(LiteralValue::Int(i)) if *i.inner() == 0 => *first.clone(),
                        Expr::Literal(LiteralValue::Int(_)) => *second.clone(),
                        _ => Ty::Dyn,
                    };
                }
                self.call(&name, receiver.flatten(), args)
            }
            Expr::Comprehension(c) => {
                let range = self.infer(&c.iter_range);
                let element = match range {
                    Ty::List(e) => *e,
                    Ty::Map(k, _) => *k,
                    Ty::DeclaredDyn => Ty::DeclaredDyn,
                    _ => Ty::Dyn,
                };
                let init = match self.infer(&c.accu_init) {
                    // An empty literal's element type is open, as a type parameter is.
                    Ty::List(e) if *e == Ty::Dyn => Ty::List(Box::new(Ty::Dyn)),
                    other => other,
                };
                self.scope.push((c.accu_var.clone(), init.clone()));
                self.scope.push((c.iter_var.clone(), element));
                self.infer(&c.loop_cond);
                let step = self.infer(&c.loop_step);
                self.scope.pop();
                // The accumulator is what the step makes of it: `[1].map(x, 'a')` is a
                // `list(string)`, though it starts as an empty list.
                if init.agrees(&step)
                    && let Some(accumulator) = self.scope.last_mut()
                {
                    accumulator.1 = init.narrower(step);
                }
                let result = self.infer(&c.result);
                self.scope.pop();
                result
            }
            Expr::Unspecified => Ty::Dyn,
        }
    }

    /// A call's target: `None` when it is a function namespace (`optional.of`), not a value.
    fn infer_target(&mut self, target: &IdedExpr) -> Option<Ty> {
        if let Expr::Ident(name) = &target.expr
            && super::scope::FUNCTION_NAMESPACES.contains(&name.as_str())
            && !self.scope.iter().any(|(bound, _)| bound == name)
        {
            return None;
        }
        Some(self.infer(target))
    }

    fn ident(&self, name: &str) -> Ty {
        if let Some((_, ty)) = self.scope.iter().rev().find(|(bound, _)| bound == name) {
            return ty.clone();
        }
        match name {
            "int" | "uint" | "double" | "bool" | "string" | "bytes" | "list" | "map"
            | "null_type" | "type" => Ty::Type,
            // Kubernetes declares the objects `dyn`, `request` an object type of its own.
            "object" | "oldObject" => Ty::DeclaredDyn,
            "request" => Ty::Opaque(request::REQUEST.to_string()),
            "authorizer" => Ty::Opaque("kubernetes.authorization.Authorizer".to_string()),
            _ => Ty::Dyn,
        }
    }

    fn call(&mut self, name: &str, receiver: Option<Ty>, mut args: Vec<Ty>) -> Ty {
        if let Some(global) = super::time::written_as(name) {
            return self.call(global, receiver, args);
        }
        if let Some(member) = written_as(name).or_else(|| super::regex::written_as(name))
            && receiver.is_none()
            && !args.is_empty()
        {
            // An expansion is checked as the member call it was written as.
            let target = args.remove(0);
            return self.call(member, Some(target), args);
        }
        if name == ENTRIES {
            let pair = match args.first() {
                Some(Ty::List(e)) => Ty::Pair(Box::new(Ty::Int), e.clone()),
                Some(Ty::Map(k, v)) => Ty::Pair(k.clone(), v.clone()),
                Some(Ty::DeclaredDyn) => {
                    Ty::Pair(Box::new(Ty::DeclaredDyn), Box::new(Ty::DeclaredDyn))
                }
                _ => Ty::Pair(Box::new(Ty::Dyn), Box::new(Ty::Dyn)),
            };
            return Ty::List(Box::new(pair));
        }
        if name == operators::OPT_SELECT {
            // `x.?f`: an optional of what `x.f` would be.
            return match args.first() {
                Some(Ty::Dyn) | None => Ty::Dyn,
                Some(Ty::Optional(held)) => Ty::Optional(Box::new(field_of((**held).clone()))),
                Some(scalar) if scalar.is_scalar() => {
                    self.errors
                        .push(format!("type '{scalar}' does not support field selection"));
                    Ty::Dyn
                }
                Some(operand) => Ty::Optional(Box::new(field_of(operand.clone()))),
            };
        }
        if name == "dyn" && receiver.is_none() && args.len() == 1 {
            return Ty::DeclaredDyn;
        }
        if name == operators::INDEX && args.first() == Some(&Ty::DeclaredDyn) {
            return Ty::DeclaredDyn;
        }
        let Some(overloads) = self.overloads.get(name) else {
            return Ty::Dyn;
        };
        let candidates: Vec<&Overload> = overloads
            .iter()
            .filter(|o| o.receiver.is_some() == receiver.is_some() && o.args.len() == args.len())
            .collect();
        if candidates.is_empty() {
            return Ty::Dyn;
        }
        let mut results = Vec::new();
        for overload in candidates {
            let mut bound = Bindings::default();
            let receiver_fits = match (&overload.receiver, &receiver) {
                (Some(p), Some(t)) => matches(p, t, &mut bound),
                _ => true,
            };
            if receiver_fits
                && overload
                    .args
                    .iter()
                    .zip(&args)
                    .all(|(p, t)| matches(p, t, &mut bound))
            {
                results.push(result_of(&overload.result, &bound));
            }
        }
        match results.as_slice() {
            [] => {
                let shown: Vec<String> = args.iter().map(Ty::to_string).collect();
                let applied = match &receiver {
                    Some(r) => format!("{r}.({})", shown.join(", ")),
                    None => format!("({})", shown.join(", ")),
                };
                self.errors.push(format!(
                    "found no matching overload for '{name}' applied to '{applied}'"
                ));
                Ty::Dyn
            }
            [only] => only.clone(),
            [first, rest @ ..] if rest.iter().all(|r| r == first) => first.clone(),
            _ => Ty::Dyn,
        }
    }

    /// The one type of a literal's `types`; the first disagreement is reported.
    fn common(&mut self, types: Vec<Ty>, what: &str) -> Ty {
        let mut first: Option<Ty> = None;
        for t in types.into_iter().filter(|t| *t != Ty::Dyn) {
            match first.take() {
                None => first = Some(t),
                Some(_) if self.in_format > 0 => return Ty::Dyn,
                Some(f) if !f.agrees(&t) || !f.same_in_literal(&t) => {
                    self.errors
                        .push(format!("a {what} literal mixes {f} and {t}"));
                    return Ty::Dyn;
                }
                Some(f) => first = Some(f.narrower(t)),
            }
        }
        first.unwrap_or(Ty::Dyn)
    }
}

/// The type of a field read from a value of type `ty` that supports field selection.
fn field_of(ty: Ty) -> Ty {
    match ty {
        Ty::Map(_, value) => *value,
        Ty::DeclaredDyn => Ty::DeclaredDyn,
        _ => Ty::Dyn,
    }
}

/// The type an optional of `ty` holds (`dyn` when not known to be an optional).
fn unwrap_optional(ty: Ty) -> Ty {
    match ty {
        Ty::Optional(inner) => *inner,
        _ => Ty::Dyn,
    }
}

#[cfg(test)]
mod tests;
