//! Compile-time checks of the variables an expression may use.
use std::collections::BTreeSet;

use ::cel::Program;

use super::ast;

/// Where an expression appears in a Policy: decides which variables it may reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// `spec.validate[i].expression`.
    Validation,
    /// `spec.mutate[i].when`; `element` is bound only when the mutation has a `forEach`.
    When { for_each: bool },
    /// `spec.match.conditions[i].expression`, which the API server also gives `authorizer`.
    MatchCondition,
    /// `spec.effects[i].object.fields[j].expression`: a value computed from the stored object,
    /// outside any request.
    Computed,
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
            Site::Computed => &["object"],
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

/// Whether `program` reads the variable `name` (free at the root, not bound by a macro).
pub fn reads_variable(program: &Program, name: &str) -> bool {
    free_identifiers(program).contains(name)
}

/// The variables `program` reads that `site` does not provide, sorted.
///
/// `Program::references()` lists every identifier, including those a comprehension binds
/// (`c` in `object.spec.containers.all(c, has(c.resources))`), so this walks the AST itself and
/// only reports identifiers free at the root.
pub fn unknown_variables(program: &Program, site: Site) -> Vec<String> {
    free_identifiers(program)
        .into_iter()
        .filter(|name| !site.variables().contains(name) && !TYPE_NAMES.contains(name))
        .map(str::to_string)
        .collect()
}

/// The identifiers `program` reads that no macro binds (leading-dot names with their dot).
pub(super) fn free_identifiers(program: &Program) -> BTreeSet<&str> {
    let mut free = ast::free_identifiers(program.expression());
    // `@`-prefixed names are the accumulators macros introduce.
    free.retain(|name| !name.starts_with('@'));
    free
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile;

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
}
