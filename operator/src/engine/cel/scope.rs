//! The one walk over an expression's AST that resolves identifiers against comprehension
//! scopes. What the walk finds is reported to a [`Visitor`]: the free-identifier check
//! ([`super::check`]) and the needs analysis ([`super::needs`]) are two visitors of it, so
//! comprehension scoping is implemented here only.
use ::cel::common::ast::{EntryExpr, Expr, IdedEntryExpr, IdedExpr};

/// Function namespaces of the extensions in the environment: `strings.quote(s)` parses as a call
/// on the identifier `strings`, which is not a variable.
pub(super) const FUNCTION_NAMESPACES: &[&str] = &[
    "strings", "lists", "math", "base64", "optional", "sets", "ip", "format",
];

/// What an identifier refers to where it is used.
pub(super) enum Root<'s, 'e, B> {
    /// Not bound by any enclosing comprehension: a variable of the activation.
    Free(&'e str),
    /// A comprehension variable, with what the visitor bound it to (`None`: nothing, as for
    /// accumulators, the second variable of two-variable comprehensions, and ranges the visitor
    /// did not take).
    Bound(Option<&'s B>),
    /// A leading-dot name (`.object`), which skips the comprehension scopes; with the dot.
    Absolute(&'e str),
}

/// What a [`walk`] reports to.
pub(super) trait Visitor<'e> {
    /// What this visitor binds the variable of a comprehension it takes ([`Visitor::enter_range`]).
    type Binding: Copy;

    /// `root` is read, through the field selections `path`; `whole` is false when the last
    /// selection is only tested with `has()`, so its value is never read.
    fn read(&mut self, root: Root<'_, 'e, Self::Binding>, path: &[&'e str], whole: bool);

    /// A one-variable comprehension iterates the field selections `path` of `root`. A visitor
    /// that returns a binding takes the range: the walk reports it with [`Visitor::leave_range`]
    /// after the body rather than as a [`Visitor::read`], and the variable is bound to it.
    fn enter_range(
        &mut self,
        root: Root<'_, 'e, Self::Binding>,
        path: &[&'e str],
    ) -> Option<Self::Binding>;

    /// The comprehension whose range [`Visitor::enter_range`] took is over.
    fn leave_range(
        &mut self,
        root: Root<'_, 'e, Self::Binding>,
        path: &[&'e str],
        binding: Self::Binding,
    );
}

/// Walks `expr`, reporting to `visitor` every use of an identifier.
pub(super) fn walk<'e, V: Visitor<'e>>(expr: &'e IdedExpr, visitor: &mut V) {
    Walk {
        visitor,
        scope: Vec::new(),
    }
    .expr(expr);
}

struct Walk<'v, 'e, V: Visitor<'e>> {
    visitor: &'v mut V,
    /// Comprehension variables, innermost last.
    scope: Vec<(&'e str, Option<V::Binding>)>,
}

/// What `name` refers to in `scope`, innermost binding first, as the interpreter resolves it.
fn resolve<'s, 'e, B>(scope: &'s [(&'e str, Option<B>)], name: &'e str) -> Root<'s, 'e, B> {
    if name.starts_with('.') {
        return Root::Absolute(name);
    }
    match scope.iter().rev().find(|(n, _)| *n == name) {
        Some((_, binding)) => Root::Bound(binding.as_ref()),
        None => Root::Free(name),
    }
}

impl<'e, V: Visitor<'e>> Walk<'_, 'e, V> {
    fn expr(&mut self, expr: &'e IdedExpr) {
        match &expr.expr {
            Expr::Ident(name) => self.visitor.read(resolve(&self.scope, name), &[], true),
            Expr::Select(select) => match select_chain(expr) {
                // `has(x.a.b)` only needs `b` to be present or not on `x.a`.
                Some((name, path)) => {
                    self.visitor
                        .read(resolve(&self.scope, name), &path, !select.test)
                }
                None => self.expr(&select.operand),
            },
            Expr::Call(call) => {
                if let Some(target) = &call.target {
                    let namespace = matches!(&target.expr, Expr::Ident(n)
                        if FUNCTION_NAMESPACES.contains(&n.as_str())
                            && matches!(resolve(&self.scope, n), Root::Free(_)));
                    if !namespace {
                        self.expr(target);
                    }
                }
                for arg in &call.args {
                    self.expr(arg);
                }
            }
            Expr::Comprehension(c) => {
                let range = match (&c.iter_var2, select_chain(&c.iter_range)) {
                    (None, Some((name, path))) if !is_test(&c.iter_range) => self
                        .visitor
                        .enter_range(resolve(&self.scope, name), &path)
                        .map(|binding| (name, path, binding)),
                    _ => None,
                };
                if range.is_none() {
                    self.expr(&c.iter_range);
                }
                self.expr(&c.accu_init);
                let depth = self.scope.len();
                self.scope
                    .push((&c.iter_var, range.as_ref().map(|(_, _, b)| *b)));
                if let Some(v) = &c.iter_var2 {
                    self.scope.push((v, None));
                }
                self.scope.push((&c.accu_var, None));
                self.expr(&c.loop_cond);
                self.expr(&c.loop_step);
                self.expr(&c.result);
                self.scope.truncate(depth);
                if let Some((name, path, binding)) = range {
                    self.visitor
                        .leave_range(resolve(&self.scope, name), &path, binding);
                }
            }
            Expr::List(list) => {
                for e in &list.elements {
                    self.expr(e);
                }
            }
            Expr::Map(map) => self.entries(&map.entries),
            Expr::Struct(s) => self.entries(&s.entries),
            Expr::Literal(_) | Expr::Unspecified => {}
        }
    }

    fn entries(&mut self, entries: &'e [IdedEntryExpr]) {
        for entry in entries {
            match &entry.expr {
                EntryExpr::StructField(f) => self.expr(&f.value),
                EntryExpr::MapEntry(m) => {
                    self.expr(&m.key);
                    self.expr(&m.value);
                }
            }
        }
    }
}

/// The direct sub-expressions of `expr`, in source order: for the checks that look at every call
/// or literal and need no scoping ([`super::functions`], [`super::regex`], [`super::types`]).
pub(super) fn children(expr: &IdedExpr) -> Vec<&IdedExpr> {
    match &expr.expr {
        Expr::Call(call) => call
            .target
            .iter()
            .map(|t| t.as_ref())
            .chain(&call.args)
            .collect(),
        Expr::Select(select) => vec![&select.operand],
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        Expr::List(list) => list.elements.iter().collect(),
        Expr::Map(map) => entry_children(&map.entries),
        Expr::Struct(s) => entry_children(&s.entries),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => Vec::new(),
    }
}

/// The keys and values of map entries, the values of struct fields.
fn entry_children(entries: &[IdedEntryExpr]) -> Vec<&IdedExpr> {
    entries
        .iter()
        .flat_map(|e| match &e.expr {
            EntryExpr::MapEntry(m) => vec![&m.key, &m.value],
            EntryExpr::StructField(f) => vec![&f.value],
        })
        .collect()
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
