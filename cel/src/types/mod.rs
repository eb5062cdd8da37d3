//! A type checker for what the API server's checker refuses when a policy is written and the
//! `cel` crate, which has none, would only fail at run time: a call no overload accepts
//! (`['a'].sum()`, `isSemver([1])`, `'a' && true`, a filter that is not a bool) and a list or map
//! literal mixing types (`[1, 'a']`: Kubernetes compiles with homogeneous aggregate literals).
//!
//! It infers what the syntax tells: literals, the results of the functions in
//! [`SIGNATURES`](signatures::SIGNATURES), comprehension variables from their ranges. Everything
//! else — the request's variables, fields read from them, functions not in the table — is `dyn`,
//! which agrees with every type, so a call is refused only when its argument types are known and
//! no overload of the function takes them.
//! The table holds every function of Kubernetes' environment with all its overloads, so no
//! expression the API server accepts is refused here.
use std::collections::HashMap;
use std::sync::LazyLock;

use ::cel::Program;
use ::cel::common::ast::{
    CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, LiteralValue, MapExpr,
    SelectExpr, StructExpr, operators,
};

use super::comprehensions::ENTRIES;
use super::extensions::written_as;
use overloads::{OVERLOADS, Overload};

mod overloads;
mod request;
mod signatures;
mod ty;

use ty::Ty;

/// The types of `program` that the API server's checker refuses, each with the reason; every
/// Policy expression is a condition, so one known to be of another type than `bool` is one.
pub fn type_errors(program: &Program) -> Vec<String> {
    let (result, mut errors) = infer(program);
    if !result.agrees(&Ty::Bool) {
        errors.push(format!("must evaluate to bool but got {result}"));
    }
    errors
}

/// The types of `program` the API server's checker refuses, for an expression whose value is
/// written somewhere (a computed field) rather than tested: any type but a function's.
pub fn value_type_errors(program: &Program) -> Vec<String> {
    infer(program).1
}

fn infer(program: &Program) -> (Ty, Vec<String>) {
    let mut checker = Checker {
        overloads: LazyLock::force(&OVERLOADS),
        scope: Vec::new(),
        in_format: 0,
        errors: Vec::new(),
    };
    let result = checker.infer(program.expression());
    (result, checker.errors)
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
            Expr::Literal(literal) => literal_type(literal),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(select) => self.select(select),
            Expr::List(list) => self.list(list),
            Expr::Map(map) => self.map(map),
            Expr::Struct(s) => self.struct_value(s),
            Expr::Call(call) => self.call_expr(call),
            Expr::Comprehension(c) => self.comprehension(c),
            Expr::Unspecified => Ty::Dyn,
        }
    }

    /// `x.f`, or `has(x.f)` when `select.test`.
    fn select(&mut self, select: &SelectExpr) -> Ty {
        let operand = self.infer(&select.operand);
        match (select.test, operand) {
            (false, Ty::Optional(held)) if !held.is_scalar() => {
                Ty::Optional(Box::new(field_of(*held)))
            }
            (_, Ty::Optional(held)) if held.is_scalar() => self.no_field_selection(&held),
            (false, Ty::DeclaredDyn) => Ty::DeclaredDyn,
            (_, Ty::Map(_, value)) if !select.test => *value,
            (test, Ty::Opaque(name)) if request::fields(&name).is_some() => {
                self.declared_field(&name, &select.field, test)
            }
            (_, scalar) if scalar.is_scalar() => self.no_field_selection(&scalar),
            (true, _) => Ty::Bool,
            _ => Ty::Dyn,
        }
    }

    /// The field `field` of the object type `type_name`, or whether it is set when `test`.
    fn declared_field(&mut self, type_name: &str, field: &str, test: bool) -> Ty {
        let declared = request::fields(type_name)
            .and_then(|fields| fields.iter().find(|(f, _)| *f == field))
            .and_then(|(_, ty)| overloads::declared_type(ty));
        match declared {
            None => {
                self.errors.push(format!("undefined field '{field}'"));
                Ty::Dyn
            }
            Some(_) if test => Ty::Bool,
            Some(ty) => ty,
        }
    }

    /// Reports selecting a field of the scalar type `ty`.
    fn no_field_selection(&mut self, ty: &Ty) -> Ty {
        self.errors
            .push(format!("type '{ty}' does not support field selection"));
        Ty::Dyn
    }

    fn list(&mut self, list: &ListExpr) -> Ty {
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

    fn map(&mut self, map: &MapExpr) -> Ty {
        let mut keys = Vec::new();
        let mut values = Vec::new();
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

    /// A message literal: its fields are checked, its type is not known.
    fn struct_value(&mut self, s: &StructExpr) -> Ty {
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

    fn call_expr(&mut self, call: &CallExpr) -> Ty {
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

    fn comprehension(&mut self, c: &ComprehensionExpr) -> Ty {
        let element = match self.infer(&c.iter_range) {
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

    /// A call's target: `None` when it is a function namespace (`optional.of`), not a value.
    fn infer_target(&mut self, target: &IdedExpr) -> Option<Ty> {
        if let Expr::Ident(name) = &target.expr
            && super::ast::FUNCTION_NAMESPACES.contains(&name.as_str())
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
            return entries_of(args.first());
        }
        if name == operators::OPT_SELECT {
            return self.optional_field(args.first());
        }
        if name == "dyn" && receiver.is_none() && args.len() == 1 {
            return Ty::DeclaredDyn;
        }
        if name == operators::INDEX && args.first() == Some(&Ty::DeclaredDyn) {
            return Ty::DeclaredDyn;
        }
        self.overload_result(name, receiver.as_ref(), &args)
    }

    /// `x.?f`: an optional of what `x.f` would be.
    fn optional_field(&mut self, operand: Option<&Ty>) -> Ty {
        match operand {
            Some(Ty::Dyn) | None => Ty::Dyn,
            Some(Ty::Optional(held)) => Ty::Optional(Box::new(field_of((**held).clone()))),
            Some(scalar) if scalar.is_scalar() => self.no_field_selection(scalar),
            Some(operand) => Ty::Optional(Box::new(field_of(operand.clone()))),
        }
    }

    /// The result of the overloads of `name` that accept the arguments; none is reported.
    fn overload_result(&mut self, name: &str, receiver: Option<&Ty>, args: &[Ty]) -> Ty {
        let Some(results) = self
            .overloads
            .get(name)
            .and_then(|overloads| overloads::results(overloads, receiver, args))
        else {
            return Ty::Dyn;
        };
        match results.as_slice() {
            [] => {
                let shown: Vec<String> = args.iter().map(Ty::to_string).collect();
                let applied = match receiver {
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

/// The type of a literal.
fn literal_type(literal: &LiteralValue) -> Ty {
    match literal {
        LiteralValue::Boolean(_) => Ty::Bool,
        LiteralValue::Bytes(_) => Ty::Bytes,
        LiteralValue::Double(_) => Ty::Double,
        LiteralValue::Int(_) => Ty::Int,
        LiteralValue::String(_) => Ty::String,
        LiteralValue::UInt(_) => Ty::Uint,
        LiteralValue::Null => Ty::Null,
    }
}

/// What `@entries(r)` yields for an `r` of type `range`: its `[index or key, value]` pairs.
fn entries_of(range: Option<&Ty>) -> Ty {
    let pair = match range {
        Some(Ty::List(e)) => Ty::Pair(Box::new(Ty::Int), e.clone()),
        Some(Ty::Map(k, v)) => Ty::Pair(k.clone(), v.clone()),
        Some(Ty::DeclaredDyn) => Ty::Pair(Box::new(Ty::DeclaredDyn), Box::new(Ty::DeclaredDyn)),
        _ => Ty::Pair(Box::new(Ty::Dyn), Box::new(Ty::Dyn)),
    };
    Ty::List(Box::new(pair))
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
