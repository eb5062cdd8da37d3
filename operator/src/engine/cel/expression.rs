//! A compiled expression, with what its evaluation would otherwise work out on every request.
use ::cel::Program;

use super::CelError;
use super::activation::Bindings;
use super::environment::{checked_eval, sized_by};

/// A Policy expression as it is kept between requests: the program, and the variables whose
/// collection sizes decide its cost (`None` when its cost does not depend on the request).
///
/// [`eval_bool`](super::eval_bool) works both out from the AST on every evaluation: in a
/// validating group of admission-load's Policies that was 9 % of the group's time (`cargo bench
/// -p gatehouse --bench engine`, groups table, perf).
#[derive(Debug)]
pub struct Expression {
    program: Program,
    sized_by: Option<Vec<&'static str>>,
}

impl Expression {
    pub fn new(program: Program) -> Self {
        let sized_by = sized_by(&program);
        Expression { program, sized_by }
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// [`eval_bool`](super::eval_bool) of the program.
    pub fn eval_bool(&self, vars: &dyn Bindings) -> Result<bool, CelError> {
        checked_eval(&self.program, self.sized_by.as_deref(), vars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::cel::{Activation, compile, eval_bool};
    use serde_json::json;

    /// The kept analysis decides as the per-evaluation one does: same answers, same budget
    /// refusals, with small and with over-budget collections.
    #[test]
    fn evaluates_as_the_program_does() {
        let small: Vec<i64> = (0..3).collect();
        let large: Vec<i64> = (0..2_000).collect();
        let sources = [
            "object.items.all(a, a >= 0)",
            "object.items.all(a, object.items.all(b, a + b >= 0))",
            "object.items.size() > 1",
            "request.operation == 'CREATE'",
            "object.items.exists(a, a == 2) && request.userInfo.groups.all(g, g != '')",
            "oldObject == null || oldObject.items.all(a, a > 0)",
            "object.missing",
            "1",
        ];
        for items in [&small, &large] {
            let object = json!({"items": items});
            let request = json!({"operation": "CREATE", "userInfo": {"groups": ["devs"]}});
            let vars = Activation::new(Some(&object), None, &request);
            for source in sources {
                let program = compile(source).unwrap();
                let kept = Expression::new(compile(source).unwrap());
                assert_eq!(
                    kept.eval_bool(&vars),
                    eval_bool(&program, &vars),
                    "{source} over {} items",
                    items.len()
                );
            }
        }
        let over = Expression::new(compile(sources[1]).unwrap());
        let object = json!({"items": large});
        let request = json!({});
        assert!(matches!(
            over.eval_bool(&Activation::new(Some(&object), None, &request)),
            Err(CelError::OverBudget(_))
        ));
    }
}
